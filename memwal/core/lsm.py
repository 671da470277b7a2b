"""LSM merge semantics shared by the compactor and the readers: the newest row per key wins.

Rows are given oldest first (write order within a WAL tail, generation order across
SSTables), so the newest row of a key is its last occurrence.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_ORDER = "__memwal_lsm_position"


def newest_per_key(rows: pa.Table, primary_key: Sequence[str]) -> pa.Table:
    """The last row of each primary key in ``rows``, in the order of those last rows."""
    if rows.num_rows <= 1:
        return rows
    rows = rows.append_column(_ORDER, pa.array(range(rows.num_rows), pa.int64()))
    last = rows.group_by(list(primary_key), use_threads=False).aggregate([(_ORDER, "max")]).column(f"{_ORDER}_max")
    return rows.take(pc.take(last, pc.sort_indices(last))).drop_columns([_ORDER])


def last_per_key(rows: pa.Table, primary_key: Sequence[str]) -> np.ndarray:
    """The position of the last row of each primary key in ``rows``, ascending. Reads only the
    key columns; a single integer key is found with NumPy, others by Arrow's group-by."""
    n = rows.num_rows
    if n <= 1:
        return np.arange(n, dtype=np.int64)
    pk = list(primary_key)
    if len(pk) == 1 and pa.types.is_integer(rows.schema.field(pk[0]).type) and rows.column(pk[0]).null_count == 0:
        keys = np.asarray(rows.column(pk[0]).to_numpy())
        _, first_from_end = np.unique(keys[::-1], return_index=True)
        return np.sort(n - 1 - first_from_end).astype(np.int64)
    positions = rows.select(pk).append_column(_ORDER, pa.array(np.arange(n, dtype=np.int64)))
    last = positions.group_by(pk, use_threads=False).aggregate([(_ORDER, "max")]).column(f"{_ORDER}_max")
    return np.sort(np.asarray(last.to_numpy(), np.int64))


def newest_across(tables: Sequence[pa.Table], primary_key: Sequence[str]) -> pa.Table:
    """Newest row per key across ``tables`` given oldest first."""
    if len(tables) == 1:
        return tables[0]
    return newest_per_key(pa.concat_tables(tables, promote_options="permissive"), primary_key)


def without_keys(rows: pa.Table, keys: pa.Table, primary_key: Sequence[str]) -> pa.Table:
    """``rows`` minus those whose primary key appears in ``keys`` (an anti-join on keys only:
    Arrow's joins cannot carry every column type, e.g. fixed-size lists)."""
    pk = list(primary_key)
    if rows.num_rows == 0 or keys.num_rows == 0:
        return rows
    if len(pk) == 1:
        return rows.filter(pc.invert(pc.is_in(rows.column(pk[0]), value_set=keys.column(pk[0]).combine_chunks())))
    probe = rows.select(pk).append_column(_ORDER, pa.array(range(rows.num_rows), pa.int64()))
    keep = probe.join(keys.select(pk), keys=pk, join_type="left anti").column(_ORDER)
    return rows.take(pc.take(keep, pc.sort_indices(keep)))
