"""memwal: streaming upserts and deletes into Lance tables, on Lance's MemWAL LSM tree.

The main entry points::

    from memwal import Table
    table = Table.create(uri, schema, primary_key=["id"], shard_by="bucket(id, 4)")
    table.write(rows); table.delete({"id": [1]}); table.flush()

    from memwal import readers
    reader = readers.open(uri)
    reader.get({"id": 1}); reader.scan(where="score > 3")

``memwal.streaming`` holds the Spark sink and the Kafka source.
"""

from memwal.core.runtime import configure_process

configure_process()  # Lance's log filter, before anything of memwal imports Lance (memwal.core.runtime)

from memwal.core.errors import (  # noqa: E402
    CommitConflictError,
    ConcurrencyError,
    FencedError,
    InputFileError,
    InvalidArgumentError,
    InvalidValueError,
    ManifestError,
    MemwalError,
    MetricsFormatError,
    PrimaryKeyError,
    SchemaMismatchError,
    ShardingSpecError,
    ShardRoutingError,
    StaleCompactionError,
    StorageError,
    StorageFullError,
    StorageUnavailableError,
    TableDamagedError,
    TableExistsError,
    TableNotFoundError,
    TransformTypeError,
    UnknownColumnError,
    WalGapError,
    WriteStalledError,
)

__version__ = "0.1.0"

# Table and friends import Lance, which configures its Rust logger on import; loading them
# lazily lets the CLI (and users) set LANCE_LOG first, and keeps `memwal --help` fast.
_LAZY = {
    "Table": "memwal.table",
    "WriteResult": "memwal.table",
    "WriteReport": "memwal.write.messages",
    "Bounds": "memwal.core.metadata",
    "IndexConfig": "memwal.core.metadata",
    "WriterConfig": "memwal.core.metadata",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'memwal' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "Bounds",
    "CommitConflictError",
    "ConcurrencyError",
    "FencedError",
    "InputFileError",
    "InvalidArgumentError",
    "IndexConfig",
    "InvalidValueError",
    "ManifestError",
    "MemwalError",
    "MetricsFormatError",
    "PrimaryKeyError",
    "SchemaMismatchError",
    "ShardRoutingError",
    "ShardingSpecError",
    "StaleCompactionError",
    "StorageError",
    "StorageFullError",
    "StorageUnavailableError",
    "Table",
    "TableDamagedError",
    "TableExistsError",
    "TableNotFoundError",
    "TransformTypeError",
    "UnknownColumnError",
    "WalGapError",
    "WriteStalledError",
    "WriteReport",
    "WriteResult",
    "WriterConfig",
    "__version__",
]
