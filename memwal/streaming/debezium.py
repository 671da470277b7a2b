"""Debezium change events (JSON converter) as upserts and deletes of a table's rows.

A Debezium value is an envelope ``{"before": row, "after": row, "op": "c"|"r"|"u"|"d",
"source": {..., "lsn": n, "ts_ms": t}, "ts_ms": t}``, either bare
(``value.converter.schemas.enable=false``) or wrapped as ``{"schema": ..., "payload":
envelope}``. Creates (``c``), snapshot reads (``r``) and updates (``u``) upsert ``after``;
deletes (``d``) delete the key of ``before``. A null value is the tombstone Debezium sends
after a delete for log compaction: it changes nothing and is skipped (counted, not a dead
letter). Key columns a row lacks (a delete's ``before`` is null or holds only some columns,
depending on the source's replica identity) come from the Kafka key, Debezium's key JSON,
wrapped or bare.

The source position (``source.lsn``, else ``source.ts_ms``, else the envelope's ``ts_ms``)
becomes the sequence column when the sink has one: versions of a key are then ordered by it
(ties by Kafka partition and offset), and with ``drop_stale_across_batches`` a replay of an
older change never overwrites a newer one, whichever partition it arrives from.

Everything is decoded per batch in Arrow calls (one JSON read for the values, one for the
keys, column-wise selection); only a batch that fails as a whole is bisected to find the
records at fault (:func:`~memwal.streaming.decode.bisect_failures`).
"""

from __future__ import annotations

import json
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal.streaming.batches import Binaries, Decoded, binary_array, bisect_failures, json_type, read_json_objects

#: The column of decoded rows holding the operation (not a table column: those may not start with "_").
OP = "__memwal_debezium_op"
#: Debezium's row operations: create, read (snapshot), update, delete.
UPSERT_OPS = ("c", "r", "u")
DELETE_OP = "d"


class DebeziumDecoder:
    """Decodes Debezium JSON change events into a table's rows (see the module's doc)."""

    op_field = OP

    def __init__(self, schema: pa.Schema, primary_key: Sequence[str], sequence_field: str | None = None) -> None:
        self.schema = schema
        self.primary_key = list(primary_key)
        self.sequence_field = sequence_field
        row = pa.struct([pa.field(f.name, json_type(f.type)) for f in schema])
        source = pa.struct([pa.field("lsn", pa.int64()), pa.field("ts_ms", pa.int64())])
        envelope = [pa.field("before", row), pa.field("after", row), pa.field("op", pa.string()),
                    pa.field("ts_ms", pa.int64()), pa.field("source", source)]
        self.value_schema = pa.schema(envelope + [pa.field("payload", pa.struct(envelope))])
        key_fields = [pa.field(c, json_type(schema.field(c).type)) for c in self.primary_key]
        self.key_schema = pa.schema(key_fields + [pa.field("payload", pa.struct(key_fields))])

    def decode_batch(self, values: Binaries, keys: Binaries) -> Decoded:
        values, key_array = binary_array(values).to_pylist(), binary_array(keys)
        present = np.array([i for i, v in enumerate(values) if v is not None], dtype=np.int64)
        skipped = len(values) - len(present)  # tombstones
        vals = [values[i] for i in present]
        errors: dict[int, str] = {}
        try:
            env = read_json_objects(vals, self.value_schema)
            good = np.arange(len(vals))
        except Exception:  # noqa: BLE001 - isolate the records at fault
            good, bad = bisect_failures(len(vals), lambda idx: read_json_objects([vals[i] for i in idx], self.value_schema))
            for j, reason in bad.items():
                errors[int(present[j])] = _envelope_reason(vals[j], reason)
            env = read_json_objects([vals[i] for i in good], self.value_schema) if len(good) else self.value_schema.empty_table()
        positions = present[good]
        rows, row_errors = self._rows(_unwrap(env, [f.name for f in self.value_schema if f.name != "payload"]),
                                      key_array.take(pa.array(positions, pa.int64())))
        for j, reason in row_errors.items():
            errors[int(positions[j])] = reason
        keep = np.array([j for j in range(len(positions)) if j not in row_errors], dtype=np.int64)
        return Decoded(rows.take(pa.array(keep, pa.int64())), positions[keep], errors, skipped)

    def _rows(self, env: dict[str, pa.Array], keys: pa.BinaryArray) -> tuple[pa.Table, dict[int, str]]:
        """Table rows (plus :data:`OP` and the sequence) of unwrapped envelopes, and the
        positions of malformed ones with the reason."""
        op = env["op"]
        is_delete = pc.fill_null(pc.equal(op, DELETE_OP), False)
        is_upsert = pc.fill_null(pc.is_in(op, pa.array(UPSERT_OPS)), False)
        errors: dict[int, str] = {}
        for j in np.flatnonzero(~np.asarray(is_delete) & ~np.asarray(is_upsert)):
            o = op[int(j)].as_py()
            errors[int(j)] = ("not a Debezium change event: no 'op' field" if o is None
                              else f"Debezium operation {o!r} is not a row change (expected one of c, r, u, d)")
        after_missing = np.asarray(pc.and_(is_upsert, env["after"].is_null()))
        for j in np.flatnonzero(after_missing):
            errors.setdefault(int(j), f"Debezium {op[int(j)].as_py()!r} event without an 'after' row")
        columns = [pc.if_else(is_delete, pc.struct_field(env["before"], f.name), pc.struct_field(env["after"], f.name))
                   for f in self.schema]
        names = list(self.schema.names)
        if any(columns[names.index(c)].null_count for c in self.primary_key):
            key_rows = self._keys(keys.to_pylist())  # the key when the value lacks it
            for c in self.primary_key:
                columns[names.index(c)] = pc.coalesce(columns[names.index(c)], key_rows[c])
        if self.sequence_field:
            source = env["source"]
            position = pc.coalesce(pc.struct_field(source, "lsn"), pc.struct_field(source, "ts_ms"), env["ts_ms"])
            for j in np.flatnonzero(np.asarray(position.is_null())):
                errors.setdefault(int(j), "the Debezium event has no source position (source.lsn, source.ts_ms or ts_ms)")
            columns[names.index(self.sequence_field)] = position
        rows = pa.Table.from_arrays(columns + [op], names=names + [OP])
        return rows, errors

    def _keys(self, keys: list[bytes | None]) -> dict[str, pa.Array]:
        """Primary-key columns of Debezium key JSON, bare or wrapped; null where a record has
        no key or its key does not parse (the value must then hold the key itself)."""
        n = len(keys)
        out = {c: pa.nulls(n, self.key_schema.field(c).type) for c in self.primary_key}
        present = [i for i, k in enumerate(keys) if k is not None]
        if not present or not self.primary_key:
            return out
        ks = [keys[i] for i in present]
        try:
            parsed, good = read_json_objects(ks, self.key_schema), np.arange(len(ks))
        except Exception:  # noqa: BLE001 - unparseable keys count as absent
            good, _ = bisect_failures(len(ks), lambda idx: read_json_objects([ks[i] for i in idx], self.key_schema))
            parsed = read_json_objects([ks[i] for i in good], self.key_schema) if len(good) else self.key_schema.empty_table()
        cols = _unwrap(parsed, self.primary_key)
        at = np.full(n, -1, np.int64)
        at[np.asarray(present, np.int64)[good]] = np.arange(len(good))
        idx = pa.array(at, pa.int64(), mask=at < 0)
        return {c: cols[c].take(idx) for c in self.primary_key}


def _unwrap(t: pa.Table, names: list[str]) -> dict[str, pa.Array]:
    """Per name: the field of ``payload`` where a record is wrapped, else its top-level field."""
    payload = t.column("payload").combine_chunks()
    wrapped = payload.is_valid()
    return {n: pc.if_else(wrapped, pc.struct_field(payload, n), t.column(n).combine_chunks()) for n in names}


def _envelope_reason(value: bytes | None, reason: str) -> str:
    try:
        obj = json.loads(value)  # type: ignore[arg-type]
    except (ValueError, UnicodeDecodeError, TypeError) as e:
        return f"the value is not valid JSON: {e}"
    if not isinstance(obj, dict):
        return f"the value is JSON {type(obj).__name__}, not a Debezium envelope"
    return f"the Debezium envelope does not match the table schema: {reason}"


__all__ = ["DebeziumDecoder"]
