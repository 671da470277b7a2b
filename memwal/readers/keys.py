"""Primary-key values as users pass them (scalars, tuples, dicts) and as SQL literals."""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import pyarrow as pa

from memwal.core.errors import PrimaryKeyError
from memwal.core.sqltext import quote_ident, sql_literal


#: What Arrow raises for a key value its column's type cannot hold (a negative value for an
#: unsigned column is Python's OverflowError).
_NOT_OF_THE_TYPE = (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError)


def normalize_key(key: Any, primary_key: Sequence[str]) -> dict[str, Any]:
    """``{column: value}`` for a key given as a scalar (single-column keys), a tuple in key
    order, or a mapping."""
    if isinstance(key, dict):
        missing = [c for c in primary_key if c not in key]
        if missing:
            raise PrimaryKeyError(f"key {key!r} lacks primary-key column(s) {missing}")
        return {c: key[c] for c in primary_key}
    if isinstance(key, (tuple, list)):
        if len(key) != len(primary_key):
            raise PrimaryKeyError(f"key {key!r} has {len(key)} values; the primary key is {list(primary_key)}")
        return dict(zip(primary_key, key))
    if len(primary_key) != 1:
        raise PrimaryKeyError(f"the primary key is composite {list(primary_key)}; pass a tuple or a dict")
    return {primary_key[0]: key}


def keys_table(keys: Iterable[Any], primary_key: Sequence[str], schema: pa.Schema) -> pa.Table:
    """A table of the key columns, typed as in ``schema``."""
    if len(primary_key) == 1:  # scalars (or 1-tuples, or dicts) of one column: no dict per key
        values = keys if isinstance(keys, (list, tuple)) else list(keys)
        if all(not isinstance(v, (dict, tuple, list)) for v in values):
            try:
                return pa.table({primary_key[0]: pa.array(values, schema.field(primary_key[0]).type)})
            except _NOT_OF_THE_TYPE as e:
                raise PrimaryKeyError(f"key values do not match the key column types: {e}") from None
        keys = values
    rows = [normalize_key(k, primary_key) for k in keys]
    try:
        return pa.table({c: pa.array([r[c] for r in rows], schema.field(c).type) for c in primary_key})
    except _NOT_OF_THE_TYPE as e:
        raise PrimaryKeyError(f"key values do not match the key column types: {e}") from None


def typed_key(key: Any, primary_key: Sequence[str], schema: pa.Schema) -> dict[str, Any]:
    """One key as ``{column: value}``, typed as :func:`keys_table` types it (and refused as it
    refuses), without building a table: a point lookup's own cost is a few microseconds."""
    k = normalize_key(key, primary_key)
    try:
        return {c: _typed(k[c], schema.field(c).type) for c in primary_key}
    except _NOT_OF_THE_TYPE as e:
        raise PrimaryKeyError(f"key values do not match the key column types: {e}") from None


def _typed(value: Any, type_: pa.DataType) -> Any:
    """``value`` as a scalar of ``type_`` gives it back; a Python int in an integer column's
    range and a str for a string column are given back as they are (Arrow would return them
    unchanged, at ~10 us a key under load), anything else goes through Arrow."""
    if type(value) is int and pa.types.is_integer(type_):
        bits = type_.bit_width
        lo, hi = (-(1 << (bits - 1)), 1 << (bits - 1)) if pa.types.is_signed_integer(type_) else (0, 1 << bits)
        if lo <= value < hi:
            return value
    elif type(value) is str and (pa.types.is_string(type_) or pa.types.is_large_string(type_)):
        return value
    return pa.scalar(value, type_).as_py()


def keys_predicate(keys: pa.Table) -> str:
    """A SQL predicate matching exactly the rows of ``keys`` (IN for one column, OR of ANDs else)."""
    cols = keys.schema.names
    if len(cols) == 1:
        vals = ", ".join(sql_literal(v) for v in keys.column(0).to_pylist())
        return f"{quote_ident(cols[0])} IN ({vals})"
    terms = []
    for row in keys.to_pylist():
        terms.append("(" + " AND ".join(f"{quote_ident(c)} = {sql_literal(row[c])}" for c in cols) + ")")
    return " OR ".join(terms)
