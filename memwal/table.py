"""The memwal table: a Lance base table with a MemWAL, a primary key and a sharding spec.

>>> t = Table.create("/tmp/users", schema, primary_key=["id"], shard_by="bucket(id, 4)")
>>> t.write(batch)          # routed to shards, durable in the WAL when it returns
>>> t.delete({"id": [7]})
>>> t.flush()               # MemTables -> SSTables: visible to every reader
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import lance
import pyarrow as pa

from memwal import paths
from memwal.errors import (
    MemwalError,
    PrimaryKeyError,
    ShardingSpecError,
    TableExistsError,
    TableNotFoundError,
)
from memwal.io import FileIO, file_io_for
from memwal.manifest import ManifestStore, ShardManifest
from memwal.metadata import CONFIG_KEY, IndexConfig, TableMetadata, WriterConfig
from memwal.routing import Route, check_shard, route
from memwal.schema import as_table, conform, key_schema, primary_key_of, user_schema, with_primary_key
from memwal.sharding import (
    ShardingSpec,
    ShardResolver,
    ShardValues,
    decode_shard_value,
    field_entries,
    lance_init_kwargs,
    parse_sharding_spec,
)
from memwal.snapshot import Snapshot, take_snapshot
from memwal.indexes import FTS_PARAMS, fts_index_name, index_lag
from memwal.status import ShardStatus, TableStatus, read_maintenance_metrics
from memwal.wal import WalTailReader
from memwal.writer import ShardWriterPool

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WriteResult:
    """What one ``write`` or ``delete`` did."""

    rows: int
    shards: int


def _dataset_exists(uri: str) -> bool:
    return os.path.isdir(paths.join(uri, paths.BASE_VERSIONS_DIR))


class Table:
    """A memwal table. Create with :meth:`create`, open with :meth:`open`.

    Writes are routed to shards and go through Lance's ShardWriters; one writer per shard
    is kept open until :meth:`flush` or :meth:`close`. Use the table as a context manager
    to flush on exit.
    """

    def __init__(self, uri: str, dataset: lance.LanceDataset, metadata: TableMetadata, io: FileIO) -> None:
        self.uri = paths.normalize_uri(uri)
        self.metadata = metadata
        self.io = io
        self.manifests = ManifestStore(self.uri, io)
        self.schema = user_schema(dataset.schema)
        #: the full schema writers take (primary-key metadata included)
        self.write_schema = dataset.schema
        self.primary_key = metadata.primary_key
        self.spec: ShardingSpec = parse_sharding_spec(
            metadata.sharding,
            self.schema,
            spec_id=metadata.sharding_spec_id,
            field_ids=metadata.sharding_field_ids or None,
        )
        self.resolver = ShardResolver(metadata.table_uuid, self.spec)
        self.writers = ShardWriterPool(self.uri, metadata.writer)
        self._known_shards: set[str] = set()
        self._executor: ThreadPoolExecutor | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        uri: str,
        schema: pa.Schema,
        primary_key: Sequence[str] | str,
        shard_by: str = "unsharded",
        *,
        writer: WriterConfig | None = None,
        indexes: IndexConfig | None = None,
        initial_data: Any = None,
    ) -> "Table":
        """Create a table, empty or bulk-loaded with ``initial_data`` (one row per key).

        ``schema`` may hold internal-looking columns only if they do not start with ``_``.
        Non-key columns become nullable: a delete is stored as a tombstone row whose non-key
        columns are null. The sharding columns must be primary-key columns, so every key
        maps to exactly one shard for its whole life.
        """
        uri = paths.normalize_uri(uri)
        io = file_io_for(uri)
        if isinstance(primary_key, str):
            primary_key = [primary_key]
        if _dataset_exists(uri):
            raise TableExistsError(f"a table already exists at {uri}; open it with Table.open or pick another URI")
        bad = [f.name for f in schema if f.name.startswith("_")]
        if bad:
            raise ShardingSpecError(
                f"column names starting with '_' are reserved for Lance and memwal internals: {bad}; rename them"
            )
        fields = [f if f.name in primary_key else f.with_nullable(True) for f in schema]
        schema = with_primary_key(pa.schema(fields, metadata=schema.metadata), primary_key)
        spec = parse_sharding_spec(shard_by, schema)
        outside = [c for c in spec.source_columns if c not in primary_key]
        if outside:
            raise ShardingSpecError(
                f"sharding column(s) {outside} are not part of the primary key {list(primary_key)}: every key "
                "must map to exactly one shard, or the compactor could let an older row win. Shard by "
                "primary-key columns, or add the column to the primary key"
            )
        indexes = indexes or IndexConfig()
        for col in (indexes.vector_column, indexes.fts_column):
            if col is not None and col not in schema.names:
                raise ShardingSpecError(f"index column {col!r} is not in the schema")
        meta = TableMetadata(
            table_uuid=uuid.uuid4(),
            primary_key=tuple(primary_key),
            sharding=spec.render(),
            sharding_spec_id=spec.spec_id,
            sharding_field_ids=tuple(f.field_id for f in spec.fields),
            writer=writer or WriterConfig(),
            indexes=indexes,
        )
        base = schema.empty_table()
        if initial_data is not None:
            base = conform(as_table(initial_data, schema), schema, what="initial data")
            keys = base.select(list(primary_key))
            if keys.group_by(list(primary_key)).aggregate([]).num_rows != base.num_rows:
                raise PrimaryKeyError("initial data repeats a primary key; load one row per key")
        # Stable row ids keep row identity across compaction, which views' change feeds need.
        ds = lance.write_dataset(base, uri, enable_stable_row_ids=True)
        ds.update_config({CONFIG_KEY: meta.to_json()})
        ds = lance.dataset(uri)
        if indexes.primary_key_btree and len(primary_key) == 1:
            ds.create_scalar_index(primary_key[0], "BTREE", name=f"{primary_key[0]}_idx")
            ds = lance.dataset(uri)
        if indexes.fts_column is not None:
            # Before the MemWAL starts, so every MemTable maintains it too.
            ds.create_scalar_index(indexes.fts_column, "INVERTED", name=fts_index_name(indexes.fts_column), **FTS_PARAMS)
            ds = lance.dataset(uri)
        ds.initialize_mem_wal(**lance_init_kwargs(spec), **meta.writer.lance_kwargs())
        log.info("created table %s (primary key %s, sharding %s)", uri, list(primary_key), spec.render())
        return cls(uri, lance.dataset(uri), meta, io)

    @classmethod
    def open(cls, uri: str) -> "Table":
        """Open an existing memwal table."""
        uri = paths.normalize_uri(uri)
        io = file_io_for(uri)
        if not _dataset_exists(uri):
            raise TableNotFoundError(f"no table at {uri}; create one with Table.create or `memwal init`")
        ds = lance.dataset(uri)
        meta = TableMetadata.from_config(ds.config())
        if meta is None:
            raise TableNotFoundError(
                f"{uri} is a Lance table but not a memwal table (no {CONFIG_KEY!r} config); create it with memwal"
            )
        if ds.mem_wal_index_details() is None:
            raise MemwalError(f"{uri} has memwal metadata but no MemWAL index: the create was interrupted; recreate it")
        if primary_key_of(ds.schema) != meta.primary_key:
            raise MemwalError(
                f"primary key in the schema {primary_key_of(ds.schema)} differs from memwal's {meta.primary_key}"
            )
        return cls(uri, ds, meta, io)

    def __enter__(self) -> "Table":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Flush every open writer (MemTables -> SSTables) and release them."""
        try:
            self.writers.close()
        finally:
            if self._executor is not None:
                self._executor.shutdown()
                self._executor = None

    # -- shards -------------------------------------------------------------------------------

    def shard_id_of(self, values: ShardValues) -> str:
        """The shard holding rows with these shard values."""
        return self.resolver.shard_id(values)

    def shard_of_key(self, key: dict[str, Any]) -> str:
        """The shard holding a primary key given as ``{column: value}``."""
        return self.shard_id_of(self.spec.shard_values_of(key, self.schema))

    def lance_spec_id(self) -> int:
        """The spec id Lance records in this table's shard manifests (0: manual shards)."""
        return self.spec.spec_id if self.spec.lance_native else 0

    def ensure_shard(self, shard_id: str, values: ShardValues) -> None:
        """Create the shard's first manifest, recording its spec id and shard values, if absent.

        Lance's writer would create a bare manifest; writing it first records the shard
        value -> shard UUID mapping in Lance's own format, and Lance keeps it in every
        later version.
        """
        if shard_id in self._known_shards:
            return
        if self.manifests.latest_version(shard_id) is None:
            self.manifests.write_shard_if_absent(
                ShardManifest(
                    shard_id=shard_id,
                    version=1,
                    shard_spec_id=self.lance_spec_id(),
                    field_entries=field_entries(self.spec, values),
                )
            )
        self._known_shards.add(shard_id)

    def shard_values(self, manifest: ShardManifest) -> dict[str, Any]:
        """A shard's values decoded from its manifest (field id -> value)."""
        return {
            f.field_id: decode_shard_value(manifest.field_entries.get(f.field_id), f.result_type)
            for f in self.spec.fields
        }

    # -- writes -------------------------------------------------------------------------------

    def _each(self, routes: list[Route], op: Callable[[Route], None]) -> None:
        # Each durable put waits for its shard's WAL flush tick; running shards in parallel
        # overlaps those waits (Lance releases the GIL while it waits).
        if len(routes) == 1:
            op(routes[0])
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="memwal-write")
        for f in [self._executor.submit(op, r) for r in routes]:
            f.result()

    def write(self, data: Any) -> WriteResult:
        """Upsert rows: the last row per primary key wins. Durable (in the WAL) on return."""
        t = conform(as_table(data, self.schema), self.write_schema)
        routes = route(t, self.spec.shard_value_arrays(t), self.resolver)
        for r in routes:
            self.ensure_shard(r.shard_id, r.values)
        self._each(routes, lambda r: self.writers.put(r.shard_id, r.rows))
        return WriteResult(t.num_rows, len(routes))

    def delete(self, keys: Any) -> WriteResult:
        """Delete rows by primary key. ``keys`` holds the key columns (others are ignored)."""
        t = as_table(keys)
        t = t.select([c for c in t.schema.names if c in self.primary_key])
        t = conform(t, key_schema(self.write_schema, self.primary_key), what="keys to delete")
        routes = route(t, self.spec.shard_value_arrays(t), self.resolver)
        for r in routes:
            self.ensure_shard(r.shard_id, r.values)
        self._each(routes, lambda r: self.writers.delete(r.shard_id, r.rows))
        return WriteResult(t.num_rows, len(routes))

    def write_shard(self, shard_id: str, values: ShardValues, rows: pa.Table, *, deletes: bool = False) -> None:
        """Write rows already routed to one shard (the Spark sink's path); refuses misrouted rows."""
        schema = key_schema(self.write_schema, self.primary_key) if deletes else self.write_schema
        rows = conform(rows, schema)
        check_shard(rows, self.spec.shard_value_arrays(rows), self.resolver, shard_id)
        self.ensure_shard(shard_id, values)
        (self.writers.delete if deletes else self.writers.put)(shard_id, rows)

    def flush(self) -> None:
        """Flush every open writer's MemTable to an SSTable, so every reader sees the data."""
        self.writers.flush()

    def flush_stranded(self, idle_seconds: float = 0.0) -> list[str]:
        """Flush shards holding acknowledged but unflushed writes that no writer here owns,
        and whose newest such write is at least ``idle_seconds`` old; returns their ids.

        Such writes (from a writer that crashed, or went idle) are durable in the WAL and
        visible to strong readers, but eventual readers see them only once flushed.
        Claiming the shard replays them and closing flushes them; a live but idle writer
        elsewhere is fenced and reopens on its next write.
        """
        tails = WalTailReader(self.uri, self.io, self.manifests, self.primary_key)
        now = time.time()
        flushed = []
        for shard_id in self.manifests.list_shards():
            if shard_id in self.writers.open_shards:
                continue
            m = self.manifests.read_shard(shard_id)
            newest = tails.newest_entry_mtime(m) if m is not None else None
            if newest is None or now - newest < idle_seconds:
                continue
            log.info("flushing stranded WAL entries of shard %s", shard_id)
            self.writers.claim_and_flush(shard_id)
            flushed.append(shard_id)
        return flushed

    # -- reads --------------------------------------------------------------------------------

    def dataset(self, version: int | None = None) -> lance.LanceDataset:
        """The base table (compacted data only) at ``version`` (latest when None)."""
        return lance.dataset(self.uri, version=version)

    def snapshot(self, version: int | None = None, shard_ids: Iterable[str] | None = None) -> Snapshot:
        """What a reader must merge: the base version and every shard's uncompacted SSTables."""
        return take_snapshot(self.dataset(version), self.manifests, shard_ids)

    def wal_tail(self, shard_id: str, start: int) -> int:
        """The last WAL position on disk at or after ``start`` (probing, as Lance's recovery does)."""
        pos = start
        while self.io.exists(paths.wal_entry_path(self.uri, shard_id, pos + 1)):
            pos += 1
        return pos

    def status(self) -> TableStatus:
        """Per-shard state from the manifests on disk, and the base table's version and rows."""
        snap = self.snapshot()
        shards = []
        for s in sorted(snap.shards, key=lambda s: s.shard_id):
            m = s.manifest
            shards.append(
                ShardStatus(
                    shard_id=m.shard_id,
                    shard_values=self.shard_values(m),
                    writer_epoch=m.writer_epoch,
                    manifest_version=m.version,
                    wal_flushed_position=m.replay_after_wal_entry_position,
                    wal_last_seen_position=m.wal_entry_position_last_seen,
                    wal_tail_position=self.wal_tail(
                        m.shard_id, max(m.wal_entry_position_last_seen, m.replay_after_wal_entry_position)
                    ),
                    current_generation=m.current_generation,
                    sstables=sorted(t.generation for t in m.sstables),
                    compacted_generation=s.compacted_generation,
                    pending_sstables=len(s.live_sstables),
                    sealed=m.sealed,
                )
            )
        extra: dict[str, Any] = {
            "index_lag_generations": {lg.index: lg.lag for lg in index_lag(snap.dataset, snap.index)},
        }
        metrics = read_maintenance_metrics(self.io, self.uri)
        if metrics is not None:
            extra["maintenance"] = metrics
        return TableStatus(
            uri=self.uri,
            primary_key=list(self.primary_key),
            sharding=self.spec.render(),
            base_version=snap.base_version,
            base_rows=snap.dataset.count_rows(),
            num_shards=len(shards),
            shards=shards,
            extra=extra,
        )
