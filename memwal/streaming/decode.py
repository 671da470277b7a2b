"""Turning incoming records into typed rows of a table, record by record when it must.

Every incoming batch is decoded and checked as a whole (fast: one Arrow call); only when
that fails is it bisected to find the records at fault, so a bad record costs a few extra
decodes of halves, not a per-record slow path for everyone. Each bad record gets the
reason in words: which column, what was wrong.
"""

from __future__ import annotations

import json
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal.core.errors import InvalidArgumentError
from memwal.core.schema import conform
from memwal.streaming.avro import AvroDecoder
from memwal.streaming.batches import (
    Binaries,
    Decoded,
    ValueDecoder,
    binary_array,
    bisect_failures,
    json_type,
    read_json_objects,
)
from memwal.streaming.debezium import DebeziumDecoder

#: Operation values that mean "delete this key"; anything in UPSERT_VALUES (or a missing
#: operation) is an upsert; any other value is a bad record.
DELETE_VALUES = frozenset({"delete", "d", "DELETE", "D", "del"})
UPSERT_VALUES = frozenset({"upsert", "insert", "update", "u", "c", "r", "i", "UPSERT", "INSERT", "UPDATE", "U", "C", "R", "I"})


class JsonDecoder:
    """Decodes JSON object values (one record each) into a table's schema plus an
    operation field and, optionally, a sequence field."""

    def __init__(self, schema: pa.Schema, op_field: str | None = "op", sequence_field: str | None = None) -> None:
        self.schema = schema
        self.op_field = op_field
        self.sequence_field = sequence_field
        fields = [pa.field(f.name, json_type(f.type), nullable=True) for f in schema]
        if op_field and op_field not in schema.names:
            fields.append(pa.field(op_field, pa.string()))
        self.parse_schema = pa.schema(fields)

    def _parse(self, values: Binaries) -> pa.Table:
        return read_json_objects(values, self.parse_schema)

    def decode(self, values: Binaries) -> tuple[pa.Table, np.ndarray, dict[int, str]]:
        """(parsed rows of the good values, their positions, position -> error).

        The values stay one Arrow binary array throughout (no Python bytes object per
        record): the bisection takes subsets of it, and only a bad record's value is
        turned into bytes, to say what is wrong with it."""
        arr = binary_array(values)
        try:
            return self._parse(arr), np.arange(len(arr)), {}
        except Exception:  # noqa: BLE001 - fall back to isolating the bad records
            pass
        good, errors = bisect_failures(len(arr), lambda idx: self._parse(arr.take(pa.array(idx, pa.int64()))))
        for i, reason in errors.items():
            errors[i] = _json_reason(arr[i].as_py(), reason)
        rows = self._parse(arr.take(pa.array(good, pa.int64()))) if len(good) else self.parse_schema.empty_table()
        return rows, good, errors

    def decode_batch(self, values: Binaries, keys: Binaries) -> "Decoded":
        """The :class:`ValueDecoder` form of :meth:`decode` (JSON values ignore the key)."""
        rows, positions, errors = self.decode(values)
        return Decoded(rows, positions, errors)


#: The value formats ``memwal ingest`` reads.
FORMATS = ("json", "debezium-json", "avro")


def value_decoder(schema: pa.Schema, fmt: str = "json", *, op_field: str | None = "op", sequence_field: str | None = None,
                  primary_key: Sequence[str] = (), avro_schema: str | None = None, avro_schema_id: int | None = None,
                  schema_registry: str | None = None) -> ValueDecoder:
    """The decoder of one value format for a table of ``schema``."""
    if fmt == "json":
        return JsonDecoder(schema, op_field, sequence_field)
    if fmt == "debezium-json":
        return DebeziumDecoder(schema, primary_key, sequence_field)
    if fmt == "avro":
        return AvroDecoder(schema, op_field, sequence_field, avro_schema, avro_schema_id, schema_registry, primary_key=primary_key)
    raise InvalidArgumentError(f"unknown value format {fmt!r}; expected one of {', '.join(FORMATS)}")


def _json_reason(value: bytes | None, reason: str) -> str:
    if value is None:
        return "the record has no value (null)"
    try:
        obj = json.loads(value)
    except (ValueError, UnicodeDecodeError) as e:
        return f"the value is not valid JSON: {e}"
    if not isinstance(obj, dict):
        return f"the value is JSON {type(obj).__name__}, not an object"
    return f"the value does not match the table schema: {reason}"


def check_rows(
    rows: pa.Table,
    schema: pa.Schema,
    primary_key: Sequence[str],
    max_row_bytes: int,
) -> tuple[pa.Table, np.ndarray, dict[int, str]]:
    """Conform ``rows`` to ``schema``; returns (conformed good rows, their positions, errors).

    Rows with a null primary key, values that do not fit their column, or more than
    ``max_row_bytes`` bytes are bad. (Non-key columns of a memwal table are nullable,
    because deletes are stored as tombstone rows, so a delete's missing values are fine.)
    """
    n = rows.num_rows
    errors: dict[int, str] = {}
    for c in primary_key:
        if c not in rows.schema.names:
            return schema.empty_table(), np.zeros(0, np.int64), {i: f"the primary key column {c!r} is missing" for i in range(n)}
        nulls = np.asarray(rows.column(c).is_null())
        for i in np.flatnonzero(nulls):
            errors[int(i)] = f"the primary key column {c!r} is null"
    sizes = row_bytes(rows)
    for i in np.flatnonzero(sizes > max_row_bytes):
        errors.setdefault(int(i), f"the row has {int(sizes[i])} bytes, more than the limit of {max_row_bytes}")
    candidates = np.arange(n, dtype=np.int64)
    if errors:
        candidates = candidates[~np.isin(candidates, np.fromiter(errors, np.int64, len(errors)))]
    present = [c for c in rows.schema.names if c in schema.names]

    def attempt(idx: np.ndarray) -> pa.Table:
        if len(idx) == n:  # every row (no take: it would copy the whole batch)
            return conform(rows.select(present), schema)
        return conform(rows.take(pa.array(candidates[idx], pa.int64())).select(present), schema)

    try:
        good_rows = attempt(np.arange(len(candidates)))
        good = candidates
    except Exception:  # noqa: BLE001
        ok, bad = bisect_failures(len(candidates), attempt)
        for j, reason in bad.items():
            errors[int(candidates[j])] = reason
        good = candidates[ok]
        good_rows = attempt(ok) if len(ok) else schema.empty_table()
    return good_rows, good, errors


def row_bytes(rows: pa.Table) -> np.ndarray:
    """Approximate bytes of every row: fixed widths plus variable-length payloads."""
    n = rows.num_rows
    total = np.zeros(n, np.int64)
    for col in rows.columns:
        arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        t = arr.type
        if pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t):
            total += np.asarray(pc.binary_length(arr).fill_null(0), dtype=np.int64)
        elif pa.types.is_fixed_size_list(t):
            total += t.list_size * max(1, (t.value_type.bit_width or 8) // 8)
        elif pa.types.is_list(t) or pa.types.is_large_list(t):
            total += np.asarray(pc.list_value_length(arr).fill_null(0), dtype=np.int64) * 8
        else:
            total += max(1, (getattr(t, "bit_width", 64) or 64) // 8)
    return total


def operations(rows: pa.Table, op_field: str | None, delete_values=DELETE_VALUES, upsert_values=UPSERT_VALUES) -> tuple[np.ndarray, dict[int, str]]:
    """Per row: True for deletes; and errors for unknown operation values."""
    n = rows.num_rows
    if not op_field or op_field not in rows.schema.names:
        return np.zeros(n, bool), {}
    col = rows.column(op_field)
    if pa.types.is_string(col.type):
        # Two set look-ups in Arrow rather than a Python comparison per row; only the rows
        # with an unknown operation (bad records) are looked at in Python, for their reason.
        deletes = np.asarray(pc.is_in(col, value_set=pa.array(sorted(delete_values), pa.string())).fill_null(False), bool)
        # (a missing operation is an upsert)
        known = np.asarray(pc.is_in(col, value_set=pa.array(sorted(upsert_values), pa.string())).fill_null(True), bool) | np.asarray(col.is_null(), bool)
        unknown = [(int(i), col[int(i)].as_py()) for i in np.flatnonzero(~(known | deletes))]
    else:
        ops = col.to_pylist()
        deletes = np.array([op in delete_values for op in ops], bool)
        unknown = [(i, op) for i, op in enumerate(ops) if not (op is None or op in upsert_values or op in delete_values)]
    expected = sorted(delete_values | upsert_values)
    errors = {i: f"unknown operation {op!r} in {op_field!r}; expected one of {expected}" for i, op in unknown}
    return deletes, errors


def json_presence(values: Sequence[bytes | None], parsed: pa.Table, positions: np.ndarray, ptype: pa.StructType) -> pa.StructArray:
    """Which columns each parsed record carries (partial updates, :mod:`memwal.core.partial`):
    ``parsed`` rows are ``values[positions]`` decoded by :class:`JsonDecoder`, ``ptype`` the
    table's presence type.

    Arrow's JSON reader makes a missing key and ``"col": null`` the same null, so a non-null
    cell is present and only records with a null cell are parsed again, in Python, to see
    which of their keys they spell out (the one per-record step, paid in partial mode only).
    """
    from memwal.core.partial import presence_of_masks

    n = parsed.num_rows
    masks = {}
    for f in ptype:
        masks[f.name] = np.asarray(parsed.column(f.name).is_valid(), bool) if f.name in parsed.schema.names else np.zeros(n, bool)
    unsure = np.zeros(n, bool)
    for m in masks.values():
        unsure |= ~m
    for i in np.flatnonzero(unsure):
        obj = json.loads(values[int(positions[i])])
        for name, m in masks.items():
            if not m[i] and name in obj:
                m[i] = True
    return presence_of_masks(masks, n, ptype)


#: What the sink and the benchmarks import from here (the shared pieces live in
#: :mod:`memwal.streaming.batches`).
__all__ = [
    "DELETE_VALUES", "FORMATS", "UPSERT_VALUES", "Binaries", "Decoded", "JsonDecoder", "ValueDecoder", "check_rows",
    "json_presence", "operations", "read_json_objects", "row_bytes", "value_decoder",
]
