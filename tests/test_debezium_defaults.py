"""Debezium as its defaults write it (issue 38): change events of a PostgreSQL table exactly as a
default Debezium connector writes them through Kafka Connect's JSON converter (every key and
value with its schema, base64 decimals, MicroTimestamp, Date, ZonedTimestamp, Uuid, Json,
Enum, VariableScaleDecimal; tests/debezium_events.py), decoded by their semantic types: the
decoder alone, `memwal init --schema-from-debezium`, then 4,000 change events through a real
Kafka broker and Spark into a table that must equal the source's final state, values exact."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
import os
import random
import re
import subprocess
import sys

import fastavro
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from helpers import examples
from brokers import produce
from debezium_events import AvroTopic, Column, PostgresTable, orders_table, random_order
from registry import Registry

from memwal import Table, readers
from memwal.streaming import SinkOptions, ingest
from memwal.streaming.avro import AvroDecoder, WriterSchema, raw_schema
from memwal.streaming.avro_native import nested_plan, record_fits
from memwal.write.dead_letters import dead_letter_uri, read_dead_letters
from memwal.streaming.debezium import OP, DebeziumDecoder, schema_from_event

ORDERS = pa.schema([
    ("id", pa.int64()), ("customer", pa.string()), ("amount", pa.decimal128(10, 2)), ("tax", pa.decimal128(38, 9)),
    ("ratio", pa.decimal256(76, 38)), ("created_at", pa.timestamp("us")), ("shipped_on", pa.date32()),
    ("paid_at", pa.timestamp("us", "UTC")), ("status", pa.string()), ("tracking", pa.string()), ("attrs", pa.string()),
    ("note", pa.string()),
])


def canonical(row: dict) -> dict:
    """A source row (Python values) as the table holds it: decimals and times as they are (a
    zoned time compares by its instant), UUIDs as text, JSON as jsonb's text."""
    out = dict(row)
    out["tracking"] = str(row["tracking"]) if row.get("tracking") is not None else None
    out["attrs"] = json.dumps(row["attrs"]) if row.get("attrs") is not None else None
    return out


def stored(row: dict) -> dict:
    return {k: v for k, v in row.items() if k in ORDERS.names}


def decode(values, keys, schema=ORDERS, sequence_field=None):
    d = DebeziumDecoder(schema, ["id"], sequence_field).decode_batch(values, keys)
    return {int(p): r for p, r in zip(d.positions, d.rows.to_pylist())}, d.errors, d.skipped


# -- the decoder -------------------------------------------------------------------------------------


def test_every_semantic_type_of_a_default_postgres_connector_decodes_exactly():
    table, rng = orders_table(), random.Random(3)
    rows = [random_order(rng, i, i) for i in range(200)]
    rows[0].update(amount=decimal.Decimal("-0.01"), created_at=dt.datetime(1969, 12, 31, 23, 59, 59, 999999),
                   shipped_on=dt.date(1901, 1, 1), tax=decimal.Decimal("-" + "9" * 29 + "." + "9" * 9),
                   paid_at=dt.datetime(1960, 5, 6, 7, 8, 9, 10, tzinfo=dt.timezone(dt.timedelta(hours=-5))))
    values = [table.event("r" if i < 50 else "c", None, r, lsn=1000 + i, commit_ms=1_700_000_000_000 + i, txid=7 + i // 10,
                          snapshot="true" if i < 49 else ("last" if i == 49 else "false")) for i, r in enumerate(rows)]
    keys = [table.key_of(r) for r in rows]
    got, errors, skipped = decode(values, keys)
    assert errors == {} and skipped == 0
    assert [stored(got[i]) for i in range(len(rows))] == [canonical(r) for r in rows]
    assert {got[i][OP] for i in range(50)} == {"r"} and got[60][OP] == "c"


def test_updates_deletes_and_tombstones_as_replica_identity_default_writes_them():
    table, rng = orders_table(), random.Random(4)
    a, b = random_order(rng, 1, 1), random_order(rng, 2, 2)
    a2 = {**a, "amount": decimal.Decimal("12.30"), "note": "gift"}
    values = [
        table.event("c", None, a, lsn=10, commit_ms=1, txid=1),
        table.event("u", None, a2, lsn=11, commit_ms=2, txid=2),  # DEFAULT identity: no before on update
        table.event("c", None, b, lsn=12, commit_ms=3, txid=3),
        table.event("d", b, None, lsn=13, commit_ms=4, txid=4),  # before: the key and NOT NULL fallbacks
        None,  # the tombstone
    ]
    keys = [table.key_of(r) for r in (a, a2, b, b, b)]
    got, errors, skipped = decode(values, keys, sequence_field=None)
    assert errors == {} and skipped == 1
    assert stored(got[1]) == canonical(a2) and got[3]["id"] == 2 and got[3][OP] == "d"


def test_a_schema_change_within_a_batch_reads_each_record_by_its_own_schema():
    """ALTER TABLE orders ALTER amount TYPE numeric(12,4): the same base64 bytes mean another
    number; records of both schemas in one batch each get their own scale."""
    old = PostgresTable([Column("id", "bigint", nullable=False), Column("amount", "numeric(10,2)")], ["id"])
    new = PostgresTable([Column("id", "bigint", nullable=False), Column("amount", "numeric(12,4)")], ["id"])
    schema = pa.schema([("id", pa.int64()), ("amount", pa.decimal128(12, 4))])
    values, keys, want = [], [], []
    for i in range(40):
        t = old if i % 3 else new
        amount = decimal.Decimal(i * 1001 - 20000).scaleb(-2)
        values.append(t.event("c", None, {"id": i, "amount": amount}, lsn=i, commit_ms=i, txid=i))
        keys.append(t.key_of({"id": i}))
        want.append(amount)
    got, errors, _ = decode(values, keys, schema)
    assert errors == {} and [got[i]["amount"] for i in range(40)] == want


def test_values_written_other_than_the_converter_writes_them_read_the_same():
    """Whitespace and key order of another writer (a re-serialized topic, a test fixture):
    found by a regular expression and read by their schema, one by one."""
    table, rng = orders_table(), random.Random(5)
    rows = [random_order(rng, i, i) for i in range(6)]
    exact = [table.event("c", None, r, lsn=i, commit_ms=i, txid=i) for i, r in enumerate(rows)]
    spaced = [json.dumps(json.loads(v), indent=1).encode() for v in exact[:2]]
    reordered = [json.dumps({"payload": json.loads(v)["payload"], "schema": json.loads(v)["schema"]}).encode() for v in exact[2:4]]
    bare = [json.dumps(json.loads(v)["payload"]).encode() for v in exact[4:]]  # schemas.enable=false: types as the columns say
    bare_schema = pa.schema([("id", pa.int64()), ("amount", pa.string()), ("created_at", pa.int64()), ("note", pa.string())])
    got, errors, _ = decode(spaced + reordered, [table.key_of(r) for r in rows[:4]])
    assert errors == {} and [stored(got[i]) for i in range(4)] == [canonical(r) for r in rows[:4]]
    got, errors, _ = decode(exact[:2] + bare, [table.key_of(r) for r in rows[:2] + rows[4:]], bare_schema)
    assert errors == {} and sorted(got) == [0, 1, 2, 3]
    assert got[0]["amount"] == str(rows[0]["amount"])  # with its schema: the decimal, as text
    assert got[2]["amount"] == json.loads(exact[4])["payload"]["after"]["amount"]  # without: the base64, as text, as before
    micros = (rows[0]["created_at"] - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1)
    assert got[0]["created_at"] == micros and got[2]["created_at"] == json.loads(exact[4])["payload"]["after"]["created_at"]


def test_values_that_do_not_fit_are_dead_letters_naming_the_column_and_type_and_the_rest_arrive():
    table, rng = orders_table(), random.Random(6)
    rows = [random_order(rng, i, i) for i in range(30)]
    rows[3]["amount"] = decimal.Decimal("99999999.99")  # fits numeric(10,2), not the table's decimal128(6,2)
    rows[7]["amount"] = decimal.Decimal("1.00")
    values = [table.event("c", None, r, lsn=i, commit_ms=i, txid=i) for i, r in enumerate(rows)]
    infinity = json.loads(values[7])
    infinity["payload"]["after"]["paid_at"] = "infinity"  # PostgreSQL's timestamptz 'infinity'
    values[7] = json.dumps(infinity, separators=(",", ":")).encode()
    schema = pa.schema([pa.field("amount", pa.decimal128(6, 2)) if f.name == "amount" else f for f in ORDERS])
    for r in rows:
        r["amount"] = r["amount"] if abs(r["amount"]) < 10_000 else None
    got, errors, _ = decode(values, [table.key_of(r) for r in rows], schema)
    bad = {i for i, r in enumerate(rows) if r["amount"] is None} | {7}
    assert set(errors) == bad and set(got) == set(range(30)) - bad
    assert "'amount'" in errors[3] and "org.apache.kafka.connect.data.Decimal" in errors[3] and "decimal128(6, 2)" in errors[3]
    assert "'paid_at'" in errors[7] and "io.debezium.time.ZonedTimestamp" in errors[7] and "'infinity'" in errors[7]


def test_a_value_whose_source_type_changed_is_a_dead_letter_naming_its_column():
    """ALTER TABLE orders ALTER amount TYPE text, then a row whose amount is no number: the
    JSON reader fails the whole envelope; its reason names the column."""
    as_text = PostgresTable([Column("id", "bigint", nullable=False), Column("amount", "text")], ["id"])
    values = [as_text.event("c", None, {"id": i, "amount": a}, lsn=i, commit_ms=i, txid=i) for i, a in enumerate(["12.5", "n/a", "7"])]
    got, errors, _ = decode(values, [as_text.key_of({"id": i}) for i in range(3)], pa.schema([("id", pa.int64()), ("amount", pa.decimal128(10, 2))]))
    assert set(errors) == {1} and sorted(got) == [0, 2]
    assert "'amount'" in errors[1]


def test_keys_with_their_schema_fill_the_key_a_value_lacks():
    """A composite key whose number is a numeric(12,0) (a Decimal in the key) into a bigint
    column; the value's before is null (REPLICA IDENTITY NOTHING): the Kafka key says which row."""
    t = PostgresTable([Column("region", "text", nullable=False), Column("order_no", "numeric(12,0)", nullable=False),
                       Column("total", "numeric(10,2)")], ["region", "order_no"])
    schema = pa.schema([("region", pa.string()), ("order_no", pa.int64()), ("total", pa.decimal128(10, 2))])
    row = {"region": "eu", "order_no": decimal.Decimal(123456789012), "total": decimal.Decimal("5.00")}
    delete = json.loads(t.event("d", row, None, lsn=5, commit_ms=5, txid=5))
    delete["payload"]["before"] = None
    values = [t.event("c", None, row, lsn=4, commit_ms=4, txid=4), json.dumps(delete, separators=(",", ":")).encode()]
    d = DebeziumDecoder(schema, ["region", "order_no"]).decode_batch(values, [t.key_of(row)] * 2)
    assert d.errors == {}
    assert [(r["region"], r["order_no"], r[OP]) for r in d.rows.to_pylist()] == [("eu", 123456789012, "c"), ("eu", 123456789012, "d")]


# -- Debezium's Avro converter -------------------------------------------------------------------------


@pytest.fixture
def avro_topic():
    """The orders table's events as Debezium's Avro converter writes them, their schemas in a registry."""
    topics = {logical: AvroTopic(orders_table(), logical_times=logical) for logical in (False, True)}
    registries = {logical: Registry({7: t.value_avro, 8: t.key_avro}) for logical, t in topics.items()}
    yield {logical: (topics[logical], registries[logical]) for logical in topics}
    for r in registries.values():
        r.close()


@pytest.mark.parametrize("logical_times", [False, True], ids=["connect-names", "avro-logical-types"])
def test_debezium_avro_envelopes_decode_like_the_json_ones(avro_topic, logical_times):
    """Confluent-framed envelopes of the registry's writer schema (connect.name, the decimal
    logical type; or timestamp-micros and date logical types), on Arrow's native decoder and on
    fastavro: the same rows as the JSON converter's events give; a delete's key from the Avro
    key when its before is null; tombstones skipped."""
    topic, registry = avro_topic[logical_times]
    rng = random.Random(8)
    rows = [random_order(rng, i, i) for i in range(120)]
    values = [topic.event("r" if i < 20 else "c", None, r, lsn=100 + i, commit_ms=1_700_000_000_000 + i, txid=9) for i, r in enumerate(rows)]
    keys = [topic.key_of(r) for r in rows]
    gone = rows[5]
    plain_delete = json.loads(topic.table.event("d", gone, None, lsn=300, commit_ms=1, txid=10))
    plain_delete["payload"]["before"] = None  # REPLICA IDENTITY NOTHING: only the Kafka key says which row
    from debezium_events import _raw  # the emulator's datum of a JSON payload
    values += [topic._frame(7, topic._value, _raw(plain_delete["payload"], plain_delete["schema"])), None]
    keys += [topic.key_of(gone)] * 2
    schema = ORDERS.append(pa.field("pos", pa.int64()))
    results = []
    for native in (True, False):
        decoder = AvroDecoder(schema, None, "pos", None, registry=registry.url, native=native, primary_key=["id"])
        d = decoder.decode_batch(values, keys)
        assert d.errors == {} and d.skipped == 1, native
        got = {int(p): r for p, r in zip(d.positions, d.rows.to_pylist())}
        assert [stored(got[i]) for i in range(len(rows))] == [canonical(r) for r in rows]
        assert (got[120]["id"], got[120][decoder.op_field], got[120]["pos"]) == (5, "d", 300)
        results.append(d.rows)
    assert results[0].equals(results[1])
    bodies = pa.array([v[5:] for v in values[:120]], pa.binary())
    assert WriterSchema(json.dumps(topic.value_avro), None, schema).read_native(bodies) is not None  # the native path took them


def test_damaged_avro_envelopes_are_dead_letters_on_both_paths(avro_topic):
    topic, registry = avro_topic[False]
    rng = random.Random(9)
    rows = [random_order(rng, i, i) for i in range(12)]
    values = [topic.event("c", None, r, lsn=i, commit_ms=i, txid=i) for i, r in enumerate(rows)]
    values[2] = values[2][:-7]  # cut short inside the source block
    values[4] = values[4] + b"\x00\x02"  # bytes left over
    values[6] = values[6][:40]  # cut inside the row
    for native in (True, False):
        d = AvroDecoder(ORDERS, None, None, None, registry=registry.url, native=native, primary_key=["id"]).decode_batch(values, [None] * 12)
        assert sorted(d.errors) == [2, 4, 6], native
        assert sorted(int(p) for p in d.positions) == [i for i in range(12) if i not in (2, 4, 6)]


@settings(max_examples=examples(60), deadline=None)
@given(seed=st.integers(0, 10**6), damages=st.lists(st.tuples(st.sampled_from(["cut", "trailing", "flip", "random", "none"]),
                                                             st.integers(0, 10**6)), min_size=1, max_size=10))
def test_the_layout_walk_of_nested_envelopes_agrees_with_fastavro(seed, damages):
    """Arrow's decoder spins forever on a value cut mid-record, so only values the walk finds
    to be exactly one envelope reach it. The model: a value fits iff fastavro reads it alone
    using up its bytes; undamaged values always fit; both decoding paths give the same rows."""
    topic = AvroTopic(orders_table())
    text = json.dumps(topic.value_avro)
    steps, _ = nested_plan(text)
    parsed = fastavro.parse_schema(raw_schema(topic.value_avro))
    rng = random.Random(seed)
    bodies = []
    for i, (damage, at) in enumerate(damages):
        body = topic.event("c", None, random_order(rng, i, i), lsn=i, commit_ms=i, txid=i)[5:]
        if damage == "cut":
            body = body[: at % len(body)]
        elif damage == "trailing":
            body += bytes([at % 256, (at >> 8) % 256])[: 1 + at % 2]
        elif damage == "flip":
            pos = at % len(body)
            body = body[:pos] + bytes([body[pos] ^ (1 + at % 255)]) + body[pos + 1:]
        elif damage == "random":
            body = random.Random(at).randbytes(at % 64)
        bodies.append(body)

    def alone(body):
        buf = io.BytesIO(body)
        try:
            fastavro.schemaless_reader(buf, parsed)
        except Exception:  # noqa: BLE001 - any failure: not a record
            return False
        return buf.tell() == len(body)

    fits = record_fits(steps, pa.array(bodies, pa.binary()))
    for (damage, _), body, fit in zip(damages, bodies, fits):
        if damage == "none":
            assert fit
        if fit:
            assert alone(body) or _bad_utf8(body, parsed), (damage, body)
    framed = [b"\x00\x00\x00\x00\x07" + b for b in bodies]
    registry = Registry({7: topic.value_avro})
    try:
        got = [AvroDecoder(ORDERS, None, None, None, registry=registry.url, native=native, primary_key=["id"]).decode_batch(framed, [None] * len(framed))
               for native in (True, False)]
    finally:
        registry.close()
    unreadable = {i for i, b in enumerate(bodies) if not alone(b)}
    assert sorted(got[0].errors) == sorted(got[1].errors) and unreadable <= set(got[0].errors)
    # a flipped byte can make a readable record whose values do not fit (an 'op' that is not a change, say)
    assert all("not an Avro record" not in why for i, why in got[0].errors.items() if i not in unreadable)
    native, fast = (g.rows.take(pa.array(g.positions.argsort())) for g in got)
    assert sorted(got[0].positions) == sorted(got[1].positions) and native.equals(fast)


def _bad_utf8(body: bytes, parsed) -> bool:
    try:
        fastavro.schemaless_reader(io.BytesIO(body), parsed)
    except UnicodeDecodeError:
        return True
    except Exception:  # noqa: BLE001 - failed on something else
        return False
    return False


# -- memwal init --schema-from-debezium -------------------------------------------------------------


def test_the_table_schema_and_primary_key_come_from_one_change_event():
    table = orders_table()
    row = random_order(random.Random(1), 1, 1)
    event = schema_from_event(table.key_of(row) + b"\t" + table.event("r", None, row, lsn=1, commit_ms=1, txid=1))
    assert [(f.name, f.type) for f in event.schema] == [(f.name, f.type) for f in ORDERS] and event.primary_key == ("id",)
    assert [f.nullable for f in event.schema] == [c.nullable for c in table.columns]
    alone = schema_from_event(table.event("c", None, row, lsn=1, commit_ms=1, txid=1))
    assert alone.schema == event.schema and alone.primary_key is None


def memwal_cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memwal", *args], input=stdin, capture_output=True)


def test_memwal_init_from_a_change_event_on_stdin_or_in_a_file(tmp_path):
    table = orders_table()
    row = random_order(random.Random(2), 1, 1)
    value = table.event("r", None, row, lsn=1, commit_ms=1, txid=1)
    p = memwal_cli("init", str(tmp_path / "a"), "--schema-from-debezium", "-", "--shard-by", "bucket(id,4)", stdin=table.key_of(row) + b"\n" + value)
    assert p.returncode == 0, p.stderr
    t = Table.open(str(tmp_path / "a"))
    assert t.primary_key == ("id",) and t.schema.field("amount").type == pa.decimal128(10, 2)
    assert t.schema.field("created_at").type == pa.timestamp("us") and t.schema.field("shipped_on").type == pa.date32()
    path = tmp_path / "event.json"
    path.write_bytes(value)
    assert memwal_cli("init", str(tmp_path / "b"), "--schema-from-debezium", str(path)).returncode == 2  # no key: which primary key?
    p = memwal_cli("init", str(tmp_path / "b"), "--schema-from-debezium", str(path), "--primary-key", "id")
    assert p.returncode == 0, p.stderr
    for bad in ([b"not json"], [b'{"schema": {"type": "int64"}, "payload": 1}']):
        p = memwal_cli("init", str(tmp_path / "c"), "--schema-from-debezium", "-", "--primary-key", "id", stdin=bad[0])
        assert p.returncode == 2 and b"Traceback" not in p.stderr
    assert memwal_cli("init", str(tmp_path / "d"), "--schema-from-debezium", "-", "--schema-from", str(path), stdin=value).returncode == 2


# -- end to end: 4,000 change events through a real broker -----------------------------------------------


def orders_stream(events: int, seed: int, partitions: int = 3) -> tuple[list[tuple[bytes, bytes | None, int]], dict[int, dict], int]:
    """A default PostgreSQL connector's topic for ``orders``: a snapshot (``r``), then creates,
    updates and deletes (each followed by its tombstone) in transactions, in LSN order; keyed
    by primary key, so a key's events stay in one partition, in order. Returns the records,
    the source table's final state and the number of tombstones."""
    table, rng = orders_table(), random.Random(seed)
    db: dict[int, dict] = {}
    records: list[tuple[bytes, bytes | None, int]] = []
    lsn, commit_ms, txid, next_id = 24_000_000, 1_700_000_000_000, 500, 0
    snapshot = events // 10
    for i in range(snapshot):
        db[next_id] = random_order(rng, next_id, i)
        mark = "true" if i < snapshot - 1 else "last"
        records.append((table.key_of(db[next_id]), table.event("r", None, db[next_id], lsn=lsn, commit_ms=commit_ms, txid=txid,
                                                               snapshot=mark), next_id % partitions))
        next_id += 1
    tombstones, done = 0, snapshot
    while done < events:
        txid += 1
        commit_ms += rng.randrange(1, 5000)
        for _ in range(rng.randrange(1, 6)):
            if done >= events:
                break
            lsn += rng.randrange(8, 400)
            r = rng.random()
            if r < 0.3 or not db:
                row = random_order(rng, next_id, done)
                db[next_id] = row
                records.append((table.key_of(row), table.event("c", None, row, lsn=lsn, commit_ms=commit_ms, txid=txid), next_id % partitions))
                next_id += 1
            elif r < 0.85:
                k = rng.choice(list(db))
                row = {**random_order(rng, k, done), "customer": db[k]["customer"]}
                db[k] = row
                records.append((table.key_of(row), table.event("u", None, row, lsn=lsn, commit_ms=commit_ms, txid=txid), k % partitions))
            else:
                k = rng.choice(list(db))
                key = table.key_of(db[k])
                records.append((key, table.event("d", db.pop(k), None, lsn=lsn, commit_ms=commit_ms, txid=txid), k % partitions))
                records.append((key, None, k % partitions))
                tombstones += 1
            done += 1
    return records, db, tombstones


DEBEZIUM_DEFAULTS_SEED = int(os.environ.get("MEMWAL_TEST_SEED", "38"))


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.slow
def test_4000_default_debezium_change_events_through_a_broker_equal_the_source(spark, kafka, tmp_path):
    topic = f"shop.public.orders.{random.randrange(1 << 30)}"
    kafka.create_topic(topic, 3)
    records, model, tombstones = orders_stream(4000, DEBEZIUM_DEFAULTS_SEED)
    produce(kafka, topic, records)
    uri = str(tmp_path / "orders")
    first = next(r for r in records if r[1] is not None)
    event = schema_from_event(first[0] + b"\n" + first[1])  # what `memwal init --schema-from-debezium` does
    Table.create(uri, event.schema, list(event.primary_key or ()), "bucket(id, 4)").close()
    job = ingest(spark, bootstrap=kafka.bootstrap, topic=topic, table_uri=uri, checkpoint=str(tmp_path / "ckpt"), available_now=True,
                 max_offsets_per_trigger=1000, options=SinkOptions(source="kafka-json", value_format="debezium-json"),
                 kafka_source="spark")
    job.await_termination()
    assert job.query.exception() is None
    assert read_dead_letters(dead_letter_uri(uri)).num_rows == 0
    totals = job.reports.totals()
    assert totals.get("dead_letters", 0) == 0 and totals.get("skipped", 0) == tombstones
    got = {r["id"]: r for r in readers.open(uri).scan().to_pylist()}
    want = {k: canonical(v) for k, v in model.items()}
    assert got.keys() == want.keys()
    diverging = [k for k in want if got[k] != want[k]]
    assert not diverging, (DEBEZIUM_DEFAULTS_SEED, [(got[k], want[k]) for k in diverging[:3]])
    # exact, not merely equal as numbers: the decimals carry the column's scale
    sample = next(iter(got.values()))
    assert sample["amount"].as_tuple().exponent == -2 and sample["created_at"].tzinfo is None


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.slow
def test_the_command_line_a_new_user_runs(kafka, tmp_path):
    """`memwal init --schema-from-debezium` and `memwal ingest --format debezium-json`, as
    processes, on a default connector's topic (a smaller one: the test above covers the
    volume, both Kafka sources, the values). An ALTER TABLE widened a decimal's scale: the
    table's column widens with it (``--evolve compatible``, the default) and the event lands. An
    event the table cannot hold (PostgreSQL's 'infinity') is a dead letter naming the column and
    type; everything else arrives."""
    topic = f"shop.public.orders.cli.{random.randrange(1 << 30)}"
    kafka.create_topic(topic, 3)
    records, model, tombstones = orders_stream(600, DEBEZIUM_DEFAULTS_SEED + 1)
    orders = orders_table()
    altered = PostgresTable([Column("amount", "numeric(12,4)", nullable=False) if c.name == "amount" else c for c in orders.columns], ["id"])
    rng = random.Random(1)
    wide = {**random_order(rng, 10**6, 0), "amount": decimal.Decimal("1.2345")}
    endless = random_order(rng, 10**6 + 1, 0)
    infinity = json.loads(orders.event("c", None, endless, lsn=10**9, commit_ms=1, txid=1))
    infinity["payload"]["after"]["paid_at"] = "infinity"
    records += [(altered.key_of(wide), altered.event("c", None, wide, lsn=10**9 + 1, commit_ms=2, txid=2), 0),
                (orders.key_of(endless), json.dumps(infinity, separators=(",", ":")).encode(), 1)]
    produce(kafka, topic, records)
    uri = str(tmp_path / "orders")
    first = next(r for r in records if r[1] is not None)
    p = memwal_cli("init", uri, "--schema-from-debezium", "-", "--shard-by", "bucket(id,2)", stdin=first[0] + b"\t" + first[1])
    assert p.returncode == 0, p.stderr
    p = memwal_cli("ingest", "--bootstrap", kafka.bootstrap, "--topic", topic, "--table", uri, "--checkpoint", str(tmp_path / "ckpt"),
                   "--format", "debezium-json", "--available-now", "--cores", "1")
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    assert f" 1 dead letter(s), {tombstones} skipped" in p.stdout.decode(), p.stdout
    # into a pipe, no progress bar (on a terminal: tests/test_observe_ingest.py)
    assert f"ingesting {topic}" not in p.stderr.decode() and not re.search(r"[\d,]+/[\d,]+ records", p.stderr.decode()), p.stderr.decode()[-3000:]
    got = {r["id"]: r for r in readers.open(uri).scan().to_pylist()}
    assert got == {k: canonical(v) for k, v in {**model, wide["id"]: wide}.items()}
    assert Table.open(uri).schema.field("amount").type == pa.decimal128(12, 4)
    dead = read_dead_letters(dead_letter_uri(uri)).to_pylist()
    assert [json.loads(d["key"])["payload"]["id"] for d in dead] == [endless["id"]] and dead[0]["error"]
