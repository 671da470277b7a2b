"""LSM merge semantics shared by the compactor and the readers: the newest row per key wins.

Rows are given oldest first (write order within a WAL tail, generation order across
SSTables), so the newest row of a key is its last occurrence.
"""

from __future__ import annotations

from typing import Sequence

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
