"""Change events exactly as Debezium's PostgreSQL connector (3.0) writes them through Kafka
Connect's JSON converter with its defaults: ``schemas.enable=true`` (every key and value
carries its schema), ``decimal.handling.mode=precise`` (decimals as base64 unscaled bytes),
``time.precision.mode=adaptive`` (timestamps in the unit of the column's precision),
``decimal.format=BASE64``, REPLICA IDENTITY DEFAULT, tombstones after deletes.

Written from Debezium's sources (``PostgresValueConverter``, ``TableSchemaBuilder``,
``Envelope``, ``SchemaFactory``, ``PostgresSourceInfoStructMaker``, ``SpecialValueDecimal``,
``ZonedTimestamp``) and Kafka's ``JsonConverter`` (``asJsonSchema``: a field's schema is
``type``, ``fields``, ``optional``, ``name``, ``version``, ``doc``, ``parameters``,
``default``, then ``field``; values serialized by Jackson without spaces):

- the envelope is ``before``, ``after``, ``source``, ``transaction``, ``op``, ``ts_ms``,
  ``ts_us``, ``ts_ns``, named ``<server>.<schema>.<table>.Envelope``, version 2;
- the source block is ``io.debezium.connector.postgresql.Source`` (``snapshot`` an
  ``io.debezium.data.Enum`` of ``true,last,false,incremental``, default ``false``);
- a delete's ``before`` holds the key (replica identity DEFAULT) and, for NOT NULL columns,
  the converter's fallback value (0, "", zero); an update's ``before`` is null;
- ``numeric(p,s)`` is ``org.apache.kafka.connect.data.Decimal`` (``scale``,
  ``connect.decimal.precision``), ``numeric`` without a scale ``io.debezium.data.VariableScaleDecimal``,
  ``timestamp`` (6 digits) ``io.debezium.time.MicroTimestamp``, ``timestamp(3)``
  ``io.debezium.time.Timestamp``, ``timestamptz`` ``io.debezium.time.ZonedTimestamp`` (UTC,
  as many fraction digits as the column's precision), ``date`` ``io.debezium.time.Date``,
  ``time`` ``io.debezium.time.MicroTime``, ``timetz`` ``io.debezium.time.ZonedTime``,
  ``uuid``, ``jsonb``, enum types, ``bit(n)``, ``interval`` their Debezium types.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import re
import uuid as uuidlib
from dataclasses import dataclass
from typing import Any

#: Exact decimal arithmetic for 38-digit values (the default context rounds to 28 digits).
EXACT = decimal.Context(prec=200)
EPOCH = dt.datetime(1970, 1, 1)
EPOCH_DATE = dt.date(1970, 1, 1)
VERSION = "3.0.8.Final"
SNAPSHOT_ALLOWED = "true,last,false,incremental"


def unscaled_bytes(value: int) -> bytes:
    """``BigInteger.toByteArray()`` of ``value``: the fewest big-endian two's-complement bytes."""
    n = max(1, (value.bit_length() + 8) // 8) if value >= 0 else max(1, ((~value).bit_length() + 8) // 8)
    return value.to_bytes(n, "big", signed=True)


def unscaled_base64(value: int) -> str:
    """:func:`unscaled_bytes` in base64: a decimal as Kafka Connect's JSON converter writes it."""
    return base64.b64encode(unscaled_bytes(value)).decode()


@dataclass(frozen=True)
class Column:
    name: str
    pg_type: str  # bigint, integer, smallint, text, boolean, double precision, real, numeric(p,s), numeric,
    # timestamp[(p)], timestamptz[(p)], date, time[(p)], timetz, uuid, jsonb, bytea, bit(n), interval, enum(a,b,...)
    nullable: bool = True
    default: Any = None  # a literal DEFAULT: it appears in the schema

    def schema(self) -> dict:
        """The field's Connect schema as the JSON converter writes it (without ``field``)."""
        t = self.pg_type
        body: dict[str, Any]
        m = re.fullmatch(r"numeric\((\d+),(\d+)\)", t)
        if m:
            body = {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal", "version": 1,
                    "parameters": {"scale": m.group(2), "connect.decimal.precision": m.group(1)}}
        elif t == "numeric":
            body = {"type": "struct", "fields": [{"type": "int32", "optional": False, "field": "scale"},
                                                 {"type": "bytes", "optional": False, "field": "value"}],
                    "name": "io.debezium.data.VariableScaleDecimal", "version": 1, "doc": "Variable scaled decimal"}
        elif t.startswith("timestamptz"):
            body = {"type": "string", "name": "io.debezium.time.ZonedTimestamp", "version": 1}
        elif t.startswith("timestamp"):
            p = self.precision(6)
            body = {"type": "int64", "name": "io.debezium.time.Timestamp" if p <= 3 else "io.debezium.time.MicroTimestamp", "version": 1}
        elif t == "date":
            body = {"type": "int32", "name": "io.debezium.time.Date", "version": 1}
        elif t == "timetz":
            body = {"type": "string", "name": "io.debezium.time.ZonedTime", "version": 1}
        elif t.startswith("time"):
            p = self.precision(6)
            body = ({"type": "int32", "name": "io.debezium.time.Time", "version": 1} if p <= 3
                    else {"type": "int64", "name": "io.debezium.time.MicroTime", "version": 1})
        elif t == "uuid":
            body = {"type": "string", "name": "io.debezium.data.Uuid", "version": 1}
        elif t in ("jsonb", "json"):
            body = {"type": "string", "name": "io.debezium.data.Json", "version": 1}
        elif t.startswith("enum("):
            body = {"type": "string", "name": "io.debezium.data.Enum", "version": 1, "parameters": {"allowed": t[5:-1]}}
        elif t.startswith("bit("):
            body = {"type": "bytes", "name": "io.debezium.data.Bits", "version": 1, "parameters": {"length": t[4:-1]}}
        elif t == "interval":
            body = {"type": "int64", "name": "io.debezium.time.MicroDuration", "version": 1}
        else:
            body = {"type": {"bigint": "int64", "integer": "int32", "smallint": "int16", "text": "string", "boolean": "boolean",
                             "double precision": "float64", "real": "float32", "bytea": "bytes"}[t]}
        out = {"type": body.pop("type")}
        if "fields" in body:
            out["fields"] = body.pop("fields")
        out["optional"] = self.nullable
        for k in ("name", "version", "doc", "parameters"):
            if k in body:
                out[k] = body[k]
        if self.default is not None:
            out["default"] = self.encode(self.default)
        return out

    def precision(self, default: int) -> int:
        m = re.search(r"\((\d+)\)", self.pg_type)
        return int(m.group(1)) if m else default

    def encode(self, v: Any) -> Any:
        """A value as the converter writes it."""
        if v is None:
            return None
        t = self.pg_type
        m = re.fullmatch(r"numeric\((\d+),(\d+)\)", t)
        if m:
            unscaled = decimal.Decimal(v).scaleb(int(m.group(2)), EXACT)
            assert unscaled == unscaled.to_integral_value(), f"{v} has more than {m.group(2)} fractional digits"
            return unscaled_base64(int(unscaled))
        if t == "numeric":
            d = decimal.Decimal(v)
            scale = max(0, -d.as_tuple().exponent)
            return {"scale": scale, "value": unscaled_base64(int(d.scaleb(scale, EXACT)))}
        if t.startswith("timestamptz"):
            utc = v.astimezone(dt.timezone.utc)
            digits = self.precision(6)
            frac = f".{utc.microsecond:06d}"[: digits + 1] if digits else ""
            return utc.strftime("%Y-%m-%dT%H:%M:%S") + frac + "Z"
        if t.startswith("timestamp"):
            micros = (v - EPOCH) // dt.timedelta(microseconds=1)
            return micros // 1000 if self.precision(6) <= 3 else micros
        if t == "date":
            return (v - EPOCH_DATE).days
        if t == "timetz":
            return v.strftime("%H:%M:%S.%f") + "Z"
        if t.startswith("time"):
            micros = ((v.hour * 60 + v.minute) * 60 + v.second) * 1_000_000 + v.microsecond
            return micros // 1000 if self.precision(6) <= 3 else micros
        if t == "uuid":
            return str(v)
        if t in ("jsonb", "json"):
            return json.dumps(v)  # jsonb's text form: ", " and ": " separators
        if t == "bytea":
            return base64.b64encode(v).decode()
        if t.startswith("bit("):
            bits = int(v, 2)  # the bit string, most significant bit first
            width = (bits.bit_length() + 7) // 8
            return base64.b64encode(bits.to_bytes(width, "little")).decode()  # java.util.BitSet.toByteArray
        if t == "interval":
            return v // dt.timedelta(microseconds=1)
        return v

    def fallback(self) -> Any:
        """What the converter writes for a NOT NULL column it has no value of (a delete's ``before``)."""
        t = self.pg_type
        if t.startswith("numeric("):
            return unscaled_base64(0)
        if t in ("text", "uuid", "jsonb", "json") or t.startswith(("enum(", "timestamptz", "timetz")):
            return ""
        if t == "boolean":
            return False
        if t == "bytea" or t.startswith("bit("):
            return ""
        return 0


def _struct(fields: list[dict], optional: bool, name: str, version: int | None = None, field: str | None = None) -> dict:
    out: dict[str, Any] = {"type": "struct", "fields": fields, "optional": optional, "name": name}
    if version is not None:
        out["version"] = version
    if field is not None:
        out["field"] = field
    return out


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


class PostgresTable:
    """One captured table: its Kafka keys and values, event by event."""

    def __init__(self, columns: list[Column], key: list[str], server: str = "shop", schema: str = "public", table: str = "orders",
                 db: str = "shop") -> None:
        self.columns = columns
        self.key_columns = key
        self.server, self.schema_name, self.table, self.db = server, schema, table, db
        prefix = f"{server}.{schema}.{table}"
        fields = [{**c.schema(), "field": c.name} for c in columns]
        source = _struct([
            {"type": "string", "optional": False, "field": "version"},
            {"type": "string", "optional": False, "field": "connector"},
            {"type": "string", "optional": False, "field": "name"},
            {"type": "int64", "optional": False, "field": "ts_ms"},
            {"type": "string", "optional": True, "name": "io.debezium.data.Enum", "version": 1,
             "parameters": {"allowed": SNAPSHOT_ALLOWED}, "default": "false", "field": "snapshot"},
            {"type": "string", "optional": False, "field": "db"},
            {"type": "string", "optional": True, "field": "sequence"},
            {"type": "int64", "optional": True, "field": "ts_us"},
            {"type": "int64", "optional": True, "field": "ts_ns"},
            {"type": "string", "optional": False, "field": "schema"},
            {"type": "string", "optional": False, "field": "table"},
            {"type": "int64", "optional": True, "field": "txId"},
            {"type": "int64", "optional": True, "field": "lsn"},
            {"type": "int64", "optional": True, "field": "xmin"},
        ], False, "io.debezium.connector.postgresql.Source", field="source")
        transaction = _struct([
            {"type": "string", "optional": False, "field": "id"},
            {"type": "int64", "optional": False, "field": "total_order"},
            {"type": "int64", "optional": False, "field": "data_collection_order"},
        ], True, "event.block", version=1, field="transaction")
        self.value_schema = _struct([
            _struct(fields, True, f"{prefix}.Value", field="before"),
            _struct(fields, True, f"{prefix}.Value", field="after"),
            source,
            transaction,
            {"type": "string", "optional": False, "field": "op"},
            {"type": "int64", "optional": True, "field": "ts_ms"},
            {"type": "int64", "optional": True, "field": "ts_us"},
            {"type": "int64", "optional": True, "field": "ts_ns"},
        ], False, f"{prefix}.Envelope", version=2)
        by_name = {c.name: c for c in columns}
        self.key_schema = _struct([{**by_name[k].schema(), "optional": False, "field": k} for k in key], False, f"{prefix}.Key")

    def row(self, values: dict[str, Any]) -> dict[str, Any]:
        """A row as the converter writes it: a null in a column with a default is written as the
        default (``JsonConverter.convertToJson`` falls back to the schema's default)."""
        return {c.name: c.encode(values.get(c.name) if values.get(c.name) is not None else c.default) for c in self.columns}

    def key_of(self, values: dict[str, Any]) -> bytes:
        by_name = {c.name: c for c in self.columns}
        return _dumps({"schema": self.key_schema, "payload": {k: by_name[k].encode(values[k]) for k in self.key_columns}})

    def event(self, op: str, before: dict | None, after: dict | None, *, lsn: int, commit_ms: int, txid: int,
              snapshot: str = "false", last_lsn: int | None = None) -> bytes:
        """One change event's value. ``before``/``after`` hold Python values (``None``: no row);
        for a delete, ``before`` is reduced to what replica identity DEFAULT gives."""
        if op == "d" and before is not None:
            before = {c.name: (c.encode(before[c.name]) if c.name in self.key_columns else (None if c.nullable else c.fallback()))
                      for c in self.columns}
        elif before is not None:
            before = self.row(before)
        processed_us = commit_ms * 1000 + 1_234
        source = {
            "version": VERSION, "connector": "postgresql", "name": self.server, "ts_ms": commit_ms, "snapshot": snapshot,
            "db": self.db, "sequence": json.dumps([str(last_lsn if last_lsn is not None else lsn), str(lsn)], separators=(",", ":")),
            "ts_us": commit_ms * 1000, "ts_ns": commit_ms * 1_000_000, "schema": self.schema_name, "table": self.table,
            "txId": txid, "lsn": lsn, "xmin": None,
        }
        payload = {"before": before, "after": self.row(after) if after is not None else None, "source": source,
                   "transaction": None, "op": op, "ts_ms": processed_us // 1000, "ts_us": processed_us, "ts_ns": processed_us * 1000}
        return _dumps({"schema": self.value_schema, "payload": payload})


def orders_table() -> PostgresTable:
    """The shop's ``orders`` table: the types a default connector turns into semantic types.

    CREATE TYPE order_status AS ENUM ('new', 'paid', 'shipped');
    CREATE TABLE orders (id bigint PRIMARY KEY, customer text NOT NULL, amount numeric(10,2) NOT NULL,
        tax numeric(38,9), ratio numeric, created_at timestamp NOT NULL, shipped_on date, paid_at timestamptz,
        status order_status NOT NULL DEFAULT 'new', tracking uuid, attrs jsonb, note text NOT NULL DEFAULT 'none');
    """
    return PostgresTable([
        Column("id", "bigint", nullable=False),
        Column("customer", "text", nullable=False),
        Column("amount", "numeric(10,2)", nullable=False),
        Column("tax", "numeric(38,9)"),
        Column("ratio", "numeric"),
        Column("created_at", "timestamp", nullable=False),
        Column("shipped_on", "date"),
        Column("paid_at", "timestamptz"),
        Column("status", "enum(new,paid,shipped)", nullable=False, default="new"),
        Column("tracking", "uuid"),
        Column("attrs", "jsonb"),
        Column("note", "text", nullable=False, default="none"),
    ], key=["id"])


def random_order(rng, oid: int, i: int) -> dict[str, Any]:
    """A source row of :func:`orders_table` (Python values), with negative amounts, pre-1970
    timestamps and dates, 38-digit taxes, and nulls."""
    amount = decimal.Decimal(rng.randrange(-99_999_999, 99_999_999 + 1)).scaleb(-2, EXACT)
    tax = decimal.Decimal(rng.randrange(-(10**38) + 1, 10**38)).scaleb(-9, EXACT) if rng.random() < 0.8 else None
    ratio = decimal.Decimal(rng.randrange(-10**12, 10**12)).scaleb(-rng.randrange(0, 8), EXACT) if rng.random() < 0.9 else None
    created = EPOCH + dt.timedelta(microseconds=rng.randrange(-2_500_000_000_000_000, 2_500_000_000_000_000))
    shipped = EPOCH_DATE + dt.timedelta(days=rng.randrange(-40_000, 40_000)) if rng.random() < 0.8 else None
    paid = (dt.datetime(1950, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=rng.randrange(-12, 13))))
            + dt.timedelta(microseconds=rng.randrange(0, 3_000_000_000_000_000))) if rng.random() < 0.7 else None
    return {
        "id": oid, "customer": f"customer {rng.randrange(1000)} é", "amount": amount, "tax": tax, "ratio": ratio,
        "created_at": created, "shipped_on": shipped, "paid_at": paid, "status": rng.choice(["new", "paid", "shipped"]),
        "tracking": uuidlib.UUID(int=rng.getrandbits(128)) if rng.random() < 0.9 else None,
        "attrs": {"n": i, "tags": ["a", "b"][: rng.randrange(3)]} if rng.random() < 0.5 else None,
        "note": rng.choice(["none", "gift", "fragile"]),
    }


# -- Debezium's Avro converter (Confluent's AvroConverter: AvroData's Connect -> Avro mapping) --------


def _avro_type(schema: dict, names: dict[str, bool], logical_times: bool) -> Any:
    """A Connect field schema (as the JSON converter writes it) as AvroData writes it in Avro:
    ``connect.name``/``connect.version``/``connect.parameters``/``connect.default`` attributes,
    Avro's ``decimal`` logical type for Connect decimals; with ``logical_times``, Avro's
    ``timestamp-micros``/``timestamp-millis``/``date`` logical types for Debezium's times (as
    converters that map them to Avro logical types write them)."""
    literal = {"int8": "int", "int16": "int", "int32": "int", "int64": "long", "float32": "float", "float64": "double",
               "boolean": "boolean", "string": "string", "bytes": "bytes"}
    name = schema.get("name")
    if schema["type"] == "struct":
        full = name or "ConnectDefault"
        if full in names:
            out: Any = full.rsplit(".", 1)[-1] if "." not in full else full
            return out
        names[full] = True
        ns, short = full.rsplit(".", 1) if "." in full else (None, full)
        record: dict[str, Any] = {"type": "record", "name": short}
        if ns:
            record["namespace"] = ns
        fields = []
        for f in schema["fields"]:
            t = _avro_type(f, names, logical_times)
            field: dict[str, Any] = {"name": f["field"], "type": ["null", t] if f.get("optional") else t}
            if f.get("optional"):
                field["default"] = None
            elif "default" in f:
                field["default"] = f["default"]
            fields.append(field)
        record["fields"] = fields
        if "doc" in schema:
            record["connect.doc"] = schema["doc"]
        if "version" in schema:
            record["connect.version"] = schema["version"]
        if name:
            record["connect.name"] = name
        return record
    t: dict[str, Any] = {"type": literal[schema["type"]]}
    if schema["type"] in ("int8", "int16"):
        t["connect.type"] = schema["type"]
    if name == "org.apache.kafka.connect.data.Decimal":
        t["scale"] = int(schema["parameters"]["scale"])
        t["precision"] = int(schema["parameters"].get("connect.decimal.precision", 64))
    if "version" in schema:
        t["connect.version"] = schema["version"]
    if "parameters" in schema:
        t["connect.parameters"] = schema["parameters"]
    if "default" in schema:
        t["connect.default"] = schema["default"]
    if name:
        t["connect.name"] = name
    if name == "org.apache.kafka.connect.data.Decimal":
        t["logicalType"] = "decimal"
    elif logical_times and name in ("io.debezium.time.MicroTimestamp", "io.debezium.time.Timestamp", "io.debezium.time.Date"):
        t = {"type": t["type"], "logicalType": {"io.debezium.time.MicroTimestamp": "timestamp-micros",
                                                "io.debezium.time.Timestamp": "timestamp-millis", "io.debezium.time.Date": "date"}[name]}
    return t if len(t) > 1 else t["type"]


def _raw(value: Any, schema: dict) -> Any:
    """A JSON converter value as the Avro converter's datum (bytes instead of base64)."""
    if value is None:
        return None
    if schema["type"] == "bytes":
        return base64.b64decode(value)
    if schema["type"] == "struct":
        return {f["field"]: _raw(value.get(f["field"]), f) for f in schema["fields"]}
    return value


class AvroTopic:
    """A table's change events as Debezium's Avro converter writes them: Confluent framing
    (magic byte, schema id), the value's and the key's Avro schemas registered by id."""

    def __init__(self, table: PostgresTable, value_id: int = 7, key_id: int = 8, logical_times: bool = False) -> None:
        self.table, self.value_id, self.key_id = table, value_id, key_id
        self.value_avro = _avro_type(table.value_schema, {}, logical_times)
        self.key_avro = _avro_type(table.key_schema, {}, logical_times)
        import fastavro

        self._fastavro = fastavro
        self._value = fastavro.parse_schema(_strip(self.value_avro))
        self._key = fastavro.parse_schema(_strip(self.key_avro))

    def _frame(self, schema_id: int, parsed: Any, datum: Any) -> bytes:
        import io

        buf = io.BytesIO()
        self._fastavro.schemaless_writer(buf, parsed, datum)
        return b"\x00" + schema_id.to_bytes(4, "big") + buf.getvalue()

    def event(self, *args: Any, **kwargs: Any) -> bytes:
        envelope = json.loads(self.table.event(*args, **kwargs))
        return self._frame(self.value_id, self._value, _raw(envelope["payload"], envelope["schema"]))

    def key_of(self, values: dict[str, Any]) -> bytes:
        key = json.loads(self.table.key_of(values))
        return self._frame(self.key_id, self._key, _raw(key["payload"], key["schema"]))


def _strip(schema: Any) -> Any:
    """Without logical types: the datum is written from raw values (the same bytes)."""
    if isinstance(schema, list):
        return [_strip(t) for t in schema]
    if isinstance(schema, dict):
        return {k: _strip(v) for k, v in schema.items() if k != "logicalType"}
    return schema
