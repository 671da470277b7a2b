"""The memwal table: a Lance base table with a MemWAL, a primary key and a sharding spec.

>>> t = Table.create("/tmp/users", schema, primary_key=["id"], shard_by="bucket(id, 4)")
>>> t.write(batch)          # routed to shards, durable in the WAL when it returns
>>> t.delete({"id": [7]})
>>> t.flush()               # MemTables -> SSTables: visible to every reader
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

import lance
import numpy as np
import pyarrow as pa

from memwal.core import paths
from memwal.core.errors import InvalidArgumentError, PrimaryKeyError, ShardingSpecError, TableExistsError
from memwal.core.indexes import FTS_PARAMS, fts_index_name
from memwal.core.io import FileIO, file_io_for
from memwal.core.manifest import ManifestStore, ShardManifest
from memwal.core.metadata import CONFIG_KEY, Bounds, IndexConfig, TableMetadata, WriterConfig
from memwal.core.partial import check_keys_present, check_merge, presence_of_columns, presence_of_dicts, presence_type
from memwal.core.routing import check_shard
from memwal.core.schema import as_table, conform, key_schema, with_primary_key
from memwal.core.sharding import ShardingSpec, ShardResolver, ShardValues, lance_init_kwargs, parse_sharding_spec
from memwal.core.snapshot import Snapshot
from memwal.core.state import TableState, resolve_storage, table_exists
from memwal.core.storage import StorageConfig
from memwal.maintain.status import TableStatus, table_status
from memwal.write.api import TableWrite, WriteBatch, WriteReport
from memwal.write.messages import WriteMode
from memwal.write.protocol import ShardRecords, TableWriter
from memwal.write.pool import ShardWriterPool

if TYPE_CHECKING:
    from memwal.maintain.evolve import SchemaUpdate
    from memwal.maintain.maintenance import Maintenance, MaintenanceConfig
    from memwal.readers.reader import Consistency, Reader
    from memwal.maintain.upgrade import UpgradeReport
    from memwal.views import View

log = logging.getLogger(__name__)


#: What ``write`` and ``delete`` return: the write API's one report (its ``rows`` and
#: ``shards`` are what this name held before). Deprecated name; use :class:`WriteReport`.
WriteResult = WriteReport


class Table:
    """A memwal table: the user facade over a :class:`~memwal.core.state.TableState` (what the
    table is) and a :class:`~memwal.write.protocol.TableWriter` (this process's write path).

    Create with :meth:`create`, open with :meth:`open`. Writes are routed to shards and go
    through Lance's ShardWriters; one writer per shard is kept open until :meth:`flush` or
    :meth:`close`. Use the table as a context manager to flush on exit. Everything that
    only reads or maintains the table takes :attr:`state`, never the facade.
    """

    def __init__(self, state: TableState) -> None:
        self.state = state
        #: This process's write path into the table (its shard writers included).
        self.writer = TableWriter(state)

    @property
    def writers(self) -> ShardWriterPool:
        """This table handle's shard writers (one per shard written, kept open)."""
        return self.writer.writers

    @writers.setter
    def writers(self, pool: ShardWriterPool) -> None:
        self.writer = TableWriter(self.state, pool)

    # -- what the table is (from its state) ---------------------------------------------------

    @property
    def uri(self) -> str:
        return self.state.uri

    @property
    def io(self) -> FileIO:
        return self.state.io

    @property
    def metadata(self) -> TableMetadata:
        return self.state.metadata

    @property
    def schema(self) -> pa.Schema:
        return self.state.schema

    @property
    def write_schema(self) -> pa.Schema:
        """The full schema writers take (primary-key metadata included)."""
        return self.state.write_schema

    @property
    def primary_key(self) -> tuple[str, ...]:
        return self.state.primary_key

    @property
    def spec(self) -> ShardingSpec:
        return self.state.spec

    @property
    def resolver(self) -> ShardResolver:
        return self.state.resolver

    @property
    def manifests(self) -> ManifestStore:
        return self.state.manifests

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
        bounds: Bounds | None = None,
        initial_data: Any = None,
        storage_options: "Mapping[str, str] | StorageConfig | None" = None,
    ) -> "Table":
        """Create a table, empty or bulk-loaded with ``initial_data`` (one row per key).

        ``schema`` may hold internal-looking columns only if they do not start with ``_``.
        Non-key columns become nullable: a delete is stored as a tombstone row whose non-key
        columns are null. The sharding columns must be primary-key columns, so every key
        maps to exactly one shard for its whole life.

        ``bounds`` (default :class:`~memwal.core.metadata.Bounds`) are stored with the table: what
        maintenance keeps it within, and where its writers slow down and stall.
        """
        uri = paths.normalize_uri(uri)
        storage = resolve_storage(storage_options)
        io = file_io_for(uri, storage)
        if isinstance(primary_key, str):
            primary_key = [primary_key]
        if io.is_file(uri):
            raise InvalidArgumentError(f"{uri} is a file, not a directory; a table is a directory: pick another URI")
        if table_exists(uri, io):
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
            bounds=bounds or Bounds(),
        )
        base = schema.empty_table()
        if initial_data is not None:
            base = conform(as_table(initial_data, schema), schema, what="initial data")
            keys = base.select(list(primary_key))
            if keys.group_by(list(primary_key)).aggregate([]).num_rows != base.num_rows:
                raise PrimaryKeyError("initial data repeats a primary key; load one row per key")
        opts = storage.lance_options()
        # No stable row ids: with them (pylance 14.0.2) every point lookup scans the row-id
        # sequence of every fragment merge_insert rewrote, so lookups slow down with update
        # history (docs/bench-log/lookup-history.md, lookups and update history). Views do not need them:
        # they are keyed on the primary key and fed by the compacted SSTables (memwal.views.changes).
        ds = lance.write_dataset(base, uri, storage_options=opts)
        ds.update_config({CONFIG_KEY: meta.to_json()})
        ds = lance.dataset(uri, storage_options=opts)
        if indexes.primary_key_btree and len(primary_key) == 1:
            ds.create_scalar_index(primary_key[0], "BTREE", name=f"{primary_key[0]}_idx")
            ds = lance.dataset(uri, storage_options=opts)
        if indexes.fts_column is not None:
            # Before the MemWAL starts, so every MemTable maintains it too.
            ds.create_scalar_index(indexes.fts_column, "INVERTED", name=fts_index_name(indexes.fts_column), **FTS_PARAMS)
            ds = lance.dataset(uri, storage_options=opts)
        ds.initialize_mem_wal(**lance_init_kwargs(spec), **meta.writer.lance_kwargs())
        log.info("created table %s (primary key %s, sharding %s)", uri, list(primary_key), spec.render())
        return cls(TableState.from_dataset(uri, lance.dataset(uri, storage_options=opts), meta, io, storage))

    @classmethod
    def open(cls, uri: str, storage_options: "Mapping[str, str] | StorageConfig | None" = None) -> "Table":
        """Open an existing memwal table (``storage_options``: see :meth:`TableState.load`)."""
        return cls(TableState.load(uri, storage_options))

    @staticmethod
    def upgrade(uri: str, *, dry_run: bool = False, storage_options: "Mapping[str, str] | StorageConfig | None" = None) -> "UpgradeReport":
        """Move a table made by the previous version (base with stable row ids) to the current
        layout, offline; a no-op on a current table (see :mod:`memwal.maintain.upgrade`)."""
        from memwal.maintain.upgrade import upgrade

        return upgrade(uri, dry_run=dry_run, storage_options=storage_options)

    def __enter__(self) -> "Table":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Flush every open writer (MemTables -> SSTables) and release them."""
        self.writer.close()

    # -- schema -------------------------------------------------------------------------------

    def update_schema(self) -> "SchemaUpdate":
        """Add nullable columns or drop columns, while the table is written and read elsewhere
        (:mod:`memwal.maintain.evolve`; a type change is refused by Lance on a MemWAL table)::

            with table.update_schema() as u:
                u.add_column("note", pa.string()).drop_column("legacy")

        This handle flushes its writers and reloads: its next writes take the new columns."""
        from memwal.maintain.evolve import SchemaUpdate

        def reload(_change: object) -> None:
            self.writer.close()
            self.state = TableState.load(self.state.uri, self.state.storage)
            self.writer = TableWriter(self.state)

        return SchemaUpdate(self.state, after_commit=reload)

    # -- shards -------------------------------------------------------------------------------

    def shard_id_of(self, values: ShardValues) -> str:
        """The shard holding rows with these shard values."""
        return self.state.shard_id_of(values)

    def shard_of_key(self, key: dict[str, Any]) -> str:
        """The shard holding a primary key given as ``{column: value}``."""
        return self.state.shard_of_key(key)

    def ensure_shard(self, shard_id: str, values: ShardValues) -> None:
        """Create the shard's first manifest if absent (see :meth:`ShardWriterPool.ensure_shard`)."""
        self.writers.ensure_shard(shard_id, values)

    def shard_values(self, manifest: ShardManifest) -> dict[str, Any]:
        """A shard's values decoded from its manifest (field id -> value)."""
        return self.state.shard_values(manifest)

    # -- writes -------------------------------------------------------------------------------

    def _route(self, data: Any, deletes: bool) -> tuple[pa.Table, list[ShardRecords]]:
        """Conform ``data`` (rows, or keys to delete) and route it: every error a write can
        raise for its input (schema, null keys, sharding transforms) is raised here."""
        if deletes:
            t = as_table(data)
            t = t.select([c for c in t.schema.names if c in self.primary_key])
            t = conform(t, key_schema(self.write_schema, self.primary_key), what="keys to delete")
            return t, self.writer.route(t, deletes=np.ones(t.num_rows, bool))
        t = conform(as_table(data, self.schema), self.write_schema)
        return t, self.writer.route(t)

    def validate(self, data: Any, *, deletes: bool = False, merge: str = "full") -> int:
        """Raise what :meth:`write` (or :meth:`delete`) would raise for ``data``, writing
        nothing; returns the number of rows. Lets a caller refuse a whole input up front."""
        if not deletes and check_merge(merge) == "partial":
            t, _ = self._partial_input(data)
            self.spec.shard_value_arrays(t)  # the sharding transforms' errors, as route() would raise them
            return t.num_rows
        return self._route(data, deletes)[0].num_rows

    def write(self, data: Any, *, merge: str = "full") -> WriteReport:
        """Upsert rows. Durable (in the WAL) on return.

        ``merge="full"``: the last row per primary key wins, whole. ``merge="partial"``: a
        row changes only the columns it carries (a column missing from an Arrow table, or a
        key missing from a dict, keeps its stored value; an explicit null sets null), rows of
        one key fold in order, and a key not stored yet is inserted with the absent columns
        null; see :mod:`memwal.core.partial`. Either way through the write path
        (:mod:`memwal.write.protocol`), shards in parallel.
        """
        if check_merge(merge) == "partial":
            return self._write_partial(data)
        _, records = self._route(data, deletes=False)
        return self._write(records, WriteMode())

    def _write_partial(self, data: Any) -> WriteReport:
        """Route rows with their presence; the write path folds them per shard and merges them
        over the stored rows, as the shard's owner."""
        if not self.metadata.writer.durable_write:
            raise InvalidArgumentError(
                "partial updates read the stored row from the WAL, which a table with durable_write=False "
                "may not have written yet; use merge='full' or a durable table"
            )
        t, present = self._partial_input(data)
        return self._write(self.writer.route(t, present=present), WriteMode(merge="partial"))

    def _write(self, records: list[ShardRecords], mode: WriteMode) -> WriteReport:
        """Through the write API, in this process: its writers, shards in parallel."""
        started = time.perf_counter()
        write = TableWrite(self.state, mode, shards=self.writer)
        return write.commit([write.prepare(WriteBatch(records), label="table")], started=started)

    def _partial_input(self, data: Any) -> tuple[pa.Table, pa.StructArray]:
        """Rows of a partial write conformed to the write schema (absent cells null) and their
        presence: a dict's missing keys, or an Arrow table's missing columns, are absent."""
        ptype = presence_type(self.write_schema, self.primary_key)
        if isinstance(data, list):
            check_keys_present(data, self.primary_key)
            return conform(as_table(data, self.schema), self.write_schema), presence_of_dicts(data, ptype)
        t = as_table(data)
        missing = [c for c in self.primary_key if c not in t.schema.names]
        if missing:
            raise InvalidArgumentError(f"a partial write must carry the primary key; the rows lack column(s) {missing}")
        return conform(t, self.write_schema), presence_of_columns(t.num_rows, ptype, t.schema.names)

    def delete(self, keys: Any) -> WriteReport:
        """Delete rows by primary key. ``keys`` holds the key columns (others are ignored)."""
        _, records = self._route(keys, deletes=True)
        return self._write(records, WriteMode())

    def write_shard(self, shard_id: str, values: ShardValues, rows: pa.Table, *, deletes: bool = False) -> None:
        """Write rows a caller routed to one shard itself; refuses rows of another shard
        (:class:`~memwal.core.errors.ShardRoutingError`)."""
        schema = key_schema(self.write_schema, self.primary_key) if deletes else self.write_schema
        rows = conform(rows, schema)
        check_shard(rows, self.spec.shard_value_arrays(rows), self.resolver, shard_id)
        records = ShardRecords.all_deletes(shard_id, values, rows) if deletes else ShardRecords(shard_id, values, rows)
        self.writer.write_shard(records, label="table")

    def flush(self) -> None:
        """Flush every open writer's MemTable to an SSTable, so every reader sees the data."""
        self.writers.flush()

    def flush_stranded(self, idle_seconds: float = 0.0) -> list[str]:
        """Flush shards whose acknowledged writes no live writer here owns (see
        :meth:`ShardWriterPool.flush_stranded`)."""
        return self.writers.flush_stranded(idle_seconds)

    # -- reads --------------------------------------------------------------------------------

    def dataset(self, version: int | None = None) -> lance.LanceDataset:
        """The base table (compacted data only) at ``version`` (latest when None)."""
        return self.state.dataset(version)

    def snapshot(self, version: int | None = None, shard_ids: Iterable[str] | None = None) -> Snapshot:
        """What a reader must merge: the base version and every shard's uncompacted SSTables."""
        return self.state.snapshot(version, shard_ids)

    def wal_tail(self, shard_id: str, start: int) -> int:
        """The last WAL position on disk at or after ``start``."""
        return self.state.wal_tail(shard_id, start)

    def reader(self, consistency: "Consistency | str" = "eventual", **kwargs: Any) -> "Reader":
        """A reader of this table (see :mod:`memwal.readers`)."""
        from memwal.readers.reader import Reader

        return Reader(self.state, consistency=consistency, **kwargs)

    def maintenance(self, config: "MaintenanceConfig | None" = None) -> "Maintenance":
        """The maintenance service of this table (compaction, indexes, GC, views)."""
        # Imported on use, like the reader and views below: a process that only writes (a
        # Spark write task) need not load the read, view and DataFusion machinery.
        from memwal.maintain.maintenance import Maintenance

        return Maintenance(self.state, config)

    def views(self) -> list[str]:
        """Names of this table's materialized views."""
        from memwal.views import list_views

        return list_views(self.state)

    def view(self, name: str) -> "View":
        """The materialized view ``name`` of this table."""
        from memwal.views import View

        return View.open(self.state, name)

    def status(self) -> TableStatus:
        """Per-shard state from the manifests on disk, and the base table's version and rows."""
        return table_status(self.state)
