"""Avro record values (schemaless binary encoding, optionally in Confluent's wire format) as
rows of a table.

**Bulk decoding.** Kafka carries each record as the bare binary encoding of one Avro datum;
Avro's object container format is exactly such encodings concatenated in a block behind a
header. For flat records (:mod:`memwal.streaming.avro_native`) a batch's values become one
in-memory container that Arrow's Rust decoder reads straight into columns, once each value's
layout is checked. Otherwise, and for the values that do not fit, fastavro's compiled reader
decodes each value alone, which must use up exactly its bytes (so trailing garbage is a dead
letter, and cannot shift the records after it), and Arrow builds the columns from the records
in one call (``Table.from_pylist`` into the table's schema); only a batch whose records the
columns cannot take is bisected to find the records at fault.

**Wire format.** With a schema id (``avro_schema_id``) or a registry, every value must start
with Confluent's header: magic byte 0, then the writer schema's id (4 bytes, big-endian).
With a fixed id, a value with another id is a dead letter; with a registry
(``schema_registry``: its URL), the writer schema of each id is fetched once per process
(``GET /schemas/ids/{id}``, through confluent-kafka's ``SchemaRegistryClient`` when its
optional dependencies are installed, else that one REST call) and the record is resolved to
the configured reader schema (``--avro-schema``, else the writer schema) by Avro's schema
resolution rules. Without either, values are bare Avro encodings of ``--avro-schema``.
"""

from __future__ import annotations

import io
import json
import logging
import os
import threading
import urllib.error
import urllib.request
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal.core.errors import InvalidArgumentError, MemwalError
from memwal.streaming.avro_native import NativeReader, Step, conform_rows, conformable, nested_plan, plan, record_fits
from memwal.streaming.batches import Binaries, Decoded, binary_array, bisect_failures, json_type, reason, value_offsets
from memwal.streaming.connect import ConnectSchema
from memwal.streaming.envelope import OP, Columns, EventSchema, change_rows, changed_columns, envelope_type, event_schema, row_schema

log = logging.getLogger(__name__)

#: Confluent wire format: magic byte 0, 4-byte big-endian schema id, then the Avro datum.
MAGIC = 0
HEADER_BYTES = 5


def _fastavro():
    try:
        import fastavro
    except ImportError as e:  # pragma: no cover - a dependency of memwal
        raise InvalidArgumentError("--format avro needs the fastavro package (pip install fastavro)") from e
    return fastavro


def _zigzag(n: int) -> bytes:
    """Avro's long encoding (zig-zag, then base-128 varint)."""
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _container_header(schema_json: str, sync: bytes) -> bytes:
    meta = {b"avro.schema": schema_json.encode(), b"avro.codec": b"null"}
    out = bytearray(b"Obj\x01") + _zigzag(len(meta))
    for k, v in meta.items():
        out += _zigzag(len(k)) + k + _zigzag(len(v)) + v
    return bytes(out + _zigzag(0) + sync)


def _concatenated(arr: pa.BinaryArray) -> bytes:
    """The values of a binary array back to back: the slice of its data buffer they occupy."""
    if len(arr) == 0:
        return b""
    offsets = value_offsets(arr)
    data = arr.buffers()[2]
    return data[int(offsets[0]):int(offsets[-1])].to_pybytes() if data is not None else b""


def is_envelope(schema: Any) -> bool:
    """Whether an Avro schema is a Debezium change-event envelope (a record with ``op``,
    ``before`` and ``after``)."""
    names = {f.get("name") for f in schema.get("fields", []) if isinstance(f, dict)} if isinstance(schema, dict) else set()
    return schema.get("type") == "record" and {"op", "before", "after"} <= names if isinstance(schema, dict) else False


def raw_schema(schema: Any) -> Any:
    """An Avro schema without its logical types: fastavro then reads the raw values (a decimal's
    bytes, a timestamp's long) that the column converters turn into the column's type, as the
    JSON converter's values are, instead of building a Python object per value."""
    if isinstance(schema, list):
        return [raw_schema(t) for t in schema]
    if isinstance(schema, dict):
        return {k: raw_schema(v) for k, v in schema.items() if k != "logicalType"}
    return schema


def conform_struct(arr: pa.Array, t: pa.DataType) -> pa.Array:
    """A decoded column as ``t`` (a reader's raw types into the parse types): struct fields by
    name (missing ones null, others dropped), integers widened; nulls kept."""
    if pa.types.is_struct(t):
        if not pa.types.is_struct(arr.type):
            return pa.nulls(len(arr), t)
        names = {arr.type.field(i).name for i in range(arr.type.num_fields)}
        children = [conform_struct(pc.struct_field(arr, f.name), f.type) if f.name in names else pa.nulls(len(arr), f.type) for f in t]
        return pa.StructArray.from_arrays(children, fields=list(t), mask=arr.is_null() if arr.null_count else None)
    return arr if arr.type == t else arr.cast(t)


class WriterSchema:
    """One writer schema, parsed, with what decoding a batch of its records needs."""

    def __init__(self, schema_json: str, reader: Any | None, parse_schema: pa.Schema, native: bool = True,
                 reader_json: str | None = None) -> None:
        fastavro = _fastavro()
        self.json = schema_json
        obj = json.loads(schema_json)
        self.sync = os.urandom(16)
        self.parse_schema = parse_schema  # what the rows of flat records are decoded into
        #: A Debezium change-event envelope (Debezium's Avro converter): its rows are read raw
        #: (logical types left to the column converters) and turned into changes.
        self.envelope = is_envelope(json.loads(reader_json) if reader is not None and reader_json else obj)
        self.connect: ConnectSchema | None = None
        container = schema_json
        if self.envelope:
            self.parsed = fastavro.parse_schema(raw_schema(obj))
            self.reader = fastavro.parse_schema(raw_schema(json.loads(reader_json))) if reader is not None and reader_json else None
            self.connect = ConnectSchema.from_avro(json.loads(reader_json) if self.reader is not None else obj)
            nested = nested_plan(schema_json) if self.reader is None and native else None
            self.steps: tuple[Step, ...] | None = nested[0] if nested else None
            container = nested[1] if nested else schema_json
        else:
            self.parsed = fastavro.parse_schema(obj)
            self.reader = reader  # parsed reader schema, None: the writer schema itself
            #: How to walk a record of this schema for the native path; None: fastavro only (also
            #: when a reader schema differs, as Avro's resolution is fastavro's, or when the table's
            #: columns cannot take the native rows' types, so no batch pays for a native read).
            steps = plan(schema_json) if reader is None and native else None
            self.steps = steps if steps is not None and conformable(schema_json, parse_schema) else None
        self.header = _container_header(container, self.sync)
        self._native: NativeReader | None = None

    def _container(self, data: bytes, n: int) -> bytes:
        """``n`` records' concatenated encodings as one Avro object container of one block."""
        return self.header + _zigzag(n) + _zigzag(len(data)) + data + self.sync

    def read_native(self, bodies: pa.BinaryArray) -> tuple[pa.Table, np.ndarray] | None:
        """The rows of the values of ``bodies`` whose layout fits the schema, decoded by Arrow
        into the parse schema, and their indices in ``bodies``; None when the native path
        cannot take them (then fastavro decodes them all, and gives the reasons)."""
        if self.steps is None:
            return None
        fits = np.flatnonzero(record_fits(self.steps, bodies))
        if not len(fits):
            return None
        chosen = bodies if len(fits) == len(bodies) else bodies.take(pa.array(fits, pa.int64()))
        try:
            if self._native is None:
                self._native = NativeReader()
            rows = self._native.read(self._container(_concatenated(chosen), len(chosen)))
            if not self.envelope:
                rows = conform_rows(rows, self.parse_schema)
        except Exception as e:  # noqa: BLE001 - e.g. a string that is not UTF-8: fastavro names it
            log.debug("native Avro decoding of %d value(s) failed, fastavro decodes them: %s", len(chosen), reason(e))
            return None
        return None if rows.num_rows != len(fits) else (rows, fits)

    def read(self, bodies: pa.BinaryArray) -> tuple[list[dict[str, Any]], np.ndarray, dict[int, str]]:
        """Decode each value of ``bodies`` (bare Avro data) alone: the records, the indices of
        the values they came from, and why each other value is not a record. A value must be
        exactly one record: decoded from a block, a record with bytes left over would shift
        every later record without an error (fastavro's block reader ignores what a block has
        left), and one call per record costs ~10% more than the block (docs/bench-log/input-formats.md, "Input formats")."""
        fastavro = _fastavro()
        n = len(bodies)
        data = _concatenated(bodies)
        ends = value_offsets(bodies)
        ends -= ends[0]
        buf = io.BytesIO(data)
        records: list[dict[str, Any]] = []
        good: list[int] = []
        errors: dict[int, str] = {}
        for k in range(n):
            start, end = int(ends[k]), int(ends[k + 1])
            buf.seek(start)
            try:
                record = fastavro.schemaless_reader(buf, self.parsed, self.reader)
            except Exception as e:  # noqa: BLE001 - fastavro's errors, as the record's reason
                errors[k] = f"the value is not an Avro record of the schema: {reason(e)}"
                continue
            if buf.tell() != end:
                errors[k] = ("the value is not an Avro record of the schema: "
                             + (f"{end - buf.tell()} byte(s) left over after the record" if buf.tell() < end
                                else "the record runs past the value's end"))
                continue
            records.append(record)
            good.append(k)
        return records, np.array(good, np.int64), errors


def schema_from_avro_event(value: bytes, key: bytes | None, registry: str) -> EventSchema:
    """The table a topic of Debezium's Avro change events fills, from one Confluent-framed
    event (its value, and its key when it has one) and the writer schemas the registry holds
    for their ids: the envelope's row fields as columns, the key's fields as the primary key."""
    def schema_of(framed: bytes, what: str) -> Any:
        if len(framed) < HEADER_BYTES or framed[0] != MAGIC:
            raise InvalidArgumentError(f"the event's {what} is not in Confluent's wire format (magic byte 0, schema id)")
        return json.loads(registry_schema(registry, int.from_bytes(framed[1:HEADER_BYTES], "big")))

    envelope = schema_of(value, "value")
    if not is_envelope(envelope):
        raise InvalidArgumentError("the event is not a Debezium change event (an Avro record with op, before and after)")
    row = row_schema(ConnectSchema.from_avro(envelope))
    if row is None:
        raise InvalidArgumentError("the change event's schema has no row fields")
    key_schema = ConnectSchema.from_avro(schema_of(key, "key")) if key else None
    return event_schema(row, key_schema if key_schema is not None and key_schema.type == "struct" else None)


_REGISTRY: dict[tuple[str, int], str] = {}
_REGISTRY_LOCK = threading.Lock()


def registry_schema(url: str, schema_id: int, timeout: float = 30.0) -> str:
    """The schema text of ``schema_id`` in the registry at ``url``, fetched once per process.

    Uses confluent-kafka's ``SchemaRegistryClient`` when its optional dependencies are
    installed (it adds authentication and its own caching), else the registry's REST call
    ``GET {url}/schemas/ids/{id}`` directly. Raises :class:`MemwalError` if it is unknown."""
    key = (url.rstrip("/"), schema_id)
    with _REGISTRY_LOCK:
        if key in _REGISTRY:
            return _REGISTRY[key]
    try:
        from confluent_kafka.schema_registry import SchemaRegistryClient
    except ImportError:  # its httpx/authlib/attrs extras are not installed
        SchemaRegistryClient = None  # noqa: N806
    if SchemaRegistryClient is not None:
        try:
            found = SchemaRegistryClient({"url": key[0]}).get_schema(schema_id)
        except Exception as e:  # noqa: BLE001 - the client's errors, as a reason
            raise MemwalError(f"schema id {schema_id} is not in the registry: {reason(e)}") from e
        kind, text = found.schema_type or "AVRO", found.schema_str
    else:
        try:
            with urllib.request.urlopen(f"{key[0]}/schemas/ids/{schema_id}", timeout=timeout) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise MemwalError(f"schema id {schema_id} is not in the registry (HTTP {e.code})") from e
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise MemwalError(f"schema id {schema_id}: the registry did not answer: {reason(e)}") from e
        kind, text = body.get("schemaType", "AVRO"), body.get("schema")
    if kind != "AVRO" or not isinstance(text, str):
        raise MemwalError(f"schema id {schema_id} is a {kind} schema, not Avro")
    with _REGISTRY_LOCK:
        _REGISTRY[key] = text
    return text


class AvroDecoder:
    """Decodes Avro values into a table's schema plus an operation field and, optionally, a
    sequence field (record fields of those names), like :class:`~memwal.streaming.decode.JsonDecoder`."""

    def __init__(self, schema: pa.Schema, op_field: str | None = "op", sequence_field: str | None = None,
                 avro_schema: str | None = None, schema_id: int | None = None, registry: str | None = None,
                 native: bool = True, primary_key: Sequence[str] = ()) -> None:
        if avro_schema is None and registry is None:
            raise InvalidArgumentError("--format avro needs --avro-schema FILE.avsc or --schema-registry URL")
        if schema_id is not None and registry is not None:
            raise InvalidArgumentError("give --avro-schema-id or --schema-registry, not both")
        self.schema = schema
        self.op_field = op_field
        self.sequence_field = sequence_field
        self.schema_id = schema_id
        self.registry = registry
        self.with_header = schema_id is not None or registry is not None
        fields = [pa.field(f.name, json_type(f.type), nullable=True) for f in schema]
        if op_field and op_field not in schema.names:
            fields.append(pa.field(op_field, pa.string()))
        self.parse_schema = pa.schema(fields)
        fastavro = _fastavro()
        try:
            self.reader = fastavro.parse_schema(json.loads(avro_schema)) if avro_schema is not None else None
        except (ValueError, TypeError, KeyError, fastavro.schema.SchemaParseException) as e:
            raise InvalidArgumentError(f"the Avro schema does not parse: {reason(e)}") from e
        self.avro_schema = avro_schema
        self.native = native  # False: fastavro decodes every schema (the native path's yardstick)
        self._writers: dict[int | None, WriterSchema] = {}
        #: What each column is converted to from a Debezium envelope (then conformed, as for JSON).
        self.targets = {f.name: json_type(f.type) for f in schema}
        self.primary_key = list(primary_key)  # a Debezium change's key columns, from the Kafka key when the value lacks them
        self._columns: dict[int, tuple[WriterSchema, Columns]] = {}
        #: Null values are Debezium's tombstones (skipped) once the topic is known to carry envelopes.
        self._envelopes = avro_schema is not None and is_envelope(json.loads(avro_schema))
        #: Per writer schema: the fields the table lacks and those it holds narrower (see
        #: :meth:`_changed_columns`).
        self._changed: dict[int, tuple[WriterSchema, tuple[dict[str, pa.Field], dict[str, pa.Field]]]] = {}

    def _writer(self, schema_id: int | None) -> WriterSchema:
        w = self._writers.get(schema_id)
        if w is None:
            if self.registry is not None and schema_id is not None:
                w = WriterSchema(registry_schema(self.registry, schema_id), self.reader, self.parse_schema, self.native, self.avro_schema)
            else:
                w = WriterSchema(str(self.avro_schema), None, self.parse_schema, self.native)
            self._envelopes |= w.envelope
            self._writers[schema_id] = w
        return w

    def decode_batch(self, values: Binaries, keys: Binaries) -> Decoded:
        arr = binary_array(values)
        n = len(arr)
        errors: dict[int, str] = {int(i): "the record has no value (null)" for i in np.flatnonzero(np.asarray(arr.is_null()))}
        nulls = len(errors)
        if self.with_header:
            lengths = np.asarray(pc.binary_length(arr).fill_null(0), dtype=np.int64)
            for i in np.flatnonzero(lengths < HEADER_BYTES):
                errors.setdefault(int(i), f"the value has {int(lengths[i])} byte(s), too short for the Confluent header")
            ok = np.array([i for i in range(n) if i not in errors], dtype=np.int64)
            heads = pc.cast(pc.binary_slice(arr.take(pa.array(ok, pa.int64())), 0, HEADER_BYTES), pa.binary(HEADER_BYTES))
            raw = np.frombuffer(heads.buffers()[1], dtype=np.uint8, count=len(ok) * HEADER_BYTES).reshape(-1, HEADER_BYTES)
            ids = (raw[:, 1:].astype(np.int64) * np.array([1 << 24, 1 << 16, 1 << 8, 1])).sum(axis=1)
            for j in np.flatnonzero(raw[:, 0] != MAGIC):
                errors[int(ok[j])] = f"the value does not start with the Confluent magic byte 0 (found {int(raw[j, 0])})"
            if self.schema_id is not None:
                for j in np.flatnonzero((ids != self.schema_id) & (raw[:, 0] == MAGIC)):
                    errors[int(ok[j])] = f"schema id {int(ids[j])} does not match the configured schema id {self.schema_id}"
            bodies = pc.binary_slice(arr, HEADER_BYTES, 2**31 - 1)  # (no stop: an Arrow error in 26.0)
            schema_of = np.full(n, -1, np.int64)
            schema_of[ok] = ids
        else:
            bodies = arr
            schema_of = np.full(n, -1, np.int64)
        tables, positions = [], []
        new_columns: dict[str, pa.Field] = {}
        wider: dict[str, pa.Field] = {}
        for sid in np.unique(schema_of):
            group = np.array([i for i in np.flatnonzero(schema_of == sid) if int(i) not in errors], dtype=np.int64)
            if not len(group):
                continue
            try:
                writer = self._writer(None if sid < 0 else int(sid))
            except MemwalError as e:
                errors.update({int(i): reason(e) for i in group})
                continue
            group_bodies = bodies.take(pa.array(group, pa.int64()))
            new, widened = self._changed_columns(writer)
            new_columns.update(new)
            wider.update(widened)
            if writer.envelope:
                got, at, bad = self._changes(writer, group_bodies, binary_array(keys).take(pa.array(group, pa.int64())))
                tables.append(got)
                positions.append(group[at])
                errors.update({int(group[j]): why for j, why in bad.items()})
                continue
            native = writer.read_native(group_bodies)
            if native is not None:
                rows, fits = native
                tables.append(rows)
                positions.append(group[fits])
                rest = np.setdiff1d(np.arange(len(group)), fits)  # what fastavro must judge
                if not len(rest):
                    continue
                group, group_bodies = group[rest], group_bodies.take(pa.array(rest, pa.int64()))

            records, decoded, failed = writer.read(group_bodies)
            errors.update({int(group[j]): why for j, why in failed.items()})
            group = group[decoded]

            def attempt(idx: np.ndarray, records=records) -> pa.Table:
                return pa.Table.from_pylist([records[j] for j in idx], schema=self.parse_schema)

            try:
                tables.append(attempt(np.arange(len(group))))
                positions.append(group)
            except Exception:  # noqa: BLE001 - isolate the records whose values the columns cannot take
                good, bad = bisect_failures(len(group), attempt)
                errors.update({int(group[j]): f"the record does not fit the table's columns: {why}" for j, why in bad.items()})
                if len(good):
                    tables.append(attempt(good))
                    positions.append(group[good])
        skipped = 0
        if self._envelopes and nulls:  # Debezium's tombstones: nothing to write, not dead letters
            for i in np.flatnonzero(np.asarray(arr.is_null())):
                errors.pop(int(i), None)
            skipped = nulls
        rows = pa.concat_tables(tables, promote_options="default") if tables else self.parse_schema.empty_table()
        pos = np.concatenate(positions) if positions else np.zeros(0, np.int64)
        return Decoded(rows, pos, errors, skipped, new_columns, wider)

    def _changed_columns(self, writer: WriterSchema) -> tuple[dict[str, pa.Field], dict[str, pa.Field]]:
        """The fields of a writer schema's rows (a Debezium envelope's ``after``, else the
        record's own fields but the operation and sequence) that the table lacks, and those
        whose type is wider than their column's, by their Connect types (Confluent's Avro
        mapping). None with a reader schema (``--avro-schema``): it decides what is read."""
        if self.reader is not None or self.registry is None:
            return {}, {}
        hit = self._changed.get(id(writer))
        if hit is not None and hit[0] is writer:
            return hit[1]
        if writer.envelope:
            found = changed_columns(self.schema, row_schema(writer.connect))
        else:
            found = changed_columns(self.schema, ConnectSchema.from_avro(json.loads(writer.json)), {self.op_field, self.sequence_field})
        self._changed[id(writer)] = (writer, found)
        return found

    # -- Debezium envelopes

    def _plan(self, writer: WriterSchema) -> Columns:
        hit = self._columns.get(id(writer))
        if hit is None or hit[0] is not writer:
            hit = (writer, Columns.of_struct(self.schema, self.targets, row_schema(writer.connect), pa.binary()))
            self._columns[id(writer)] = hit
        return hit[1]

    def _changes(self, writer: WriterSchema, bodies: pa.BinaryArray, keys: pa.BinaryArray) -> tuple[pa.Table, np.ndarray, dict[int, str]]:
        """Rows of Debezium envelopes (``bodies``, bare Avro data of ``writer``): the table's columns
        converted by their Connect types, the operation (column :attr:`op_field`) and the source
        position (the sequence); their indices in ``bodies``, and why each other one is bad."""
        if self.op_field is None:
            self.op_field = OP  # the envelope says which changes are deletes
        columns = self._plan(writer)
        env_type = envelope_type(columns.parse)
        env_schema = pa.schema(list(env_type))
        parts: list[tuple[pa.Table, np.ndarray]] = []
        errors: dict[int, str] = {}
        index = np.arange(len(bodies))
        native = writer.read_native(bodies)
        if native is not None:
            table, fits = native
            try:
                parts.append((pa.table([conform_struct(table.column(f.name).combine_chunks() if f.name in table.column_names
                                                       else pa.nulls(table.num_rows), f.type) for f in env_type], schema=env_schema), fits))
                index = np.setdiff1d(index, fits)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:  # a value its column cannot take: fastavro's path names it
                log.debug("native Avro rows do not fit the columns, fastavro decodes them: %s", reason(e))
        if len(index):
            rest = bodies if len(index) == len(bodies) else bodies.take(pa.array(index, pa.int64()))
            records, decoded, failed = writer.read(rest)
            errors.update({int(index[j]): why for j, why in failed.items()})

            def attempt(idx: np.ndarray, records=records) -> pa.Table:
                return pa.Table.from_pylist([records[j] for j in idx], schema=env_schema)

            try:
                parts.append((attempt(np.arange(len(decoded))), index[decoded]))
            except Exception:  # noqa: BLE001 - isolate the records whose values the reader cannot take
                good, bad = bisect_failures(len(decoded), attempt)
                errors.update({int(index[decoded[j]]): f"the record does not fit the table's columns: {why}" for j, why in bad.items()})
                if len(good):
                    parts.append((attempt(good), index[decoded[good]]))
        env = pa.concat_tables([t for t, _ in parts]) if parts else env_schema.empty_table()
        at = np.concatenate([i for _, i in parts]) if parts else np.zeros(0, np.int64)
        fields = {f.name: env.column(f.name).combine_chunks() for f in env_type}
        rows, bad_rows = change_rows(fields, columns, self.primary_key, self.sequence_field,
                                     lambda: self._keys(keys.take(pa.array(at, pa.int64()))))
        for j, why in bad_rows.items():
            errors[int(at[j])] = why
        keep = np.flatnonzero(~np.isin(np.arange(len(at)), np.fromiter(bad_rows, np.int64, len(bad_rows))))
        rows = rows.rename_columns([self.op_field if c == OP else c for c in rows.column_names])
        return rows.take(pa.array(keep, pa.int64())), at[keep], errors

    def _keys(self, keys: pa.BinaryArray) -> dict[str, pa.Array]:
        """Primary-key columns of Debezium's Avro keys (Confluent-framed records, their writer
        schema from the registry), converted by their Connect types; null where a key cannot be
        read (without a registry, always): the value must then hold the key. Read one by one:
        only a batch with a change whose value lacks its key asks."""
        n = len(keys)
        targets = {c: self.targets[c] for c in self.primary_key}
        out: dict[str, list] = {c: [None] * n for c in self.primary_key}
        fastavro = _fastavro()
        raw = keys.to_pylist()
        by_id: dict[int, tuple[Any, Columns]] = {}
        for i, key in enumerate(raw if self.registry is not None else []):
            if key is None or len(key) < HEADER_BYTES or key[0] != MAGIC:
                continue
            sid = int.from_bytes(key[1:HEADER_BYTES], "big")
            try:
                if sid not in by_id:
                    text = json.loads(registry_schema(self.registry, sid))  # type: ignore[arg-type]
                    by_id[sid] = (fastavro.parse_schema(raw_schema(text)),
                                  Columns.of_struct(self.schema, self.targets, ConnectSchema.from_avro(text), pa.binary(), self.primary_key))
                record = fastavro.schemaless_reader(io.BytesIO(key[HEADER_BYTES:]), by_id[sid][0])
            except Exception:  # noqa: BLE001 - an unreadable key is no key
                continue
            columns = by_id[sid][1]
            cells = {c: pa.array([record.get(c) if isinstance(record, dict) else None], columns.parse.field(c).type) for c in self.primary_key}
            converted = columns.convert(cells, {})
            for c in self.primary_key:
                out[c][i] = converted[c][0].as_py()
        return {c: pa.array(out[c], targets[c]) for c in self.primary_key}
