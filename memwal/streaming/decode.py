"""Turning incoming records into typed rows of a table, record by record when it must.

Every incoming batch is decoded and checked as a whole (fast: one Arrow call); only when
that fails is it bisected to find the records at fault, so a bad record costs a few extra
decodes of halves, not a per-record slow path for everyone. Each bad record gets the
reason in words: which column, what was wrong.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from memwal.errors import InvalidArgumentError, MemwalError
from memwal.schema import conform

#: Operation values that mean "delete this key"; anything in UPSERT_VALUES (or a missing
#: operation) is an upsert; any other value is a bad record.
DELETE_VALUES = frozenset({"delete", "d", "DELETE", "D", "del"})
UPSERT_VALUES = frozenset({"upsert", "insert", "update", "u", "c", "r", "i", "UPSERT", "INSERT", "UPDATE", "U", "C", "R", "I"})


def bisect_failures(n: int, attempt: Callable[[np.ndarray], object]) -> tuple[np.ndarray, dict[int, str]]:
    """Positions ``0..n-1`` split into those ``attempt`` accepts together and those it rejects alone.

    ``attempt(positions)`` raises on failure. Halves are retried recursively, so k bad
    records cost O(k log n) attempts.
    """
    errors: dict[int, str] = {}

    def run(idx: np.ndarray) -> list[np.ndarray]:
        if len(idx) == 0:
            return []
        try:
            attempt(idx)
            return [idx]
        except Exception as e:  # noqa: BLE001 - any failure marks the records at fault
            if len(idx) == 1:
                errors[int(idx[0])] = _reason(e)
                return []
        mid = len(idx) // 2
        return run(idx[:mid]) + run(idx[mid:])

    good = run(np.arange(n))
    return (np.concatenate(good) if good else np.zeros(0, np.int64)), errors


def _reason(e: Exception) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text[:1000]


def _json_type(t: pa.DataType) -> pa.DataType:
    """The type Arrow's JSON reader can produce for ``t`` (conform() then casts to ``t``):
    it reads arrays as variable-length lists only. Floats narrower than 64 bits are read as
    float64 and narrowed by the cast: Arrow's JSON reader parses float32 much more slowly
    (decode + conform of 10k rows with a 64 x float32 vector: 0.59x the time measured in
    one process, docs/bench-log/ingest.md, "Ingest profile, axes and backlog catch-up"), and the result is the same float32 but for a rare
    double-rounding difference of one unit in the last place."""
    if pa.types.is_fixed_size_list(t) or pa.types.is_list(t):
        return pa.list_(_json_type(t.value_type))
    if pa.types.is_float32(t):
        return pa.float64()
    return t


class JsonDecoder:
    """Decodes JSON object values (one record each) into a table's schema plus an
    operation field and, optionally, a sequence field."""

    def __init__(self, schema: pa.Schema, op_field: str | None = "op", sequence_field: str | None = None) -> None:
        self.schema = schema
        self.op_field = op_field
        self.sequence_field = sequence_field
        fields = [pa.field(f.name, _json_type(f.type), nullable=True) for f in schema]
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


#: Kafka keys or values: an Arrow binary array (as the source yields them) or a list.
Binaries = pa.Array | pa.ChunkedArray | Sequence[bytes | None]


def binary_array(values: Binaries) -> pa.BinaryArray:
    """``values`` as one binary array (32-bit offsets: a micro-batch's values stay far below 2 GiB)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if not isinstance(values, pa.Array):
        values = pa.array(list(values), pa.binary())
    return values if values.type == pa.binary() else values.cast(pa.binary())


def json_lines(values: Binaries) -> pa.Buffer:
    """``values`` as newline-delimited JSON: each value with its newlines made spaces (JSON
    allows a raw newline only as whitespace), followed by one newline. Built by two Arrow
    kernels over the array's data, without a Python bytes object per value."""
    arr = binary_array(values)
    if arr.null_count:
        raise MemwalError("the record has no value (null)")
    lines = pc.binary_join_element_wise(pc.replace_substring(arr, b"\n", b" "), _EMPTY, _NEWLINE)
    offsets = np.frombuffer(lines.buffers()[1], np.int32, len(lines) + 1, lines.offset * 4)
    data = lines.buffers()[2]
    return pa.py_buffer(b"") if data is None else data.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))


_EMPTY = pa.scalar(b"", pa.binary())
_NEWLINE = pa.scalar(b"\n", pa.binary())


def read_json_objects(values: Binaries, parse_schema: pa.Schema) -> pa.Table:
    """One row per value, each one JSON object, read in one Arrow call into ``parse_schema``
    (fields outside it are ignored). Raises if any value is null or not exactly one object."""
    n = len(values)
    blob = json_lines(values)
    if n == 0:
        return parse_schema.empty_table()
    # A blank value makes no row, so with a value of two objects elsewhere in the batch the
    # row count below would still match and rows would shift onto the wrong records:
    # without blanks every value makes at least one row, and n rows means one each.
    if pc.any(pc.match_substring_regex(binary_array(values), r"^\s*$")).as_py():
        raise MemwalError("the record's value is empty")
    t = pajson.read_json(
        blob,
        parse_options=pajson.ParseOptions(explicit_schema=parse_schema, unexpected_field_behavior="ignore"),
        read_options=pajson.ReadOptions(block_size=max(1 << 20, blob.size + 1)),
    )
    if t.num_rows != n:
        # A value that is not one JSON object per record (e.g. two objects, or an array)
        raise MemwalError(f"expected {n} JSON object(s), found {t.num_rows}")
    return t


@dataclass(frozen=True)
class Decoded:
    """What a value decoder made of a batch of Kafka records."""

    #: Rows of the good records: table columns (as decoded, before conforming), the
    #: decoder's operation column (:attr:`ValueDecoder.op_field`) and the sequence, if any.
    rows: pa.Table
    #: Each row's position in the batch.
    positions: np.ndarray
    #: Position -> why the record cannot be written (it goes to the dead-letter table).
    errors: dict[int, str]
    #: Records deliberately left out, neither rows nor errors (Debezium tombstones).
    skipped: int = 0


class ValueDecoder(Protocol):
    """Decodes Kafka record values (and keys, where the format takes key columns from them)."""

    #: The column of :attr:`Decoded.rows` naming each row's operation (None: all upserts).
    op_field: str | None

    def decode_batch(self, values: Binaries, keys: Binaries) -> Decoded: ...


#: The value formats ``memwal ingest`` reads.
FORMATS = ("json", "debezium-json", "avro")


def value_decoder(schema: pa.Schema, fmt: str = "json", *, op_field: str | None = "op", sequence_field: str | None = None,
                  primary_key: Sequence[str] = (), avro_schema: str | None = None, avro_schema_id: int | None = None,
                  schema_registry: str | None = None) -> ValueDecoder:
    """The decoder of one value format for a table of ``schema``."""
    if fmt == "json":
        return JsonDecoder(schema, op_field, sequence_field)
    if fmt == "debezium-json":
        from memwal.streaming.debezium import DebeziumDecoder

        return DebeziumDecoder(schema, primary_key, sequence_field)
    if fmt == "avro":
        from memwal.streaming.avro import AvroDecoder

        return AvroDecoder(schema, op_field, sequence_field, avro_schema, avro_schema_id, schema_registry)
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
    """Which columns each parsed record carries (partial updates, :mod:`memwal.partial`):
    ``parsed`` rows are ``values[positions]`` decoded by :class:`JsonDecoder`, ``ptype`` the
    table's presence type.

    Arrow's JSON reader makes a missing key and ``"col": null`` the same null, so a non-null
    cell is present and only records with a null cell are parsed again, in Python, to see
    which of their keys they spell out (the one per-record step, paid in partial mode only).
    """
    from memwal.partial import presence_of_masks

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
