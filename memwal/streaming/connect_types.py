"""Kafka Connect and Debezium semantic types: what a field of a change event means (its
:class:`ConnectSchema`, from Connect's JSON or Avro converter) and the Arrow types a reader
reads its literals as. :mod:`memwal.streaming.connect` converts the values, and is where the
rest of memwal takes all of it from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

import pyarrow as pa

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

PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
SECONDS_PER_DAY = 86_400


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
