"""A batch of Kafka record values as one Arrow array: what every value decoder shares.

Reading a batch's JSON objects in one Arrow call, isolating the records at fault by bisection,
the reason a record is bad in words, and the decoder's result (:class:`Decoded`). The value
formats (:mod:`~memwal.streaming.decode` for JSON, :mod:`~memwal.streaming.debezium`,
:mod:`~memwal.streaming.avro`) import from here, and :mod:`~memwal.streaming.decode`
dispatches to them, so no format imports the module that chooses it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from memwal.core.errors import MemwalError

#: Kafka keys or values: an Arrow binary array (as the source yields them) or a list.
Binaries = pa.Array | pa.ChunkedArray | Sequence[bytes | None]


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
                errors[int(idx[0])] = reason(e)
                return []
        mid = len(idx) // 2
        return run(idx[:mid]) + run(idx[mid:])

    good = run(np.arange(n))
    return (np.concatenate(good) if good else np.zeros(0, np.int64)), errors


def reason(e: BaseException) -> str:
    """An exception as the one-line reason a record is bad (its first line, at most 1000 characters)."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text[:1000]


def json_type(t: pa.DataType) -> pa.DataType:
    """The type Arrow's JSON reader can produce for ``t`` (conform() then casts to ``t``):
    it reads arrays as variable-length lists only. Floats narrower than 64 bits are read as
    float64 and narrowed by the cast: Arrow's JSON reader parses float32 much more slowly
    (decode + conform of 10k rows with a 64 x float32 vector: 0.59x the time measured in
    one process, docs/bench-log/ingest.md, "Ingest profile, axes and backlog catch-up"), and the result is the same float32 but for a rare
    double-rounding difference of one unit in the last place."""
    if pa.types.is_fixed_size_list(t) or pa.types.is_list(t):
        return pa.list_(json_type(t.value_type))
    if pa.types.is_float32(t):
        return pa.float64()
    return t


def binary_array(values: Binaries) -> pa.BinaryArray:
    """``values`` as one binary array (32-bit offsets: a micro-batch's values stay far below 2 GiB)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if not isinstance(values, pa.Array):
        values = pa.array(list(values), pa.binary())
    return values if values.type == pa.binary() else values.cast(pa.binary())


def value_offsets(values: pa.BinaryArray) -> np.ndarray:
    """Where each value of a binary array starts in its data buffer, and where the last ends
    (``len(values) + 1`` offsets)."""
    return np.frombuffer(values.buffers()[1], np.int32, len(values) + 1, values.offset * 4).astype(np.int64)


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
    #: Fields the records' own schemas have and the table lacks (name -> nullable Arrow field
    #: of the field's Connect type): a source that gained columns (``SinkOptions.evolve``).
    new_columns: dict[str, pa.Field] = field(default_factory=dict)
    #: Table columns whose type the records' schemas give wider (name -> the wider nullable
    #: field): a source whose column was widened, ``int`` to ``bigint`` (``SinkOptions.evolve``).
    wider_columns: dict[str, pa.Field] = field(default_factory=dict)


class ValueDecoder(Protocol):
    """Decodes Kafka record values (and keys, where the format takes key columns from them)."""

    #: The column of :attr:`Decoded.rows` naming each row's operation (None: all upserts).
    op_field: str | None

    def decode_batch(self, values: Binaries, keys: Binaries) -> Decoded: ...
