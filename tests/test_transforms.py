"""Sharding transforms: Lance's own ones equal lance.mem_wal.evaluate_sharding_spec exactly;
memwal-only ones against independent oracles (Python datetime, mmh3)."""

from __future__ import annotations

import datetime as dt
import struct
import uuid
import zlib

import lance
import lance.mem_wal
import mmh3
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from memwal.core.errors import InvalidValueError, ShardingSpecError, TransformTypeError
from memwal.core.sharding import ShardResolver, lance_spec_dict, parse_sharding_spec
from memwal.core.transforms import (
    Bucket,
    Day,
    Hour,
    Identity,
    Month,
    MultiBucket,
    Truncate,
    Year,
    murmur3,
    parse_transform_call,
)

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
TEXT = st.text(max_size=40)  # any Unicode, so UTF-8 lengths hit every tail size


@pytest.fixture(scope="module")
def lance_schemas(tmp_path_factory):
    """A Lance schema (with field ids) per key type: evaluate_sharding_spec resolves ids by it."""
    out = {}
    for name, t in {
        "int32": pa.int32(),
        "int64": pa.int64(),
        "string": pa.string(),
        "large_string": pa.large_string(),
        "bool": pa.bool_(),
        "uint32": pa.uint32(),
        "uint64": pa.uint64(),
        "int8": pa.int8(),
        "float32": pa.float32(),
        "float64": pa.float64(),
        "date32": pa.date32(),
        "timestamp": pa.timestamp("us"),
    }.items():
        schema = pa.schema([pa.field("k", t)])
        ds = lance.write_dataset(schema.empty_table(), str(tmp_path_factory.mktemp(name)))
        out[name] = (schema, ds.lance_schema)
    return out


def lance_eval(spec_text: str, values: list, kind: str, lance_schemas) -> list:
    schema, lance_schema = lance_schemas[kind]
    spec = parse_sharding_spec(spec_text, schema)
    batch = pa.record_batch({"k": pa.array(values, schema.field("k").type)})
    out = lance.mem_wal.evaluate_sharding_spec(batch, lance_spec_dict(spec, {"k": 0}), lance_schema)
    return out.column(0).to_pylist()


def memwal_eval(spec_text: str, values: list, kind: str, lance_schemas) -> list:
    schema, _ = lance_schemas[kind]
    spec = parse_sharding_spec(spec_text, schema)
    batch = pa.table({"k": pa.array(values, schema.field("k").type)})
    return spec.shard_value_arrays(batch)[0].to_pylist()


def both(spec_text: str, values: list, kind: str, lance_schemas) -> tuple[list, list]:
    return memwal_eval(spec_text, values, kind, lance_schemas), lance_eval(spec_text, values, kind, lance_schemas)


# -- routing == Lance (property tests) ------------------------------------------------------------


@given(values=st.lists(st.one_of(st.none(), INT32), min_size=1, max_size=50), n=st.integers(1, 1024))
def test_bucket_int32_matches_lance(lance_schemas, values, n):
    ours, theirs = both(f"bucket(k, {n})", values, "int32", lance_schemas)
    assert ours == theirs


@given(values=st.lists(st.one_of(st.none(), INT64), min_size=1, max_size=50), n=st.integers(1, 1024))
def test_bucket_int64_matches_lance(lance_schemas, values, n):
    ours, theirs = both(f"bucket(k, {n})", values, "int64", lance_schemas)
    assert ours == theirs


@given(values=st.lists(st.one_of(st.none(), TEXT), min_size=1, max_size=50), n=st.integers(1, 1024))
def test_bucket_string_matches_lance(lance_schemas, values, n):
    ours, theirs = both(f"bucket(k, {n})", values, "string", lance_schemas)
    assert ours == theirs


@given(values=st.lists(st.one_of(st.none(), TEXT), min_size=1, max_size=20), n=st.integers(1, 1024))
def test_bucket_large_string_matches_lance(lance_schemas, values, n):
    ours, theirs = both(f"bucket(k, {n})", values, "large_string", lance_schemas)
    assert ours == theirs


@pytest.mark.parametrize(
    "kind,strategy",
    [
        ("bool", st.booleans()),
        ("uint32", st.integers(0, 2**32 - 1)),
        ("uint64", st.integers(0, 2**64 - 1)),
        ("int8", st.integers(-128, 127)),
        ("float32", st.floats(width=32)),  # NaN and -0.0 included: Lance normalizes them
        ("float64", st.floats()),
        ("date32", st.dates()),
        ("timestamp", st.datetimes()),
    ],
)
def test_bucket_other_types_match_lance(lance_schemas, kind, strategy):
    @given(values=st.lists(st.one_of(st.none(), strategy), min_size=1, max_size=30), n=st.integers(1, 1024))
    def check(values, n):
        ours, theirs = both(f"bucket(k, {n})", values, kind, lance_schemas)
        assert ours == theirs

    check()


@given(values=st.lists(st.one_of(st.none(), INT64), min_size=1, max_size=30))
def test_identity_int64_matches_lance(lance_schemas, values):
    ours, theirs = both("identity(k)", values, "int64", lance_schemas)
    assert ours == theirs


@given(values=st.lists(st.one_of(st.none(), INT32), min_size=1, max_size=30))
def test_identity_int32_matches_lance(lance_schemas, values):
    ours, theirs = both("identity(k)", values, "int32", lance_schemas)
    assert ours == theirs


@given(values=st.lists(st.one_of(st.none(), TEXT), min_size=1, max_size=30))
def test_identity_string_matches_lance(lance_schemas, values):
    ours, theirs = both("identity(k)", values, "string", lance_schemas)
    assert ours == theirs


def test_unsharded_matches_lance(lance_schemas):
    schema, lance_schema = lance_schemas["int64"]
    spec = parse_sharding_spec("unsharded", schema)
    batch = pa.record_batch({"k": pa.array([1, None, 3], pa.int64())})
    theirs = lance.mem_wal.evaluate_sharding_spec(batch, lance_spec_dict(spec, {"k": 0}), lance_schema)
    assert spec.shard_value_arrays(pa.Table.from_batches([batch]))[0].to_pylist() == theirs.column(0).to_pylist()


def test_bucket_vectors_from_the_lance_spec():
    # Appendix 3 of Lance's MemWAL spec, num_buckets = 8.
    b = Bucket(8)
    assert b.apply([pa.array([1, 2, None, 3], pa.int32())]).to_pylist() == [2, 7, 0, 1]
    assert b.apply([pa.array([1, 2, None, 3], pa.date32())]).to_pylist() == [2, 7, 0, 1]
    assert b.apply([pa.array(["a", "b", None])]).to_pylist() == [1, 5, 0]
    assert b.apply([pa.array([True])]).to_pylist() == [2]
    assert b.apply([pa.array([1.25], pa.float32())]).to_pylist() == [0]
    assert b.apply([pa.array([1.25], pa.float64())]).to_pylist() == [0]


# -- the hash against an independent Murmur3 ----------------------------------------------------------


@given(st.lists(INT32, min_size=1, max_size=20))
def test_murmur3_int32_equals_reference(values):
    ours = murmur3(pa.array(values, pa.int32())).tolist()
    assert ours == [mmh3.hash(struct.pack("<i", v), signed=False) for v in values]


@given(st.lists(INT64, min_size=1, max_size=20))
def test_murmur3_int64_equals_reference(values):
    ours = murmur3(pa.array(values, pa.int64())).tolist()
    assert ours == [mmh3.hash(struct.pack("<q", v), signed=False) for v in values]


@given(st.lists(st.binary(max_size=10).map(lambda b: b * 4), min_size=1, max_size=20))
def test_murmur3_aligned_strings_equal_reference(blobs):
    # Lance's byte hash differs from reference Murmur3 only in the tail (len % 4 != 0).
    strings = [b.hex() for b in blobs]  # hex of 4k bytes: length 8k, aligned
    assert murmur3(pa.array(strings)).tolist() == [mmh3.hash(s.encode(), signed=False) for s in strings]


def test_murmur3_sliced_arrays():
    arr = pa.array(["x", "hello", "world!", "abc"])
    assert murmur3(arr.slice(1, 2)).tolist() == murmur3(pa.array(["hello", "world!"])).tolist()


# -- memwal-only transforms ---------------------------------------------------------------------------


@given(st.lists(st.one_of(st.none(), st.datetimes(min_value=dt.datetime(1, 1, 2))), min_size=1, max_size=20))
def test_date_parts_of_timestamps(values):
    arr = pa.array(values, pa.timestamp("us"))
    for transform, attr in ((Year(), "year"), (Month(), "month"), (Day(), "day"), (Hour(), "hour")):
        expected = [None if v is None else getattr(v, attr) for v in values]
        assert transform.apply([arr]).to_pylist() == expected


@given(st.lists(st.one_of(st.none(), st.dates()), min_size=1, max_size=20))
def test_date_parts_of_dates(values):
    arr = pa.array(values, pa.date32())
    for transform, attr in ((Year(), "year"), (Month(), "month"), (Day(), "day")):
        assert transform.apply([arr]).to_pylist() == [None if v is None else getattr(v, attr) for v in values]


@given(st.lists(st.one_of(st.none(), INT64), min_size=1, max_size=20), st.integers(1, 1000))
def test_truncate_integers_like_sql(values, width):
    out = Truncate(width).apply([pa.array(values, pa.int64())]).to_pylist()
    # SQL remainder takes the dividend's sign: v - (v % w) rounds toward zero.
    assert out == [None if v is None else v - int(np.fmod(v, width)) for v in values]


def test_truncate_examples():
    assert Truncate(5).apply([pa.array([7, -7, 10, 0], pa.int32())]).to_pylist() == [5, -5, 10, 0]
    assert Truncate(2).apply([pa.array(["héllo", "a", None, ""])]).to_pylist() == ["hé", "a", None, ""]


@given(
    st.lists(st.tuples(st.one_of(st.none(), INT64), st.one_of(st.none(), INT64)), min_size=1, max_size=20),
    st.integers(1, 1024),
)
def test_multi_bucket_chains_seeds(rows, n):
    a = pa.array([r[0] for r in rows], pa.int64())
    b = pa.array([r[1] for r in rows], pa.int64())
    out = MultiBucket(n).apply([a, b]).to_pylist()
    expected = []
    for x, y in rows:
        if x is None and y is None:
            expected.append(None)
            continue
        h = 0
        for v in (x, y):
            if v is not None:
                h = mmh3.hash(struct.pack("<q", v), seed=h, signed=False)
        expected.append((h & 0x7FFFFFFF) % n)
    assert out == expected


# -- parsing and type errors ---------------------------------------------------------------------------


def test_parse_transform_calls():
    assert parse_transform_call("bucket(id, 4)") == (Bucket(4), ["id"])
    assert parse_transform_call(" identity( region ) ") == (Identity(), ["region"])
    assert parse_transform_call("multi_bucket(a, b, 16)") == (MultiBucket(16), ["a", "b"])
    assert parse_transform_call("truncate(name, 3)") == (Truncate(3), ["name"])


@pytest.mark.parametrize(
    "text,error",
    [
        ("buckets(id, 4)", "unknown sharding transform"),
        ("bucket(id)", "takes a column and an integer"),
        ("bucket(id, x)", "must be an integer"),
        ("bucket(id, 0)", "bucket count must be in"),
        ("bucket(id, 1025)", "bucket count must be in"),
        ("identity(a, b)", "exactly one column"),
        ("multi_bucket(a, 4)", "two or more columns"),
        ("unsharded(x)", "takes no arguments"),
        ("bucket(id, 4", "cannot parse"),
    ],
)
def test_parse_errors(text, error):
    with pytest.raises(ShardingSpecError, match=error):
        parse_transform_call(text)


@pytest.mark.parametrize(
    "spec,column_type,allowed",
    [
        ("identity(c)", pa.float64(), "boolean, integer or string"),
        ("bucket(c, 4)", pa.list_(pa.int32()), "boolean, integer, float"),
        ("year(c)", pa.int64(), "date, timestamp or ISO-8601 string"),
        ("hour(c)", pa.date32(), "timestamp"),
        ("truncate(c, 2)", pa.float32(), "integer or string"),
    ],
)
def test_transform_refuses_column_type(spec, column_type, allowed):
    with pytest.raises(TransformTypeError, match=allowed) as e:
        parse_sharding_spec(spec, pa.schema([pa.field("c", column_type)]))
    assert str(column_type) in str(e.value)


def test_date_parts_of_iso_strings():
    arr = pa.array(["2026-03-04", "2026-03-04T05:06:07", "2026-03-04 23:00:00", None])
    assert Hour().apply([arr]).to_pylist() == [0, 5, 23, None]
    assert Day().apply([arr]).to_pylist() == [4, 4, 4, None]
    # an explicit offset is honoured: 01:00+02:00 is 23:00 UTC the day before
    assert Day().apply([pa.array(["2026-03-04T01:00:00+02:00"])]).to_pylist() == [3]


# -- which write task owns a shard ----------------------------------------------------------------

PARTITION_SCHEMA = pa.schema([("id", pa.int64()), ("region", pa.string()), ("ts", pa.timestamp("us"))])


@pytest.mark.parametrize(
    "text, count",
    [
        ("unsharded", 1),
        ("bucket(id, 4)", 4),
        ("multi_bucket(id, region, 8)", 8),
        ("identity(region)", None),
        ("day(ts)", None),
        ("bucket(id, 4), day(ts)", None),
    ],
)
def test_fixed_shard_count(text, count):
    assert parse_sharding_spec(text, PARTITION_SCHEMA).fixed_shard_count == count


@pytest.mark.parametrize("text", ["unsharded", "bucket(id, 16)", "multi_bucket(id, region, 8)"])
def test_fixed_count_specs_give_each_shard_its_own_partition(text):
    spec = parse_sharding_spec(text, PARTITION_SCHEMA)
    count = spec.fixed_shard_count
    values = [(v,) for v in range(count)]
    # as many partitions as shards: one to one
    assert sorted(spec.partition_of(v, f"shard-{v[0]}", count) for v in values) == list(range(count))
    # fewer partitions: every shard in exactly one, spread evenly
    for n in (1, 3, 5):
        parts = [spec.partition_of(v, f"shard-{v[0]}", n) for v in values]
        assert all(0 <= p < n for p in parts)
        assert max(parts.count(p) for p in range(n)) - min(parts.count(p) for p in range(n)) <= 1


@given(st.lists(st.text(max_size=10), min_size=1, max_size=50), st.integers(1, 16))
def test_open_specs_place_shards_by_their_id(regions, n):
    spec = parse_sharding_spec("identity(region)", PARTITION_SCHEMA)
    resolver = ShardResolver(uuid.UUID(int=7), spec)
    for r in regions:
        sid = resolver.shard_id((r,))
        p = spec.partition_of((r,), sid, n)
        assert 0 <= p < n
        # the same shard lands in the same partition in every process: a function of its id alone
        assert p == spec.partition_of(("ignored",), sid, n) == zlib.crc32(sid.encode()) % n


def test_partition_of_needs_partitions():
    with pytest.raises(InvalidValueError):
        parse_sharding_spec("bucket(id, 4)", PARTITION_SCHEMA).partition_of((1,), "s", 0)


ONE_ROW_KINDS = [
    ("int32", INT32),
    ("int64", INT64),
    ("int8", st.integers(-128, 127)),
    ("uint32", st.integers(0, 2**32 - 1)),
    ("uint64", st.integers(0, 2**64 - 1)),
    ("string", TEXT),
    ("bool", st.booleans()),
    ("float64", st.floats()),
    ("timestamp", st.datetimes()),
]


@pytest.mark.parametrize("kind,strategy", ONE_ROW_KINDS)
def test_one_row_routing_matches_lance(lance_schemas, kind, strategy):
    """A point lookup routes its key through the scalar path (pure-Python Murmur3 for
    integers): it must give the shard value Lance gives the same row."""
    schema, _ = lance_schemas[kind]

    @given(value=st.one_of(st.none(), strategy), n=st.integers(1, 1024))
    def check(value, n):
        for text in (f"bucket(k, {n})", "identity(k)") if kind in ("int32", "int64", "string") else (f"bucket(k, {n})",):
            ours = parse_sharding_spec(text, schema).shard_values_of({"k": value}, schema)
            assert list(ours) == lance_eval(text, [value], kind, lance_schemas), text

    check()


def test_one_row_routing_refuses_a_value_its_column_cannot_hold(lance_schemas):
    schema, _ = lance_schemas["int32"]
    spec = parse_sharding_spec("bucket(k, 8)", schema)
    with pytest.raises((pa.ArrowInvalid, OverflowError)):
        spec.shard_values_of({"k": 2**31}, schema)  # hashed as its low 32 bits, it would route silently
