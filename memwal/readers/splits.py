"""A scan as a plan of splits, and the one place the splits are read.

Every scan path reads the merged view through here: :meth:`Reader.scan`, its stream
(``to_batches``, the Arrow C stream DuckDB, Polars and DataFusion read) and Spark's
``format("memwal")``. A reader plans (:meth:`Reader.plan_scan`): a snapshot pinned, for a
strong read the WAL tail, and the splits:

- a :class:`DeltaSplit` per shard with live SSTables: the shard's SSTables, newest first,
  each minus the keys of its newer SSTables and of the WAL tail, tombstones dropped;
- :class:`BaseSplit`\\ s, the base version's fragments (all of them in one, or grouped by
  rows for Spark's tasks): their rows minus every key an SSTable or the tail holds;
- a :class:`TailSplit` when there is a tail: its live rows.

Shards own disjoint keys, so each live key is in exactly one split, and the splits' rows
together are the newest live row per key (:func:`memwal.core.lsm.newest_per_key` over the
levels, tombstones dropped). A plan pickles to its pinned form (the base version and the
shard manifests as bytes), so an executor reads any split of it alone
(:meth:`SplitReader.read`). In one process, :meth:`SplitReader.scan` reads them in order,
the SSTables ahead on threads and the base decoded ahead; both go through the same merge
(:func:`memwal.readers.stream.shard_rows`, :func:`~memwal.readers.stream.base_rows`).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from collections import deque
from dataclasses import dataclass
from typing import Iterator, Sequence, Union

import lance
import pyarrow as pa
import pyarrow.compute as pc

from memwal.core import paths
from memwal.core.manifest import ShardManifest, SsTable
from memwal.readers.config import ReadConfig
from memwal.readers.sql import filter_rows
from memwal.readers.sstables import KeySet, SSTableCache
from memwal.readers.stream import Prefetch, ShadowKeys, base_rows, shard_rows, take
from memwal.core.schema import TOMBSTONE
from memwal.core.snapshot import ShardState, Snapshot
from memwal.core.state import TableState


@dataclass(frozen=True)
class DeltaSplit:
    """One shard's live SSTables."""

    shard_id: str


@dataclass(frozen=True)
class BaseSplit:
    """Base fragments (None: every fragment of the base version, read as one Lance scan)."""

    fragment_ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class TailSplit:
    """The WAL tail's live rows (strong reads)."""


Split = Union[DeltaSplit, BaseSplit, TailSplit]


@dataclass(frozen=True)
class PinnedShard:
    """A shard as the plan's snapshot saw it: its manifest (bytes) and compacted generation."""

    manifest: bytes
    compacted_generation: int


@dataclass(frozen=True)
class PinnedSnapshot:
    """A snapshot in a form that travels: the base version and the shards' manifests."""

    base_version: int
    shards: tuple[PinnedShard, ...]

    @classmethod
    def of(cls, snap: Snapshot) -> "PinnedSnapshot":
        return cls(snap.base_version, tuple(PinnedShard(s.manifest.to_bytes(), s.compacted_generation) for s in snap.shards))

    def open(self, state: TableState, base: lance.LanceDataset | None = None) -> Snapshot:
        """The snapshot again (``base``: its base version, if already open)."""
        shards = tuple(ShardState(ShardManifest.from_bytes(s.manifest), s.compacted_generation) for s in self.shards)
        base = base if base is not None else state.dataset(self.base_version)
        return Snapshot(base, state.manifests.mem_wal_index(self.base_version), shards)


@dataclass(frozen=True)
class ScanPlan:
    """A planned scan: what to read (``columns``, which hold the primary key; ``where``), the
    snapshot, the WAL tail (newest row per key with ``_tombstone``; None for eventual reads)
    and the splits. Pickled, the snapshot travels pinned (:class:`PinnedSnapshot`)."""

    columns: tuple[str, ...]
    where: str | None
    snapshot: Snapshot | PinnedSnapshot
    tail: pa.Table | None
    splits: tuple[Split, ...]

    def __reduce__(self) -> tuple:
        snap = self.snapshot if isinstance(self.snapshot, PinnedSnapshot) else PinnedSnapshot.of(self.snapshot)
        return (ScanPlan, (self.columns, self.where, snap, self.tail, self.splits))

    @property
    def base_version(self) -> int:
        return self.snapshot.base_version

    def open(self, state: TableState, base: lance.LanceDataset | None = None) -> Snapshot:
        """The plan's snapshot, open (``base``: its base version, if already open)."""
        return self.snapshot if isinstance(self.snapshot, Snapshot) else self.snapshot.open(state, base)


def plan_splits(snap: Snapshot, tail: pa.Table | None, rows_per_split: int | None = None) -> tuple[Split, ...]:
    """The splits of a scan of ``snap`` and ``tail``: base fragments grouped up to
    ``rows_per_split`` rows each (None: one split of the whole base, counting no rows)."""
    splits: list[Split] = [DeltaSplit(s.shard_id) for s in snap.shards if s.live_sstables]
    if rows_per_split is None:
        splits.append(BaseSplit())
    else:
        group: list[int] = []
        rows = 0
        for frag in snap.dataset.get_fragments():
            n = frag.count_rows()
            if group and rows + n > rows_per_split:
                splits.append(BaseSplit(tuple(group)))
                group, rows = [], 0
            group.append(frag.fragment_id)
            rows += n
        if group:
            splits.append(BaseSplit(tuple(group)))
    if tail is not None and tail.num_rows:
        splits.append(TailSplit())
    return tuple(splits)


class SplitReader:
    """Reads a plan's splits over an open snapshot, SSTables through ``cache``."""

    def __init__(self, plan: ScanPlan, snap: Snapshot, cache: SSTableCache, config: ReadConfig, primary_key: Sequence[str],
                 schema: pa.Schema) -> None:
        self.plan = plan
        self.snap = snap
        self.cache = cache
        self.config = config
        self.primary_key = list(primary_key)
        self.schema = schema
        self.columns = list(plan.columns)
        self.out_schema = pa.schema([schema.field(c) for c in self.columns])
        self._tail_keys = ShadowKeys(self.primary_key, schema)
        if plan.tail is not None:
            self._tail_keys.add_rows(plan.tail)

    # -- the levels ------------------------------------------------------------------------------

    def _read_level(self, shard_id: str, sst: SsTable) -> tuple[KeySet, pa.Table]:
        """An SSTable's key set, and its rows projected and filtered (``_tombstone`` kept)."""
        cache, pk, where = self.cache, self.primary_key, self.plan.where
        path = paths.sstable_path(self.snap.dataset.uri, shard_id, sst.path)
        if where is None:
            if cache.worth_caching(sst.in_memory_bytes):
                rows = cache.rows(path, self.columns)  # cached: an SSTable never changes
            else:
                rows = cache.read(path, columns=[*self.columns, TOMBSTONE])
            return cache.keys(path, pk, rows), rows
        return cache.keys(path, pk), cache.read(path, columns=[*self.columns, TOMBSTONE], filter=where)

    def _levels(self, shard_id: str) -> list[SsTable]:
        shard = self.snap.shard(shard_id)
        return list(reversed(shard.live_sstables)) if shard is not None else []

    def _base(self, split: BaseSplit) -> pa.RecordBatchReader:
        ds = self.snap.dataset
        fragments = None if split.fragment_ids is None else [ds.get_fragment(i) for i in split.fragment_ids]
        return ds.scanner(columns=self.columns, filter=self.plan.where, fragments=fragments, batch_size=self.config.scan_batch_rows).to_reader()

    def _shadow(self) -> ShadowKeys:
        """Every key the base's rows are shadowed by: the live SSTables' and the tail's."""
        shadow = ShadowKeys(self.primary_key, self.schema)
        shadow.merge(self._tail_keys)
        for p in self.snap.sstable_paths():
            shadow.add_key_set(self.cache.keys(p, self.primary_key))
        return shadow

    # -- output ----------------------------------------------------------------------------------

    def _batches(self, rows: pa.Table) -> Iterator[pa.RecordBatch]:
        rows = rows.select(self.columns).cast(self.out_schema)
        yield from (b for b in rows.to_batches(max_chunksize=self.config.scan_batch_rows) if b.num_rows)

    def _tail_rows(self) -> Iterator[pa.RecordBatch]:
        tail = self.plan.tail
        if tail is None:
            return
        live = tail.filter(pc.invert(tail.column(TOMBSTONE))).drop_columns([TOMBSTONE])
        yield from self._batches(filter_rows(live, self.plan.where))

    def _base_rows(self, batches: Iterator[pa.RecordBatch], shadow: ShadowKeys) -> Iterator[pa.RecordBatch]:
        for batch in base_rows(batches, shadow):
            yield batch.select(self.columns) if batch.schema.names != self.columns else batch

    # -- one split (an executor's task) ----------------------------------------------------------

    def read(self, split: Split) -> Iterator[pa.RecordBatch]:
        """The rows of one split: those of no other split of the plan."""
        if isinstance(split, DeltaSplit):
            reads = (self._read_level(split.shard_id, t) for t in self._levels(split.shard_id))
            for rows in shard_rows(reads, self._tail_keys, self.primary_key, self.schema):
                yield from self._batches(rows)
        elif isinstance(split, BaseSplit):
            if split.fragment_ids == ():
                return
            yield from self._base_rows(iter(self._base(split)), self._shadow())
        else:
            yield from self._tail_rows()

    # -- every split, in one process -------------------------------------------------------------

    def scan(self, limit: int | None = None) -> Iterator[pa.RecordBatch]:
        """Every split's rows in plan order, cut after ``limit`` rows: the SSTables read up to
        ``scan_sstables_ahead`` ahead on threads, the base's first batches decoded while they
        are merged, and its shadow the key sets the delta splits read (no second lookup)."""
        plan, snap = self.plan, self.snap
        if plan.tail is None and snap.num_live_sstables == 0 and plan.splits == (BaseSplit(),):
            # the base alone: Lance applies the limit
            ds = snap.dataset
            return iter(ds.scanner(columns=self.columns, filter=plan.where, limit=limit, batch_size=self.config.scan_batch_rows).to_reader())
        return take(self._scan(limit), limit)

    def _scan(self, limit: int | None) -> Iterator[pa.RecordBatch]:
        deltas = [s for s in self.plan.splits if isinstance(s, DeltaSplit)]
        bases = [s for s in self.plan.splits if isinstance(s, BaseSplit)]
        order = [(d.shard_id, t) for d in deltas for t in self._levels(d.shard_id)]
        # A limited scan reads one SSTable at a time and nothing of the base ahead: it usually
        # ends inside the newest SSTable.
        ahead_n = self.config.scan_sstables_ahead if limit is None else 1
        base_ahead = self.config.scan_base_batches_ahead if limit is None else 0
        first_base = None
        if bases and order and base_ahead:
            first_base = Prefetch(lambda: self._base(bases[0]), base_ahead)
        shadow = ShadowKeys(self.primary_key, self.schema)
        shadow.merge(self._tail_keys)
        pool = ThreadPoolExecutor(min(max(1, ahead_n), len(order))) if order else None
        try:
            ahead: deque[Future[tuple[KeySet, pa.Table]]] = deque()
            queued = 0

            def fill() -> None:
                nonlocal queued
                while pool is not None and queued < len(order) and len(ahead) < max(1, ahead_n):
                    ahead.append(pool.submit(self._read_level, *order[queued]))
                    queued += 1

            def reads(shard_id: str, n: int) -> Iterator[tuple[KeySet, pa.Table]]:
                for _ in range(n):
                    if not ahead:
                        fill()
                    keys, rows = ahead.popleft().result()
                    if ahead_n > 1:
                        fill()  # the next ones are read while this one is yielded
                    shadow.add_key_set(keys)
                    yield keys, rows

            for d in deltas:
                for rows in shard_rows(reads(d.shard_id, len(self._levels(d.shard_id))), self._tail_keys, self.primary_key, self.schema):
                    yield from self._batches(rows)
        except BaseException:
            if first_base is not None:
                first_base.close()
            raise
        finally:
            if pool is not None:
                # A scan stopped early (a limit, a closed stream) does not wait for the reads
                # ahead: those not started are dropped, those running end on their own.
                pool.shutdown(wait=False, cancel_futures=True)
        for i, split in enumerate(bases):
            if split.fragment_ids == ():
                continue
            batches = first_base if (i == 0 and first_base is not None) else iter(self._base(split))
            yield from self._base_rows(iter(batches), shadow)
        yield from self._tail_rows()


def plan_scan(snap: Snapshot, tail: pa.Table | None, columns: Sequence[str], where: str | None,
              rows_per_split: int | None = None) -> ScanPlan:
    """A scan of ``snap`` and ``tail`` returning ``columns`` (which hold the primary key)."""
    return ScanPlan(tuple(columns), where, snap, tail, plan_splits(snap, tail, rows_per_split))
