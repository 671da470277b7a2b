"""Reading through ``format("memwal")``: one consistent snapshot, split over Spark's tasks.

The driver plans the read once (:class:`ScanPlan`): it pins a snapshot, the base table
version and every shard's manifest as the reader sees them (plus, for a strong read, every
shard's unflushed WAL rows), and splits it:

- **delta splits**, one per shard with anything above the base: the shard's newest row per
  key across its live SSTables and WAL tail, deleted keys dropped;
- **base splits**, the base version's fragments grouped up to ``rowsPerPartition`` rows:
  their rows minus every key a delta holds (the newest version of such a key is in the delta,
  emitted by its shard's split; a deleted key is in no split);
When the filters name every primary-key column by equality (``id = 5``, ``id IN (...)``), the
read is a point lookup: shard pruning leaves the keys' shards, and one base split reads all
fragments through the key's index.

Each key is live in exactly one split, so the splits' union is exactly what
``readers.open(uri).scan()`` returns. Executors rebuild the pinned snapshot from the plan (the
manifests travel as bytes; the base version is read at that version) and keep an SSTable cache
per process across tasks.

Filters Spark pushes (``spark.sql.python.filterPushdown.enabled``, which memwal's
``local_session`` sets) become one SQL predicate: shard pruning and Lance's filter on the base
and the delta. They are all handed back to Spark too, which evaluates them again on what the
splits return: pushing them changes how much is read, never the answer.
"""

from __future__ import annotations

import datetime as dt
import decimal
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceReader,
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
)

from memwal.spark.options import FormatOptions
from memwal.sqltext import quote_ident, sql_literal
from memwal.write.messages import from_payload, to_payload

_OPS = {EqualTo: "=", GreaterThan: ">", GreaterThanOrEqual: ">=", LessThan: "<", LessThanOrEqual: "<="}


def filter_sql(f: Filter) -> str | None:
    """``f`` as a SQL predicate over the table's columns (DataFusion, Lance's dialect), or None
    when memwal does not translate it (Spark evaluates it alone)."""
    attr = getattr(f, "attribute", None)
    if attr is not None and len(attr) != 1:
        return None  # a nested field
    try:
        if type(f) in _OPS:
            return f"{quote_ident(attr[0])} {_OPS[type(f)]} {_literal(f.value)}"
        if isinstance(f, EqualNullSafe):
            return f"{quote_ident(attr[0])} IS NOT DISTINCT FROM {_literal(f.value)}"
        if isinstance(f, In):
            if not f.value:
                return "false"
            return f"{quote_ident(attr[0])} IN ({', '.join(_literal(v) for v in f.value)})"
        if isinstance(f, IsNull):
            return f"{quote_ident(attr[0])} IS NULL"
        if isinstance(f, IsNotNull):
            return f"{quote_ident(attr[0])} IS NOT NULL"
        if isinstance(f, Not):
            inner = filter_sql(f.child)
            return None if inner is None else f"NOT ({inner})"
    except (TypeError, ValueError):
        return None
    return None


def _literal(value: Any) -> str:
    if isinstance(value, float) and value != value:
        raise ValueError("NaN")  # no SQL literal; Spark filters it
    if isinstance(value, (dt.date, dt.datetime, decimal.Decimal, str, int, float, bool, bytes)) or value is None:
        from memwal.errors import PrimaryKeyError

        try:
            return sql_literal(value)
        except PrimaryKeyError as e:
            raise ValueError(str(e)) from None
    raise ValueError(f"no literal for {type(value).__name__}")


def pushdown_enabled() -> bool:
    """Whether Spark runs this planning with filter pushdown.

    Spark refuses a reader that implements ``pushFilters`` when
    ``spark.sql.python.filterPushdown.enabled`` is false, and tells the data source nothing
    about the setting: it plans in a worker of its own (the pushdown worker) only when the
    setting is on. So a reader that pushes filters is made only inside that worker, and a plain
    session with the setting off still reads (Spark then filters on its own).
    """
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__") == "pyspark.sql.worker.data_source_pushdown_filters":
            return True
        frame = frame.f_back
    return False


# -- the plan ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PinnedShard:
    """A shard as the plan's snapshot saw it: its manifest (bytes: immutable, picklable) and
    its compacted generation in the pinned base version."""

    manifest: bytes
    compacted_generation: int


@dataclass(frozen=True)
class PinnedSnapshot:
    """What every split reads: a base version and the shards' manifests at planning time."""

    base_version: int
    shards: tuple[PinnedShard, ...]


class BaseSplit(InputPartition):
    """Base fragments, minus every key a delta holds."""

    def __init__(self, fragment_ids: tuple[int, ...]) -> None:
        super().__init__(fragment_ids)
        self.fragment_ids = fragment_ids


class DeltaSplit(InputPartition):
    """One shard's newest rows above the base (its SSTables, its WAL tail for strong reads)."""

    def __init__(self, shard_id: str) -> None:
        super().__init__(shard_id)
        self.shard_id = shard_id


@dataclass(frozen=True)
class ScanPlan:
    """A read planned on the driver, carried (pickled) to every task."""

    uri: str
    opts: FormatOptions
    columns: tuple[str, ...]
    where: str | None
    snapshot: PinnedSnapshot
    #: Strong reads: each shard's unflushed WAL rows (IPC bytes, tombstones included).
    tails: dict[str, bytes]
    #: Shards left after pruning (None: every shard).
    shard_ids: tuple[str, ...] | None


# -- executor side: what a process keeps across tasks --------------------------------------------


class _Process:
    """The table states and SSTable cache this process keeps between read tasks."""

    def __init__(self) -> None:
        self._states: dict[tuple[str, Any], Any] = {}
        self._cache = None

    def state(self, uri: str, storage: Any) -> Any:
        from memwal.state import TableState

        key = (uri, storage)
        if key not in self._states:
            self._states[key] = TableState.load(uri, storage)
        return self._states[key]

    def state_of(self, uri: str, storage: Any, base: Any) -> Any:
        """The table's state for reading ``base`` (a pinned base version's dataset): reloaded
        when the kept one has other columns than ``base`` and a fresh load has the same (its
        columns were added, widened or dropped since this process loaded it; a time-travel read
        of an older version keeps the latest state)."""
        from memwal.state import TableState

        state = self.state(uri, storage)
        names = base.schema.names
        if names != state.write_schema.names:
            fresh = TableState.load(uri, storage)
            if fresh.write_schema.names == names:
                self._states[(uri, storage)] = state = fresh
        return state

    def cache(self, storage_options: dict[str, str] | None) -> Any:
        from memwal.readers import sstables

        if self._cache is None:
            self._cache = sstables.SSTableCache(sstables.DEFAULT_CACHE_BYTES, storage_options)
        return self._cache


_PROCESS = _Process()


def _snapshot(state: Any, pin: PinnedSnapshot, base: Any = None) -> Any:
    """The pinned snapshot (``base``: its base version, already open)."""
    from memwal.manifest import ShardManifest
    from memwal.snapshot import ShardState, Snapshot

    shards = tuple(ShardState(ShardManifest.from_bytes(s.manifest), s.compacted_generation) for s in pin.shards)
    base = base if base is not None else state.dataset(pin.base_version)
    return Snapshot(base, state.manifests.mem_wal_index(pin.base_version), shards)


class ScanReader(DataSourceReader):
    """The batch reader: plans on the driver, reads splits on the executors."""

    def __init__(self, uri: str, opts: FormatOptions, schema: Any) -> None:
        self.uri = uri
        self.opts = opts
        #: The Spark schema of what Spark expects back (the table's, or the user's subset).
        self.schema = schema
        self.columns = tuple(f.name for f in schema.fields)
        self.predicates: list[str] = []
        #: The filters name every primary-key column by equality: a point lookup.
        self.point_lookup = False
        self._plan: ScanPlan | None = None

    # -- planning (driver) ----------------------------------------------------------------------

    def _push(self, filters: list[Filter]) -> list[Filter]:
        """Translate the filters memwal can use; hand every one back to Spark (see the module)."""
        from memwal.state import TableState

        state = TableState.load(self.uri, self.opts.storage)
        pk = list(state.primary_key)
        equal: dict[str, list[Any]] = {}
        for f in filters:
            sql = filter_sql(f)
            if sql is not None:
                self.predicates.append(sql)
            attr = getattr(f, "attribute", ())
            if len(attr) == 1 and attr[0] in pk and isinstance(f, (EqualTo, In)) and sql is not None:
                values = [f.value] if isinstance(f, EqualTo) else list(f.value)
                prior = equal.get(attr[0])
                equal[attr[0]] = values if prior is None else [v for v in prior if v in values]
        self.point_lookup = bool(pk) and all(c in equal for c in pk)
        return list(filters)

    def plan(self) -> ScanPlan:
        if self._plan is not None:
            return self._plan
        from memwal.readers.reader import Reader
        from memwal.state import TableState
        from memwal.schema import stored_schema
        from memwal.wal import WalTailReader

        state = TableState.load(self.uri, self.opts.storage)
        reader = Reader(state, consistency=self.opts.consistency, as_of=self.opts.past())
        where = " AND ".join(f"({p})" for p in self.predicates) or None
        pruning = reader.pruning(where)
        snap = reader.snapshot if self.opts.consistency == "eventual" else state.snapshot()
        if pruning.shard_ids is not None:
            snap = snap.restrict(pruning.shard_ids)
        tails: dict[str, bytes] = {}
        if self.opts.consistency == "strong":
            wal = WalTailReader(state.uri, state.io, state.manifests, state.primary_key, schema=stored_schema(state.write_schema))
            for shard in snap.shards:
                tail = wal.tail(shard.manifest)
                if tail is not None and tail.num_rows:
                    tails[shard.shard_id] = to_payload(tail)
        pin = PinnedSnapshot(snap.base_version, tuple(PinnedShard(s.manifest.to_bytes(), s.compacted_generation) for s in snap.shards))
        self._plan = ScanPlan(self.uri, self.opts, self.columns, where, pin, tails,
                              tuple(pruning.shard_ids) if pruning.shard_ids is not None else None)
        return self._plan

    def partitions(self) -> Sequence[InputPartition]:
        plan = self.plan()
        from memwal.state import TableState

        state = TableState.load(self.uri, self.opts.storage)
        snap = _snapshot(state, plan.snapshot)
        splits: list[InputPartition] = [DeltaSplit(s.shard_id) for s in snap.shards if s.live_sstables or s.shard_id in plan.tails]
        group: list[int] = []
        rows = 0
        # A point lookup reads every fragment through the key's index in one task.
        limit = sys.maxsize if self.point_lookup else self.opts.rows_per_partition
        for frag in snap.dataset.get_fragments():
            n = frag.count_rows()
            if group and rows + n > limit:
                splits.append(BaseSplit(tuple(group)))
                group, rows = [], 0
            group.append(frag.fragment_id)
            rows += n
        if group:
            splits.append(BaseSplit(tuple(group)))
        return splits or [BaseSplit(())]

    # -- reading (executors) --------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from pyspark.sql.pandas.types import to_arrow_schema

        from memwal.lsm import newest_across
        from memwal.readers.sql import filter_rows
        from memwal.readers.stream import ShadowKeys
        from memwal.schema import TOMBSTONE, as_evolved, stored_schema
        from memwal import paths

        plan = self._plan if self._plan is not None else self.plan()
        base = _PROCESS.state(plan.uri, plan.opts.storage).dataset(plan.snapshot.base_version)
        state = _PROCESS.state_of(plan.uri, plan.opts.storage, base)
        pk = list(state.primary_key)
        out = list(plan.columns)
        target = to_arrow_schema(self.schema, timezone="UTC")
        snap = _snapshot(state, plan.snapshot, base)
        cache = _PROCESS.cache(state.storage_options)
        columns = list(dict.fromkeys([*out, *pk])) if plan.where is None else state.schema.names
        if isinstance(partition, DeltaSplit):
            shard = snap.shard(partition.shard_id)
            # An SSTable written before a column was added lacks it: read as the table's columns.
            stored = stored_schema(state.write_schema)
            read_as = pa.schema([stored.field(c) for c in [*columns, TOMBSTONE]])
            parts = [as_evolved(cache.rows(paths.sstable_path(snap.dataset.uri, shard.shard_id, t.path), columns), read_as)
                     for t in shard.live_sstables]
            if partition.shard_id in plan.tails:
                parts.append(from_payload(plan.tails[partition.shard_id]))
            if not parts:
                return
            newest = newest_across([p.select([*columns, TOMBSTONE]) for p in parts], pk)
            live = newest.filter(pc.invert(newest.column(TOMBSTONE))).drop_columns([TOMBSTONE])
            live = filter_rows(live, plan.where) if plan.where else live
            yield from live.select(out).cast(target).to_batches()
            return
        # A base split: its fragments' rows whose key no delta holds.
        if not partition.fragment_ids:
            return
        shadow = ShadowKeys(pk, state.schema)
        for p in snap.sstable_paths():
            shadow.add_key_set(cache.keys(p, pk))
        for t in plan.tails.values():
            shadow.add_rows(from_payload(t))
        drop = shadow.batch_filter()
        fragments = [snap.dataset.get_fragment(i) for i in partition.fragment_ids]
        scan = snap.dataset.scanner(columns=list(dict.fromkeys([*out, *pk])), filter=plan.where, fragments=fragments)
        for batch in scan.to_batches():
            kept = drop(batch)
            if kept.num_rows:
                yield pa.Table.from_batches([kept]).select(out).cast(target).to_batches()[0]


class PushdownScanReader(ScanReader):
    """:class:`ScanReader` with filter pushdown (made only where Spark pushes filters)."""

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:  # noqa: N802 - Spark's name
        return iter(self._push(filters))
