"""The merged view as a stream of record batches: scans that never hold the table.

A scan used to build the newest version of every key of every live SSTable in memory, then
drop those keys from the base: a table whose rows were all in SSTables (5M rows just put)
took 2.8 GB and 9 s before its first row. :class:`MergedScan` yields the same rows level by
level, newest first, holding one SSTable at a time:

1. each shard's live SSTables, newest first: an SSTable's rows, read by Lance with the scan's
   filter and projection, minus the keys of the shard's newer SSTables and of the WAL tail
   (their key sets say which), tombstones dropped;
2. the base table's batches, as Lance yields them, minus every key an SSTable or the WAL
   tail holds;
3. the WAL tail's live rows (strong reads).

Shards own disjoint keys, so a shard's SSTables shadow only its own older rows and the base.
What is held is one SSTable's rows (at most ``max_memtable_rows``), the key sets of the live
SSTables (which a reader keeps for its point lookups anyway) and Lance's read-ahead of the
base; a scan with a limit stops reading when it has its rows, usually inside the newest
SSTable. The rows are those of :func:`memwal.lsm.newest_per_key` over the levels minus the
tombstones, in another order (tests/test_lsm.py checks it against that model).
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal import paths
from memwal.lsm import without_keys
from memwal.manifest import SsTable
from memwal.readers.config import ReadConfig
from memwal.readers.merge import BATCH_BITMAP_BYTES, BatchKeyDrop, int_key
from memwal.readers.sql import filter_rows
from memwal.readers.sstables import KeySet, SSTableCache
from memwal.schema import TOMBSTONE
from memwal.snapshot import Snapshot


def _distinct(ids: np.ndarray) -> np.ndarray:
    """Sorted ``ids`` without repeats (``np.unique`` hashes, and measured 20x slower here)."""
    if len(ids) < 2:
        return ids
    keep = np.empty(len(ids), dtype=bool)
    keep[0] = True
    np.not_equal(ids[1:], ids[:-1], out=keep[1:])
    return ids if keep.all() else ids[keep]


class ShadowKeys:
    """Keys of newer LSM levels, growing as a scan goes down the levels: a row of an older
    level whose key is here is shadowed.

    A single integer key (not uint64) is held as sorted NumPy runs merged like an LSM's own
    levels (a run is merged with the last one while that is at most twice its size), so
    adding n keys costs O(n log n) overall and a test looks in O(log n) runs; other keys as
    Arrow tables of the key columns.
    """

    def __init__(self, primary_key: Sequence[str], schema: pa.Schema) -> None:
        self.primary_key = list(primary_key)
        key_type = schema.field(self.primary_key[0]).type
        self.ints = len(self.primary_key) == 1 and pa.types.is_integer(key_type) and not pa.types.is_uint64(key_type)
        self.key_schema = pa.schema([schema.field(c) for c in self.primary_key])
        self._runs: list[np.ndarray] = []
        self._tables: list[pa.Table] = []

    def __len__(self) -> int:
        return sum(len(r) for r in self._runs) + sum(t.num_rows for t in self._tables)

    def add_key_set(self, keys: KeySet) -> None:
        if keys.ints is not None:
            self._add_sorted(keys.ints)
        elif keys.other:
            ids = list(keys.other)
            cols = [ids] if len(self.primary_key) == 1 else [list(c) for c in zip(*ids)]
            self._tables.append(pa.table([pa.array(c, f.type) for c, f in zip(cols, self.key_schema)], schema=self.key_schema))

    def add_rows(self, rows: pa.Table) -> None:
        """Add the keys of ``rows`` (which have the key columns)."""
        if rows.num_rows == 0:
            return
        ids = int_key(rows, self.primary_key) if self.ints else None
        if ids is not None:
            self._add_sorted(np.sort(ids))
        else:
            self._tables.append(rows.select(self.primary_key).cast(self.key_schema))

    def _add_sorted(self, ids: np.ndarray) -> None:
        """Add keys given sorted (repeats allowed)."""
        if not len(ids):
            return
        run = _distinct(ids)
        while self._runs and len(self._runs[-1]) <= 2 * len(run):
            merged = np.concatenate([self._runs.pop(), run])
            merged.sort(kind="stable")  # two sorted runs: NumPy's stable sort merges them
            run = _distinct(merged)
        self._runs.append(run)

    def _hits(self, ids: np.ndarray) -> np.ndarray:
        hit = np.zeros(len(ids), dtype=bool)
        for run in self._runs:
            i = np.minimum(np.searchsorted(run, ids), len(run) - 1)
            hit |= run[i] == ids
        return hit

    def merge(self, other: "ShadowKeys") -> None:
        """Add every key ``other`` holds."""
        for run in other._runs:
            self._add_sorted(run)
        self._tables.extend(other._tables)

    def _key_table(self) -> pa.Table:
        keys = pa.concat_tables(self._tables) if len(self._tables) > 1 else self._tables[0]
        self._tables = [keys]
        return keys

    def keep_mask(self, rows: pa.Table) -> np.ndarray:
        """True for the rows of ``rows`` whose key is not held here."""
        if rows.num_rows == 0 or len(self) == 0:
            return np.ones(rows.num_rows, dtype=bool)
        ids = int_key(rows, self.primary_key) if self.ints else None
        if ids is not None:
            return ~self._hits(ids)
        marked = rows.select(self.primary_key).append_column("__memwal_row", pa.array(np.arange(rows.num_rows, dtype=np.int64)))
        keep = np.zeros(rows.num_rows, dtype=bool)
        if self._runs:  # integer keys that int_key could not take (a null key): none held as tables
            return ~keep
        keep[without_keys(marked, self._key_table(), self.primary_key).column("__memwal_row").to_numpy()] = True
        return keep

    def drop(self, rows: pa.Table) -> pa.Table:
        """``rows`` without those whose key is held here, order kept."""
        if rows.num_rows == 0 or len(self) == 0:
            return rows
        ids = int_key(rows, self.primary_key) if self.ints else None
        if ids is not None:
            hit = self._hits(ids)
            return rows.filter(pa.array(~hit)) if hit.any() else rows
        if self.ints:
            return rows  # a null key (memwal writes none) is no key held here
        return without_keys(rows, self._key_table(), self.primary_key)

    def batch_filter(self) -> Callable[[pa.RecordBatch], pa.RecordBatch]:
        """A function dropping the held keys from base batches, built once for the base: a
        bitmap over the keys' range when it is at most ``BATCH_BITMAP_BYTES`` (one gather per
        row, :class:`BatchKeyDrop`), else the runs or the key tables."""
        if len(self) == 0:
            return lambda batch: batch
        if self.ints:
            lo = min(int(r[0]) for r in self._runs)
            hi = max(int(r[-1]) for r in self._runs)
            if hi - lo < BATCH_BITMAP_BYTES:
                present = np.zeros(hi - lo + 2, dtype=bool)
                for run in self._runs:
                    present[run - lo] = True
                return BatchKeyDrop(self.primary_key[0], lo, present).drop

        def drop(batch: pa.RecordBatch) -> pa.RecordBatch:
            kept = self.drop(pa.Table.from_batches([batch]))
            return batch if kept.num_rows == batch.num_rows else (kept.combine_chunks().to_batches() or [batch.slice(0, 0)])[0]

        return drop


@dataclass(frozen=True)
class Level:
    """One SSTable as a scan reads it: its path, and how to read its key set and its rows
    (projected and filtered, with ``_tombstone``)."""

    path: str
    read: Callable[[], tuple[KeySet, pa.Table]]


class MergedScan:
    """The live rows of a snapshot, streamed level by level (see the module doc).

    ``shards`` holds each shard's live SSTables, newest first; ``base`` starts the base
    table's scan (projected and filtered by Lance) when called; ``tail`` is the WAL tail,
    newest row per key with ``_tombstone`` (None for eventual reads). Every level is projected
    to ``columns``, which hold the primary key.
    """

    def __init__(
        self,
        shards: Sequence[Sequence[Level]],
        base: Callable[[], pa.RecordBatchReader],
        tail: pa.Table | None,
        columns: Sequence[str],
        primary_key: Sequence[str],
        schema: pa.Schema,
        where: str | None,
        batch_rows: int,
        sstables_ahead: int,
        base_ahead: int = 0,
    ) -> None:
        self.shards = shards
        self.base = base
        self.tail = tail
        self.columns = list(columns)
        self.primary_key = list(primary_key)
        self.schema = schema
        self.where = where
        self.batch_rows = batch_rows
        self.sstables_ahead = sstables_ahead
        self.base_ahead = base_ahead
        self.out_schema = pa.schema([schema.field(c) for c in self.columns])

    def _batches(self, rows: pa.Table) -> Iterator[pa.RecordBatch]:
        rows = rows.select(self.columns).cast(self.out_schema)
        yield from (b for b in rows.to_batches(max_chunksize=self.batch_rows) if b.num_rows)

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        tail_keys = ShadowKeys(self.primary_key, self.schema)
        if self.tail is not None:
            tail_keys.add_rows(self.tail)
        every = ShadowKeys(self.primary_key, self.schema)  # what shadows the base
        if self.tail is not None:
            every.add_rows(self.tail)
        order = [(s, level) for s, levels in enumerate(self.shards) for level in levels]
        # Lance decodes the base on its own threads while the SSTables are read and merged
        # here: up to ``base_ahead`` batches wait in a queue (none for a limited scan, which
        # usually ends before the base).
        base_batches = _Prefetch(self.base, self.base_ahead) if self.base_ahead and order else _Lazy(self.base)
        ahead_n = max(1, self.sstables_ahead)
        pool = ThreadPoolExecutor(min(ahead_n, len(order))) if order else None
        try:
            ahead: deque[Future[tuple[KeySet, pa.Table]]] = deque()
            queued = 0

            def fill() -> None:
                nonlocal queued
                while pool is not None and queued < len(order) and len(ahead) < ahead_n:
                    ahead.append(pool.submit(order[queued][1].read))
                    queued += 1

            current, newer = -1, ShadowKeys(self.primary_key, self.schema)
            for shard, _level in order:
                if not ahead:
                    fill()
                keys, rows = ahead.popleft().result()
                if ahead_n > 1:
                    fill()  # the next ones are read while this one is yielded
                if shard != current:
                    current, newer = shard, ShadowKeys(self.primary_key, self.schema)
                rows = tail_keys.drop(newer.drop(rows))
                rows = rows.filter(pc.invert(rows.column(TOMBSTONE)))
                newer.add_key_set(keys)
                every.add_key_set(keys)
                yield from self._batches(rows)
        except BaseException:
            base_batches.close()
            raise
        finally:
            if pool is not None:
                # A scan stopped early (a limit, a closed stream) does not wait for the reads
                # ahead: those not started are dropped, those running end on their own.
                pool.shutdown(wait=False, cancel_futures=True)
        drop = every.batch_filter()
        for batch in base_batches:
            kept = drop(batch)
            if kept.num_rows:
                yield kept.select(self.columns) if kept.schema.names != self.columns else kept
        if self.tail is not None:
            live = self.tail.filter(pc.invert(self.tail.column(TOMBSTONE)))
            yield from self._batches(filter_rows(live.drop_columns([TOMBSTONE]), self.where))


class _Lazy:
    """The base's batches, its scan started when first iterated."""

    def __init__(self, start: Callable[[], pa.RecordBatchReader]) -> None:
        self._start = start

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        return iter(self._start())

    def close(self) -> None:
        pass


class _Prefetch:
    """The base's batches, read on a thread into a queue of at most ``ahead`` from now on.

    Closing it (the scan stopped) makes the thread stop at its next batch."""

    _END = object()

    def __init__(self, start: Callable[[], pa.RecordBatchReader], ahead: int) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=ahead)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(start,), name="memwal-scan-base", daemon=True)
        self._thread.start()

    def _run(self, start: Callable[[], pa.RecordBatchReader]) -> None:
        try:
            for batch in start():
                while not self._stop.is_set():
                    try:
                        self._queue.put(batch, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set():
                    return
            item: object = self._END
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, which raises it
            item = e
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        try:
            while True:
                item = self._queue.get()
                if item is self._END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.close()

    def close(self) -> None:
        self._stop.set()


def take(batches: Iterator[pa.RecordBatch], limit: int | None) -> Iterator[pa.RecordBatch]:
    """``batches`` cut after ``limit`` rows in all (all of them for None); the source is
    closed as soon as the limit is reached, so its remaining levels are never read."""
    if limit is None:
        yield from batches
        return
    left = limit
    try:
        for batch in batches:
            if left <= 0:
                break
            if batch.num_rows > left:
                batch = batch.slice(0, left)
            left -= batch.num_rows
            yield batch
            if left <= 0:
                break
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()


def scan_snapshot(
    snap: Snapshot,
    tail: pa.Table | None,
    cache: SSTableCache,
    config: ReadConfig,
    primary_key: Sequence[str],
    schema: pa.Schema,
    wanted: Sequence[str],
    where: str | None,
    limit: int | None,
) -> Iterator[pa.RecordBatch]:
    """The live rows of ``snap`` and ``tail`` matching ``where``, columns ``wanted`` (which
    hold the primary key), as record batches: a :class:`MergedScan` of the snapshot's levels,
    their SSTables read through ``cache``, cut after ``limit`` rows. ``schema`` is the table's."""
    pk = list(primary_key)
    wanted = list(wanted)
    batch_rows = config.scan_batch_rows
    if tail is None and snap.num_live_sstables == 0:  # the base alone: Lance applies the limit
        return iter(snap.dataset.scanner(columns=wanted, filter=where, limit=limit, batch_size=batch_rows).to_reader())
    read_columns = [*wanted, TOMBSTONE]

    def level(shard_id: str, sst: SsTable) -> Level:
        path = paths.sstable_path(snap.dataset.uri, shard_id, sst.path)

        def read() -> tuple[KeySet, pa.Table]:
            if where is None:
                if cache.worth_caching(sst.in_memory_bytes):
                    rows = cache.rows(path, wanted)  # cached: an SSTable never changes
                else:
                    rows = cache.read(path, columns=read_columns)
                return cache.keys(path, pk, rows), rows
            return cache.keys(path, pk), cache.read(path, columns=read_columns, filter=where)

        return Level(path, read)

    shards = [[level(s.shard_id, t) for t in reversed(s.live_sstables)] for s in snap.shards]

    def base() -> pa.RecordBatchReader:
        return snap.dataset.scanner(columns=wanted, filter=where, batch_size=batch_rows).to_reader()

    # A limited scan reads one SSTable at a time: it usually ends inside the newest.
    ahead = config.scan_sstables_ahead if limit is None else 1
    base_ahead = config.scan_base_batches_ahead if limit is None else 0
    merged = MergedScan(shards, base, tail, wanted, pk, schema, where, batch_rows, ahead, base_ahead)
    return take(iter(merged), limit)
