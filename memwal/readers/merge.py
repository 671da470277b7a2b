"""The scan's LSM merge, vectorised: the newest delta row per key, and base rows minus the
delta's keys.

Profiled on a 1M-row base with 10 and 100 SSTables (docs/benchmarks.md, "Scans with
uncompacted SSTables"), a deduplicated scan spent its time outside Lance's base scan in:
reading the SSTables one after another before the base scan started; deduplicating the
delta with a hash aggregation over every column; testing every base key against a hash set
of the delta's keys (the larger the delta, the more cache misses); and one single-threaded
filter copying every kept base row. For the common single integer key, both key tests here
work on the key column alone with NumPy (a sort of the delta's keys, and a bitmap over their
range), and the copy is split over threads by record batch (Arrow's kernels release the
GIL); the reader overlaps the SSTable reads with the base scan. Other keys take
:mod:`memwal.lsm`'s general path. Either way the rows and their order are those of
:func:`memwal.lsm.newest_per_key` and :func:`memwal.lsm.without_keys`.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
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


def _int_key(table: pa.Table, primary_key: Sequence[str]) -> np.ndarray | None:
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
    keys = _int_key(rows, primary_key) if rows.num_rows > 1 else None
    if keys is None:
        return newest_per_key(rows, primary_key)
    # np.unique keeps the first occurrence: on the reversed keys, that is each key's last row.
    _, first_in_reversed = np.unique(keys[::-1], return_index=True)
    last = np.sort(len(keys) - 1 - first_in_reversed)
    return rows if len(last) == len(keys) else rows.take(pa.array(last))


def _keep_mask(rows: pa.Table, keys: pa.Table, primary_key: Sequence[str]) -> pa.Array:
    """True where a row of ``rows`` has a key absent from ``keys`` (single-column keys)."""
    ids, drop = _int_key(rows, primary_key), _int_key(keys, primary_key)
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
