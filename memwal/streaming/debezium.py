"""Debezium change events (Kafka Connect's JSON converter) as upserts and deletes of a table's rows.

A value is a Debezium envelope (:mod:`~memwal.streaming.envelope`), either bare
(``value.converter.schemas.enable=false``) or wrapped as ``{"schema": ..., "payload":
envelope}`` (``schemas.enable=true``, the converter's default). A null value is the tombstone
Debezium sends after a delete for log compaction: it changes nothing and is skipped (counted,
not a dead letter). Keys are Debezium's key JSON, wrapped or bare.

**Values with their schema.** A wrapped value's schema names each column's Connect type:
decimals are base64 (``decimal.handling.mode=precise``, the default), timestamps epoch
numbers in the unit their name says (``time.precision.mode=adaptive``, the default), and so
on; each column is converted by it (:mod:`~memwal.streaming.connect`), exactly. The records
of a batch are grouped by their schema without parsing each one: Kafka Connect writes
``{"schema":`` first, so each value is split where its ``"payload":`` key starts (one Arrow
kernel), the schema parts are grouped by an Arrow hash (normally one group per batch), each
distinct schema is parsed once (and remembered), and only the payload part is given to
Arrow's JSON reader: the schema, several times the payload's size, is never tokenized.
Values written otherwise (another key order, whitespace) are found by a regular expression
and their schema read record by record. Bare values, and wrapped ones whose schema does not
describe the columns, are read as the table's types, as before.

Everything is decoded per batch in Arrow calls; only a group that fails as a whole is
bisected to find the records at fault (:func:`~memwal.streaming.batches.bisect_failures`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal.core.errors import InvalidArgumentError
from memwal.streaming.batches import Binaries, Decoded, binary_array, bisect_failures, json_type, read_json_objects, value_offsets
from memwal.streaming.connect import ConnectSchema
from memwal.streaming.envelope import OP, Columns, EventSchema, change_rows, changed_columns, envelope_type, event_schema, row_schema

__all__ = ["DebeziumDecoder", "EventSchema", "OP", "SchemaGroup", "schema_from_event", "schema_groups"]

#: What Kafka Connect's JSON converter writes at the start of a value with its schema, and
#: the key that follows the schema.
_SCHEMA_FIRST = b'{"schema":'
_PAYLOAD_KEY = b'"payload":'
#: A value whose schema is written otherwise (another key order, whitespace).
_ANY_SCHEMA = r'"schema"\s*:\s*\{'
_PAYLOAD_RE = '"payload":'
#: Distinct schemas a batch is searched for by comparing starts (each a pass over the batch).
_PREFIXES = 8
#: Distinct schemas remembered per decoder (a topic has a handful; the bound only stops growth).
_SCHEMA_CACHE = 256


@dataclass(frozen=True)
class SchemaGroup:
    """Records of a batch that share one Connect schema."""

    #: Their positions in the batch.
    rows: np.ndarray
    #: The schema of their values (None: none, or none that could be read).
    schema: ConnectSchema | None
    #: What the JSON reader reads: the values without their schema (``{"payload": ...}``),
    #: or the values as they are.
    values: pa.BinaryArray


class _Schemas:
    """The Connect schemas of the JSON converter's values, parsed once per distinct text."""

    def __init__(self) -> None:
        self._known: dict[bytes, ConnectSchema | None] = {}

    def of_prefix(self, prefix: bytes) -> ConnectSchema | None:
        """The schema of values starting ``{"schema": ..., `` (None if that is not one)."""
        if prefix not in self._known:
            if len(self._known) >= _SCHEMA_CACHE:
                self._known.clear()
            try:
                obj = json.loads(prefix.rstrip(b" \t\r\n,") + b"}")
                self._known[prefix] = ConnectSchema.from_json(obj["schema"]) if isinstance(obj, dict) and len(obj) == 1 else None
            except (ValueError, KeyError, TypeError):
                self._known[prefix] = None
        return self._known[prefix]

    def of_value(self, value: bytes) -> ConnectSchema | None:
        """The schema of one value, read whole (values not written as the converter writes them);
        parsed once per distinct schema (its canonical text)."""
        try:
            obj = json.loads(value)
        except (ValueError, UnicodeDecodeError):
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("schema"), dict):
            return None
        return self.of_prefix(b'{"schema":' + json.dumps(obj["schema"], sort_keys=True, separators=(",", ":")).encode())


def _split(arr: pa.BinaryArray, at: np.ndarray, part: int) -> pa.BinaryArray:
    """Each value cut in two at ``at`` (a position per value): the heads (``part`` 0) or the
    tails (1). The values' data is not copied to cut them: one array of 2n values over the same
    data buffer (offsets start, start + at, next start, ...) holds both; one is taken."""
    n = len(arr)
    offsets = value_offsets(arr)
    cut = np.empty(2 * n + 1, np.int64)
    cut[0:-1:2] = offsets[:-1]
    cut[1:-1:2] = offsets[:-1] + at
    cut[-1] = offsets[-1]
    both = pa.Array.from_buffers(pa.binary(), 2 * n, [None, pa.py_buffer(cut.astype(np.int32).tobytes()), arr.buffers()[2]])
    return both.take(pa.array(np.arange(n, dtype=np.int64) * 2 + part, pa.int64()))


def schema_groups(arr: pa.BinaryArray, schemas: _Schemas | None = None) -> list[SchemaGroup]:
    """The non-null values of ``arr`` grouped by their Connect schema (see the module's doc).

    A batch's values normally share their schema's bytes: the schema part of one value (up to
    its ``"payload":``, found in Python) is compared with the start of every value by one Arrow
    kernel (a memcmp per value), and so on for each further distinct schema, up to
    :data:`_PREFIXES` of them; Arrow's substring search (much slower) finds the rest's."""
    schemas = schemas or _Schemas()
    n = len(arr)
    present = np.asarray(arr.is_valid(), bool)
    candidates = present & np.asarray(pc.starts_with(arr, _SCHEMA_FIRST).fill_null(False), bool)
    groups: list[SchemaGroup] = []
    found = np.zeros(n, bool)
    at = np.zeros(n, np.int64)
    schema_of: list[tuple[ConnectSchema, np.ndarray]] = []
    for _ in range(_PREFIXES):
        if not candidates.any():
            break
        first = int(np.flatnonzero(candidates)[0])
        value = arr[first].as_py()
        cut = value.find(_PAYLOAD_KEY)
        schema = schemas.of_prefix(value[:cut]) if cut > 0 else None
        if schema is None:
            candidates[first] = False
            continue
        same = candidates & np.asarray(pc.starts_with(arr, value[:cut]).fill_null(False), bool)
        same &= np.asarray(pc.equal(pc.binary_slice(arr, cut, cut + len(_PAYLOAD_KEY)), _PAYLOAD_KEY).fill_null(False), bool)
        at[same] = cut
        schema_of.append((schema, same))
        candidates &= ~same
    if candidates.any():  # more distinct schemas than that: find each value's payload
        where = np.asarray(pc.find_substring_regex(arr, _PAYLOAD_RE).fill_null(-1), np.int64)
        rows = np.flatnonzero(candidates & (where > 0))
        if len(rows):
            heads = _split(arr.take(pa.array(rows, pa.int64())), where[rows], 0)
            codes = pc.dictionary_encode(heads)
            index = np.asarray(codes.indices, np.int64)
            for k, prefix in enumerate(codes.dictionary.to_pylist()):
                schema = schemas.of_prefix(prefix)
                if schema is not None:
                    same = np.zeros(n, bool)
                    same[rows[index == k]] = True
                    at[same] = where[same]
                    schema_of.append((schema, same))
    if schema_of:
        rows = np.flatnonzero(np.logical_or.reduce([m for _, m in schema_of]))
        chosen = arr if len(rows) == n else arr.take(pa.array(rows, pa.int64()))
        tails = _split(chosen, at[rows], 1)
        tails = pc.binary_join_element_wise(_OPEN, tails, _EMPTY)  # "{" + '"payload": ...}'
        position = np.full(n, -1, np.int64)
        position[rows] = np.arange(len(rows))
        for schema, same in schema_of:
            idx = np.flatnonzero(same)
            groups.append(SchemaGroup(idx, schema, tails.take(pa.array(position[idx], pa.int64()))))
            found |= same
    rest = present & ~found
    if rest.any():
        slow = rest & np.asarray(pc.match_substring_regex(arr, _ANY_SCHEMA).fill_null(False), bool)
        by_schema: dict[int, tuple[ConnectSchema, list[int]]] = {}
        for i in np.flatnonzero(slow):  # written otherwise than Kafka Connect writes: read one by one
            schema = schemas.of_value(arr[int(i)].as_py())
            if schema is not None:
                by_schema.setdefault(id(schema), (schema, []))[1].append(int(i))
        for schema, idx in by_schema.values():
            rows = np.array(idx, np.int64)
            groups.append(SchemaGroup(rows, schema, arr.take(pa.array(rows, pa.int64()))))
            rest[rows] = False
        if rest.any():
            rows = np.flatnonzero(rest)
            groups.append(SchemaGroup(rows, None, arr if len(rows) == n else arr.take(pa.array(rows, pa.int64()))))
    return groups


_OPEN = pa.scalar(b"{", pa.binary())
_EMPTY = pa.scalar(b"", pa.binary())


class DebeziumDecoder:
    """Decodes Debezium JSON change events into a table's rows (see the module's doc)."""

    op_field = OP

    def __init__(self, schema: pa.Schema, primary_key: Sequence[str], sequence_field: str | None = None) -> None:
        self.schema = schema
        self.primary_key = list(primary_key)
        self.sequence_field = sequence_field
        #: What each column is converted to (then conformed to the table's type, as for JSON).
        self.targets = {f.name: json_type(f.type) for f in schema}
        self._schemas = _Schemas()
        self._key_schemas = _Schemas()
        self._plans: dict[int, tuple[ConnectSchema | None, Columns, pa.Schema]] = {}

    def _plan(self, schema: ConnectSchema | None, key: bool = False) -> tuple[Columns, pa.Schema]:
        """How records of one schema are read: the columns, and the JSON reader's schema."""
        cache_key = (id(schema), key)
        hit = self._plans.get(cache_key)  # type: ignore[call-overload]
        if hit is not None and hit[0] is schema:
            return hit[1], hit[2]
        if len(self._plans) >= _SCHEMA_CACHE:
            self._plans.clear()
        if key:
            columns = Columns.of_struct(self.schema, self.targets, schema, pa.string(), self.primary_key)
            fields = [pa.field(c, columns.parse.field(c).type) for c in self.primary_key]
            parse = pa.schema([pa.field("payload", pa.struct(fields))] if schema is not None else fields + [pa.field("payload", pa.struct(fields))])
        else:
            columns = Columns.of_struct(self.schema, self.targets, row_schema(schema), pa.string())
            envelope = envelope_type(columns.parse)
            parse = pa.schema([pa.field("payload", envelope)] if schema is not None else list(envelope) + [pa.field("payload", envelope)])
        self._plans[cache_key] = (schema, columns, parse)  # type: ignore[index]
        return columns, parse

    def decode_batch(self, values: Binaries, keys: Binaries) -> Decoded:
        arr, key_array = binary_array(values), binary_array(keys)
        skipped = int(arr.null_count)  # tombstones
        errors: dict[int, str] = {}
        tables: list[pa.Table] = []
        positions: list[np.ndarray] = []
        new_columns: dict[str, pa.Field] = {}
        wider: dict[str, pa.Field] = {}
        for group in schema_groups(arr, self._schemas):
            columns, parse = self._plan(group.schema)
            new, widened = changed_columns(self.schema, row_schema(group.schema))
            new_columns.update(new)
            wider.update(widened)
            vals = group.values
            try:
                env, good = read_json_objects(vals, parse), np.arange(len(vals))
            except Exception:  # noqa: BLE001 - isolate the records at fault
                good, bad = bisect_failures(len(vals), lambda idx, v=vals, p=parse: read_json_objects(v.take(pa.array(idx, pa.int64())), p))
                for j, why in bad.items():
                    errors[int(group.rows[j])] = _envelope_reason(arr[int(group.rows[j])].as_py(), why)
                env = read_json_objects(vals.take(pa.array(good, pa.int64())), parse) if len(good) else parse.empty_table()
            rows_at = group.rows[good]
            fields = _unwrap(env, ["before", "after", "op", "ts_ms", "source"], wrapped=group.schema is not None)
            rows, row_errors = change_rows(fields, columns, self.primary_key, self.sequence_field,
                                           lambda at=rows_at: self._keys(key_array.take(pa.array(at, pa.int64()))))
            for j, why in row_errors.items():
                errors[int(rows_at[j])] = why
            keep = np.flatnonzero(~np.isin(np.arange(len(rows_at)), np.fromiter(row_errors, np.int64, len(row_errors))))
            tables.append(rows if len(keep) == len(rows_at) else rows.take(pa.array(keep, pa.int64())))
            positions.append(rows_at[keep])
        if not tables:
            columns, _ = self._plan(None)
            empty = pa.schema([pa.field(c, columns.targets[c]) for c in columns.names] + [pa.field(OP, pa.string())])
            return Decoded(empty.empty_table(), np.zeros(0, np.int64), errors, skipped, new_columns, wider)
        pos = np.concatenate(positions)
        rows = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        if len(tables) > 1:  # in batch order, as one group gives them
            order = np.argsort(pos, kind="stable")
            rows, pos = rows.take(pa.array(order, pa.int64())), pos[order]
        return Decoded(rows, pos, errors, skipped, new_columns, wider)

    def _keys(self, keys: pa.BinaryArray) -> dict[str, pa.Array]:
        """Primary-key columns of Debezium key JSON, bare or wrapped (converted by their schema);
        null where a record has no key, or its key does not parse or fit (the value must then
        hold the key itself)."""
        n = len(keys)
        targets = {c: self.targets[c] for c in self.primary_key}
        out = {c: pa.nulls(n, targets[c]) for c in self.primary_key}
        if not self.primary_key or keys.null_count == n:
            return out
        at = {c: [] for c in self.primary_key}  # type: dict[str, list[pa.Array]]
        rows_of: list[np.ndarray] = []
        for group in schema_groups(keys, self._key_schemas):
            columns, parse = self._plan(group.schema, key=True)
            vals = group.values
            try:
                parsed, good = read_json_objects(vals, parse), np.arange(len(vals))
            except Exception:  # noqa: BLE001 - unparseable keys count as absent
                good, _ = bisect_failures(len(vals), lambda idx, v=vals, p=parse: read_json_objects(v.take(pa.array(idx, pa.int64())), p))
                parsed = read_json_objects(vals.take(pa.array(good, pa.int64())), parse) if len(good) else parse.empty_table()
            raw = _unwrap(parsed, self.primary_key, wrapped=group.schema is not None)
            converted = columns.convert(raw, {})  # a key that does not fit is null: the value must hold it
            for c in self.primary_key:
                at[c].append(converted[c])
            rows_of.append(group.rows[good])
        if not rows_of:
            return out
        rows = np.concatenate(rows_of)
        where = np.full(n, len(rows), np.int64)  # a trailing null for records without a key
        where[rows] = np.arange(len(rows))
        idx = pa.array(where, pa.int64())
        return {c: pa.concat_arrays([*(a.cast(targets[c]) for a in at[c]), pa.nulls(1, targets[c])]).take(idx) for c in self.primary_key}


def _unwrap(t: pa.Table, names: list[str], wrapped: bool) -> dict[str, pa.Array]:
    """Per name: the field of ``payload`` (wrapped values; a bare value's own field when it has
    no ``payload``), or the value's top-level field."""
    payload = t.column("payload").combine_chunks()
    if wrapped:
        return {n: pc.struct_field(payload, n) for n in names}
    has = payload.is_valid()
    return {n: pc.if_else(has, pc.struct_field(payload, n), t.column(n).combine_chunks()) for n in names}


def _envelope_reason(value: bytes | None, reason: str) -> str:
    try:
        obj = json.loads(value)  # type: ignore[arg-type]
    except (ValueError, UnicodeDecodeError, TypeError) as e:
        return f"the value is not valid JSON: {e}"
    if not isinstance(obj, dict):
        return f"the value is JSON {type(obj).__name__}, not a Debezium envelope"
    return f"the Debezium envelope does not match the table schema: {_naming_the_column(obj, reason)}"


def _naming_the_column(envelope: dict, reason: str) -> str:
    """Arrow's JSON reader names the value it could not convert, not its field: the reason with
    the row's field holding that value in front (a source column whose type changed, say)."""
    quoted = re.search(r"'([^']*)'", reason)
    payload = envelope.get("payload", envelope)
    if quoted is None or not isinstance(payload, dict):
        return reason
    for part in ("after", "before"):
        row = payload.get(part)
        if isinstance(row, dict):
            for name, v in row.items():
                if v is not None and not isinstance(v, (dict, list)) and str(v) == quoted.group(1):
                    return f"column {name!r}: {reason}"
    return reason


def schema_from_event(text: bytes | str) -> EventSchema:
    """The table schema of one change event as Kafka Connect's JSON converter writes it with
    its schema (``memwal init --schema-from-debezium``): ``text`` holds the event's value,
    optionally preceded or followed by its key (JSON documents one after another, as
    ``kafka-console-consumer --property print.key=true`` prints them). Each column gets the
    natural Arrow type of its Connect type (:func:`~memwal.streaming.connect.arrow_type`),
    nullable as the column is optional."""
    data = text.decode("utf-8") if isinstance(text, bytes) else text
    decoder = json.JSONDecoder()
    docs, at = [], 0
    while True:
        while at < len(data) and data[at].isspace():
            at += 1
        if at >= len(data):
            break
        try:
            doc, at = decoder.raw_decode(data, at)
        except ValueError as e:
            raise InvalidArgumentError(f"the change event is not JSON: {e}") from None
        docs.append(doc)
    row: ConnectSchema | None = None
    key: ConnectSchema | None = None
    for doc in docs:
        schema = doc.get("schema") if isinstance(doc, dict) and "schema" in doc else doc
        if not isinstance(schema, dict):
            continue
        try:
            parsed = ConnectSchema.from_json(schema)
        except ValueError:
            continue
        if row_schema(parsed) is not None:
            row = row_schema(parsed)
        elif parsed.type == "struct" and parsed.fields:
            key = parsed
    if row is None:
        raise InvalidArgumentError("no change event with its schema found: give a Debezium value as Kafka Connect's JSON converter "
                                   "writes it with schemas.enable=true ({\"schema\": {...}, \"payload\": {...}})")
    return event_schema(row, key)
