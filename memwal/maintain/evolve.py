"""Schema evolution: add nullable columns, widen and drop columns of a table that is being written.

What Lance 14.0.2 allows on a table with a MemWAL (measured, docs/schema-evolution.md):
adding an all-null column, renaming and dropping a column commit on the base table at once,
with writers running; a type change and a computed column are refused (rows still in a WAL
could not be matched to the new field). So a change is a Lance commit on the base, and
everything written before it stays as it was stored: SSTables and WAL entries of an earlier
schema are read as the table's columns now (:func:`memwal.core.schema.as_evolved`: an added column
null, a dropped one left out) by every reader, the compactor and the change feed. A shard
writer claimed before the change goes on writing the columns it was claimed with (its rows
read the added column as null); a pool reopens it under the new schema when a write brings a
column it lacks (:meth:`ShardWriterPool.put`). A dropped column is renamed out of sight rather
than dropped (see :meth:`SchemaUpdate.commit`).

A type change Lance refuses, so a widening (int32 -> int64, decimal(10,2) -> decimal(12,2), ...)
is a new column that takes the name (:meth:`SchemaUpdate.widen_column`): the base's values are
cast into a hidden column (Lance's ``merge`` on the row id: new column files, no row rewritten),
which is then renamed to the column's name while the narrow column is renamed out of sight to
``_widened_<version>_<name>``, in one commit. Maintenance commits nothing to the base meanwhile
(:meth:`TableState.base_paused`): a compaction in between would write rows the cast missed.
Stored data of before the widening is cast when read; data a writer stored by replaying WAL
entries of before it holds the value in the hidden column, read as the wide column's
(:func:`memwal.core.schema.as_evolved`).

Invariant: a column keeps its name and type for its whole life. So a dropped column's name
cannot come back while an uncompacted SSTable or a WAL entry still stores it: its old values
would be read as the new column's. :meth:`SchemaUpdate.commit` refuses such a name until
maintenance has folded them.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc

from memwal.core import paths
from memwal.core.errors import InvalidArgumentError, SchemaMismatchError, UnknownColumnError
from memwal.core.lance_errors import is_commit_conflict
from memwal.core.schema import WIDENED_PREFIX, is_widening, widened_sources
from memwal.core.state import TableState
from memwal.core.wal import WalTailReader

log = logging.getLogger(__name__)

#: What a dropped column is renamed to (with the base version and its name): hidden, never reused.
DROPPED_PREFIX = "_dropped_"
#: How long a widening may pause maintenance's base commits at most (a process that dies
#: mid-way leaves its pause marker, which ends then).
WIDEN_PAUSE_SECONDS = 600.0
#: Attempts at the merge of a widening's cast values (a compaction that began before the pause
#: may commit first; the merge is then redone on the new version).
WIDEN_ATTEMPTS = 10


@dataclass(frozen=True)
class SchemaChange:
    """What one :meth:`SchemaUpdate.commit` did: the columns added and dropped, the base
    version before and after."""

    added: tuple[str, ...]
    dropped: tuple[str, ...]
    version_before: int
    version_after: int
    #: columns widened, with their new types
    widened: tuple[tuple[str, str], ...] = ()


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
    _widen: list[pa.Field] = field(default_factory=list)

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

    def widen_column(self, name: str, type: pa.DataType) -> "SchemaUpdate":
        """Widen a column to ``type`` (every value converts exactly: int32 -> int64,
        float32 -> float64, decimal(10,2) -> decimal(12,2), string -> large_string, ...).
        Costs one read of the column from the base and one column file per base fragment
        (:mod:`memwal.maintain.evolve`); the column moves to the end of the table's columns. Not a
        primary-key or sharding column (a changed key is a new table), nor an indexed one."""
        self._widen.append(pa.field(name, type, nullable=True))
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
        for f in self._widen:
            if f.name not in names or f.name.startswith("_"):
                raise UnknownColumnError(f"cannot widen {f.name!r}: no such column (columns: {', '.join(names)})")
            if f.name in pk or f.name in shard_cols or f.name in indexed:
                raise InvalidArgumentError(
                    f"cannot widen {f.name!r}: rows are matched, routed or indexed by it (a changed key is a new table)")
            if f.name in self._drop or sum(g.name == f.name for g in self._widen) > 1:
                raise InvalidArgumentError(f"column {f.name!r} is changed twice in one update")
        changed = set(self._drop) | {f.name for f in self._widen}
        if changed:
            from memwal.views.view import View, list_views

            for view in list_views(self.state):
                read = set(View.open(self.state, view).definition.columns_used(names)) & changed
                if read:
                    raise InvalidArgumentError(
                        f"cannot drop or widen {', '.join(sorted(read))}: materialized view {view!r} reads it "
                        "(drop the view, change the table, then create the view again)")
        if not self._add and not self._drop and not self._widen:
            raise InvalidArgumentError("nothing to change: add_column, widen_column or drop_column first")
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
        self._widenings(base.schema)  # refused before anything is committed
        before = base.version
        if self._add:
            base.add_columns(pa.schema(self._add))
        if self._drop:
            # Renamed out of sight, not dropped: Lance gives a new column the lowest free field
            # id, a dropped column's, and a writer replaying an older WAL entry matches columns
            # by field id, so the dropped column's values would come back as the new column's.
            # A column whose name starts with '_' is no column of the table's (schema.user_schema).
            after_add = self.state.dataset()
            # A widened column's older selves go with it: nothing may read them as a later
            # column of the same name.
            older = widened_sources(after_add.schema.names)
            after_add.alter_columns(*({"path": old, "name": f"{DROPPED_PREFIX}{after_add.version}_{old}"}
                                      for name in self._drop for old in (name, *older.get(name, ())) if old))
        if self._widen:
            self._widen_columns()
        after = self.state.dataset().version
        change = SchemaChange(tuple(f.name for f in self._add), tuple(self._drop), before, after,
                              tuple((f.name, str(f.type)) for f in self._widen))
        log.info("table %s: added %s, dropped %s, widened %s (base version %d -> %d)", self.state.uri, list(change.added),
                 list(change.dropped), list(change.widened), before, after)
        if self.after_commit is not None:
            self.after_commit(change)
        return change

    def _widen_columns(self) -> None:
        """Widen :attr:`_widen`'s columns: holding the base pause (a marker made only if absent:
        one widening at a time), merge each column's values cast into a hidden column, then one
        commit renames the narrow column out of sight and the hidden one to its name; then
        check that no row was missed. A column another widening made as wide meanwhile is left."""
        io, marker = self.state.io, paths.base_pause(self.state.uri)
        names = [f.name for f in self._widen]
        self._hold_pause(marker, names)
        try:
            # Again, under the pause: another widening may have made a column as wide meanwhile.
            todo = self._widenings(self.state.dataset().schema, done_ok=True)
            if not todo:
                return
            names = [f.name for f in todo]
            for attempt in range(WIDEN_ATTEMPTS):
                ds = self.state.dataset()
                stage = {f.name: f"_widening_{ds.version}_{f.name}" for f in todo}
                rows = ds.to_table(columns=names, with_row_id=True)
                cast = pa.table({"_rowid": rows.column("_rowid"), **{stage[f.name]: rows.column(f.name).cast(f.type) for f in todo}})
                try:
                    if cast.num_rows:
                        ds.merge(cast, left_on="_rowid")
                    else:  # Lance's merge joins nothing to nothing: an empty base takes all-null columns
                        ds.add_columns(pa.schema([pa.field(stage[f.name], f.type) for f in todo]))
                    break
                except OSError as e:  # a compaction begun before the pause committed first
                    if not is_commit_conflict(e) or attempt == WIDEN_ATTEMPTS - 1:
                        raise
                    log.info("widening %s: the base moved on (%s); casting again", names, e)
            self._renew_pause(marker, names)
            merged = self.state.dataset()
            hidden = {name: f"{WIDENED_PREFIX}{merged.version}_{name}" for name in names}
            merged.alter_columns(*({"path": name, "name": hidden[name]} for name in names),
                                 *({"path": stage[name], "name": name} for name in names))
            self._renew_pause(marker, names)
            self._repair_missed(hidden)
        finally:
            io.remove(marker)

    def _widenings(self, schema: pa.Schema, done_ok: bool = False) -> list[pa.Field]:
        """The widenings of :attr:`_widen` that ``schema`` still needs; SchemaMismatchError for
        one that is no widening of its column (with ``done_ok``, a column already of the type is
        left out: another widening made it)."""
        todo = []
        for f in self._widen:
            now = schema.field(f.name).type if f.name in schema.names else None
            if done_ok and now is not None and now.equals(f.type):
                continue
            if now is None or not is_widening(now, f.type):
                raise SchemaMismatchError(
                    f"cannot change {f.name!r} from {now} to {f.type}: not every value converts exactly "
                    "(a column only widens: a wider integer or float, a decimal with no fewer digits)")
            todo.append(f)
        return todo

    def _hold_pause(self, marker: str, names: list[str]) -> None:
        """Make the pause marker, waiting while another widening holds it (one that died holds
        it until the time it gave)."""
        deadline = time.monotonic() + WIDEN_PAUSE_SECONDS
        while not self.state.io.write_if_absent(marker, self._pause_text(names)):
            if self.state.base_paused() is None:  # expired: its widening died
                self.state.io.remove(marker)
                continue
            if time.monotonic() > deadline:
                raise SchemaMismatchError(f"cannot widen {', '.join(names)}: another schema change holds the table "
                                          f"({paths.base_pause(self.state.uri)})")
            time.sleep(0.2)

    def _renew_pause(self, marker: str, names: list[str]) -> None:
        self.state.io.write(marker, self._pause_text(names))

    @staticmethod
    def _pause_text(names: list[str]) -> bytes:
        return json.dumps({"until": time.time() + WIDEN_PAUSE_SECONDS, "why": f"widening {', '.join(names)}"}).encode()

    def _repair_missed(self, hidden: dict[str, str]) -> None:
        """Rows whose wide column differs from their narrow one after the swap were written by a
        commit that slipped in between the cast and the merge (Lance let it): set from the
        narrow value, under the pause still. Without Lance's retry: a commit that conflicts is
        redone on what the base holds then, so no newer row is overwritten."""
        from memwal.readers.feed import rows_by_key

        pk = list(self.state.primary_key)
        for name, old in hidden.items():
            for attempt in range(WIDEN_ATTEMPTS):
                ds = self.state.dataset()
                wide = ds.schema.field(name).type
                rows = ds.to_table(columns=list(dict.fromkeys([*pk, name, old])))
                new, was = rows.column(name), rows.column(old).cast(wide)
                same = pc.fill_null(pc.equal(new, was), False)
                if pa.types.is_floating(wide):  # NaN is NaN
                    same = pc.or_(same, pc.fill_null(pc.and_(pc.is_nan(new), pc.is_nan(was)), False))
                keys = rows.filter(pc.and_(pc.is_valid(rows.column(old)), pc.invert(same))).select(pk)
                if not keys.num_rows:
                    break
                log.warning("widening %s: %d row(s) written during the cast; setting them", name, keys.num_rows)
                full = rows_by_key(ds, keys, ds.schema.names, pk)
                full = full.set_column(full.schema.get_field_index(name), name, full.column(old).cast(wide))
                try:
                    ds.merge_insert(pk).when_matched_update_all().conflict_retries(0).execute(full)
                except OSError as e:
                    if not is_commit_conflict(e) or attempt == WIDEN_ATTEMPTS - 1:
                        raise
