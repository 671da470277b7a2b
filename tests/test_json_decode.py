"""The JSON decoder and the operation check on whole Arrow columns: a batch decoded at once
(values as an Arrow binary array, sliced or chunked as the Kafka source hands them over)
finds the same good rows and the same bad records as decoding every record on its own."""

from __future__ import annotations

import json

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from memwal.streaming.decode import DELETE_VALUES, UPSERT_VALUES, JsonDecoder, operations

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("vec", pa.list_(pa.float32(), 2))])

GOOD = st.builds(lambda i, name, vec: json.dumps({"id": i, "name": name, "vec": vec}, indent=1 if i % 2 else None).encode(),
                 st.integers(0, 10**6), st.text(max_size=5), st.lists(st.floats(-1e3, 1e3, width=32), min_size=2, max_size=2))
BAD = st.sampled_from([None, b"", b"{", b"[1, 2]", b"42", b'{"id": 1}{"id": 2}', b'{"id": "x"}', b'{"vec": "no"}', b"\xff"])
VALUES = st.lists(st.one_of(GOOD, GOOD, BAD), max_size=30)


def alone(decoder: JsonDecoder, value: bytes | None) -> dict | None:
    """The row of ``value`` decoded by itself, or None if it is a bad record."""
    rows, positions, errors = decoder.decode([value])
    assert len(positions) + len(errors) == 1
    return None if errors else rows.to_pylist()[0]


@settings(max_examples=60, deadline=None)
@given(values=VALUES, pad=st.integers(0, 3), chunks=st.integers(1, 3))
def test_a_batch_decodes_like_its_records_one_by_one(values: list[bytes | None], pad: int, chunks: int) -> None:
    decoder = JsonDecoder(SCHEMA)
    model = [alone(decoder, v) for v in values]
    # The source's column: a slice of a larger array, in one or more chunks.
    arr = pa.array([b"{}"] * pad + values + [b"{}"], pa.binary()).slice(pad, len(values))
    step = max(1, len(values) // chunks)
    column = pa.chunked_array([arr[i:i + step] for i in range(0, len(values), step)] or [arr], pa.binary())
    decoded = decoder.decode_batch(column, [None] * len(values))
    assert sorted(decoded.errors) == [i for i, m in enumerate(model) if m is None]
    assert all(decoded.errors.values())  # every bad record says why
    assert list(decoded.positions) == [i for i, m in enumerate(model) if m is not None]
    assert decoded.rows.to_pylist() == [m for m in model if m is not None]


@given(ops=st.lists(st.one_of(st.none(), st.sampled_from(sorted(DELETE_VALUES | UPSERT_VALUES)), st.text(max_size=3)), max_size=30))
def test_operations_match_the_per_row_rule(ops: list[str | None]) -> None:
    rows = pa.table({"op": pa.chunked_array([pa.array(ops[:5], pa.string()), pa.array(ops[5:], pa.string())])})
    deletes, errors = operations(rows, "op")
    assert list(deletes) == [op in DELETE_VALUES for op in ops]
    assert sorted(errors) == [i for i, op in enumerate(ops) if not (op is None or op in DELETE_VALUES or op in UPSERT_VALUES)]
