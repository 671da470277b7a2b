"""The LSM merge of a scan, as streams of record batches that never hold the table.

A scan used to build the newest version of every key of every live SSTable in memory, then
drop those keys from the base: a table whose rows were all in SSTables (5M rows just put)
took 2.8 GB and 9 s before its first row. The merge here goes level by level, newest first,
holding one SSTable at a time:

1. each shard's live SSTables, newest first (:func:`shard_rows`): an SSTable's rows, read by
   Lance with the scan's filter and projection, minus the keys of the shard's newer SSTables
   and of the WAL tail (their key sets say which), tombstones dropped;
2. the base table's batches, as Lance yields them, minus every key an SSTable or the WAL
   tail holds (:func:`base_rows`);
3. the WAL tail's live rows (strong reads).

Shards own disjoint keys, so a shard's SSTables shadow only its own older rows and the base.
The rows are those of :func:`memwal.core.lsm.newest_per_key` over the levels minus the tombstones,
in another order (tests/test_scans.py checks it against that model). Which levels a scan
reads, and in what pieces, is planned in :mod:`memwal.readers.splits`.
"""

from __future__ import annotations

import queue
import threading
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal.core.lsm import without_keys
from memwal.readers.merge import BATCH_BITMAP_BYTES, BatchKeyDrop, int_key
from memwal.readers.sstables import KeySet
from memwal.core.schema import TOMBSTONE


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


def shard_rows(
    reads: Iterable[tuple[KeySet, pa.Table]], tail_keys: ShadowKeys, primary_key: Sequence[str], schema: pa.Schema
) -> Iterator[pa.Table]:
    """One shard's live rows above the base: ``reads`` are its SSTables newest first (each
    one's key set, and its rows with ``_tombstone``); each yields its rows whose key neither a
    newer SSTable of the shard nor the WAL tail (``tail_keys``) holds, tombstones dropped.
    The merge every scan path runs (:mod:`memwal.readers.splits`)."""
    newer = ShadowKeys(primary_key, schema)
    for keys, rows in reads:
        rows = tail_keys.drop(newer.drop(rows))
        newer.add_key_set(keys)
        yield rows.filter(pc.invert(rows.column(TOMBSTONE)))


def base_rows(batches: Iterable[pa.RecordBatch], shadow: ShadowKeys) -> Iterator[pa.RecordBatch]:
    """The base's batches minus the rows whose key ``shadow`` (every live SSTable's keys and
    the WAL tail's) holds: their newest version, or their deletion, is above the base."""
    drop = shadow.batch_filter()
    for batch in batches:
        kept = drop(batch)
        if kept.num_rows:
            yield kept


class Prefetch:
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
