"""Vectorised LSM merge helpers for a single integer key: the newest delta row per key
(:func:`newest`), and the delta's keys as a bitmap dropping them from base batches
(:class:`BatchKeyDrop`), which the streamed scan (:mod:`memwal.readers.stream`) and the
SSTable cache use. Profiled on a 1M-row base (docs/bench-log/reads.md, "Scans with
uncompacted SSTables"), a hash aggregation over every column and a hash-set membership test
cost several times these NumPy passes over the key column alone. Other keys take
:mod:`memwal.core.lsm`'s general path; either way the rows and their order are those of
:func:`memwal.core.lsm.newest_per_key` and :func:`memwal.core.lsm.without_keys`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pyarrow as pa

from memwal.core.lsm import newest_per_key

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
    the general anti-join keeps it for a delta without nulls.
    """

    key: str
    lo: int
    present: np.ndarray

    @classmethod
    def of(cls, delta: pa.Table | None, primary_key: Sequence[str]) -> "BatchKeyDrop | None":
        """The delta's keys (none for no delta), or None when they are not a single integer
        key with a range of at most ``BATCH_BITMAP_BYTES``."""
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
