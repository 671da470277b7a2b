"""Routing rows to shards: pure functions over Arrow data, no I/O.

Every primary key must live in exactly one shard. Otherwise two shards could hold
versions of the same key and the order in which the compactor folds shards into the base
table (which is per shard, not global) would decide which version survives.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal.core.errors import ShardRoutingError
from memwal.core.sharding import ShardResolver, ShardValues


@dataclass(frozen=True)
class RoutedBatch:
    """Rows that belong to one shard, in their input order: what a shard writer takes.

    Made once, by :func:`route` (or, in Spark, by the prepare stage, whose routing the
    write task trusts). ``rows`` are conformed to the table's write schema, or to its key
    schema when ``deletes`` is set.
    """

    shard_id: str
    values: ShardValues
    rows: pa.Table
    deletes: bool = False


def shard_codes(arrays: list[pa.Array]) -> tuple[np.ndarray, list[ShardValues]]:
    """Per-row group codes and the shard value tuple of every code.

    Codes are dense integers; rows with equal shard values get equal codes.
    """
    n = len(arrays[0]) if arrays else 0
    codes = np.zeros(n, np.int64)
    dictionaries = []
    for arr in arrays:
        enc = arr.dictionary_encode(null_encoding="encode")
        idx = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        codes = codes * len(enc.dictionary) + idx
        dictionaries.append(enc.dictionary.to_pylist())
    uniq, dense = np.unique(codes, return_inverse=True)
    values = []
    for code in uniq.tolist():
        parts = []
        for d in reversed(dictionaries):
            code, i = divmod(code, len(d))
            parts.append(d[i])
        values.append(tuple(reversed(parts)))
    return dense.astype(np.int64), values


def route(data: pa.Table, arrays: list[pa.Array], resolver: ShardResolver, *, deletes: bool = False) -> list[RoutedBatch]:
    """Split ``data`` by shard, given its shard value arrays (``spec.shard_value_arrays``).

    Row order within a shard is the input order, because later rows of a write override
    earlier rows with the same key.
    """
    if data.num_rows == 0:
        return []
    codes, values = shard_codes(arrays)
    if len(values) == 1:
        return [RoutedBatch(resolver.shard_id(values[0]), values[0], data, deletes)]
    order = np.argsort(codes, kind="stable")
    bounds = np.flatnonzero(np.diff(codes[order])) + 1
    routes = []
    for group in np.split(order, bounds):
        v = values[int(codes[group[0]])]
        routes.append(RoutedBatch(resolver.shard_id(v), v, data.take(pa.array(group)), deletes))
    return routes


def check_row_shards(shard_id: str, row_shards: pa.Array | pa.ChunkedArray) -> None:
    """Raise :class:`ShardRoutingError` unless every row's shard id (as routing upstream gave
    it: Spark's prepare stage) is ``shard_id``: rows routed elsewhere must never reach this
    shard's writer. The cheap check a trusted routing gets instead of a re-route."""
    if len(row_shards) and not pc.all(pc.equal(row_shards, pa.scalar(shard_id, pa.string())), skip_nulls=False).as_py():
        raise ShardRoutingError(f"rows routed to another shard reached the writer of shard {shard_id}")


def check_shard(data: pa.Table, arrays: list[pa.Array], resolver: ShardResolver, shard_id: str) -> None:
    """Raise :class:`ShardRoutingError` if any row of ``data`` belongs to another shard."""
    if data.num_rows == 0:
        return
    codes, values = shard_codes(arrays)
    for code, v in enumerate(values):
        owner = resolver.shard_id(v)
        if owner != shard_id:
            row = int(np.flatnonzero(codes == code)[0])
            key = {c: data.column(c)[row].as_py() for c in resolver.spec.source_columns}
            raise ShardRoutingError(
                f"row {row} ({key}) belongs to shard {owner} (shard values {v}), not to shard "
                f"{shard_id}; route rows with Table.write() or memwal.core.routing.route()"
            )
