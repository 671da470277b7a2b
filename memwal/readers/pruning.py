"""Shard pruning: which shards can hold rows matching a ``where`` clause.

The filter is parsed with DataFusion (the dialect Lance's filters use) and walked for
equality and IN predicates on the sharding columns: ``AND`` intersects what two sides
allow, ``OR`` unites them (a column one side leaves open stays open). When every
sharding column is pinned to finitely many values, the shards are those values' shards,
computed with the table's own transforms, so ``id IN (1, 2)`` on ``bucket(id, 8)`` reads
at most two shards. Anything it cannot reason about prunes nothing: pruning is only ever
an optimization, never a change of result.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import datafusion
import pyarrow as pa

from memwal.core.sharding import ShardingSpec, ShardResolver

#: Above this many value combinations, pruning gives up (it would cost more than it saves).
MAX_COMBINATIONS = 100_000

#: column -> the values a matching row can have there (absent: any value)
_Constraints = dict[str, frozenset]


@dataclass(frozen=True)
class Pruning:
    """The outcome for one filter: the shard ids to read (None: all of them) and why."""

    shard_ids: frozenset[str] | None
    reason: str


def _strip(expr):
    """``expr`` without the casts and aliases DataFusion's type coercion wraps around it."""
    while type(expr.to_variant()).__name__ in ("Cast", "TryCast", "Alias"):
        expr = expr.to_variant().expr()
    return expr


def _column(expr) -> str | None:
    v = _strip(expr).to_variant()
    return v.name() if type(v).__name__ == "Column" else None


def _literal(expr) -> tuple[bool, Any]:
    e = _strip(expr)
    if type(e.to_variant()).__name__ != "Literal":
        return False, None
    value = e.python_value()
    return value is not None, value  # "= NULL" matches nothing; leave it to the reader


def _constraints(expr, columns: frozenset[str]) -> _Constraints:
    v = expr.to_variant()
    kind = type(v).__name__
    if kind == "BinaryExpr":
        op = str(v.op()).upper()
        if op == "AND":
            left, right = _constraints(v.left(), columns), _constraints(v.right(), columns)
            out = dict(left)
            for c, vals in right.items():
                out[c] = out[c] & vals if c in out else vals
            return out
        if op == "OR":
            left, right = _constraints(v.left(), columns), _constraints(v.right(), columns)
            return {c: left[c] | right[c] for c in set(left) & set(right)}
        if op == "=":
            for a, b in ((v.left(), v.right()), (v.right(), v.left())):
                col = _column(a)
                ok, value = _literal(b)
                if col in columns and ok:
                    return {col: frozenset([value])}
        return {}
    if kind == "InList" and not v.negated():
        col = _column(v.expr())
        if col in columns:
            values = []
            for item in v.list():
                ok, value = _literal(item)
                if not ok:
                    return {}
                values.append(value)
            return {col: frozenset(values)}
    return {}


@lru_cache(maxsize=256)
def _parse(where: str, schema: pa.Schema):
    ctx = datafusion.SessionContext()
    ctx.register_record_batches("t", [[pa.RecordBatch.from_pylist([], schema=schema)]])
    plan = ctx.sql(f"SELECT * FROM t WHERE {where}").logical_plan()
    stack = [plan]
    while stack:
        node = stack.pop()
        v = node.to_variant()
        if type(v).__name__ == "Filter":
            return v.predicate()
        stack.extend(node.inputs())
    return None


def prune(where: str | None, spec: ShardingSpec, resolver: ShardResolver, schema: pa.Schema) -> Pruning:
    """The shards a read filtered by ``where`` must look at."""
    if not where:
        return Pruning(None, "no filter")
    columns = frozenset(spec.source_columns)
    if not columns:
        return Pruning(None, "the table is unsharded")
    try:
        predicate = _parse(where, schema)
    except Exception as e:  # noqa: BLE001 - Lance reports bad filters itself, better than we could
        return Pruning(None, f"filter not analysed ({type(e).__name__})")
    if predicate is None:
        return Pruning(None, "no filter")
    constraints = _constraints(predicate, columns)
    open_cols = [c for c in spec.source_columns if constraints.get(c) is None]
    if open_cols:
        return Pruning(None, f"no equality or IN constraint on sharding column(s) {open_cols}")
    value_sets = [sorted(constraints[c], key=repr) for c in spec.source_columns]
    combos = 1
    for vs in value_sets:
        combos *= len(vs)
    if combos > MAX_COMBINATIONS:
        return Pruning(None, f"{combos} value combinations: too many to prune")
    rows = list(itertools.product(*value_sets))
    try:
        table = pa.table(
            {c: pa.array([r[i] for r in rows], schema.field(c).type) for i, c in enumerate(spec.source_columns)}
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return Pruning(None, "filter values do not fit the sharding columns' types")
    arrays = spec.shard_value_arrays(table)
    shard_values = {tuple(a[i].as_py() for a in arrays) for i in range(table.num_rows)}
    ids = frozenset(resolver.shard_id(v) for v in shard_values)
    return Pruning(ids, f"{', '.join(spec.source_columns)} pinned to {table.num_rows} value(s) -> {len(ids)} shard(s)")
