"""Kafka Connect and Debezium semantic types: what a field of a change event means, and its
values turned into a table's Arrow column, vectorized and exact.

A Connect schema gives each field a literal type (``int32``, ``int64``, ``string``,
``bytes``, ``struct``...) and, for many, a semantic name (``org.apache.kafka.connect.data.Decimal``,
``io.debezium.time.MicroTimestamp``...) with parameters (a decimal's ``scale``). Kafka
Connect's JSON converter writes the literal value (a decimal as its unscaled big-endian
two's-complement bytes in base64, a timestamp as a number), and so does the Avro converter
(raw bytes, longs; it adds Avro logical types for Connect's own decimal, date, time and
timestamp). :class:`ConnectSchema` reads a field's schema from either; :func:`parse_type`
says what Arrow type a reader should read the literal as, and :func:`convert` turns a column
of literals into the table column's type.

**Exactly or not at all.** A value that cannot be stored exactly in the column (a decimal
with more digits than the column's precision or scale, a nanosecond timestamp with a
sub-microsecond part in a microsecond column, a date outside the column's range, a string
that is not an ISO instant) is not rounded or clipped: its row is reported with a reason
naming the column and the semantic type, and becomes a dead letter. Decimals go into float
columns (approximately) only when the table's column is a float: the table's type is the ask.

**Vectorized.** Every conversion works on whole columns with numpy and Arrow compute:
base64 and two's complement are decoded over the column's data buffer, ISO strings are split
by one regular-expression kernel and assembled with integer arithmetic; Python runs per
distinct schema, per distinct scale of a ``VariableScaleDecimal`` column, and per bad row
(for its reason), never per good row.

**Time zones.** Debezium's ``Timestamp``/``MicroTimestamp``/``NanoTimestamp`` (and Connect's
``Timestamp``) carry a ``TIMESTAMP WITHOUT TIME ZONE`` as the epoch value of its wall-clock
time read as UTC; a naive timestamp column keeps that wall-clock time, and a column with a
time zone holds the same epoch value (the wall-clock time taken as UTC). ``ZonedTimestamp``
is an ISO string with an offset: it is converted to its UTC instant, which is what every
Arrow timestamp column stores (a naive column then holds UTC wall-clock time).
``ZonedTime`` becomes its time of day in UTC.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# -- semantic names ----------------------------------------------------------------------------

DECIMAL = "org.apache.kafka.connect.data.Decimal"
CONNECT_DATE = "org.apache.kafka.connect.data.Date"
CONNECT_TIME = "org.apache.kafka.connect.data.Time"
CONNECT_TIMESTAMP = "org.apache.kafka.connect.data.Timestamp"
VARIABLE_SCALE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
DATE = "io.debezium.time.Date"
TIME = "io.debezium.time.Time"
MICRO_TIME = "io.debezium.time.MicroTime"
NANO_TIME = "io.debezium.time.NanoTime"
TIMESTAMP = "io.debezium.time.Timestamp"
MICRO_TIMESTAMP = "io.debezium.time.MicroTimestamp"
NANO_TIMESTAMP = "io.debezium.time.NanoTimestamp"
ZONED_TIMESTAMP = "io.debezium.time.ZonedTimestamp"
ZONED_TIME = "io.debezium.time.ZonedTime"
ISO_DATE = "io.debezium.time.IsoDate"
ISO_TIME = "io.debezium.time.IsoTime"
ISO_TIMESTAMP = "io.debezium.time.IsoTimestamp"
MICRO_DURATION = "io.debezium.time.MicroDuration"
NANO_DURATION = "io.debezium.time.NanoDuration"
UUID = "io.debezium.data.Uuid"
JSON = "io.debezium.data.Json"
ENUM = "io.debezium.data.Enum"
ENUM_SET = "io.debezium.data.EnumSet"
XML = "io.debezium.data.Xml"
BITS = "io.debezium.data.Bits"

#: Epoch instants: name -> unit of the int64 value.
INSTANTS = {TIMESTAMP: "ms", MICRO_TIMESTAMP: "us", NANO_TIMESTAMP: "ns", CONNECT_TIMESTAMP: "ms"}
#: Times of day (since midnight): name -> unit.
TIMES = {TIME: "ms", MICRO_TIME: "us", NANO_TIME: "ns", CONNECT_TIME: "ms"}
#: Days since the epoch.
DATES = frozenset({DATE, CONNECT_DATE})
#: Durations: name -> unit.
DURATIONS = {MICRO_DURATION: "us", NANO_DURATION: "ns"}
#: Text whose meaning needs no conversion (kept as strings, or in a JSON or dictionary column).
TEXTS = frozenset({JSON, ENUM, ENUM_SET, XML, UUID})
#: Avro logical types and the Connect or Debezium semantic type they carry the same values as.
AVRO_LOGICAL = {
    "date": CONNECT_DATE,
    "time-millis": CONNECT_TIME,
    "time-micros": MICRO_TIME,
    "timestamp-millis": CONNECT_TIMESTAMP,
    "timestamp-micros": MICRO_TIMESTAMP,
    "timestamp-nanos": NANO_TIMESTAMP,
    "local-timestamp-millis": TIMESTAMP,
    "local-timestamp-micros": MICRO_TIMESTAMP,
    "local-timestamp-nanos": NANO_TIMESTAMP,
    "uuid": UUID,
}

_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
_SECONDS_PER_DAY = 86_400
_INT64_MAX = np.iinfo(np.int64).max


@dataclass(frozen=True)
class ConnectSchema:
    """One field's Kafka Connect schema: the literal type, the semantic name and parameters,
    and the schemas of its items (arrays, map values), keys (maps) or fields (structs)."""

    type: str
    name: str | None = None
    parameters: tuple[tuple[str, str], ...] = ()
    optional: bool = True
    items: "ConnectSchema | None" = None
    keys: "ConnectSchema | None" = None
    fields: tuple[tuple[str, "ConnectSchema"], ...] = ()

    def param(self, key: str) -> str | None:
        return dict(self.parameters).get(key)

    def field(self, name: str) -> "ConnectSchema | None":
        return dict(self.fields).get(name)

    def describe(self) -> str:
        """The semantic type in words, for reasons: its name (with a decimal's scale), else the literal type."""
        if self.name == DECIMAL:
            return f"{DECIMAL}, scale {self.param('scale')}"
        return self.name or self.type

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "ConnectSchema":
        """A schema as Kafka Connect's JSON converter writes it (``{"type": ..., "name": ...,
        "parameters": {...}, "fields": [{..., "field": name}]}``)."""
        if not isinstance(obj, Mapping) or not isinstance(obj.get("type"), str):
            raise ValueError(f"not a Kafka Connect schema: {json.dumps(obj)[:200]}")
        params = obj.get("parameters") or {}
        return cls(
            type=obj["type"],
            name=obj.get("name") if isinstance(obj.get("name"), str) else None,
            parameters=tuple((str(k), str(v)) for k, v in params.items()) if isinstance(params, Mapping) else (),
            optional=bool(obj.get("optional", False)),
            items=cls.from_json(obj["items"]) if isinstance(obj.get("items"), Mapping) else
            (cls.from_json(obj["values"]) if isinstance(obj.get("values"), Mapping) else None),
            keys=cls.from_json(obj["keys"]) if isinstance(obj.get("keys"), Mapping) else None,
            fields=tuple((str(f["field"]), cls.from_json(f)) for f in obj.get("fields") or () if isinstance(f, Mapping) and "field" in f),
        )

    @classmethod
    def from_avro(cls, schema: Any, named: dict[str, Any] | None = None, namespace: str | None = None) -> "ConnectSchema":
        """A schema as Confluent's Avro converter writes it: Avro types with ``connect.name``,
        ``connect.parameters`` and Avro logical types (``decimal``, ``date``, ``timestamp-micros``...);
        a union of ``null`` and one type is that type, optional. ``named`` collects the named
        types met so far (references to them are by name)."""
        named = {} if named is None else named
        if isinstance(schema, list):
            rest = [s for s in schema if s != "null"]
            inner = cls.from_avro(rest[0], named, namespace) if len(rest) == 1 else cls("union")
            return _replace(inner, optional=True)
        if isinstance(schema, str):
            if schema in named or f"{namespace}.{schema}" in named:
                return named.get(schema) or named[f"{namespace}.{schema}"]
            return cls(_AVRO_PRIMITIVE.get(schema, schema), optional=False)
        t = schema.get("type")
        name = schema.get("connect.name")
        params = dict(schema.get("connect.parameters") or {})
        logical = schema.get("logicalType")
        if logical == "decimal":
            name = DECIMAL
            params.setdefault("scale", str(schema.get("scale", 0)))
            if "precision" in schema:
                params.setdefault("connect.decimal.precision", str(schema["precision"]))
        elif logical in AVRO_LOGICAL and name is None:
            name = AVRO_LOGICAL[logical]
        ns = schema.get("namespace", namespace)
        full = None
        if t in ("record", "enum", "fixed") and "name" in schema:
            full = schema["name"] if "." in schema["name"] or not ns else f"{ns}.{schema['name']}"
        if t == "record":
            if name is None and full in (VARIABLE_SCALE_DECIMAL,):
                name = full
            fields = tuple((f["name"], cls.from_avro(f["type"], named, ns)) for f in schema.get("fields", []))
            out = cls("struct", name, tuple(params.items()), False, fields=fields)
        elif t == "array":
            out = cls("array", name, tuple(params.items()), False, items=cls.from_avro(schema["items"], named, ns))
        elif t == "map":
            out = cls("map", name, tuple(params.items()), False, items=cls.from_avro(schema["values"], named, ns),
                      keys=cls("string", optional=False))
        elif t == "enum":
            out = cls("string", name, tuple(params.items()), False)
        elif t == "fixed":
            out = cls("bytes", name, tuple(params.items()), False)
        elif isinstance(t, (str, list, dict)) and t not in _AVRO_PRIMITIVE:
            out = cls.from_avro(t, named, ns)  # {"type": "Name"} or {"type": {...}}: the inner type
            out = _replace(out, name=name or out.name, parameters=tuple(params.items()) or out.parameters)
        else:
            literal = schema.get("connect.type") or _AVRO_PRIMITIVE[t]
            out = cls(literal, name, tuple(params.items()), False)
        if full is not None:
            named[full] = out
        return out


_AVRO_PRIMITIVE = {"null": "null", "boolean": "boolean", "int": "int32", "long": "int64", "float": "float32",
                   "double": "float64", "bytes": "bytes", "string": "string"}


def _replace(s: ConnectSchema, **changes: Any) -> ConnectSchema:
    return ConnectSchema(**{**s.__dict__, **changes})


# -- the Arrow types -----------------------------------------------------------------------------


def arrow_type(s: ConnectSchema) -> pa.DataType:
    """The natural Arrow column type of a field (what ``memwal init --schema-from-debezium``
    gives the table): decimals with their precision and scale, times and timestamps in their
    unit (``ZonedTimestamp``: microseconds in UTC), texts as strings, bits and bytes as binary."""
    name = s.name
    if name == DECIMAL:
        scale = int(s.param("scale") or 0)
        precision = int(s.param("connect.decimal.precision") or 0) or 38
        precision = max(precision, scale, 1)
        return pa.decimal128(precision, scale) if precision <= 38 else pa.decimal256(precision, scale)
    if name == VARIABLE_SCALE_DECIMAL:
        # No fixed scale: the widest decimal, as many digits after the point as before.
        return pa.decimal256(76, 38)
    if name in INSTANTS:
        return pa.timestamp(INSTANTS[name])
    if name in (ZONED_TIMESTAMP,):
        return pa.timestamp("us", "UTC")
    if name == ISO_TIMESTAMP:
        return pa.timestamp("us")
    if name in TIMES:
        unit = TIMES[name]
        return pa.time32(unit) if unit in ("s", "ms") else pa.time64(unit)
    if name in (ZONED_TIME, ISO_TIME):
        return pa.time64("us")
    if name in DATES or name == ISO_DATE:
        return pa.date32()
    if name in DURATIONS:
        return pa.duration(DURATIONS[name])
    if name in TEXTS:
        return pa.string()
    if name == BITS:
        return pa.binary()
    literal = {"int8": pa.int8(), "int16": pa.int16(), "int32": pa.int32(), "int64": pa.int64(), "float32": pa.float32(),
               "float64": pa.float64(), "boolean": pa.bool_(), "string": pa.string(), "bytes": pa.binary()}
    if s.type in literal:
        return literal[s.type]
    if s.type == "array" and s.items is not None:
        return pa.list_(arrow_type(s.items))
    if s.type == "map" and s.items is not None and s.keys is not None:
        return pa.map_(arrow_type(s.keys), arrow_type(s.items))
    if s.type == "struct":
        return pa.struct([pa.field(n, arrow_type(f), nullable=f.optional) for n, f in s.fields])
    raise ValueError(f"the Kafka Connect type {s.describe()} has no Arrow type")


def semantic(s: ConnectSchema | None) -> bool:
    """Whether a field's values need :func:`convert` (else the reader reads them as the column's type)."""
    if s is None:
        return False
    if s.type == "array":
        return semantic(s.items)
    return s.type == "bytes" or s.name in _CONVERTED


_CONVERTED = frozenset({DECIMAL, VARIABLE_SCALE_DECIMAL, *INSTANTS, *TIMES, *DATES, *DURATIONS, ZONED_TIMESTAMP,
                        ZONED_TIME, ISO_DATE, ISO_TIME, ISO_TIMESTAMP, *TEXTS, BITS})


def parse_type(s: ConnectSchema | None, target: pa.DataType, bytes_type: pa.DataType) -> pa.DataType:
    """The Arrow type a reader reads a field's literal values as, before :func:`convert`:
    ``target`` (the column's type, as Arrow's JSON reader can produce it) for fields without
    a semantic type; ``bytes_type`` for bytes (``pa.string()`` for the JSON converter's
    base64, ``pa.binary()`` for Avro)."""
    if not semantic(s):
        return target
    assert s is not None
    if s.type == "array":
        inner = target.value_type if pa.types.is_list(target) or pa.types.is_large_list(target) or pa.types.is_fixed_size_list(target) else target
        return pa.list_(parse_type(s.items, inner, bytes_type))
    if s.name == VARIABLE_SCALE_DECIMAL:
        return pa.struct([pa.field("scale", pa.int32()), pa.field("value", bytes_type)])
    if s.type == "bytes":
        return bytes_type
    if s.type in ("int8", "int16", "int32", "int64"):
        return pa.int64()
    return pa.string()


# -- conversion ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Converted:
    """A converted column: values of the target type (null where the row is bad) and, per bad row, why."""

    array: pa.Array
    errors: dict[int, str]


def convert(parsed: pa.Array | pa.ChunkedArray, s: ConnectSchema | None, target: pa.DataType, column: str) -> Converted:
    """``parsed`` (read as :func:`parse_type` says) as a column of ``target``; rows whose value
    cannot be stored exactly are null with their reason (naming ``column`` and the semantic type)."""
    arr = parsed.combine_chunks() if isinstance(parsed, pa.ChunkedArray) else parsed
    if not semantic(s):
        return Converted(arr, {})
    assert s is not None
    c = _Conversion(arr, s, target, column)
    return c.run()


class _Conversion:
    """One column's conversion: the values, their validity and the bad rows found so far."""

    def __init__(self, arr: pa.Array, s: ConnectSchema, target: pa.DataType, column: str) -> None:
        self.arr = arr
        self.s = s
        self.target = target
        self.column = column
        self.n = len(arr)
        self.valid = np.asarray(arr.is_valid(), bool) if arr.null_count else np.ones(self.n, bool)
        self.errors: dict[int, str] = {}

    def bad(self, mask: np.ndarray, why: str | Iterable[str]) -> None:
        """Mark the valid rows of ``mask`` bad (``why``: one reason, or one per marked row)."""
        rows = np.flatnonzero(mask & self.valid)
        whys = [why] * len(rows) if isinstance(why, str) else list(why)
        for i, w in zip(rows, whys):
            self.errors.setdefault(int(i), f"column {self.column!r} ({self.s.describe()}): {w}")
        self.valid = self.valid & ~mask

    def unsupported(self) -> Converted:
        self.bad(np.ones(self.n, bool), f"a value of this type cannot be stored in a {self.target} column")
        return Converted(pa.nulls(self.n, self.target), self.errors)

    def run(self) -> Converted:
        s, name = self.s, self.s.name
        if s.type == "array":
            return self.array()
        if name == DECIMAL:
            return self.decimal()
        if name == VARIABLE_SCALE_DECIMAL:
            return self.variable_scale_decimal()
        if name in INSTANTS:
            return self.epoch(INSTANTS[name], "instant")
        if name in TIMES:
            return self.epoch(TIMES[name], "time")
        if name in DATES:
            return self.days(self.ints())
        if name in DURATIONS:
            return self.epoch(DURATIONS[name], "duration")
        if name in (ZONED_TIMESTAMP, ISO_TIMESTAMP):
            return self.iso_instant()
        if name in (ZONED_TIME, ISO_TIME):
            return self.iso_time()
        if name == ISO_DATE:
            return self.iso_date()
        if name == UUID and (pa.types.is_fixed_size_binary(self.target) or pa.types.is_binary(self.target)
                             or isinstance(self.target, pa.UuidType)):
            return self.uuid_bytes()
        if name in TEXTS:
            return self.text()
        if s.type == "bytes":  # Bits and plain bytes
            return self.bytes()
        return Converted(self.arr, {})

    # -- results

    def done(self, values: np.ndarray | pa.Array, arrow_type: pa.DataType | None = None) -> Converted:
        """The column from numpy values (of ``arrow_type``, the target's storage by default) or
        an Arrow array, with the bad and null rows null."""
        mask = ~self.valid
        if isinstance(values, np.ndarray):
            out = pa.array(values, type=arrow_type or _storage(self.target), mask=mask if mask.any() else None)
            if out.type != self.target:
                out = out.view(self.target) if _same_width(out.type, self.target) else out.cast(self.target)
            return Converted(out, self.errors)
        out = values
        if mask.any() and out.null_count < mask.sum():
            out = pc.if_else(pa.array(self.valid), out, pa.nulls(self.n, out.type))
        return Converted(out if out.type == self.target else out.cast(self.target), self.errors)

    def ints(self) -> np.ndarray:
        """The column's integers as int64 (0 where null)."""
        return np.asarray(self.arr.cast(pa.int64()).fill_null(0), np.int64)

    # -- decimals

    def decimal(self) -> Converted:
        flat, starts, lengths = self.byte_segments(self.arr)
        return self.decimal_from_bytes(flat, starts, lengths, int(self.s.param("scale") or 0))

    def decimal_from_bytes(self, flat: np.ndarray, starts: np.ndarray, lengths: np.ndarray, scale: int) -> Converted:
        """Unscaled big-endian two's-complement integers of ``scale`` into the target: a decimal
        column (exactly: no digit dropped, none beyond its precision), an integer column (the
        same, at scale 0), or a float or text column (the value as it is, then cast)."""
        t = self.target
        if pa.types.is_decimal(t):
            width = 32 if isinstance(t, pa.Decimal256Type) else 16
            precision, target_scale = t.precision, t.scale
        elif pa.types.is_integer(t):
            width, precision, target_scale = 16, 38, 0
        elif pa.types.is_floating(t) or pa.types.is_string(t) or pa.types.is_large_string(t):
            width, precision, target_scale = 32, 76, None
        else:
            return self.unsupported()
        self.bad(lengths == 0, "no bytes (a decimal's unscaled value needs at least one)")
        words = self.twos_complement(flat, starts, lengths, width)
        words[~self.valid] = 0
        if target_scale is None:  # a float or text column takes the value as it is
            source = _decimal_array(words, scale, self.valid)
            return self.done(source.cast(pa.float64()).cast(t) if pa.types.is_floating(t) else source.cast(pa.string()).cast(t))
        shift = target_scale - scale
        before_point = f"digit(s) before the point (the column is {t})"
        if shift >= 0:  # more fractional digits in the column: exact if the digits fit
            big = ~_abs_below(words, 10 ** max(precision - shift, 0))
            self.bad(big, (f"{_decimal_text(words[i], scale)} has more than {precision - target_scale} {before_point}"
                           for i in np.flatnonzero(big & self.valid)))
            words[~self.valid] = 0
            source = _decimal_array(words, scale, self.valid)
            scaled = source.cast(_decimal_type(width, target_scale), safe=True) if shift else source
        else:  # fewer: exact only if the digits dropped are zeros
            source = _decimal_array(words, scale, self.valid)
            scaled = source.cast(_decimal_type(width, target_scale), safe=False)
            lost = ~np.asarray(pc.equal(scaled.cast(source.type, safe=False), source).fill_null(True), bool)
            self.bad(lost, (f"{_decimal_text(words[i], scale)} has more than {target_scale} digit(s) after the point (the column is {t})"
                            for i in np.flatnonzero(lost & self.valid)))
            big = ~_abs_below(_words_of(scaled, width), 10 ** precision)
            self.bad(big, (f"{_decimal_text(words[i], scale)} has more than {precision - target_scale} {before_point}"
                           for i in np.flatnonzero(big & self.valid)))
        out_words = _words_of(scaled, width)
        out_words[~self.valid] = 0
        if pa.types.is_integer(t):
            return self.decimal_to_int(out_words)
        result = _decimal_array(out_words, target_scale, self.valid, precision)
        return self.done(result if result.type == t else result.cast(t))

    def decimal_to_int(self, words: np.ndarray) -> Converted:
        """128-bit integers (two words per row) into the integer target, if they fit."""
        t = self.target
        lo, hi = words[:, 0], words[:, 1]
        info = np.iinfo(t.to_pandas_dtype())
        if info.min == 0:
            fits = (hi == 0) & (lo <= np.uint64(info.max))
            values = lo
        else:
            fits = ((hi == 0) & (lo < np.uint64(1 << 63))) | ((hi == np.uint64(2**64 - 1)) & (lo >= np.uint64(1 << 63)))
            values = lo.view(np.int64)
            fits &= (values >= info.min) & (values <= info.max)
        self.bad(~fits, f"does not fit a {t} column")
        return self.done(np.where(self.valid, values, 0).astype(t.to_pandas_dtype()), t)

    def variable_scale_decimal(self) -> Converted:
        arr = self.arr
        scales = arr.field("scale")
        values = arr.field("value")
        self.bad(np.asarray(scales.is_null(), bool) | np.asarray(values.is_null(), bool), "no 'scale' or 'value'")
        scale = np.asarray(scales.fill_null(0), np.int64)
        parts: list[tuple[np.ndarray, pa.Array]] = []
        for sc in np.unique(scale[self.valid]):
            rows = np.flatnonzero(self.valid & (scale == sc))
            sub = _Conversion(values.take(pa.array(rows, pa.int64())), self.s, self.target, self.column)
            flat, starts, lengths = sub.byte_segments(sub.arr)
            got = sub.decimal_from_bytes(flat, starts, lengths, int(sc))
            for j, why in got.errors.items():
                self.errors.setdefault(int(rows[j]), why.replace(f"({self.s.describe()})", f"({self.s.describe()}, scale {sc})"))
            parts.append((rows, got.array))
        self.valid &= ~np.isin(np.arange(self.n), np.fromiter(self.errors, np.int64, len(self.errors)))
        if not parts:
            return self.done(pa.nulls(self.n, self.target))
        order = np.concatenate([r for r, _ in parts])
        joined = pa.concat_arrays([a for _, a in parts] + [pa.nulls(1, self.target)])
        at = np.full(self.n, len(order), np.int64)  # the trailing null
        at[order] = np.arange(len(order))
        return self.done(joined.take(pa.array(at, pa.int64())))

    # -- bytes

    def byte_segments(self, arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The bytes of each row as (flat bytes, start, length): raw for binary columns (Avro),
        decoded from base64 for strings (the JSON converter); rows that are not base64 are bad."""
        if pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type) or pa.types.is_fixed_size_binary(arr.type):
            arr = arr.cast(pa.binary()) if not pa.types.is_binary(arr.type) else arr
            offsets = np.frombuffer(arr.buffers()[1], np.int32, len(arr) + 1, arr.offset * 4).astype(np.int64)
            data = arr.buffers()[2]
            flat = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
            lengths = np.where(self.valid, np.diff(offsets), 0)
            return flat, offsets[:-1], lengths
        flat, starts, lengths, wrong = base64_segments(arr, self.valid)
        self.bad(wrong, "not base64")
        return flat, starts, np.where(self.valid, lengths, 0)

    def twos_complement(self, flat: np.ndarray, starts: np.ndarray, lengths: np.ndarray, width: int) -> np.ndarray:
        """Each row's big-endian two's-complement bytes as ``width // 8`` little-endian uint64 words;
        a row of more bytes than ``width`` is bad unless the extra bytes only extend the sign."""
        words, too_long = twos_complement_words(flat, starts, np.where(self.valid, lengths, 0), width)
        self.bad(too_long, f"more than {width * 8} bits")
        return words

    def bytes(self) -> Converted:
        t = self.target
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            if pa.types.is_string(self.arr.type):  # plain bytes into a text column: the base64 text, as before
                return self.done(self.arr)
            return self.unsupported()
        flat, starts, lengths = self.byte_segments(self.arr)
        if pa.types.is_integer(t) and self.s.name == BITS:
            width = t.bit_width // 8
            self.bad(lengths > width, f"more bits than a {t} column holds")
            padded = np.zeros((self.n, 8), np.uint8)
            k = np.where(self.valid, lengths, 0)
            rows = np.repeat(np.arange(self.n), k)
            j = np.arange(int(k.sum())) - np.repeat(np.cumsum(k) - k, k)
            padded[rows, j] = flat[np.repeat(starts, k) + j]  # little-endian: the BitSet's byte order
            values = padded.view(np.uint64).ravel()
            if not pa.types.is_unsigned_integer(t):
                self.bad(values > np.uint64(np.iinfo(t.to_pandas_dtype()).max), f"more bits than a {t} column holds")
            return self.done(np.where(self.valid, values, 0).astype(t.to_pandas_dtype()), t)
        if pa.types.is_fixed_size_binary(t):
            self.bad(lengths != t.byte_width, f"not {t.byte_width} bytes")
        elif not (pa.types.is_binary(t) or pa.types.is_large_binary(t)):
            return self.unsupported()
        return self.done(segments_to_binary(flat, starts, np.where(self.valid, lengths, 0), self.valid).cast(t))

    def uuid_bytes(self) -> Converted:
        """A UUID's text as its 16 bytes (a binary, fixed-size binary or ``pa.uuid()`` column)."""
        text = self.arr.cast(pa.string())
        ok = np.asarray(pc.match_substring_regex(text, _UUID_RE).fill_null(False), bool)
        self.bad(~ok, "not a UUID")
        hexes = pc.replace_substring(pc.if_else(pa.array(self.valid), text, "0" * 36), "-", "")
        start = int(np.frombuffer(hexes.buffers()[1], np.int32, 1, hexes.offset)[0]) if self.n else 0
        raw = np.frombuffer(hexes.buffers()[2], np.uint8, self.n * 32, start).reshape(self.n, 32) if self.n else np.zeros((0, 32), np.uint8)
        nibbles = _HEX[raw]
        data = (nibbles[:, 0::2] << 4 | nibbles[:, 1::2]).astype(np.uint8)
        mask = None if self.valid.all() else pa.py_buffer(np.packbits(self.valid, bitorder="little").tobytes())
        fixed = pa.Array.from_buffers(pa.binary(16), self.n, [mask, pa.py_buffer(data.tobytes())])
        if isinstance(self.target, pa.UuidType):
            return Converted(pa.ExtensionArray.from_storage(self.target, fixed), self.errors)
        return self.done(fixed)

    def text(self) -> Converted:
        t = self.target
        if isinstance(t, pa.ExtensionType) and pa.types.is_string(t.storage_type):
            return self.done(pa.ExtensionArray.from_storage(t, self.arr.cast(t.storage_type)))
        if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_dictionary(t) or pa.types.is_binary(t):
            return self.done(self.arr.cast(t))
        return self.unsupported()

    # -- times

    def epoch(self, unit: str, kind: str) -> Converted:
        """Integers counting ``unit`` since the epoch (``instant``), since midnight (``time``) or
        not anchored (``duration``), into the target column."""
        t = self.target
        values = self.ints()
        per_day = _PER_SECOND[unit] * _SECONDS_PER_DAY
        if kind == "time" and not pa.types.is_integer(t):
            self.bad((values < 0) | (values >= per_day), "is not a time of day (from 00:00 up to 24:00)")
        if pa.types.is_integer(t):  # the number as it is (epoch numbers in integer columns)
            info = np.iinfo(t.to_pandas_dtype())
            self.bad((values < info.min) | (values > info.max), f"does not fit a {t} column")
            return self.done(np.where(self.valid, values, 0).astype(t.to_pandas_dtype()), t)
        if kind == "instant" and pa.types.is_timestamp(t):
            return self.done(self.rescale(values, unit, t.unit), pa.int64())
        if kind == "instant" and pa.types.is_date(t):
            self.bad(values % per_day != 0, "is not at midnight (the column is a date)")
            return self.days(values // per_day)
        if kind == "time" and pa.types.is_time(t):
            out = self.rescale(values, unit, t.unit)
            return self.done(out.astype(np.int32) if pa.types.is_time32(t) else out, _storage(t))
        if kind == "duration" and pa.types.is_duration(t):
            return self.done(self.rescale(values, unit, t.unit), pa.int64())
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            natural = {"instant": pa.timestamp(unit), "duration": pa.duration(unit),
                       "time": pa.time32(unit) if unit in ("s", "ms") else pa.time64(unit)}[kind]
            raw = pa.array(np.where(self.valid, values, 0), pa.int64()).cast(_storage(natural)).view(natural)
            return self.done(raw.cast(pa.string()))
        return self.unsupported()

    def rescale(self, values: np.ndarray, unit: str, to: str) -> np.ndarray:
        """``values`` in ``unit`` as ``to``: exact (a finer part that does not divide is a bad row)
        and in range (a coarser value that overflows int64 in the finer unit is a bad row)."""
        a, b = _PER_SECOND[unit], _PER_SECOND[to]
        if a == b:
            return values
        if b > a:
            factor = b // a
            self.bad(_beyond(values, _INT64_MAX // factor), f"is out of the range of the column's unit ({to})")
            return np.where(self.valid, values, 0) * factor
        factor = a // b
        self.bad(values % factor != 0, f"has a part finer than the column's unit ({to})")
        return values // factor

    def days(self, days: np.ndarray) -> Converted:
        t = self.target
        if pa.types.is_date32(t):
            self.bad((days < -(2**31)) | (days >= 2**31), "is out of the range of a date32 column")
            return self.done(np.where(self.valid, days, 0).astype(np.int32), pa.int32())
        if pa.types.is_date64(t):
            return self.done(self.rescale_days(days, "ms"), pa.int64())
        if pa.types.is_timestamp(t):
            return self.done(self.rescale_days(days, t.unit), pa.int64())
        if pa.types.is_integer(t):
            info = np.iinfo(t.to_pandas_dtype())
            self.bad((days < info.min) | (days > info.max), f"does not fit a {t} column")
            return self.done(days.astype(t.to_pandas_dtype()), t)
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            self.bad((days < -(2**31)) | (days >= 2**31), "is out of the range of a date")
            return self.done(pa.array(np.where(self.valid, days, 0).astype(np.int32), mask=~self.valid).cast(pa.date32()).cast(pa.string()).cast(t))
        return self.unsupported()

    def rescale_days(self, days: np.ndarray, unit: str) -> np.ndarray:
        per_day = _PER_SECOND[unit] * _SECONDS_PER_DAY
        self.bad(_beyond(days, _INT64_MAX // per_day), f"is out of the range of the column's unit ({unit})")
        return np.where(self.valid, days, 0) * per_day

    def iso_parts(self, pattern: str) -> dict[str, np.ndarray | pa.Array]:
        text = self.arr.cast(pa.string())
        parts = pc.extract_regex(text, pattern)
        self.bad(~np.asarray(parts.is_valid(), bool), (f"{text[int(i)].as_py()!r} is not an ISO 8601 value of this type"
                                                       for i in np.flatnonzero(~np.asarray(parts.is_valid(), bool) & self.valid)))
        out: dict[str, np.ndarray | pa.Array] = {}
        for f in parts.type:
            col = pc.struct_field(parts, f.name)
            if f.name == "f":
                out[f.name] = np.asarray(pc.cast(pc.utf8_rpad(pc.if_else(pc.equal(col, ""), "0", col), 9, "0"), pa.int64()).fill_null(0), np.int64)
            elif f.name == "z":
                out[f.name] = _offset_seconds(col)
            else:
                digits = pc.utf8_ltrim(pc.if_else(pc.equal(col, ""), "0", col), "+")  # Java writes years past 9999 as +10000
                out[f.name] = np.asarray(pc.cast(digits, pa.int64()).fill_null(0), np.int64)
        return out

    def iso_instant(self) -> Converted:
        t = self.target
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            return self.text()
        if not pa.types.is_timestamp(t):
            return self.unsupported()
        try:  # Arrow's ISO 8601 cast takes what Debezium writes (an offset, up to the unit's digits), all or nothing
            parsed = self.arr.cast(pa.string()).cast(pa.timestamp(t.unit, "UTC"))
            return self.done(parsed.view(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False), pa.int64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass  # a value it cannot take: each row's reason from the parts
        p = self.iso_parts(_ISO_INSTANT)
        days, ok_date = _days_from_civil(p["y"], p["m"], p["d"])
        ok = ok_date & (p["H"] < 24) & (p["M"] < 60) & (p["S"] < 60)
        self.bad(~ok, "is not a valid date and time")
        seconds = days * _SECONDS_PER_DAY + p["H"] * 3600 + p["M"] * 60 + p["S"] - p["z"]
        return self.done(self.from_seconds(seconds, p["f"], t.unit), pa.int64())

    def from_seconds(self, seconds: np.ndarray, nanos: np.ndarray, unit: str) -> np.ndarray:
        per = _PER_SECOND[unit]
        step = 1_000_000_000 // per
        self.bad(nanos % step != 0, f"has a part finer than the column's unit ({unit})")
        sub = nanos // step  # 0 <= sub < per
        top_s, top_sub = divmod(_INT64_MAX, per)
        low_s, low_sub = divmod(-_INT64_MAX - 1, per)
        fits = ((seconds < top_s) | ((seconds == top_s) & (sub <= top_sub))) & ((seconds > low_s) | ((seconds == low_s) & (sub >= low_sub)))
        self.bad(~fits, f"is out of the range of the column's unit ({unit})")
        seconds = np.where(self.valid, seconds, 0)
        return seconds * per + np.where(self.valid, sub, 0)

    def iso_time(self) -> Converted:
        t = self.target
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            return self.text()
        if not pa.types.is_time(t):
            return self.unsupported()
        p = self.iso_parts(_ISO_TIME)
        self.bad(~((p["H"] < 24) & (p["M"] < 60) & (p["S"] < 60)), "is not a valid time of day")
        seconds = (p["H"] * 3600 + p["M"] * 60 + p["S"] - p["z"]) % _SECONDS_PER_DAY
        out = self.from_seconds(seconds, p["f"], t.unit)
        return self.done(out.astype(np.int32) if pa.types.is_time32(t) else out, _storage(t))

    def iso_date(self) -> Converted:
        t = self.target
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            return self.text()
        p = self.iso_parts(_ISO_DATE)
        days, ok = _days_from_civil(p["y"], p["m"], p["d"])
        self.bad(~ok, "is not a valid date")
        return self.days(days)

    # -- arrays

    def array(self) -> Converted:
        t = self.target
        arr = self.arr
        if not (pa.types.is_list(t) or pa.types.is_large_list(t)) or not pa.types.is_list(arr.type):
            return self.unsupported()
        assert self.s.items is not None
        items = convert(arr.flatten(), self.s.items, t.value_type, self.column)
        parents = np.asarray(pc.list_parent_indices(arr), np.int64)
        for j, why in items.errors.items():
            self.errors.setdefault(int(parents[j]), why.replace(f"column {self.column!r}", f"an item of column {self.column!r}", 1))
        lengths = np.asarray(arr.value_lengths().fill_null(0), np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        bad = np.zeros(self.n, bool)
        bad[list(self.errors)] = True
        self.valid &= ~bad
        mask = pa.array(~self.valid)
        out = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), items.array, type=pa.list_(t.value_type), mask=mask)
        return Converted(out if out.type == t else out.cast(t), self.errors)


# -- vectorized byte-level helpers ------------------------------------------------------------------

_B64 = np.full(256, 255, np.uint8)
for _i, _c in enumerate(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"):
    _B64[_c] = _i
_PAD = ord("=")
_B64[_PAD] = 64
_HEX = np.full(256, 0, np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX[_c] = 10 + _i
_UUID_RE = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"


def base64_segments(arr: pa.Array, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Base64 text (standard alphabet, padded, as Java's encoder writes it) of each valid row,
    decoded over the whole column at once: (decoded bytes, each row's start in them, its
    length, rows that are not base64)."""
    text = arr.cast(pa.string()) if not pa.types.is_string(arr.type) else arr
    n = len(text)
    lengths = np.asarray(pc.binary_length(text).fill_null(0), np.int64)
    wrong = valid & (lengths % 4 != 0)
    if wrong.any() or (~valid & (lengths > 0)).any():
        # every row a whole number of 4-character groups from the data's start: the others empty
        text = pc.if_else(pa.array(valid & ~wrong), text, pa.scalar("", pa.string()))
        lengths = np.asarray(pc.binary_length(text).fill_null(0), np.int64)
    offsets = np.frombuffer(text.buffers()[1], np.int32, n + 1, text.offset * 4).astype(np.int64)
    data = text.buffers()[2]
    raw = np.frombuffer(data, np.uint8)[offsets[0]:offsets[-1]] if data is not None else np.zeros(0, np.uint8)
    starts = offsets[:-1] - offsets[0]
    sextets = _B64[raw]
    # characters outside the alphabet, and padding anywhere but a row's last two characters
    odd = np.flatnonzero(sextets >= 64)
    if len(odd):
        row_of = np.searchsorted(starts, odd, side="right") - 1
        at = odd - starts[row_of]
        end = lengths[row_of]
        pad = sextets[odd] == 64
        ok = pad & ((at == end - 1) | ((at == end - 2) & (raw[np.minimum(odd + 1, len(raw) - 1)] == _PAD)))
        wrong[row_of[~ok]] = True
    pads = np.zeros(n, np.int64)
    has = lengths > 0
    last = starts[has] + lengths[has] - 1
    pads[has] = (raw[last] == _PAD).astype(np.int64) + (raw[last - 1] == _PAD).astype(np.int64)
    q = np.where(sextets >= 64, 0, sextets).astype(np.uint8).reshape(-1, 4)
    out = np.empty((len(q), 3), np.uint8)
    out[:, 0] = (q[:, 0] << 2) | (q[:, 1] >> 4)
    out[:, 1] = ((q[:, 1] & 15) << 4) | (q[:, 2] >> 2)
    out[:, 2] = ((q[:, 2] & 3) << 6) | q[:, 3]
    return out.ravel(), starts // 4 * 3, lengths // 4 * 3 - pads, wrong


def segments_to_binary(flat: np.ndarray, starts: np.ndarray, lengths: np.ndarray, valid: np.ndarray) -> pa.BinaryArray:
    """Rows given as (start, length) in ``flat`` as one binary array (a gather of their bytes)."""
    lengths = np.where(valid, lengths, 0)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    total = int(offsets[-1])
    idx = np.repeat(starts - offsets[:-1], lengths) + np.arange(total)
    data = flat[idx] if total else np.zeros(0, np.uint8)
    mask = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little").tobytes())
    return pa.BinaryArray.from_buffers(pa.binary(), len(lengths), [mask, pa.py_buffer(offsets.astype(np.int32).tobytes()),
                                                                    pa.py_buffer(data.tobytes())])


def twos_complement_words(flat: np.ndarray, starts: np.ndarray, lengths: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Big-endian two's-complement integers of ``lengths`` bytes at ``starts`` in ``flat`` as
    ``width``-byte little-endian integers (``width // 8`` uint64 words per row), sign-extended;
    and the rows longer than ``width`` whose extra leading bytes are more than sign extension."""
    n = len(starts)
    out = np.zeros((n, width), np.uint8)
    has = lengths > 0
    negative = np.zeros(n, bool)
    negative[has] = flat[starts[has]] >= 0x80
    out[negative] = 0xFF
    k = np.minimum(lengths, width)
    rows = np.repeat(np.arange(n), k)
    j = np.arange(int(k.sum())) - np.repeat(np.cumsum(k) - k, k)
    out[rows, j] = flat[np.repeat(starts + lengths - 1, k) - j]
    too_long = np.zeros(n, bool)
    long_rows = np.flatnonzero(lengths > width)
    for i in long_rows:  # rare: Java's BigInteger writes the fewest bytes
        extra = flat[starts[i]: starts[i] + lengths[i] - width]
        sign = 0xFF if negative[i] else 0x00
        top_ok = (flat[starts[i] + lengths[i] - width] >= 0x80) == bool(negative[i])
        too_long[i] = not (np.all(extra == sign) and top_ok)
    return out.view(np.uint64).reshape(n, width // 8).copy(), too_long


def _negate(words: np.ndarray) -> np.ndarray:
    """Two's complement negation of multiword little-endian integers."""
    inv = ~words
    out = inv.copy()
    carry = np.ones(len(words), bool)
    for w in range(words.shape[1]):
        out[:, w] = inv[:, w] + carry.astype(np.uint64)
        carry = carry & (out[:, w] == 0)
    return out


def _abs_below(words: np.ndarray, bound: int) -> np.ndarray:
    """Per row, whether |value| < ``bound`` (multiword little-endian two's complement)."""
    nwords = words.shape[1]
    negative = (words[:, -1] >> np.uint64(63)).astype(bool)
    mag = words.copy()
    if negative.any():
        mag[negative] = _negate(words[negative])
    if bound >= 1 << (64 * nwords - 1):
        return np.ones(len(words), bool)
    limbs = [np.uint64((bound >> (64 * w)) & ((1 << 64) - 1)) for w in range(nwords)]
    less = np.zeros(len(words), bool)
    equal = np.ones(len(words), bool)
    for w in reversed(range(nwords)):
        less |= equal & (mag[:, w] < limbs[w])
        equal &= mag[:, w] == limbs[w]
    # -2**(64n-1) negates to itself: its magnitude reads negative; it is never below a smaller bound
    return less & ~(negative & (mag[:, -1] >> np.uint64(63)).astype(bool))


def _decimal_type(width: int, scale: int, precision: int | None = None) -> pa.DataType:
    if width == 16:
        return pa.decimal128(precision or 38, scale)
    return pa.decimal256(precision or 76, scale)


def _decimal_array(words: np.ndarray, scale: int, valid: np.ndarray, precision: int | None = None) -> pa.Array:
    t = _decimal_type(words.shape[1] * 8, scale, precision)
    mask = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little").tobytes())
    return pa.Array.from_buffers(t, len(words), [mask, pa.py_buffer(np.ascontiguousarray(words).tobytes())])


def _words_of(arr: pa.Array, width: int) -> np.ndarray:
    data = arr.buffers()[1]
    return np.frombuffer(data, np.uint64, len(arr) * width // 8, arr.offset * width).reshape(len(arr), width // 8).copy()


def _decimal_text(words: np.ndarray, scale: int) -> str:
    """One row's value as text, for a reason."""
    v = int.from_bytes(np.ascontiguousarray(words).tobytes(), "little", signed=True)
    sign, digits = ("-" if v < 0 else ""), str(abs(v))
    if scale <= 0:
        return sign + digits + "0" * -scale
    digits = digits.rjust(scale + 1, "0")
    return f"{sign}{digits[:-scale]}.{digits[-scale:]}"


def _beyond(values: np.ndarray, limit: int) -> np.ndarray:
    """|values| > limit, without numpy's overflow of abs(-2**63)."""
    return (values > limit) | (values < -limit)


def _storage(t: pa.DataType) -> pa.DataType:
    if pa.types.is_timestamp(t) or pa.types.is_duration(t) or pa.types.is_date64(t) or pa.types.is_time64(t):
        return pa.int64()
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return pa.int32()
    return t


def _same_width(a: pa.DataType, b: pa.DataType) -> bool:
    return getattr(a, "bit_width", None) == getattr(b, "bit_width", None)


_DATE = r"(?P<y>[+-]?\d{4,9})-(?P<m>\d{2})-(?P<d>\d{2})"
_CLOCK = r"(?P<H>\d{2}):(?P<M>\d{2})(?::(?P<S>\d{2})(?:\.(?P<f>\d{1,9}))?)?"
_ZONE = r"(?P<z>Z|[+-]\d{2}:\d{2}(?::\d{2})?)"
_ISO_INSTANT = rf"^{_DATE}T{_CLOCK}{_ZONE}$"
_ISO_TIME = rf"^{_CLOCK}{_ZONE}$"
_ISO_DATE = rf"^{_DATE}(?P<z>Z|[+-]\d{{2}}:\d{{2}})?$"


def _offset_seconds(zone: pa.Array) -> np.ndarray:
    """``Z`` or ``±HH:MM[:SS]`` as seconds east of UTC (0 where empty or null)."""
    z = pc.if_else(pc.or_(pc.equal(zone, "Z"), pc.equal(zone, "")), "+00:00:00", zone).fill_null("+00:00:00")
    z = pc.if_else(pc.equal(pc.utf8_length(z), 6), pc.binary_join_element_wise(z, ":00", ""), z)
    sign = np.where(np.asarray(pc.starts_with(z, "-"), bool), -1, 1)
    hh = np.asarray(pc.cast(pc.utf8_slice_codeunits(z, 1, 3), pa.int64()), np.int64)
    mm = np.asarray(pc.cast(pc.utf8_slice_codeunits(z, 4, 6), pa.int64()), np.int64)
    ss = np.asarray(pc.cast(pc.utf8_slice_codeunits(z, 7, 9), pa.int64()), np.int64)
    return sign * (hh * 3600 + mm * 60 + ss)


def _days_from_civil(y: np.ndarray, m: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Days since 1970-01-01 of proleptic Gregorian dates (any year), and whether each date exists."""
    leap = ((y % 4 == 0) & (y % 100 != 0)) | (y % 400 == 0)
    month_days = np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], np.int64)
    ok = (m >= 1) & (m <= 12)
    mi = np.clip(m, 1, 12) - 1
    ok &= (d >= 1) & (d <= month_days[mi] + ((mi == 1) & leap))
    yy = y - (m <= 2)
    era = np.floor_divide(yy, 400)
    yoe = yy - era * 400
    mp = (m + 9) % 12
    doy = (153 * mp + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468, ok


__all__ = ["ConnectSchema", "Converted", "arrow_type", "convert", "parse_type", "semantic"]
