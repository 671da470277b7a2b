"""Schema evolution: add nullable columns and drop columns of a table that is being written.

What Lance 14.0.2 allows on a table with a MemWAL (measured, docs/schema-evolution.md):
adding an all-null column, renaming and dropping a column commit on the base table at once,
with writers running; a type change and a computed column are refused (rows still in a WAL
could not be matched to the new field). So a change is a Lance commit on the base, and
everything written before it stays as it was stored: SSTables and WAL entries of an earlier
schema are read as the table's columns now (:func:`memwal.schema.as_evolved`: an added column
null, a dropped one left out) by every reader, the compactor and the change feed. A shard
writer claimed before the change goes on writing the columns it was claimed with (its rows
read the added column as null); a pool reopens it under the new schema when a write brings a
column it lacks (:meth:`ShardWriterPool.put`). A dropped column is renamed out of sight rather
than dropped (see :meth:`SchemaUpdate.commit`).

Invariant: a column keeps its name and type for its whole life. So a dropped column's name
cannot come back while an uncompacted SSTable or a WAL entry still stores it: its old values
would be read as the new column's. :meth:`SchemaUpdate.commit` refuses such a name until
maintenance has folded them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

import pyarrow as pa

from memwal import paths
from memwal.errors import InvalidArgumentError, SchemaMismatchError, UnknownColumnError
from memwal.state import TableState
from memwal.wal import WalTailReader

log = logging.getLogger(__name__)

#: What a dropped column is renamed to (with the base version and its name): hidden, never reused.
DROPPED_PREFIX = "_dropped_"


@dataclass(frozen=True)
class SchemaChange:
    """What one :meth:`SchemaUpdate.commit` did: the columns added and dropped, the base
    version before and after."""

    added: tuple[str, ...]
    dropped: tuple[str, ...]
    version_before: int
    version_after: int


@dataclass
class SchemaUpdate:
    """Changes to a table's columns, committed together (PyIceberg's ``update_schema()``).

    ``with table.update_schema() as u: u.add_column("note", pa.string())`` commits on leaving
    the block; or call :meth:`commit`."""

    state: TableState
    #: called with the change once it committed (a :class:`~memwal.table.Table` reloads its state)
    after_commit: Callable[[SchemaChange], None] | None = None
    _add: list[pa.Field] = field(default_factory=list)
    _drop: list[str] = field(default_factory=list)

    def add_column(self, name: str, type: pa.DataType) -> "SchemaUpdate":
        """Add a column, null in every existing row (and in rows written by writers that do
        not know it yet). Nullable: a row written before it has no value."""
        self._add.append(pa.field(name, type, nullable=True))
        return self

    def drop_column(self, name: str) -> "SchemaUpdate":
        """Drop a column: readers and writers no longer see it (the base keeps it under a
        hidden name, so its field id is never given to another column; its values stay on
        disk until the base is rewritten). Not a primary-key or sharding column, nor an
        indexed one."""
        self._drop.append(name)
        return self

    def __enter__(self) -> "SchemaUpdate":
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            self.commit()

    def _check(self, names: list[str]) -> None:
        """Refuse what cannot be done to a table whose columns are now ``names`` (the latest
        base's: this handle's state may predate another process's change)."""
        pk, shard_cols = set(self.state.primary_key), set(self.state.spec.source_columns)
        indexed = {self.state.metadata.indexes.vector_column, self.state.metadata.indexes.fts_column} - {None}
        seen: set[str] = set()
        for f in self._add:
            if f.name in names or f.name in seen:
                raise SchemaMismatchError(f"column {f.name!r} already exists; a column keeps its name and type for life")
            if not f.name or f.name.startswith("_"):
                raise InvalidArgumentError(f"column name {f.name!r}: names starting with '_' are memwal's and Lance's")
            seen.add(f.name)
        for name in self._drop:
            if name not in names or name.startswith("_"):
                raise UnknownColumnError(f"cannot drop {name!r}: no such column (columns: {', '.join(names)})")
            if name in pk or name in shard_cols:
                raise InvalidArgumentError(f"cannot drop {name!r}: rows are matched and routed by it (primary key or sharding column)")
            if name in indexed:
                raise InvalidArgumentError(f"cannot drop {name!r}: the table indexes it (vector or full-text index in its metadata)")
        if not self._add and not self._drop:
            raise InvalidArgumentError("nothing to change: add_column or drop_column first")
        stored = self._stored_names() if self._add else set()
        for f in self._add:
            if f.name in stored:
                raise SchemaMismatchError(
                    f"column {f.name!r} was dropped and uncompacted SSTables or WAL entries still hold its old values; "
                    "add it back once maintenance has compacted them (memwal status: no pending SSTables)")

    def _stored_names(self) -> set[str]:
        """The columns stored in the table's uncompacted SSTables and unflushed WAL entries."""
        snap = self.state.snapshot()
        wal = WalTailReader(self.state.uri, self.state.io, self.state.manifests, self.state.primary_key)
        names: set[str] = set()
        for shard in snap.shards:
            for sst in shard.live_sstables:
                names.update(self.state.lance_dataset(paths.sstable_path(self.state.uri, shard.shard_id, sst.path)).schema.names)
            for entry in wal.entries(shard.manifest):
                if entry.rows is not None:
                    names.update(entry.rows.schema.names)
        return names

    def commit(self) -> SchemaChange:
        """Commit the changes on the base table (one Lance commit each for the added and the
        dropped columns). Writers, readers and maintenance running elsewhere go on: what they
        stored before is read as the new columns."""
        base = self.state.dataset()
        self._check(base.schema.names)
        before = base.version
        if self._add:
            base.add_columns(pa.schema(self._add))
        if self._drop:
            # Renamed out of sight, not dropped: Lance gives a new column the lowest free field
            # id, a dropped column's, and a writer replaying an older WAL entry matches columns
            # by field id, so the dropped column's values would come back as the new column's.
            # A column whose name starts with '_' is no column of the table's (schema.user_schema).
            after_add = self.state.dataset()
            after_add.alter_columns(*({"path": name, "name": f"{DROPPED_PREFIX}{after_add.version}_{name}"} for name in self._drop))
        after = self.state.dataset().version
        change = SchemaChange(tuple(f.name for f in self._add), tuple(self._drop), before, after)
        log.info("table %s: added %s, dropped %s (base version %d -> %d)", self.state.uri, list(change.added),
                 list(change.dropped), before, after)
        if self.after_commit is not None:
            self.after_commit(change)
        return change
