"""Kafka Connect and Debezium semantic types into Arrow columns (memwal.streaming.connect): every
type, converted column-wise, against a plain-Python model of each value (exact decimals,
integer arithmetic on epochs), including negative decimals, precision 38 and 76, pre-1970
timestamps and dates, and values that do not fit (a reason naming the column and type)."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import uuid

import pyarrow as pa
import pytest
from debezium_events import unscaled_base64 as decimal_base64
from debezium_events import unscaled_bytes as decimal_bytes
from hypothesis import given, settings
from hypothesis import strategies as st

from memwal.streaming import connect
from memwal.streaming.connect import ConnectSchema, arrow_type, convert, parse_type

EXACT = decimal.Context(prec=200)
UNITS = {"s": 1, "ms": 1000, "us": 10**6, "ns": 10**9}
INT64 = 2**63


def dec_schema(scale: int, precision: int | None = None) -> ConnectSchema:
    params = [("scale", str(scale))] + ([("connect.decimal.precision", str(precision))] if precision else [])
    return ConnectSchema("bytes", connect.DECIMAL, tuple(params))


def rows_of(result) -> list:
    return result.array.to_pylist()


# -- decimals ------------------------------------------------------------------------------------


def expected_decimal(unscaled: int, scale: int, target: pa.DataType):
    """The value in the column, or None if it does not fit exactly."""
    # Exact arithmetic throughout: abs() would round to the default context's 28 digits, and a
    # 30-digit value scaled to 38 digits then looked like an overflow (a failing example of 2026-11-29).
    value = decimal.Decimal(unscaled).scaleb(-scale, EXACT)
    in_target = value.scaleb(target.scale, EXACT)
    if in_target != in_target.to_integral_value() or in_target.copy_abs() >= 10**target.precision:
        return None
    return value.quantize(decimal.Decimal(1).scaleb(-target.scale), context=EXACT)


TARGETS = st.one_of(
    st.builds(lambda p, s: pa.decimal128(p, min(s, p)), st.integers(1, 38), st.integers(0, 38)),
    st.builds(lambda p, s: pa.decimal256(p, min(s, p)), st.integers(39, 76), st.integers(0, 40)),
)
UNSCALED = st.one_of(st.integers(-(10**38) + 1, 10**38 - 1), st.integers(-(2**127), 2**127 - 1),
                     st.integers(-(10**76) + 1, 10**76 - 1), st.integers(-1000, 1000))


@settings(max_examples=300)
@given(values=st.lists(st.one_of(st.none(), UNSCALED), min_size=1, max_size=20), scale=st.integers(0, 20), target=TARGETS)
def test_decimals_convert_exactly_or_not_at_all(values, scale, target):
    """Base64 big-endian two's complement with a scale (the JSON converter's decimals): every
    value that fits the column exactly is that value; every other is a bad row whose reason
    names the column and the semantic type; nulls stay null."""
    text = pa.array([None if v is None else decimal_base64(v) for v in values], pa.string())
    got = convert(text, dec_schema(scale), target, "amount")
    want = [None if v is None else expected_decimal(v, scale, target) for v in values]
    assert rows_of(got) == want
    assert sorted(got.errors) == [i for i, v in enumerate(values) if v is not None and want[i] is None]
    for why in got.errors.values():
        assert "'amount'" in why and connect.DECIMAL in why
    # Avro's raw bytes give the same column
    raw = pa.array([None if v is None else decimal_bytes(v) for v in values], pa.binary())
    assert convert(raw, dec_schema(scale), target, "amount").array.equals(got.array)


def test_decimals_at_the_edges_of_precision_38_and_negative_values():
    top = 10**38 - 1
    values = [top, -top, top + 1, -(top + 1), -1, 0, 1, -(2**127), 2**127 - 1]
    got = convert(pa.array([decimal_base64(v) for v in values]), dec_schema(0, 38), pa.decimal128(38, 0), "n")
    assert rows_of(got)[:3] == [decimal.Decimal(top), decimal.Decimal(-top), None]
    assert rows_of(got)[4:7] == [decimal.Decimal(-1), decimal.Decimal(0), decimal.Decimal(1)]
    assert sorted(got.errors) == [2, 3, 7, 8]
    # Java's BigInteger writes the fewest bytes; a value padded with sign bytes is the same value
    padded = base64.b64encode(b"\xff" * 20 + (-5).to_bytes(1, "big", signed=True)).decode()
    assert rows_of(convert(pa.array([padded]), dec_schema(2), pa.decimal128(10, 2), "n")) == [decimal.Decimal("-0.05")]


def test_decimals_into_float_text_and_integer_columns():
    values = [decimal_base64(v) for v in (12345, -5, 0)] + [None]
    s = dec_schema(2)
    assert rows_of(convert(pa.array(values), s, pa.float64(), "x")) == [123.45, -0.05, 0.0, None]
    assert rows_of(convert(pa.array(values), s, pa.string(), "x")) == ["123.45", "-0.05", "0.00", None]
    ints = convert(pa.array([decimal_base64(v) for v in (1200, -100, 150, 2**70)]), s, pa.int32(), "x")
    assert rows_of(ints) == [12, -1, None, None] and sorted(ints.errors) == [2, 3]
    wrong = convert(pa.array(values), s, pa.bool_(), "x")
    assert sorted(wrong.errors) == [0, 1, 2] and "bool" in wrong.errors[0]


@pytest.mark.parametrize("bad", ["!!!!", "AQ=", "A===", "AB=C", "", "AQI"])
def test_text_that_is_not_base64_is_a_bad_row(bad):
    got = convert(pa.array([decimal_base64(7), bad, decimal_base64(-7)]), dec_schema(1), pa.decimal128(5, 1), "p")
    assert rows_of(got) == [decimal.Decimal("0.7"), None, decimal.Decimal("-0.7")]
    assert list(got.errors) == [1]


@settings(max_examples=100)
@given(values=st.lists(st.one_of(st.none(), st.tuples(st.integers(0, 12), st.integers(-(10**30), 10**30))), min_size=1, max_size=15),
       target_scale=st.integers(0, 10))
def test_variable_scale_decimals_convert_per_row_scale(values, target_scale):
    """io.debezium.data.VariableScaleDecimal: a struct of each value's own scale and its bytes."""
    target = pa.decimal128(38, target_scale)
    arr = pa.array([None if v is None else {"scale": v[0], "value": decimal_base64(v[1])} for v in values],
                   pa.struct([("scale", pa.int32()), ("value", pa.string())]))
    schema = ConnectSchema("struct", connect.VARIABLE_SCALE_DECIMAL, fields=(("scale", ConnectSchema("int32")), ("value", ConnectSchema("bytes"))))
    got = convert(arr, schema, target, "ratio")
    want = [None if v is None else expected_decimal(v[1], v[0], target) for v in values]
    assert rows_of(got) == want
    assert sorted(got.errors) == [i for i, v in enumerate(values) if v is not None and want[i] is None]


# -- epoch numbers -------------------------------------------------------------------------------

INSTANT_UNITS = {connect.TIMESTAMP: "ms", connect.MICRO_TIMESTAMP: "us", connect.NANO_TIMESTAMP: "ns", connect.CONNECT_TIMESTAMP: "ms"}


@settings(max_examples=200)
@given(name=st.sampled_from(sorted(INSTANT_UNITS)), unit=st.sampled_from(["s", "ms", "us", "ns"]), tz=st.sampled_from([None, "UTC", "Asia/Kolkata"]),
       values=st.lists(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.integers(-(10**13), 10**13)), min_size=1, max_size=20))
def test_epoch_timestamps_into_any_unit(name, unit, tz, values):
    """Timestamp/MicroTimestamp/NanoTimestamp and Connect's Timestamp (epoch numbers, negative
    before 1970) into timestamp columns of any unit and zone: the same instant, or a bad row
    when the column's unit cannot hold it exactly or at all."""
    src = UNITS[INSTANT_UNITS[name]]
    dst = UNITS[unit]
    got = convert(pa.array(values, pa.int64()), ConnectSchema("int64", name), pa.timestamp(unit, tz), "at")
    want = []
    for v in values:
        if v is None:
            want.append(None)
            continue
        scaled, rem = divmod(v * dst, src)
        want.append(scaled if rem == 0 and -INT64 <= scaled < INT64 else None)
    assert got.array.type == pa.timestamp(unit, tz)
    assert got.array.cast(pa.int64()).to_pylist() == want
    assert sorted(got.errors) == [i for i, v in enumerate(values) if v is not None and want[i] is None]


def test_timestamps_before_1970_and_in_integer_and_text_columns():
    micros = [-1, -2_208_988_800_000_000, 1_700_000_000_123_456]  # just before 1970, 1900-01-01
    s = ConnectSchema("int64", connect.MICRO_TIMESTAMP)
    assert rows_of(convert(pa.array(micros), s, pa.timestamp("us"), "t")) == [
        dt.datetime(1969, 12, 31, 23, 59, 59, 999999), dt.datetime(1900, 1, 1), dt.datetime(2023, 11, 14, 22, 13, 20, 123456)]
    assert rows_of(convert(pa.array(micros), s, pa.int64(), "t")) == micros  # epoch numbers in an integer column, as before
    assert rows_of(convert(pa.array(micros[:1]), s, pa.string(), "t")) == ["1969-12-31 23:59:59.999999"]
    midnight = convert(pa.array([86_400_000_000 * -3, 5]), s, pa.date32(), "t")
    assert rows_of(midnight) == [dt.date(1969, 12, 29), None] and list(midnight.errors) == [1]


@settings(max_examples=100)
@given(days=st.lists(st.one_of(st.none(), st.integers(-800_000, 2_900_000)), min_size=1, max_size=20),
       name=st.sampled_from([connect.DATE, connect.CONNECT_DATE]))
def test_dates_before_and_after_1970(days, name):
    got = convert(pa.array(days, pa.int64()), ConnectSchema("int32", name), pa.date32(), "d")
    assert got.array.cast(pa.int32()).to_pylist() == days and not got.errors
    ts = convert(pa.array(days, pa.int64()), ConnectSchema("int32", name), pa.timestamp("ns"), "d")
    want = [None if d is None or abs(d * 86_400 * 10**9) >= INT64 else d * 86_400 * 10**9 for d in days]
    assert ts.array.cast(pa.int64()).to_pylist() == want


@pytest.mark.parametrize("name,unit", [(connect.TIME, "ms"), (connect.MICRO_TIME, "us"), (connect.NANO_TIME, "ns"), (connect.CONNECT_TIME, "ms")])
def test_times_of_day(name, unit):
    per_day = 86_400 * UNITS[unit]
    values = [0, per_day - 1, per_day, -1, 3600 * UNITS[unit], None]
    for target in (pa.time64("ns"), pa.time64("us"), pa.time32("ms"), pa.time32("s")):
        got = convert(pa.array(values, pa.int64()), ConnectSchema("int64", name), target, "t")
        want = []
        for v in values:
            if v is None or not 0 <= v < per_day:
                want.append(None)
                continue
            scaled, rem = divmod(v * UNITS[target.unit], UNITS[unit])
            want.append(scaled if rem == 0 else None)
        storage = pa.int32() if pa.types.is_time32(target) else pa.int64()
        assert got.array.view(storage).to_pylist() == want, target
        assert {2, 3} <= set(got.errors)


def test_durations():
    got = convert(pa.array([-5, 3_600_000_000, None]), ConnectSchema("int64", connect.MICRO_DURATION), pa.duration("ms"), "d")
    assert rows_of(got) == [None, dt.timedelta(hours=1), None] and list(got.errors) == [0]


# -- ISO strings ---------------------------------------------------------------------------------


@st.composite
def zoned(draw):
    """A ZonedTimestamp's text (with an offset, 0-9 fraction digits, years 1..9999), and its
    instant in nanoseconds since the epoch."""
    days = draw(st.integers(-719_162, 2_932_896))  # 0001-01-01 .. 9999-12-31
    secs = draw(st.integers(0, 86_399))
    digits = draw(st.integers(0, 9))
    frac = draw(st.integers(0, 10**digits - 1)) if digits else 0
    offset_min = draw(st.sampled_from([0, 60, -300, 330, 345, -720, 840]))
    local = dt.datetime(1970, 1, 1) + dt.timedelta(days=days, seconds=secs)
    zone = "Z" if offset_min == 0 and draw(st.booleans()) else f"{'+' if offset_min >= 0 else '-'}{abs(offset_min) // 60:02d}:{abs(offset_min) % 60:02d}"
    text = local.strftime("%Y-%m-%dT%H:%M:%S").rjust(19, "0") + (f".{frac:0{digits}d}" if digits else "") + zone
    nanos = (days * 86_400 + secs - offset_min * 60) * 10**9 + frac * 10 ** (9 - digits)
    return text, nanos


@settings(max_examples=300)
@given(values=st.lists(st.one_of(st.none(), zoned()), min_size=1, max_size=12), unit=st.sampled_from(["s", "ms", "us", "ns"]),
       tz=st.sampled_from([None, "UTC", "America/New_York"]))
def test_zoned_timestamps_are_their_utc_instant(values, unit, tz):
    got = convert(pa.array([None if v is None else v[0] for v in values]), ConnectSchema("string", connect.ZONED_TIMESTAMP),
                  pa.timestamp(unit, tz), "paid_at")
    want = []
    for v in values:
        if v is None:
            want.append(None)
            continue
        scaled, rem = divmod(v[1] * UNITS[unit], 10**9)
        want.append(scaled if rem == 0 and -INT64 <= scaled < INT64 else None)
    assert got.array.cast(pa.int64()).to_pylist() == want
    assert sorted(got.errors) == [i for i, v in enumerate(values) if v is not None and want[i] is None]


def test_iso_strings_that_are_not_instants_are_bad_rows_with_the_value():
    texts = ["infinity", "-infinity", "2020-02-30T00:00:00Z", "2020-01-01 00:00:00Z", "2020-01-01T00:00:00", "2021-03-04T05:06:07.5+01:00"]
    got = convert(pa.array(texts), ConnectSchema("string", connect.ZONED_TIMESTAMP), pa.timestamp("us", "UTC"), "paid_at")
    assert rows_of(got)[:5] == [None] * 5
    assert got.array.cast(pa.int64())[5].as_py() == (dt.datetime(2021, 3, 4, 4, 6, 7, 500000) - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1)
    assert sorted(got.errors) == [0, 1, 2, 3, 4]
    assert "'infinity'" in got.errors[0] and connect.ZONED_TIMESTAMP in got.errors[0] and "'paid_at'" in got.errors[0]
    # Java writes years past 9999 with a sign
    far = convert(pa.array(["+10000-01-01T00:00:00Z"]), ConnectSchema("string", connect.ZONED_TIMESTAMP), pa.timestamp("s"), "t")
    assert far.array.cast(pa.int64()).to_pylist() == [253_402_300_800]
    iso = convert(pa.array(["2019-07-09T02:28:57.123456Z"]), ConnectSchema("string", connect.ISO_TIMESTAMP), pa.timestamp("us"), "t")
    assert rows_of(iso) == [dt.datetime(2019, 7, 9, 2, 28, 57, 123456)]


def test_zoned_times_and_iso_dates():
    got = convert(pa.array(["10:15:30.030431Z", "23:30:00-02:00", "00:00:00+01:00", "25:00:00Z", None]),
                  ConnectSchema("string", connect.ZONED_TIME), pa.time64("us"), "t")
    assert rows_of(got) == [dt.time(10, 15, 30, 30431), dt.time(1, 30), dt.time(23, 0), None, None] and list(got.errors) == [3]
    dates = convert(pa.array(["2017-09-15Z", "1901-12-13Z", "2017-02-29Z"]), ConnectSchema("string", connect.ISO_DATE), pa.date32(), "d")
    assert rows_of(dates) == [dt.date(2017, 9, 15), dt.date(1901, 12, 13), None] and list(dates.errors) == [2]


# -- texts, bits, bytes, arrays ----------------------------------------------------------------------


def test_uuids_json_and_enums():
    ids = [str(uuid.UUID(int=i * 7919)) for i in range(3)]
    s = ConnectSchema("string", connect.UUID)
    assert rows_of(convert(pa.array(ids), s, pa.string(), "u")) == ids
    as_bytes = convert(pa.array(ids + ["not-a-uuid", None]), s, pa.binary(16), "u")
    assert rows_of(as_bytes) == [uuid.UUID(x).bytes for x in ids] + [None, None] and list(as_bytes.errors) == [3]
    typed = convert(pa.array(ids), s, pa.uuid(), "u")
    assert typed.array.type == pa.uuid() and rows_of(typed) == [uuid.UUID(x) for x in ids]
    doc = ['{"a": [1, 2]}', None]
    assert rows_of(convert(pa.array(doc), ConnectSchema("string", connect.JSON), pa.string(), "j")) == doc
    assert convert(pa.array(doc), ConnectSchema("string", connect.JSON), pa.json_(), "j").array.type == pa.json_()
    status = convert(pa.array(["new", "paid", "new"]), ConnectSchema("string", connect.ENUM, (("allowed", "new,paid"),)),
                     pa.dictionary(pa.int32(), pa.string()), "s")
    assert rows_of(status) == ["new", "paid", "new"]


def test_bits_and_plain_bytes():
    bits = ConnectSchema("bytes", connect.BITS, (("length", "12"),))
    b64 = [base64.b64encode(b).decode() for b in (b"\x01\x02", b"\xff\x0f", b"")]
    assert rows_of(convert(pa.array(b64), bits, pa.binary(), "b")) == [b"\x01\x02", b"\xff\x0f", b""]
    assert rows_of(convert(pa.array(b64), bits, pa.int32(), "b")) == [0x0201, 0x0FFF, 0]  # java.util.BitSet: little-endian
    plain = convert(pa.array([base64.b64encode(b"\x00raw\xff").decode(), None]), ConnectSchema("bytes"), pa.binary(), "blob")
    assert rows_of(plain) == [b"\x00raw\xff", None]
    fixed = convert(pa.array(b64), bits, pa.binary(2), "b")
    assert rows_of(fixed)[:2] == [b"\x01\x02", b"\xff\x0f"] and list(fixed.errors) == [2]


def test_arrays_of_semantic_items():
    s = ConnectSchema("array", items=dec_schema(2))
    arr = pa.array([[decimal_base64(150), None], None, [], [decimal_base64(10**12)]], pa.list_(pa.string()))
    got = convert(arr, s, pa.list_(pa.decimal128(6, 2)), "prices")
    assert rows_of(got) == [[decimal.Decimal("1.50"), None], None, [], None]
    assert list(got.errors) == [3] and "an item of column 'prices'" in got.errors[3]


# -- schemas -----------------------------------------------------------------------------------------


def test_schemas_from_the_json_and_the_avro_converter_and_their_arrow_types():
    field = {"type": "bytes", "optional": True, "name": connect.DECIMAL, "version": 1,
             "parameters": {"scale": "2", "connect.decimal.precision": "10"}, "field": "amount"}
    from_json = ConnectSchema.from_json(field)
    avro = ["null", {"type": "bytes", "scale": 2, "precision": 10, "connect.version": 1,
                     "connect.parameters": {"scale": "2", "connect.decimal.precision": "10"},
                     "connect.name": connect.DECIMAL, "logicalType": "decimal"}]
    from_avro = ConnectSchema.from_avro(avro)
    assert arrow_type(from_json) == arrow_type(from_avro) == pa.decimal128(10, 2)
    assert from_json.optional and from_avro.optional
    assert arrow_type(dec_schema(4, 60)) == pa.decimal256(60, 4)
    cases = {
        connect.MICRO_TIMESTAMP: pa.timestamp("us"), connect.TIMESTAMP: pa.timestamp("ms"), connect.NANO_TIMESTAMP: pa.timestamp("ns"),
        connect.ZONED_TIMESTAMP: pa.timestamp("us", "UTC"), connect.DATE: pa.date32(), connect.CONNECT_DATE: pa.date32(),
        connect.MICRO_TIME: pa.time64("us"), connect.TIME: pa.time32("ms"), connect.ZONED_TIME: pa.time64("us"),
        connect.UUID: pa.string(), connect.JSON: pa.string(), connect.ENUM: pa.string(), connect.BITS: pa.binary(),
        connect.MICRO_DURATION: pa.duration("us"), connect.VARIABLE_SCALE_DECIMAL: pa.decimal256(76, 38),
    }
    for name, t in cases.items():
        assert arrow_type(ConnectSchema("int64", name)) == t, name
    for logical, t in {"timestamp-micros": pa.timestamp("us"), "date": pa.date32(), "timestamp-millis": pa.timestamp("ms"),
                       "time-micros": pa.time64("us"), "local-timestamp-micros": pa.timestamp("us")}.items():
        base = "int" if logical == "date" else "long"
        assert arrow_type(ConnectSchema.from_avro({"type": base, "logicalType": logical})) == t, logical
    named = ConnectSchema.from_avro({"type": "long", "connect.version": 1, "connect.name": connect.MICRO_TIMESTAMP})
    assert named.name == connect.MICRO_TIMESTAMP and parse_type(named, pa.timestamp("us"), pa.binary()) == pa.int64()
    vsd = ConnectSchema.from_avro({"type": "record", "name": "VariableScaleDecimal", "namespace": "io.debezium.data",
                                   "fields": [{"name": "scale", "type": "int"}, {"name": "value", "type": "bytes"}],
                                   "connect.doc": "Variable scaled decimal", "connect.version": 1, "connect.name": connect.VARIABLE_SCALE_DECIMAL})
    assert vsd.name == connect.VARIABLE_SCALE_DECIMAL
    assert parse_type(vsd, pa.decimal128(20, 4), pa.string()) == pa.struct([("scale", pa.int32()), ("value", pa.string())])
    plain = ConnectSchema("int64")
    assert parse_type(plain, pa.int64(), pa.string()) == pa.int64() and convert(pa.array([1]), plain, pa.int64(), "x").array.to_pylist() == [1]
