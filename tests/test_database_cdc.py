"""Whole-database CDC (memwal.streaming.database): one query over a database's Debezium topics,
one table per source table, each created from its first event and following its source's
schema changes. The model: per source table, a dict of its rows; after every run each table
equals its source, and the records memwal cannot store are dead letters of their own table."""

from __future__ import annotations

import datetime as dt
import json
import random
from decimal import Decimal

import pytest
from prometheus_client import CollectorRegistry

from memwal import InvalidArgumentError, Table, readers
from memwal.streaming.database import DatabaseSink, table_name


def test_a_topic_names_its_source_table():
    assert table_name("shop.public.orders") == "public.orders"
    assert table_name("mysql1.inventory.customers") == "inventory.customers"
    assert table_name("orders") == "orders"
    assert table_name("a.b") == "a.b"
    assert table_name("srv.public.weird name/../x") == "public.weird_name_.._x"
    assert table_name("srv._.x") == "__.x"  # never a hidden name
    with pytest.raises(InvalidArgumentError):
        DatabaseSink("/tmp/never", shards=0)


def _tables(server: str):
    from debezium_events import Column, PostgresTable, orders_table

    orders = PostgresTable(orders_table().columns, ["id"], server=server, table="orders")
    customers = PostgresTable([Column("region", "text", nullable=False), Column("id", "bigint", nullable=False),
                               Column("name", "text"), Column("credit", "numeric(12,2)"), Column("since", "date")],
                              ["region", "id"], server=server, table="customers")
    items = PostgresTable([Column("sku", "text", nullable=False), Column("qty", "integer"), Column("price", "numeric(10,2)")],
                          ["sku"], server=server, table="items")
    return orders, customers, items


def _changes(rng, table, db: dict, n: int, lsn: int, row_of) -> tuple[list, int]:
    """``n`` inserts, updates and deletes of ``table`` (its rows in ``db``, by key) as Kafka records."""
    records = []

    def partition(key: tuple) -> int:  # by key, as Kafka's producer does: a key's changes stay in order
        return sum(map(ord, repr(key))) % 2

    for i in range(n):
        lsn += 11
        row = row_of(rng, i)
        key = tuple(row[c] for c in table.key_columns)
        if key in db and rng.random() < 0.2:
            gone = db.pop(key)
            records.append((table.key_of(gone), table.event("d", gone, None, lsn=lsn, commit_ms=lsn, txid=i), partition(key)))
            continue
        op = "u" if key in db else "c"
        db[key] = row
        records.append((table.key_of(row), table.event(op, None, row, lsn=lsn, commit_ms=lsn, txid=i), partition(key)))
    return records, lsn


def _customer(rng, i):
    return {"region": rng.choice(["eu", "us", "apac"]), "id": rng.randrange(60), "name": f"customer {i} " + "é" * (i % 9),
            "credit": Decimal(rng.randrange(-10**11, 10**11)).scaleb(-2), "since": dt.date(1990, 1, 1) + dt.timedelta(days=rng.randrange(12000))}


def _item(rng, i, wide=False):
    row = {"sku": f"sku-{rng.randrange(80):03d}", "qty": rng.randrange(-2**31, 2**31), "price": Decimal(rng.randrange(-10**9, 10**9)).scaleb(-2)}
    if wide:  # ALTER qty TYPE bigint, ADD COLUMN note text
        row.update(qty=rng.randrange(-2**62, 2**62), note=rng.choice([None, "fragile", "gift"]))
    return row


@pytest.mark.spark
@pytest.mark.kafka
def test_one_query_syncs_a_three_table_database(spark, kafka, tmp_path):
    """Three source tables (a composite key, decimals, dates, Debezium's semantic types), each
    its own topic, read by one query through a topic pattern: each table is created from its
    first event and equals its source after each run; then the items table gains a column and
    widens another mid-stream; a record no table can take is a dead letter of its own table;
    metrics count per table."""
    from brokers import produce
    from debezium_events import Column, PostgresTable, random_order
    from test_debezium_defaults import canonical

    from memwal.observe.ingest import IngestMetrics
    from memwal.streaming import SinkOptions
    from memwal.streaming.database import ingest_database
    from memwal.write.dead_letters import dead_letter_uri, read_dead_letters

    server = f"db{abs(hash(tmp_path.name)) % 10**6}"
    orders, customers, items = _tables(server)
    for t in (orders, customers, items):
        kafka.create_topic(f"{server}.public.{t.table}", 2)
    twin = PostgresTable(orders.columns, ["id"], server=f"{server}x", table="orders")  # another server's orders: named alike
    kafka.create_topic(f"{server}x.public.orders", 1)
    root = str(tmp_path / "shop")
    rng = random.Random(46)
    dbs: dict[str, dict] = {"orders": {}, "customers": {}, "items": {}}
    registry = CollectorRegistry()
    metrics = IngestMetrics(registry)

    def run(steps):
        lsn = 50_000_000 + 10_000 * run.calls
        for table, n, row_of, extra in steps:
            records, lsn = _changes(rng, table, dbs[table.table], n, lsn, row_of)
            produce(kafka, f"{server}.public.{table.table}", records + extra)
        run.calls += 1
        job = ingest_database(spark, bootstrap=kafka.bootstrap, root=root, checkpoint=str(tmp_path / "ckpt"),
                              topic_pattern=rf"{server}x?\.public\..*", available_now=True, max_offsets_per_trigger=250,
                              options=SinkOptions(source="kafka-json", value_format="debezium-json"), observers=[metrics])
        job.await_termination()
        assert job.query.exception() is None
        for name, db in dbs.items():
            uri = f"{root}/public.{name}"
            got = readers.open(uri, consistency="strong").scan().to_pylist()
            key = {"orders": ("id",), "customers": ("region", "id"), "items": ("sku",)}[name]
            want = {k: canonical(v) if name == "orders" else v for k, v in db.items()}
            got_by_key = {tuple(r[c] for c in key): r for r in got}
            assert got_by_key.keys() == want.keys(), name
            diverging = [k for k in want if {c: got_by_key[k].get(c) for c in want[k]} != want[k]]
            assert not diverging, (name, [(got_by_key[k], want[k]) for k in diverging[:2]])
        return job

    run.calls = 0
    bad = [(items.key_of({"sku": "sku-bad"}), b'{"schema": {"type": "struct"}, "payload": {"op": "c", "after": ', 0)]  # cut short
    run([(orders, 200, lambda r, i: random_order(r, r.randrange(90), i), []),
         (customers, 150, _customer, []),
         (items, 150, _item, bad)])
    t = Table.open(f"{root}/public.customers")
    assert t.primary_key == ("region", "id") and t.schema.field("credit").type.precision == 12
    assert Table.open(f"{root}/public.orders").primary_key == ("id",)

    # ALTER TABLE items ALTER qty TYPE bigint, ADD COLUMN note text; the other tables go on.
    wide = PostgresTable([Column("sku", "text", nullable=False), Column("qty", "bigint"), Column("price", "numeric(10,2)"),
                          Column("note", "text")], ["sku"], server=server, table="items")
    for row in dbs["items"].values():
        row["note"] = None
    twins = [(twin.key_of(r), twin.event("c", None, r, lsn=i, commit_ms=i, txid=i), 0)
             for i, r in enumerate(random_order(rng, 10**6 + i, i) for i in range(3))]
    produce(kafka, f"{server}x.public.orders", twins)
    job = run([(wide, 150, lambda r, i: _item(r, i, wide=True), []), (customers, 80, _customer, [])])
    t = Table.open(f"{root}/public.items")
    assert t.schema.field("qty").type.bit_width == 64 and "note" in t.schema.names

    dead = read_dead_letters(dead_letter_uri(f"{root}/public.items")).to_pylist()
    assert [json.loads(d["key"])["payload"]["sku"] for d in dead] == ["sku-bad"] and dead[0]["error"]
    for name in ("orders", "customers"):
        assert read_dead_letters(dead_letter_uri(f"{root}/public.{name}")).num_rows == 0
    # the twin's records: the root's dead letters (the orders table is the first topic's), counted
    assert sorted(d["topic"] for d in read_dead_letters(f"{root}/_dead_letters").to_pylist()) == [f"{server}x.public.orders"] * 3
    assert job.reports.table_totals()[f"{root}/_dead_letters"]["dead_letters"] == 3
    counted = {name: registry.get_sample_value("memwal_ingest_table_records_total", {"table": f"public.{name}"})
               for name in ("orders", "customers", "items")}
    assert counted == {"orders": 200, "customers": 230, "items": 301}
    assert sorted(job.reports.table_totals()) == [f"{root}/_dead_letters", f"{root}/public.customers", f"{root}/public.items"]


def test_memwal_ingest_takes_a_tables_root_with_topics_or_a_pattern(tmp_path):
    from memwal import cli

    base = ["ingest", "--bootstrap", "127.0.0.1:9", "--checkpoint", str(tmp_path / "ckpt")]
    root = ["--tables-root", str(tmp_path / "db")]
    assert cli.main(base + root) == 2  # neither topics nor a pattern
    assert cli.main(base + root + ["--topic", "a.b.c", "--topic-pattern", "a.*"]) == 2  # both
    assert cli.main(base + root + ["--topic-pattern", "a.*", "--table", str(tmp_path / "t")]) == 2
    assert cli.main(base + root + ["--topic-pattern", "a.*", "--real-time"]) == 2
    assert cli.main(base + ["--topic-pattern", "a.*", "--table", str(tmp_path / "t")]) == 2  # a pattern needs a root
