"""The options of ``format("memwal")``: one config dataclass, parsed once from Spark's options.

Spark hands a Python data source its options as a case-insensitive mapping of strings; every
reader and writer of the format takes a :class:`FormatOptions` made from it by
:meth:`FormatOptions.parse`, so names, defaults and validation live here only.

Storage options (credentials, endpoint) are given as ``storage.<Lance key>`` (``.option(
"storage.aws_region", "eu-west-1")``), or by a bare Lance key (``aws_*``, ``google_*``,
``azure_*`` and the HTTP client's keys such as ``allow_http``); they are resolved over the
standard environment variables of the process that plans the read or write, and travel with
every task from there (an executor's environment need not know the object store).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from memwal.core.errors import InvalidArgumentError
from memwal.core.storage import CLIENT_OPTION_KEYS, StorageConfig, canonical_key, options_from_environment

#: The short name Spark resolves: ``spark.read.format("memwal")``.
NAME = "memwal"

_STORE_PREFIXES = ("aws_", "google_", "azure_")


def _bool(name: str, text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise InvalidArgumentError(f"option {name}={text!r} must be true or false")


def _int(name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InvalidArgumentError(f"option {name}={text!r} must be an integer") from None


def _float(name: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise InvalidArgumentError(f"option {name}={text!r} must be a number") from None


@dataclass(frozen=True)
class FormatOptions:
    """Every option of the format, typed, with its default."""

    #: The table (``load(uri)`` / ``save(uri)`` / ``start(uri)``, or ``option("path", uri)``).
    path: str
    #: Resolved storage options (explicit ones over the planning process's environment).
    storage: StorageConfig = field(default_factory=StorageConfig)

    # -- reads ------------------------------------------------------------------------------------
    #: "eventual": base + flushed SSTables; "strong": also every shard's unflushed WAL.
    consistency: str = "eventual"
    #: Read the table as of this base version (time travel).
    version: int | None = None
    #: Read the table as it was at this time (ISO 8601 or epoch seconds), base and SSTables.
    as_of: str | None = None
    #: Base rows per read task (the base's fragments are grouped up to this many rows).
    rows_per_partition: int = 1_000_000

    # -- the change feed (memwal.readers.feed) ----------------------------------------------------------
    #: Read the table's changes (rows with _change_type, _shard, _generation, _commit_time).
    read_change_feed: bool = False
    #: Changes after this base version, "earliest" (the oldest still kept) or "latest".
    starting_version: str | None = None
    #: A batch read stops at what this base version had folded (default: the last flush).
    ending_version: int | None = None
    #: A stream registered as this feed consumer: GC keeps what it has not read.
    consumer: str | None = None

    # -- writes -----------------------------------------------------------------------------------
    #: "upsert": rows replace their keys' rows; "delete": the keys of the rows are deleted.
    operation: str = "upsert"
    #: "full" or "partial" (the columns the DataFrame has; a column it lacks is kept).
    merge: str = "full"
    #: A column ordering versions of a key: the highest wins within a write or micro-batch.
    sequence_column: str | None = None
    #: With a sequence column: drop a row older than its key's stored version.
    drop_stale: bool = False
    #: "auto" (a DataFrame with Spark's Kafka source columns is read as Kafka records, any
    #: other as the table's columns), "kafka" or "columns".
    input: str = "auto"
    #: Kafka record values: "json", "debezium-json" or "avro" (see docs/formats.md).
    value_format: str = "json"
    #: Field naming each record's operation (Kafka JSON values; a column for "columns" input).
    op_field: str | None = "op"
    #: With "avro": the writer schema (the text of an ``.avsc``).
    avro_schema: str | None = None
    #: With "avro": values carry Confluent's header with this schema id (others are dead letters).
    avro_schema_id: int | None = None
    #: With "avro": values carry Confluent's header; writer schemas come from this registry URL.
    schema_registry: str | None = None
    #: When the records' own schemas differ from the table's columns: "compatible", "add" or
    #: "none" (``SinkOptions.evolve``, docs/schema-evolution.md).
    evolve: str = "compatible"
    #: Rows larger than this go to the dead-letter table.
    max_row_bytes: int = 8 << 20
    #: Dead-letter table (default ``{table}_dead_letters``).
    dead_letter_table: str | None = None
    #: Streaming: flush each shard's MemTable at most this often (seconds), for eventual readers.
    flush_interval_seconds: float | None = 2.0
    #: "os" or "fsync" for this query's writes (None: the table's default).
    durability: str | None = None
    #: Seconds without writes after which an executor's writer process exits (None: its default).
    writer_process_idle_seconds: float | None = None
    #: Streaming: a directory where each micro-batch's commit leaves its report as JSON
    #: (``<batch id>.json``), for a listener in the query's own process (``memwal ingest``).
    report_dir: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str], *, environ: Mapping[str, str] | None = None) -> "FormatOptions":
        """The options Spark handed the data source (keys in any case)."""
        given = {str(k).lower(): str(v) for k, v in options.items()}
        path = given.pop("path", None)
        if not path:
            raise InvalidArgumentError("format('memwal') needs the table's URI: load(uri), save(uri), start(uri) or option('path', uri)")
        storage_given: dict[str, str] = {}
        for key in list(given):
            if key.startswith("storage."):
                storage_given[canonical_key(key.removeprefix("storage."))] = given.pop(key)
            elif key.startswith(_STORE_PREFIXES) or canonical_key(key) in CLIENT_OPTION_KEYS:
                storage_given[canonical_key(key)] = given.pop(key)
        merged = options_from_environment(environ) | storage_given
        out: dict[str, object] = {"path": path, "storage": StorageConfig(tuple(sorted(merged.items())))}
        names = {f.name.replace("_", ""): f for f in fields(cls)}
        for key, text in given.items():
            f = names.get(key.replace("_", ""))
            if f is None or f.name in ("path", "storage"):
                continue  # options of Spark's own (checkpointLocation, ...) and unknown keys
            if f.name in ("version", "rows_per_partition", "max_row_bytes", "ending_version", "avro_schema_id"):
                out[f.name] = _int(key, text)
            elif f.name == "writer_process_idle_seconds":
                out[f.name] = _float(key, text)
            elif f.name in ("drop_stale", "read_change_feed"):
                out[f.name] = _bool(key, text)
            elif f.name == "flush_interval_seconds":
                out[f.name] = None if text.strip().lower() in ("none", "") else _float(key, text)
            elif f.name == "op_field":
                out[f.name] = text or None
            else:
                out[f.name] = text
        opts = cls(**out)  # type: ignore[arg-type]
        opts.check()
        return opts

    def past(self) -> "int | dt.datetime | None":
        """The state a time-travel read reads (``asOf``: a base version number or an ISO-8601
        time, naive meaning UTC; ``version``: a base version), None for the latest."""
        if self.as_of is None:
            return self.version
        if self.version is not None:
            raise InvalidArgumentError("give option asOf or version, not both")
        text = self.as_of.strip()
        if text.isdigit():
            return int(text)
        try:
            return dt.datetime.fromisoformat(text)
        except ValueError:
            raise InvalidArgumentError(f"option asOf={self.as_of!r}: a base version number or an ISO-8601 time") from None

    def check(self) -> None:
        if self.consistency not in ("eventual", "strong"):
            raise InvalidArgumentError(f"option consistency={self.consistency!r}: eventual or strong")
        if self.operation not in ("upsert", "delete"):
            raise InvalidArgumentError(f"option operation={self.operation!r}: upsert or delete")
        if self.merge not in ("full", "partial"):
            raise InvalidArgumentError(f"option merge={self.merge!r}: full or partial")
        if self.evolve not in ("compatible", "add", "none"):
            raise InvalidArgumentError(f"option evolve={self.evolve!r}: compatible, add or none")
        if self.input not in ("auto", "kafka", "columns"):
            raise InvalidArgumentError(f"option input={self.input!r}: auto, kafka or columns")
        if self.drop_stale and not self.sequence_column:
            raise InvalidArgumentError("option dropStale needs a sequenceColumn")
        if self.operation == "delete" and self.merge == "partial":
            raise InvalidArgumentError("option merge=partial goes with upserts, not operation=delete")
        sv = self.starting_version
        if sv is not None and not (sv.strip().isdigit() or sv.strip() in ("earliest", "latest")):
            raise InvalidArgumentError(f"option startingVersion={sv!r}: a base version, earliest or latest")
        if (sv is not None or self.ending_version is not None or self.consumer) and not self.read_change_feed:
            raise InvalidArgumentError("options startingVersion, endingVersion and consumer go with readChangeFeed=true")
        if self.rows_per_partition < 1:
            raise InvalidArgumentError("option rowsPerPartition must be at least 1")
