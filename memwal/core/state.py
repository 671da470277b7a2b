"""The table-state handle: everything about a memwal table that does not change while it is open.

:class:`TableState` is what every part of memwal below the user facade works from: readers,
the compactor, garbage collection, index maintenance, views and the Spark tasks. It holds
the table's URI and storage, its memwal metadata, schema, sharding spec and shard
resolver, the manifest store and Lance's caches for the base. It holds no writer, no thread
pool and no open dataset, so it is cheap to build, safe to share between threads, and says
nothing about who writes.

Invariant: every field is derived from the table's metadata, which memwal writes once at
create time (``memwal.table`` in the Lance config) and never rewrites except for the index
configuration; so a state loaded once stays correct for the table's life. What does change
(base versions, shard manifests) is read through it on demand: :meth:`dataset`,
:meth:`snapshot`, :attr:`manifests`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import lance
import pyarrow as pa

from memwal.core import paths
from memwal.core.cache import ByteLRU, LanceCaches
from memwal.core.errors import TableDamagedError, TableNotFoundError
from memwal.core.io import FileIO, file_io_for
from memwal.core.lance_errors import memwal_errors
from memwal.core.manifest import ManifestStore, ShardManifest
from memwal.core.metadata import CONFIG_KEY, TableMetadata
from memwal.core.schema import primary_key_of, user_schema
from memwal.core.sharding import ShardingSpec, ShardResolver, ShardValues, decode_shard_value, parse_sharding_spec
from memwal.core.snapshot import Snapshot, take_snapshot
from memwal.core.storage import StorageConfig


def resolve_storage(storage_options: "Mapping[str, str] | StorageConfig | None") -> StorageConfig:
    """A storage config as given, or resolved from explicit options over the environment."""
    if isinstance(storage_options, StorageConfig):
        return storage_options
    return StorageConfig.resolve(storage_options)


def table_exists(uri: str, io: FileIO | None = None) -> bool:
    """True if a Lance table (memwal or not) exists at ``uri``."""
    uri = paths.normalize_uri(uri)
    io = io or file_io_for(uri)
    return bool(io.list_dir(paths.join(uri, paths.BASE_VERSIONS_DIR)))


#: what an opened SSTable dataset is taken to hold (its manifest and file metadata)
SSTABLE_DATASET_BYTES = 64 << 10
#: opened SSTable datasets a table handle keeps (about a thousand)
SSTABLE_DATASETS_BYTES = 64 << 20


@dataclass(frozen=True)
class TableState:
    """An open memwal table's fixed facts, and the way to its changing ones."""

    uri: str
    io: FileIO = field(repr=False)
    metadata: TableMetadata = field(repr=False)
    #: The user's columns (no primary-key metadata).
    schema: pa.Schema = field(repr=False)
    #: The schema writers take: the user's columns with Lance's primary-key metadata.
    write_schema: pa.Schema = field(repr=False)
    spec: ShardingSpec = field(repr=False)
    resolver: ShardResolver = field(repr=False)
    manifests: ManifestStore = field(repr=False, compare=False)
    #: Where the files live and how to reach them (credentials, endpoint): handed to every
    #: Lance call and to :attr:`io`.
    storage: StorageConfig = field(default_factory=StorageConfig, repr=False, compare=False)
    #: Lance's caches, shared by every base dataset this handle opens (see :class:`LanceCaches`).
    lance_caches: LanceCaches = field(default_factory=LanceCaches, repr=False, compare=False)
    #: Opened SSTable datasets by path. An SSTable is written once and never changed, so an
    #: opened one stays valid; a long-lived process (a maintenance loop refreshing views)
    #: then opens each once instead of on every read of it.
    sstable_datasets: "ByteLRU[str, lance.LanceDataset]" = field(
        default_factory=lambda: ByteLRU(SSTABLE_DATASETS_BYTES), repr=False, compare=False
    )

    @classmethod
    def from_dataset(
        cls, uri: str, dataset: lance.LanceDataset, metadata: TableMetadata, io: FileIO,
        storage: StorageConfig | None = None,
    ) -> "TableState":
        uri = paths.normalize_uri(uri)
        schema = user_schema(dataset.schema)
        spec = parse_sharding_spec(
            metadata.sharding,
            schema,
            spec_id=metadata.sharding_spec_id,
            field_ids=metadata.sharding_field_ids or None,
        )
        return cls(
            uri=uri,
            io=io,
            metadata=metadata,
            schema=schema,
            write_schema=dataset.schema,
            spec=spec,
            resolver=ShardResolver(metadata.table_uuid, spec),
            manifests=ManifestStore(uri, io),
            storage=storage or StorageConfig(),
        )

    @classmethod
    @memwal_errors()
    def load(cls, uri: str, storage_options: "Mapping[str, str] | StorageConfig | None" = None) -> "TableState":
        """Read the state of the memwal table at ``uri``; TableNotFoundError if there is none.

        ``storage_options`` (Lance's key names) override what the standard environment
        variables say (``AWS_*``, ``GOOGLE_*``, ``AZURE_*``); see :mod:`memwal.core.storage`.
        """
        uri = paths.normalize_uri(uri)
        storage = resolve_storage(storage_options)
        io = file_io_for(uri, storage)
        if not table_exists(uri, io):
            raise TableNotFoundError(f"no table at {uri}; create one with Table.create or `memwal init`")
        ds = lance.dataset(uri, storage_options=storage.lance_options())
        meta = TableMetadata.from_config(ds.config())
        if meta is None:
            raise TableNotFoundError(
                f"{uri} is a Lance table but not a memwal table (no {CONFIG_KEY!r} config); create it with memwal"
            )
        if ds.mem_wal_index_details() is None:
            raise TableDamagedError(f"{uri} has memwal metadata but no MemWAL index: the create was interrupted; recreate it")
        if primary_key_of(ds.schema) != meta.primary_key:
            raise TableDamagedError(
                f"primary key in the schema {primary_key_of(ds.schema)} differs from memwal's {meta.primary_key}"
            )
        return cls.from_dataset(uri, ds, meta, io, storage)

    # -- fixed facts -----------------------------------------------------------------------

    @property
    def primary_key(self) -> tuple[str, ...]:
        return self.metadata.primary_key

    def shard_id_of(self, values: ShardValues) -> str:
        """The shard holding rows with these shard values."""
        return self.resolver.shard_id(values)

    def shard_of_key(self, key: Mapping[str, Any]) -> str:
        """The shard holding a primary key given as ``{column: value}``."""
        return self.shard_id_of(self.spec.shard_values_of(dict(key), self.schema))

    def lance_spec_id(self) -> int:
        """The spec id Lance records in this table's shard manifests (0: manual shards)."""
        return self.spec.spec_id if self.spec.lance_native else 0

    def shard_values(self, manifest: ShardManifest) -> dict[str, Any]:
        """A shard's values decoded from its manifest (field id -> value)."""
        return {
            f.field_id: decode_shard_value(manifest.field_entries.get(f.field_id), f.result_type)
            for f in self.spec.fields
        }

    # -- what changes, read on demand ------------------------------------------------------

    @property
    def storage_options(self) -> dict[str, str] | None:
        """The storage options every Lance call on this table's files takes."""
        return self.storage.lance_options()

    def base_paused(self, now: float | None = None) -> str | None:
        """Why base commits other than a schema change's are paused now (a column is being
        widened: :mod:`memwal.maintain.evolve`), or None. A pause left by a process that died ends at
        the time it gave."""
        try:
            marker = json.loads(self.io.read(paths.base_pause(self.uri)))
        except FileNotFoundError:
            return None
        except ValueError:  # a marker being written: a pause
            return "a schema change (its pause marker is being written)"
        if float(marker.get("until", 0)) <= (time.time() if now is None else now):
            return None
        return str(marker.get("why", "a schema change"))

    def dataset(self, version: int | None = None) -> lance.LanceDataset:
        """The base table (compacted data only) at ``version`` (latest when None), opened with
        this handle's Lance caches: its indexes and file metadata stay warm between opens."""
        return lance.dataset(
            self.uri, version=version, storage_options=self.storage_options, session=self.lance_caches.session()
        )

    def latest_dataset(self, known: lance.LanceDataset | None = None) -> lance.LanceDataset:
        """The base table at its latest version: ``known`` itself while no later version is
        committed. A strong reader asks before every read; Lance commits version ``v + 1``
        by creating its manifest file, so one or two existence checks answer instead of an
        open (1-5 ms per vector search here, docs/bench-log/reads.md)."""
        if known is not None:
            nxt = known.version + 1
            if not self.io.exists(paths.base_manifest_path(self.uri, nxt)) and not self.io.exists(paths.base_manifest_path_v1(self.uri, nxt)):
                return known
        return self.dataset()

    def lance_dataset(self, uri: str, version: int | None = None, warm: bool = False) -> lance.LanceDataset:
        """Any Lance dataset of this table's storage (an SSTable, a view) at ``uri``; ``warm``:
        with this handle's Lance caches (a view looked up by its key index on every refresh)."""
        session = self.lance_caches.session() if warm else None
        return lance.dataset(uri, version=version, storage_options=self.storage_options, session=session)

    def sstable_dataset(self, uri: str) -> lance.LanceDataset:
        """The SSTable at ``uri``, opened once per handle (see :attr:`sstable_datasets`)."""
        return self.sstable_datasets.get_or_load(
            uri, lambda: lance.dataset(uri, storage_options=self.storage_options), lambda _: SSTABLE_DATASET_BYTES
        )

    def snapshot(self, version: int | None = None, shard_ids: Iterable[str] | None = None) -> Snapshot:
        """What a reader must merge: the base version and every shard's uncompacted SSTables."""
        return take_snapshot(self.dataset(version), self.manifests, shard_ids)

    def wal_tail(self, shard_id: str, start: int) -> int:
        """The last WAL position on disk at or after ``start`` (probing, as Lance's recovery does)."""
        pos = start
        while self.io.exists(paths.wal_entry_path(self.uri, shard_id, pos + 1)):
            pos += 1
        return pos
