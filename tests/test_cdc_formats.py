"""Debezium JSON change events and Avro values: the decoders alone, then end to end through a
real Kafka-protocol broker and Spark into real tables."""

from __future__ import annotations

import io
import json
import os
import random
import threading

import fastavro
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from brokers import produce
from helpers import approx, keyed_changes, run_sink_batch, table_rows
from registry import Registry

from memwal import Table, readers
from memwal.core.errors import InvalidArgumentError
from memwal.streaming import SinkOptions, ingest
from memwal.streaming.avro import AvroDecoder
from memwal.streaming.avro_native import plan, record_fits
from memwal.write.dead_letters import dead_letter_uri, read_dead_letters
from memwal.streaming.debezium import DebeziumDecoder
from memwal.streaming.decode import value_decoder

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64()), ("pos", pa.int64())])
AVRO_SCHEMA = {
    "type": "record",
    "name": "user",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": ["null", "string"], "default": None},
        {"name": "score", "type": ["null", "double"], "default": None},
        {"name": "vec", "type": ["null", {"type": "array", "items": "float"}], "default": None},
        {"name": "op", "type": ["null", "string"], "default": None},
    ],
}
AVRO_TABLE = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64()), ("vec", pa.list_(pa.float32(), 4))])


# -- Debezium: the decoder ---------------------------------------------------------------------------


def change(op: str, before: dict | None, after: dict | None, *, lsn: int | None = None, ts_ms: int = 1000, wrap: bool = False) -> bytes:
    payload = {"before": before, "after": after, "op": op, "ts_ms": ts_ms + 5,
               "source": {"connector": "postgresql", "db": "shop", "table": "users", "ts_ms": ts_ms, "lsn": lsn}}
    if wrap:  # the JSON converter's schemas.enable=true form
        return json.dumps({"schema": {"type": "struct", "fields": [], "name": "users.Envelope"}, "payload": payload}).encode()
    return json.dumps(payload).encode()


def key(k: int, wrap: bool = False) -> bytes:
    return json.dumps({"schema": {"type": "struct"}, "payload": {"id": k}} if wrap else {"id": k}).encode()


def decode_debezium(values, keys=None, sequence_field="pos"):
    keys = keys if keys is not None else [None] * len(values)
    d = DebeziumDecoder(SCHEMA, ["id"], sequence_field).decode_batch(values, keys)
    rows = d.rows.to_pylist()
    return [(int(p), r) for p, r in zip(d.positions, rows)], d.errors, d.skipped


def test_debezium_ops_wrapped_or_bare_with_the_source_position_as_sequence():
    values = [
        change("r", None, {"id": 1, "name": "a", "score": 1.0}, lsn=10),
        change("c", None, {"id": 2, "name": "b", "score": 2.0}, lsn=11, wrap=True),
        change("u", {"id": 1, "name": "a", "score": 1.0}, {"id": 1, "name": "a2", "score": 1.5}, lsn=12),
        change("d", {"id": 2, "name": "b", "score": 2.0}, None, lsn=13, wrap=True),
        None,  # the tombstone after the delete
        change("u", None, {"id": 3, "name": "c", "score": 3.0}, lsn=None, ts_ms=777),  # no LSN: source.ts_ms
    ]
    rows, errors, skipped = decode_debezium(values)
    assert errors == {} and skipped == 1
    got = {p: (r["id"], r["name"], r["__memwal_debezium_op"], r["pos"]) for p, r in rows}
    assert got == {0: (1, "a", "r", 10), 1: (2, "b", "c", 11), 2: (1, "a2", "u", 12), 3: (2, "b", "d", 13), 5: (3, "c", "u", 777)}


def test_debezium_key_columns_come_from_the_kafka_key_when_the_value_lacks_them():
    values = [
        change("d", None, None, lsn=20),  # before is null (no replica identity): the key says which row
        change("d", {"id": None, "name": None, "score": None}, None, lsn=21, wrap=True),
        change("u", None, {"name": "x"}, lsn=22),
        change("d", None, None, lsn=23),  # no usable key at all
    ]
    rows, errors, _ = decode_debezium(values, [key(7), key(8, wrap=True), key(9), b"{not json"])
    assert {p: (r["id"], r["__memwal_debezium_op"]) for p, r in rows} == {0: (7, "d"), 1: (8, "d"), 2: (9, "u"), 3: (None, "d")}
    assert errors == {}  # a null key is the sink's check (check_rows), with the column's name


def test_malformed_debezium_envelopes_get_reasons():
    values = [
        b"{not json",
        json.dumps([1, 2]).encode(),
        json.dumps({"after": {"id": 1}}).encode(),  # no op: not a change event
        change("t", None, None, lsn=5),  # truncate: not a row change
        change("c", None, None, lsn=6),  # create without after
        change("c", None, {"id": "seven"}, lsn=7),  # wrong type
        json.dumps({"before": None, "after": {"id": 8}, "op": "c", "source": {}}).encode(),  # no position at all
        change("c", None, {"id": 9, "name": "good"}, lsn=9),
    ]
    rows, errors, skipped = decode_debezium(values)
    assert [p for p, _ in rows] == [7] and skipped == 0
    assert "not valid JSON" in errors[0]
    assert "not a Debezium envelope" in errors[1]
    assert "no 'op'" in errors[2]
    assert "'t' is not a row change" in errors[3]
    assert "without an 'after'" in errors[4]
    assert "does not match the table schema" in errors[5]
    assert "no source position" in errors[6]
    # without a sequence column the position is not needed
    rows, errors, _ = decode_debezium(values[6:], sequence_field=None)
    assert errors == {} and [r["id"] for _, r in rows] == [8, 9]


# -- Avro: the decoder --------------------------------------------------------------------------------


def avro_bytes(record: dict, schema=AVRO_SCHEMA, schema_id: int | None = None) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), record)
    body = buf.getvalue()
    return body if schema_id is None else b"\x00" + schema_id.to_bytes(4, "big") + body


def avro_rows(decoded):
    return {int(p): r for p, r in zip(decoded.positions, decoded.rows.to_pylist())}


def test_avro_values_decode_in_bulk_with_and_without_the_confluent_header():
    records = [{"id": i, "name": f"n{i}", "score": i / 2, "vec": [float(i)] * 4, "op": "delete" if i == 3 else None} for i in range(6)]
    text = json.dumps(AVRO_SCHEMA)
    plain = AvroDecoder(AVRO_TABLE, "op", None, text).decode_batch([avro_bytes(r) for r in records], [None] * 6)
    framed = AvroDecoder(AVRO_TABLE, "op", None, text, schema_id=42).decode_batch([avro_bytes(r, schema_id=42) for r in records], [None] * 6)
    for d in (plain, framed):
        assert d.errors == {}
        got = avro_rows(d)
        assert [got[i]["name"] for i in range(6)] == [f"n{i}" for i in range(6)]
        assert got[3]["op"] == "delete" and got[5]["vec"] == [5.0] * 4


def test_corrupt_avro_records_and_foreign_schema_ids_are_isolated_with_reasons():
    text = json.dumps(AVRO_SCHEMA)
    good = [avro_bytes({"id": i, "name": f"n{i}"}, schema_id=42) for i in range(8)]
    values = list(good)
    values[1] = avro_bytes({"id": 1, "name": "x"}, schema_id=7)  # another schema's id
    values[2] = good[2][:7]  # truncated
    values[3] = good[3] + b"\x02\x04"  # trailing garbage
    values[4] = b"\x01" + good[4][1:]  # not the magic byte
    values[5] = b"\x00\x00"  # shorter than the header
    values[6] = None
    d = AvroDecoder(AVRO_TABLE, "op", None, text, schema_id=42).decode_batch(values, [None] * 8)
    assert sorted(avro_rows(d)) == [0, 7]
    assert "schema id 7 does not match the configured schema id 42" in d.errors[1]
    assert "not an Avro record" in d.errors[2] and "not an Avro record" in d.errors[3]
    assert "magic byte" in d.errors[4] and "too short" in d.errors[5] and "no value" in d.errors[6]
    with pytest.raises(InvalidArgumentError):
        value_decoder(AVRO_TABLE, "avro")  # neither a schema nor a registry
    with pytest.raises(InvalidArgumentError):
        value_decoder(AVRO_TABLE, "avro", avro_schema="{not a schema")


# -- the native Avro path against fastavro ------------------------------------------------------

#: Avro type -> (Arrow column type of the table, strategy for a value).
_FLOAT32 = st.floats(width=32, allow_nan=False)
_AVRO_TYPES = {
    "boolean": (pa.bool_(), st.booleans()),
    "int": (pa.int64(), st.integers(-(2**31), 2**31 - 1)),
    "long": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "float": (pa.float32(), _FLOAT32),
    "double": (pa.float64(), st.floats(allow_nan=False)),
    "string": (pa.string(), st.text(max_size=12)),
    "bytes": (pa.binary(), st.binary(max_size=12)),
    "floats": (pa.list_(pa.float32()), st.lists(_FLOAT32, max_size=6)),
    "doubles": (pa.list_(pa.float64()), st.lists(st.floats(allow_nan=False), max_size=6)),
    "bools": (pa.list_(pa.bool_()), st.lists(st.booleans(), max_size=6)),
}


def _avro_type(name: str):
    items = {"floats": "float", "doubles": "double", "bools": "boolean"}
    return {"type": "array", "items": items[name]} if name in items else name


@st.composite
def native_batches(draw):
    """A flat Avro schema the native path takes, records of it, and each record's encoding,
    some of them damaged (cut short, trailing bytes, other bytes, empty) or null."""
    kinds = draw(st.lists(st.tuples(st.sampled_from(sorted(_AVRO_TYPES)), st.sampled_from(["plain", "null first", "null last"])),
                          min_size=1, max_size=5))
    fields, table = [], [("id", pa.int64())]
    for i, (name, nullable) in enumerate(kinds):
        t = _avro_type(name)
        fields.append({"name": f"f{i}", "type": t if nullable == "plain" else (["null", t] if nullable == "null first" else [t, "null"])})
        table.append((f"f{i}", _AVRO_TYPES[name][0]))
    schema = {"type": "record", "name": "r", "fields": [{"name": "id", "type": "long"}, *fields]}
    records = []
    for k in range(draw(st.integers(1, 12))):
        rec = {"id": k}
        for i, (name, nullable) in enumerate(kinds):
            value = _AVRO_TYPES[name][1]
            rec[f"f{i}"] = draw(value if nullable == "plain" else st.none() | value)
        records.append(rec)
    values, damages = [], []
    for rec in records:
        body = avro_bytes(rec, schema)
        damage = draw(st.sampled_from(["none"] * 6 + ["cut", "trailing", "other", "empty", "null"]))
        if damage == "cut" and body:
            body = body[: draw(st.integers(0, len(body) - 1))]
        elif damage == "trailing":
            body += draw(st.binary(min_size=1, max_size=4))
        elif damage == "other":
            body = draw(st.binary(max_size=24))
        elif damage == "empty":
            body = b""
        values.append(None if damage == "null" else body)
        damages.append(damage)
    return schema, pa.schema(table), values, damages


def _fastavro_alone(schema, value: bytes | None) -> dict | None:
    """The record fastavro decodes from ``value`` alone, if it uses up all its bytes."""
    if value is None:
        return None
    buf = io.BytesIO(value)
    try:
        record = fastavro.schemaless_reader(buf, fastavro.parse_schema(schema))
    except Exception:  # noqa: BLE001 - any failure is a record that does not decode
        return None
    return record if buf.tell() == len(value) else None


def _not_utf8(schema, value: bytes) -> bool:
    try:
        fastavro.schemaless_reader(io.BytesIO(value), fastavro.parse_schema(schema))
    except UnicodeDecodeError:
        return True
    except Exception:  # noqa: BLE001 - failed on something else
        return False
    return False


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(native_batches())
def test_native_avro_decoding_matches_fastavro_record_by_record(batch):
    """The model: a value is a row iff fastavro decodes it alone with no byte left, and the
    row is what ``from_pylist`` makes of fastavro's record; every other value is a dead letter.
    Both paths (native, and fastavro for every schema) must give the model's rows. Damaged
    values must not hang the native decoder (it spins on a block cut mid-record)."""
    schema, table, values, damages = batch
    text = json.dumps(schema)
    steps = plan(text)
    assert steps is not None
    expected = {i: r for i, r in enumerate(_fastavro_alone(schema, v) for v in values) if r is not None}
    # The layout walk alone: a value fastavro wrote fits (so it takes the native path), and a
    # value that fits is one fastavro decodes exactly, unless only its UTF-8 is at fault.
    present = [i for i, v in enumerate(values) if v is not None]
    fits = record_fits(steps, pa.array([values[i] for i in present], pa.binary()))
    for i, fit in zip(present, fits):
        if damages[i] == "none":
            assert fit, (i, values[i])
        if fit:
            assert i in expected or _not_utf8(schema, values[i]), (i, values[i])
    for native in (True, False):
        decoder = AvroDecoder(table, None, None, text, native=native)
        got = decoder.decode_batch(values, [None] * len(values))
        assert sorted(got.errors) == sorted(set(range(len(values))) - set(expected)), native
        order = np.argsort(got.positions)
        assert got.positions[order].tolist() == sorted(expected)
        want = pa.Table.from_pylist([expected[i] for i in sorted(expected)], schema=decoder.parse_schema)
        assert got.rows.take(pa.array(order, pa.int64())).equals(want), native


def test_trailing_bytes_make_a_dead_letter_and_never_shift_the_records_after_it():
    """Decoded from one block, a record with bytes left over shifted every later record without
    an error (fastavro ignores what a block has left). On both paths, and for a schema the
    native path does not take, such a value is a dead letter and the others decode right, also
    when another value in the batch makes the native decoder fail (a string that is not UTF-8)."""
    timestamps = {**AVRO_SCHEMA, "fields": [*AVRO_SCHEMA["fields"], {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}}]}
    for s in (AVRO_SCHEMA, timestamps):
        text = json.dumps(s)
        values = [avro_bytes({"id": i, "name": f"n{i}", "score": float(i), "at": 0}, s) for i in range(4)]
        values[1] += b"\x04"  # mid-batch
        values[3] += b"\x00"  # the batch's last value
        bad_utf8 = bytearray(avro_bytes({"id": 9, "name": "xx", "at": 0}, s))
        bad_utf8[bad_utf8.index(b"xx")] = 0xFF
        for batch in (values, [*values, bytes(bad_utf8)]):
            for native in (True, False):
                d = AvroDecoder(AVRO_TABLE, "op", None, text, native=native).decode_batch(batch, [None] * len(batch))
                rows = avro_rows(d)
                assert sorted(rows) == [0, 2], (plan(text) is not None, native, d.errors)
                assert [rows[0]["name"], rows[2]["name"], rows[2]["score"]] == ["n0", "n2", 2.0]
                assert sorted(d.errors) == sorted({1, 3, 4} & set(range(len(batch))))


def test_an_array_block_count_of_minus_two_to_the_63_is_judged_by_fastavro_not_a_crash():
    schema = {"type": "record", "name": "r", "fields": [{"name": "id", "type": "long"}, {"name": "v", "type": {"type": "array", "items": "boolean"}}]}
    text = json.dumps(schema)
    weird = bytes.fromhex("02ffffffffffffffffff010000")  # id 1, then a block of -2**63 items
    values = [avro_bytes({"id": 0, "v": [True]}, schema), weird]
    assert record_fits(plan(text), pa.array(values, pa.binary())).tolist() == [True, False]
    table = pa.schema([("id", pa.int64()), ("v", pa.list_(pa.bool_()))])
    d = AvroDecoder(table, None, None, text).decode_batch(values, [None, None])
    expected = _fastavro_alone(schema, weird)
    assert avro_rows(d)[0] == {"id": 0, "v": [True]}
    assert (1 in d.errors) == (expected is None)


def test_only_flat_writer_schemas_without_logical_types_take_the_native_path():
    record = {"type": "record", "name": "r", "fields": [{"name": "id", "type": "long"}]}

    def with_field(t):
        return json.dumps({**record, "fields": [*record["fields"], {"name": "x", "type": t}]})

    assert plan(json.dumps(AVRO_SCHEMA)) is not None
    assert plan(with_field({"type": "string", "avro.java.string": "String"})) is not None
    for t in ({"type": "long", "logicalType": "timestamp-millis"}, {"type": "enum", "name": "e", "symbols": ["a"]},
              {"type": "map", "values": "long"}, {"type": "array", "items": "long"}, ["null", "long", "string"],
              {"type": "record", "name": "inner", "fields": []}, {"type": "fixed", "name": "f", "size": 2}):
        assert plan(with_field(t)) is None, t
    assert plan("[1, 2]") is None and plan("not json") is None


@pytest.fixture
def registry():
    # id 1: an older writer schema without "score"; id 2: the current one
    old = {**AVRO_SCHEMA, "fields": [f for f in AVRO_SCHEMA["fields"] if f["name"] != "score"]}
    r = Registry({1: old, 2: AVRO_SCHEMA})
    yield r
    r.close()


def test_writer_schemas_come_from_the_registry_by_id(registry):
    old = registry.schemas[1]
    values = [
        avro_bytes({"id": 1, "name": "old"}, schema=old, schema_id=1),
        avro_bytes({"id": 2, "name": "new", "score": 2.5}, schema_id=2),
        avro_bytes({"id": 3, "name": "unknown"}, schema_id=99),
        avro_bytes({"id": 4, "name": "new2", "score": 4.5}, schema_id=2),
    ]
    d = AvroDecoder(AVRO_TABLE, "op", None, json.dumps(AVRO_SCHEMA), registry=registry.url).decode_batch(values, [None] * 4)
    got = avro_rows(d)
    assert {p: (r["id"], r["name"], r["score"]) for p, r in got.items()} == {0: (1, "old", None), 1: (2, "new", 2.5), 3: (4, "new2", 4.5)}
    assert "schema id 99 is not in the registry" in d.errors[2]
    # once per id and process
    AvroDecoder(AVRO_TABLE, "op", None, None, registry=registry.url).decode_batch(values[1:2], [None])
    assert sorted(set(registry.requests)) == ["/schemas/ids/1", "/schemas/ids/2", "/schemas/ids/99"]
    assert registry.requests.count("/schemas/ids/2") == 1


# -- end to end: a Debezium stream over 3 partitions, with one restart ------------------------------


def debezium_stream(n: int, seed: int, partitions: int = 3):
    """Change events of a source table as Debezium emits them (snapshot reads, creates,
    updates, deletes each followed by a tombstone), in LSN order; every event goes to a
    random partition (so a key's changes come from any partition, each partition in LSN
    order); some events are replayed later (at-least-once redelivery). Returns the Kafka
    records, the source table's final state (the model) and the number of tombstones."""
    rng = random.Random(seed)
    db: dict[int, dict] = {}
    sent: list[tuple[bytes, bytes | None, int]] = []
    records: list[tuple[bytes, bytes | None, int]] = []
    tombstones = 0
    lsn = 10_000
    next_id = 0

    def emit(op, k, before, after):
        nonlocal lsn
        lsn += rng.randrange(1, 20)
        wrap = rng.random() < 0.5
        if op == "d" and rng.random() < 0.5:
            before = None if rng.random() < 0.5 else {"id": k}  # replica identity: nothing, or the key only
        value = change(op, before, after, lsn=lsn, ts_ms=1_700_000_000_000 + lsn, wrap=wrap)
        rec = (key(k, wrap), value, rng.randrange(partitions))
        records.append(rec)
        sent.append(rec)
        return lsn

    for _ in range(150):  # the snapshot
        row = {"id": next_id, "name": f"s{next_id}", "score": float(next_id)}
        db[next_id] = {**row, "pos": emit("r", next_id, None, row)}
        next_id += 1
    for i in range(n):
        r = rng.random()
        if r < 0.25 or not db:
            row = {"id": next_id, "name": f"c{i}", "score": rng.random()}
            db[next_id] = {**row, "pos": emit("c", next_id, None, row)}
            next_id += 1
        elif r < 0.8:
            k = rng.choice(list(db))
            before = {c: db[k][c] for c in ("id", "name", "score")}
            row = {**before, "name": f"u{i}", "score": rng.random()}
            db[k] = {**row, "pos": emit("u", k, before, row)}
        else:
            k = rng.choice(list(db))
            emit("d", k, {c: db[k][c] for c in ("id", "name", "score")}, None)
            del db[k]
            records.append((key(k), None, records[-1][2]))  # the tombstone, behind its delete
            tombstones += 1
        if rng.random() < 0.06:  # an old event delivered again, later, from any partition
            k, v, _ = rng.choice(sent)
            records.append((k, v, rng.randrange(partitions)))
    return records, db, tombstones


def wait_for_batches(job, n: int, timeout: float = 300) -> None:
    import time

    deadline = time.monotonic() + timeout
    while len(job.reports.reports) < n:
        assert job.query.exception() is None and job.query.isActive, job.query.exception()
        assert time.monotonic() < deadline, "the query did not reach its batches"
        time.sleep(0.2)


#: The Debezium end-to-end test's generator seed: ``MEMWAL_TEST_SEED=n`` reruns it with another
#: stream (a failure prints the seed it ran with).
DEBEZIUM_SEED = int(os.environ.get("MEMWAL_TEST_SEED", "5"))


def divergence(got: dict, model: dict, records: list, coordinates: list, batches: list) -> str:
    """Why the table is not the model: per diverging key, the stored and the expected row and
    the key's Kafka records (op, source position, partition/offset) in production order."""
    bad = sorted(k for k in set(got) | set(model) if got.get(k) != model.get(k))
    lines = [f"seed {DEBEZIUM_SEED}: {len(bad)} diverging key(s) {bad[:20]}",
             f"batches (id, rows, deletes, stale, writer opens, fenced retries): {batches}"]
    for k in bad[:5]:
        lines.append(f"key {k}: table {got.get(k)} source {model.get(k)}")
        for (kb, v, _), (part, off) in zip(records, coordinates):
            if json.loads(kb).get("payload", json.loads(kb)).get("id") != k:
                continue
            if v is None:
                lines.append(f"    tombstone p{part}@{off}")
                continue
            e = json.loads(v)
            e = e.get("payload", e)
            row = e["after"] or e["before"] or {}
            lines.append(f"    {e['op']} lsn={e['source']['lsn']} name={row.get('name')} p{part}@{off}")
    return "\n".join(lines)


@pytest.mark.spark
@pytest.mark.kafka
def test_a_debezium_stream_over_three_partitions_with_a_restart_equals_the_source(spark, kafka, tmp_path):
    topic = f"dbz-{random.randrange(1 << 30)}"
    kafka.create_topic(topic, 3)
    records, model, tombstones = debezium_stream(2000, seed=DEBEZIUM_SEED)
    coordinates = produce(kafka, topic, records)
    uri, ckpt = str(tmp_path / "users"), str(tmp_path / "ckpt")
    Table.create(uri, SCHEMA, ["id"], "bucket(id, 2)").close()
    options = SinkOptions(source="kafka-json", value_format="debezium-json", sequence_field="pos", drop_stale_across_batches=True)
    run = dict(bootstrap=kafka.bootstrap, topic=topic, table_uri=uri, checkpoint=ckpt, max_offsets_per_trigger=400, options=options)
    first = ingest(spark, **run)  # a continuous query, stopped mid-way
    wait_for_batches(first, 2)
    first.stop()
    half = {r["id"]: r for r in readers.open(uri, consistency="strong").scan().to_pylist()}
    assert half != model
    second = ingest(spark, available_now=True, **run)  # resumes from the checkpoint
    second.await_termination()
    assert second.query.exception() is None
    got = {r["id"]: r for r in readers.open(uri).scan().to_pylist()}
    batches = [(r.batch_id, r.rows, r.deletes, r.stale_dropped, r.writer_opens, r.fenced_retries) for job in (first, second) for r in job.reports.reports]
    assert got == model, divergence(got, model, records, coordinates, batches)
    totals = [job.reports.totals() for job in (first, second)]
    assert sum(t.get("stale_dropped", 0) for t in totals) > 0  # replays really were older than what was stored
    assert sum(t.get("skipped", 0) for t in totals) >= tombstones  # (a batch replayed after the stop counts twice)
    assert read_dead_letters(dead_letter_uri(uri)).num_rows == 0  # tombstones are not dead letters


# -- end to end: Avro values, bare and Confluent-framed, with corrupt records --------------------------


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.parametrize("framing", ["bare", "registry"])
def test_avro_values_end_to_end_with_corrupt_records_in_the_dead_letter_table(spark, kafka, tmp_path, registry, framing):
    topic = f"avro-{framing}-{random.randrange(1 << 30)}"
    kafka.create_topic(topic, 3)
    plain, model = keyed_changes(3000, 500, seed=7)
    schema_id = 2 if framing == "registry" else None
    records = [(k, avro_bytes(rec, schema_id=schema_id), p) for k, rec, p in plain]
    good = avro_bytes({"id": 1, "name": "x"}, schema_id=schema_id)
    bad = [(b"b1", good[:-3], 0), (b"b2", b"\xff\xfe\xfd garbage", 1), (b"b3", None, 2)]
    if framing == "registry":
        bad.append((b"b4", avro_bytes({"id": 1, "name": "x"}, schema_id=77), 0))  # an id the registry lacks
    mixed = records[:1000] + bad[:2] + records[1000:2000] + bad[2:] + records[2000:]
    produce(kafka, topic, mixed)
    uri = str(tmp_path / "users")
    Table.create(uri, AVRO_TABLE, ["id"], "bucket(id, 4)").close()
    avsc = json.dumps(AVRO_SCHEMA)
    options = SinkOptions(source="kafka-json", value_format="avro", avro_schema=avsc,
                          schema_registry=registry.url if framing == "registry" else None)
    job = ingest(spark, bootstrap=kafka.bootstrap, topic=topic, table_uri=uri, checkpoint=str(tmp_path / "ckpt"),
                 available_now=True, max_offsets_per_trigger=1000, options=options)
    job.await_termination()
    assert job.query.exception() is None
    assert approx(table_rows(uri)) == model  # every good record arrived
    dlq = {d["key"]: d["error"] for d in read_dead_letters(dead_letter_uri(uri)).to_pylist()}
    assert set(dlq) == {k for k, _, _ in bad}
    assert "not an Avro record" in dlq[b"b1"] and "no value" in dlq[b"b3"]
    if framing == "registry":
        assert "magic byte" in dlq[b"b2"] and "schema id 77 is not in the registry" in dlq[b"b4"]
    else:
        assert "not an Avro record" in dlq[b"b2"]


def test_ingest_format_flags_are_checked_before_spark_starts(tmp_path):
    import subprocess
    import sys

    base = ["--bootstrap", "127.0.0.1:1", "--topic", "t", "--table", str(tmp_path / "t"), "--checkpoint", str(tmp_path / "c")]
    for extra in (["--avro-schema-id", "3"], ["--format", "avro", "--avro-schema", str(tmp_path / "missing.avsc")]):
        p = subprocess.run([sys.executable, "-m", "memwal", "ingest", *base, *extra], capture_output=True, text=True)
        assert p.returncode == 2, (p.returncode, p.stderr)
        assert "Traceback" not in p.stderr and p.stderr.count("memwal: error:") == 1


def test_a_delete_keeps_its_sequence_for_the_next_writer(tmp_path):
    """--drop-stale across a delete: the delete's sequence is recorded beside the table, so a
    later writer of the shard (another worker, a restarted query: here the worker cache is
    cleared) still drops a change older than the delete, and takes a newer one."""
    from memwal.write.deleted import deleted_sequences_uri, read_deletes
    from memwal.write.worker import WORKER

    uri = str(tmp_path / "t")
    Table.create(uri, SCHEMA, ["id"], "bucket(id, 2)").close()
    options = SinkOptions(source="columns", sequence_field="pos", drop_stale_across_batches=True, max_write_tasks=1,
                          flush_interval_seconds=None, writer_process=False)

    def run(batch_id: int, rows: list[dict]):
        data = pa.Table.from_pylist(rows, schema=SCHEMA.append(pa.field("op", pa.string())))
        try:
            return run_sink_batch(uri, options, data, batch_id)
        finally:
            WORKER.clear()  # the next batch's writers are new ones

    run(0, [{"id": k, "name": f"v{k}", "pos": 10, "op": "upsert"} for k in range(6)])
    run(1, [{"id": k, "pos": 20, "op": "delete"} for k in (0, 1, 2)])
    report = run(2, [{"id": 0, "name": "older than the delete", "pos": 15, "op": "upsert"},
                     {"id": 1, "name": "newer than the delete", "pos": 25, "op": "upsert"},
                     {"id": 3, "name": "older than the row", "pos": 5, "op": "upsert"}])
    assert report.stale_dropped == 2
    got = {r["id"]: r["name"] for r in readers.open(uri, consistency="strong").scan().to_pylist()}
    assert got == {1: "newer than the delete", 3: "v3", 4: "v4", 5: "v5"}
    recorded = {}
    for shard in Table.open(uri).manifests.list_shards():
        recorded.update(read_deletes(deleted_sequences_uri(uri), str(shard), ["id"], "pos", None))
    assert recorded == {(0,): 20, (1,): 20, (2,): 20}


def test_a_worker_whose_shard_another_worker_wrote_does_not_trust_what_it_remembers(tmp_path, monkeypatch):
    """Two worker processes (two worker caches) take turns writing one shard with --drop-stale:
    the first one's memory of a key is stale once the second wrote it, and the first one learns
    so before deciding (the shard's lease names the other), not at its next (fenced) write."""
    from memwal.write import worker as worker_module
    from memwal.write.worker import WorkerCache

    uri = str(tmp_path / "t")
    Table.create(uri, SCHEMA, ["id"], "unsharded").close()
    options = SinkOptions(source="columns", sequence_field="pos", drop_stale_across_batches=True, max_write_tasks=1,
                          flush_interval_seconds=None, writer_process=False)
    workers = [WorkerCache(), WorkerCache()]

    def run(worker: int, batch_id: int, rows: list[dict]) -> int:
        monkeypatch.setattr(worker_module, "WORKER", workers[worker])
        data = pa.Table.from_pylist(rows, schema=SCHEMA.append(pa.field("op", pa.string())))
        return run_sink_batch(uri, options, data, batch_id).stale_dropped

    try:
        assert run(0, 0, [{"id": 1, "name": "a", "pos": 10, "op": "upsert"}, {"id": 2, "name": "a", "pos": 10, "op": "upsert"}]) == 0
        assert run(1, 1, [{"id": 1, "name": "b", "pos": 20, "op": "upsert"}, {"id": 2, "pos": 20, "op": "delete"}]) == 0
        # worker 0 remembers both keys at 10; worker 1 has since written them at 20
        assert run(0, 2, [{"id": 1, "name": "late", "pos": 15, "op": "upsert"}, {"id": 2, "name": "late", "pos": 15, "op": "upsert"}]) == 2
    finally:
        for w in workers:
            w.clear()
    got = {r["id"]: r["name"] for r in readers.open(uri, consistency="strong").scan().to_pylist()}
    assert got == {1: "b"}


def test_a_write_task_fenced_after_deciding_decides_again(tmp_path, monkeypatch):
    """--drop-stale against a write task that stood still between deciding and writing (a task
    of a stopped query still running while the restarted query writes the shard; Spark's
    zombie tasks). It decided from what was stored then: key 1's update is newer than the
    stored snapshot row. Meanwhile another worker deleted key 1 at a newer sequence. Its write
    is fenced by that worker's claim; written through a new claim it would bring key 1 back
    (the Debezium end-to-end test's rare failure: a deleted key's row back in the table).
    It decides again instead, and drops the update as older than the delete."""
    from memwal.streaming import sink
    from memwal.write import worker as worker_module
    from memwal.write.worker import WorkerCache

    uri = str(tmp_path / "t")
    Table.create(uri, SCHEMA, ["id"], "unsharded").close()
    options = SinkOptions(source="columns", sequence_field="pos", drop_stale_across_batches=True, max_write_tasks=1,
                          flush_interval_seconds=None, writer_process=False)
    sink.MemwalSink(uri, options)  # the driver creates the deleted-sequences table
    workers = [WorkerCache(), WorkerCache()]
    stale: dict[int, int] = {}

    def run(worker: int, batch_id: int, rows: list[dict]) -> None:
        monkeypatch.setattr(worker_module, "WORKER", workers[worker])  # read once, at the task's start
        data = pa.Table.from_pylist(rows, schema=SCHEMA.append(pa.field("op", pa.string())))
        stale[batch_id] = run_sink_batch(uri, options, data, batch_id).stale_dropped

    points = tmp_path / "failpoints"
    points.mkdir()
    marker = points / "write.decided.batch-1"
    try:
        run(0, 0, [{"id": 1, "name": "snapshot", "pos": 10, "op": "upsert"}, {"id": 2, "name": "snapshot", "pos": 10, "op": "upsert"}])
        monkeypatch.setenv("MEMWAL_FAILPOINTS", "write.decided.batch-1=wait")
        monkeypatch.setenv("MEMWAL_FAILPOINT_DIR", str(points))
        zombie = threading.Thread(target=run, args=(0, 1, [{"id": 1, "name": "update", "pos": 15, "op": "upsert"}]))
        zombie.start()
        while not marker.exists():  # worker 0 has decided to write the update
            assert zombie.is_alive()
            zombie.join(0.01)
        run(1, 2, [{"id": 1, "pos": 20, "op": "delete"}])
        while zombie.is_alive():  # let it go on (also past the point again, when it decides anew)
            marker.unlink(missing_ok=True)
            zombie.join(0.01)
    finally:
        marker.unlink(missing_ok=True)
        for w in workers:
            w.clear()
    assert stale == {0: 0, 1: 1, 2: 0}
    got = {r["id"]: r["name"] for r in readers.open(uri, consistency="strong").scan().to_pylist()}
    assert got == {2: "snapshot"}


def test_the_sink_creates_the_deleted_sequences_table_before_its_tasks_append(tmp_path):
    """A write task's shard threads append their deletes' sequences at the same time. Had they
    to create the table, both creates could commit and one thread's entries be lost (then a
    replay older than those deletes, in a later writer generation, brought the keys back: the
    Debezium end-to-end test's failure before the driver created the table). The sink's driver
    creates it; concurrent appends then all land."""
    import lance

    from memwal.streaming import sink
    from memwal.write.deleted import deleted_sequences_uri, read_deletes, record_deletes

    uri = str(tmp_path / "t")
    Table.create(uri, SCHEMA, ["id"], "bucket(id, 2)").close()
    sink.MemwalSink(uri, SinkOptions(source="columns", sequence_field="pos", drop_stale_across_batches=True))
    deleted = deleted_sequences_uri(uri)
    assert lance.dataset(deleted).count_rows() == 0
    start = threading.Barrier(2)

    def append(shard: str, first: int) -> None:
        start.wait()
        for i in range(5):
            record_deletes(deleted, pa.table({"id": pa.array([first + i], pa.int64()), "pos": pa.array([i], pa.int64())}), shard, None)

    threads = [threading.Thread(target=append, args=(f"s{j}", 100 * j)) for j in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert read_deletes(deleted, "s0", ["id"], "pos", None) == {(i,): i for i in range(5)}
    assert read_deletes(deleted, "s1", ["id"], "pos", None) == {(100 + i,): i for i in range(5)}
