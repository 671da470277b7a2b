"""The scan's LSM merge, vectorised: the newest delta row per key, and base rows minus the
delta's keys.

Profiled on a 1M-row base with 10 and 100 SSTables (docs/bench-log/reads.md,
"Scans with uncompacted SSTables"), a deduplicated scan spent its time outside Lance's base scan in:
reading the SSTables one after another before the base scan started; deduplicating the
delta with a hash aggregation over every column; testing every base key against a hash set
of the delta's keys (the larger the delta, the more cache misses); and one single-threaded
filter copying every kept base row. For the common single integer key, both key tests here
work on the key column alone with NumPy (a sort of the delta's keys, and a bitmap over their
range), and the copy is split over threads by record batch (Arrow's kernels release the
GIL); the reader overlaps the SSTable reads with the base scan. Lance's base scan keeps
about one core busy, so the reader also drops the delta's keys from each base batch as Lance
yields it (:func:`base_without_delta`), on the other core, instead of copying the whole base
once more after the scan. Other keys take
:mod:`memwal.lsm`'s general path. Either way the rows and their order are those of
:func:`memwal.lsm.newest_per_key` and :func:`memwal.lsm.without_keys`.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal.lsm import newest_per_key, without_keys

#: Threads that copy the kept base rows; below ``PARALLEL_MIN_ROWS`` rows one thread does it
#: (starting threads would cost more than the copy).
THREADS = max(1, min(8, os.cpu_count() or 1))
PARALLEL_MIN_ROWS = 200_000
#: The bitmap over the delta keys' range may hold this many bytes per base row (it is
#: allocated per scan); a wider range uses Arrow's hash-set membership test instead.
BITMAP_BYTES_PER_ROW = 32
#: A scan that drops the delta's keys batch by batch uses a bitmap over their range up to this
#: size (NumPy's zeroed allocation maps pages only as keys touch them); wider, the whole base.
BATCH_BITMAP_BYTES = 64 << 20


def int_key(table: pa.Table, primary_key: Sequence[str]) -> np.ndarray | None:
    """The single integer key column as int64 NumPy (no copy for one int64 chunk), else
    None. Widened so that differences of keys cannot overflow a narrow type; uint64 keys
    (which int64 cannot hold) take the general path."""
    if len(primary_key) != 1:
        return None
    col = table.column(primary_key[0])
    if not pa.types.is_integer(col.type) or pa.types.is_uint64(col.type) or col.null_count:
        return None
    arr = col.combine_chunks().to_numpy() if col.num_chunks != 1 else col.chunk(0).to_numpy()
    return arr.astype(np.int64, copy=False)


def newest(rows: pa.Table, primary_key: Sequence[str]) -> pa.Table:
    """The last row of each key in ``rows`` (given oldest first), in the order of those rows."""
    keys = int_key(rows, primary_key) if rows.num_rows > 1 else None
    if keys is None:
        return newest_per_key(rows, primary_key)
    # np.unique keeps the first occurrence: on the reversed keys, that is each key's last row.
    _, first_in_reversed = np.unique(keys[::-1], return_index=True)
    last = np.sort(len(keys) - 1 - first_in_reversed)
    return rows if len(last) == len(keys) else rows.take(pa.array(last))


def _keep_mask(rows: pa.Table, keys: pa.Table, primary_key: Sequence[str]) -> pa.Array:
    """True where a row of ``rows`` has a key absent from ``keys`` (single-column keys)."""
    ids, drop = int_key(rows, primary_key), int_key(keys, primary_key)
    if ids is not None and drop is not None and len(ids):
        # A bitmap over the range of both key sets: one gather per row, no bounds checks.
        lo, hi = min(int(drop.min()), int(ids.min())), max(int(drop.max()), int(ids.max()))
        if hi - lo < BITMAP_BYTES_PER_ROW * max(len(ids), 1 << 15):
            absent = np.ones(hi - lo + 1, dtype=bool)
            absent[drop - lo] = False
            return pa.array(absent[ids - lo] if lo else absent[ids])
    col = primary_key[0]
    return pc.invert(pc.is_in(rows.column(col), value_set=keys.column(col).combine_chunks())).combine_chunks()


def drop_keys(rows: pa.Table, keys: pa.Table, primary_key: Sequence[str]) -> pa.Table:
    """``rows`` minus those whose primary key appears in ``keys``, order kept."""
    pk = list(primary_key)
    if rows.num_rows == 0 or keys.num_rows == 0:
        return rows
    if len(pk) != 1:
        return without_keys(rows, keys, pk)
    keep = _keep_mask(rows, keys, pk)
    if keep.false_count == 0:  # the delta only inserted new keys: nothing of the base to copy
        return rows
    if rows.num_rows < PARALLEL_MIN_ROWS or THREADS == 1:
        return rows.filter(keep)
    batches = rows.to_batches()
    starts = [0]
    for b in batches:
        starts.append(starts[-1] + b.num_rows)

    def part(i: int) -> pa.RecordBatch:
        return batches[i].filter(keep.slice(starts[i], batches[i].num_rows))

    with ThreadPoolExecutor(THREADS) as pool:
        return pa.Table.from_batches(list(pool.map(part, range(len(batches)))), rows.schema)


@dataclass(frozen=True)
class BatchKeyDrop:
    """A scan delta's single integer keys as a bitmap over their range, to drop from base
    record batches one at a time.

    ``present[k - lo]`` is True exactly when ``k`` is a delta key, for ``k`` in
    ``[lo, lo + n)`` with ``n = len(present) - 1``; the last entry is False and stands for
    every key outside the range. A base key's offset ``k - lo`` is taken modulo 2**64 and
    clipped to ``n``: a key below ``lo`` wraps to at least ``n`` (no int64 key is more than
    ``2**64 - n`` below ``lo``, since ``lo + n`` is at most ``2**63``), so one subtraction, one
    minimum and one gather test every row. A null base key (memwal writes none) is kept, as
    the general anti-join keeps it for a delta without nulls. (:func:`drop_keys`, which has the
    whole base in hand, spans both key sets' range and gathers with no clip: measured 1.5x
    faster there than this mask over the whole key column, so the two stay apart.)
    """

    key: str
    lo: int
    present: np.ndarray

    @classmethod
    def of(cls, delta: pa.Table | None, primary_key: Sequence[str]) -> "BatchKeyDrop | None":
        """The delta's keys (none for no delta), or None when they are not a single integer
        key with a range of at most ``BATCH_BITMAP_BYTES``: those take :func:`drop_keys`."""
        if delta is None or delta.num_rows == 0:
            return cls(primary_key[0], 0, np.zeros(1, dtype=bool))
        keys = int_key(delta, primary_key)
        if keys is None:
            return None
        lo, hi = int(keys.min()), int(keys.max())
        if hi - lo >= BATCH_BITMAP_BYTES:
            return None
        present = np.zeros(hi - lo + 2, dtype=bool)
        present[keys - lo] = True
        return cls(primary_key[0], lo, present)

    def drop(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch`` without the rows whose key is a delta key, order kept; the batch itself
        when it has none (no copy)."""
        n = len(self.present) - 1
        if not n or not batch.num_rows:
            return batch
        col = batch.column(self.key)
        ids = (col.fill_null(0) if col.null_count else col).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        with np.errstate(over="ignore"):
            offset = (ids - np.int64(self.lo)).view(np.uint64)
        hit = self.present[np.minimum(offset, np.uint64(n)).view(np.int64)]
        if col.null_count:
            hit &= col.is_valid().to_numpy(zero_copy_only=False)
        return batch.filter(pa.array(~hit)) if hit.any() else batch


def base_without_delta(
    base: pa.RecordBatchReader, delta: "Future[pa.Table | None]", primary_key: Sequence[str]
) -> tuple[pa.Table, pa.Table | None]:
    """The rows of the ``base`` scan whose key the ``delta`` (still being read) does not
    hold, in base order, and the delta.

    Batches that arrive before the delta is ready wait for it; from then on each is filtered
    as it arrives, while Lance decodes the next ones. When the delta is ready only after the
    scan, or its keys are not what :class:`BatchKeyDrop` holds, the whole base is filtered at
    once by :func:`drop_keys` (the copy split over threads).
    """
    waiting: list[pa.RecordBatch] = []
    kept: list[pa.RecordBatch] = []
    drop: BatchKeyDrop | None = None
    general = False
    for batch in base:
        waiting.append(batch)
        if drop is None and not general and delta.done():
            drop = BatchKeyDrop.of(delta.result(), primary_key)
            general = drop is None
        if drop is not None:
            kept.extend(drop.drop(b) for b in waiting)
            waiting.clear()
    rows = delta.result()
    if drop is not None:
        return pa.Table.from_batches(kept, base.schema), rows
    whole = pa.Table.from_batches(waiting, base.schema)
    return (drop_keys(whole, rows, primary_key) if rows is not None else whole), rows
