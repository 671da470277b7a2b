"""Schema evolution (memwal.maintain.evolve): columns added and dropped while the table is written.

Data is stored under the schema it was written with: SSTables flushed before the change, WAL
entries still unflushed, and rows a writer claimed before the change goes on writing. Every
read path (eventual and strong scans, lookups, the change feed, compaction into the base) must
read them as the table's columns now: an added column null, a dropped one gone. The model is
a dict of rows under the current columns.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import tempfile
import threading
import time
from decimal import Decimal

import lance
import pyarrow as pa
import pytest
from helpers import examples
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from memwal import InvalidArgumentError, readers, SchemaMismatchError, Table, UnknownColumnError, WriterConfig
from memwal.core import paths
from memwal.maintain.bounds import FoldSchedule
from memwal.maintain.compactor import Compactor
from memwal.maintain.maintenance import Maintenance, MaintenanceConfig
from memwal.core.metadata import Bounds, IndexConfig
from memwal.core.state import TableState

SCHEMA = pa.schema([
    pa.field("id", pa.int64()),
    pa.field("name", pa.string()),
    pa.field("amount", pa.decimal128(12, 2)),
    pa.field("day", pa.date32()),
    pa.field("legacy", pa.string()),
])


def rows(ids, tag: str, columns: list[str]) -> list[dict]:
    out = []
    for i in ids:
        r = {"id": i, "name": f"{tag}-{i}-" + "x" * (i % 7) * 40, "amount": Decimal(f"{i * 3}.{i % 100:02d}"),
             "day": dt.date(2020, 1, 1) + dt.timedelta(days=i), "legacy": f"old{i}", "note": f"{tag} note {i}"}
        out.append({c: r.get(c) for c in columns})  # a hidden (dropped) column: null
    return out


def write(t: Table, ids, tag: str, model: dict, schema: pa.Schema) -> None:
    """Write rows of ``schema``'s columns through ``t`` and apply them to the model, whose rows
    have the table's current columns (set by the caller)."""
    batch = rows(ids, tag, schema.names)
    t.write(pa.Table.from_pylist(batch, schema=schema))
    for r in batch:
        model[r["id"]] = r


def as_model(model: dict, columns: list[str]) -> dict:
    return {k: {c: r.get(c) for c in columns} for k, r in model.items()}


def check(uri: str, model: dict, columns: list[str], flushed: bool = False) -> None:
    """Strong reads equal the model; eventual ones too once everything is flushed (before,
    they may be older), and have the table's columns either way."""
    want = as_model(model, columns)
    strong = readers.open(uri, consistency="strong")
    assert {row["id"]: row for row in strong.scan().to_pylist()} == want
    some = sorted(want)[:: max(1, len(want) // 9)]
    assert {k: strong.get(k) for k in some} == {k: want[k] for k in some}
    assert {row["id"]: row for row in strong.get_many(some).to_pylist()} == {k: want[k] for k in some}
    eventual = readers.open(uri, refresh_interval_ms=0).scan()
    assert eventual.schema.names == columns
    if flushed:
        assert {row["id"]: row for row in eventual.to_pylist()} == want


def test_columns_added_and_dropped_while_writers_hold_older_schemas(table_uri):
    old = Table.create(table_uri, SCHEMA, ["id"], "bucket(id, 2)")
    model: dict = {}
    write(old, range(0, 40), "a", model, SCHEMA)
    old.flush()  # SSTables under the first schema
    write(old, range(30, 60), "b", model, SCHEMA)  # WAL entries under it, the writers still open

    new = Table.open(table_uri)
    change = new.update_schema().add_column("note", pa.string()).drop_column("legacy").commit()
    assert (change.added, change.dropped) == (("note",), ("legacy",))
    columns = ["id", "name", "amount", "day", "note"]
    assert new.schema.names == columns
    check(table_uri, model, columns)

    # A writer claimed before the change goes on writing the old columns: read as the new ones.
    write(old, range(50, 70), "c", model, SCHEMA)
    for k in range(50, 70):
        model[k]["note"] = None
    check(table_uri, model, columns)

    # The new handle claims the shards (fencing the old writers, replaying their WAL) and
    # writes the new column; the old handle's next write reopens under the new schema.
    write(new, range(65, 90), "d", model, new.schema)
    write(old, range(85, 95), "e", model, SCHEMA)
    for k in range(85, 95):
        model[k]["note"] = None
    check(table_uri, model, columns)

    # The change feed reads SSTables of both schemas as the new columns.
    old.flush()
    new.flush()
    check(table_uri, model, columns, flushed=True)
    changes = readers.open(table_uri).changes("earliest")
    assert "note" in changes.schema.names and "legacy" not in changes.schema.names
    assert {r["id"] for r in changes.to_pylist()} == set(model)

    # A dropped name cannot come back while stored SSTables hold its old values ...
    with pytest.raises(SchemaMismatchError):
        new.update_schema().add_column("legacy", pa.string()).commit()
    # ... compaction folds them into the base as the new columns ...
    Compactor(new.state).run_once()
    assert new.status().shards[0].pending_sstables == 0
    base = new.dataset()
    assert [c for c in base.schema.names if not c.startswith("_")] == columns
    assert {r["id"]: r for r in base.to_table(columns=columns).to_pylist()} == as_model(model, columns)
    check(table_uri, model, columns, flushed=True)
    # ... after which it may: a new column, null everywhere.
    with new.update_schema() as u:
        u.add_column("legacy", pa.string())
    assert all(r["legacy"] is None for r in readers.open(table_uri, consistency="strong").scan().to_pylist())
    new.close()
    old.close()


def test_changes_that_cannot_be_made_are_refused(table_uri):
    t = Table.create(table_uri, SCHEMA, ["id"], "bucket(id, 2)")
    for update, error in [
        (lambda u: u.drop_column("id"), InvalidArgumentError),  # the primary key
        (lambda u: u.drop_column("nope"), UnknownColumnError),
        (lambda u: u.add_column("name", pa.large_string()), SchemaMismatchError),  # a type change
        (lambda u: u.add_column("_hidden", pa.int8()), InvalidArgumentError),
        (lambda u: u.widen_column("id", pa.decimal128(30, 0)), InvalidArgumentError),  # the key
        (lambda u: u.widen_column("name", pa.int64()), SchemaMismatchError),  # not a widening
        (lambda u: u.widen_column("amount", pa.decimal128(12, 3)), SchemaMismatchError),  # one integer digit fewer
        (lambda u: u.widen_column("nope", pa.int64()), UnknownColumnError),
        (lambda u: u, InvalidArgumentError),  # nothing
    ]:
        with pytest.raises(error):
            update(t.update_schema()).commit()
    assert t.dataset().schema.names == SCHEMA.names
    t.close()


@pytest.mark.spark
def test_spark_reads_data_of_both_schemas_as_the_new_columns(spark, table_uri):
    old = Table.create(table_uri, SCHEMA, ["id"], "bucket(id, 2)")
    model: dict = {}
    write(old, range(0, 40), "a", model, SCHEMA)
    old.flush()
    write(old, range(30, 50), "b", model, SCHEMA)  # unflushed, under the first schema
    new = Table.open(table_uri)
    with new.update_schema() as u:
        u.add_column("note", pa.string()).drop_column("legacy")
    columns = ["id", "name", "amount", "day", "note"]
    want = as_model(model, columns)

    def by_id(df) -> dict:
        return {r["id"]: r.asDict() for r in df.collect()}

    read = spark.read.format("memwal")
    assert read.load(table_uri).columns == columns
    assert by_id(read.option("consistency", "strong").load(table_uri)) == want
    eventual = {r["id"]: r for r in readers.open(table_uri).scan().to_pylist()}
    assert by_id(spark.read.format("memwal").load(table_uri)) == eventual
    new.close()
    old.close()


def test_memwal_alter_adds_and_drops_columns(table_uri, capsys):
    from memwal import cli

    with Table.create(table_uri, SCHEMA, ["id"], "bucket(id, 2)") as t:
        t.write(pa.Table.from_pylist(rows(range(5), "a", SCHEMA.names), schema=SCHEMA))
    assert cli.main(["alter", table_uri, "--add-column", "total:decimal(14,2)", "--add-column", "seen:timestamp[us]",
                     "--widen-column", "amount:decimal(16,2)", "--drop-column", "legacy"]) == 0
    assert "dropped ['legacy']" in capsys.readouterr().out
    t = Table.open(table_uri)
    assert t.schema.field("amount").type == pa.decimal128(16, 2)
    assert readers.open(table_uri, consistency="strong").get(3)["amount"] == Decimal("9.03")
    assert t.schema.field("total").type == pa.decimal128(14, 2) and t.schema.field("seen").type == pa.timestamp("us")
    assert "legacy" not in t.schema.names
    assert readers.open(table_uri, consistency="strong").get(3)["total"] is None
    assert cli.main(["alter", table_uri, "--add-column", "bad"]) == 2  # NAME:TYPE
    assert cli.main(["alter", table_uri, "--add-column", "x:nonsense"]) == 2
    assert cli.main(["alter", table_uri, "--drop-column", "id"]) == 2
    assert cli.main(["alter", table_uri, "--widen-column", "day"]) == 2


WIDE = pa.schema([
    pa.field("id", pa.int64()),
    pa.field("qty", pa.int32()),
    pa.field("price", pa.decimal128(10, 2)),
    pa.field("day", pa.date32()),
    pa.field("name", pa.string()),
])


def wide_rows(ids, tag: int, big: bool = False) -> list[dict]:
    return [{"id": i, "qty": (i + tag * 1000) + (2**40 if big else 0),
             "price": Decimal(f"{i * 7 + tag}.{i % 100:02d}") + (Decimal("123456789012") if big else 0),
             "day": dt.date(2021, 3, 1) + dt.timedelta(days=i % 400), "name": f"order {i} " + "w" * (i % 5) * 60}
            for i in ids]


def test_a_column_widens_while_writers_and_maintenance_run(table_uri):
    """A widening races a writer (a handle of the narrow columns, fenced and replayed by the
    handle that widens) and maintenance folding into the base: no write is lost or misread,
    maintenance commits nothing to the base while the cast runs, and values only the wide type
    holds land once it committed."""
    Table.create(table_uri, WIDE, ["id"], "bucket(id, 4)").close()
    model: dict = {}
    stop, errors, cycles = threading.Event(), [], []

    def write() -> None:
        w, tag = Table.open(table_uri), 0
        try:
            while not stop.is_set():
                tag += 1
                batch = wide_rows(range((tag * 37) % 300, (tag * 37) % 300 + 40), tag)
                w.write(pa.Table.from_pylist(batch, schema=WIDE))  # the columns it opened with
                model.update((r["id"], r) for r in batch)
                if tag % 5 == 0:
                    w.flush()
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(e)
        finally:
            w.close()

    def maintain() -> None:
        m = Maintenance(table_uri, MaintenanceConfig(fold=FoldSchedule(fraction=0), gc=False, views=False, indexes=False))
        while not stop.is_set():
            try:
                cycles.append(m.run_cycle())
            except Exception as e:  # noqa: BLE001
                errors.append(e)

    threads = [threading.Thread(target=write), threading.Thread(target=maintain)]
    for th in threads:
        th.start()
    while len(cycles) < 3 and not errors:
        threading.Event().wait(0.1)
    t = Table.open(table_uri)
    change = t.update_schema().widen_column("qty", pa.int64()).widen_column("price", pa.decimal128(24, 2)).commit()
    assert dict(change.widened) == {"qty": "int64", "price": "decimal128(24, 2)"}
    threading.Event().wait(1.0)
    stop.set()
    for th in threads:
        th.join()
    assert not errors, errors
    assert t.state.base_paused() is None  # the pause ended with the widening
    big = wide_rows(range(280, 320), 99, big=True)
    t.write(pa.Table.from_pylist(big, schema=t.schema))
    model.update((r["id"], r) for r in big)
    columns = t.schema.names
    assert (t.schema.field("qty").type, t.schema.field("price").type) == (pa.int64(), pa.decimal128(24, 2))
    check(table_uri, model, columns)
    t.flush()
    Compactor(t.state).run_once()
    check(table_uri, model, columns, flushed=True)
    t.close()


def test_maintenance_commits_nothing_to_a_paused_base(table_uri):
    """While a widening holds the base paused, maintenance folds nothing (a fold would write rows
    the widening's cast missed); a pause whose process died ends at the time it gave."""
    t = Table.create(table_uri, WIDE, ["id"], "bucket(id, 2)")
    t.write(pa.Table.from_pylist(wide_rows(range(20), 1), schema=WIDE))
    t.flush()
    marker = paths.base_pause(t.state.uri)
    t.state.io.write(marker, json.dumps({"until": time.time() + 600, "why": "widening qty"}).encode())
    config = MaintenanceConfig(fold=FoldSchedule(fraction=0), gc=False, views=False)
    report = Maintenance(table_uri, config).run_cycle()
    assert report.compaction_commits == 0 and sum(report.pending_sstables.values()) > 0
    assert Compactor(t.state).run_once() == []
    assert t.dataset().count_rows() == 0
    t.state.io.write(marker, json.dumps({"until": time.time() - 1, "why": "widening qty"}).encode())  # its process died
    assert Maintenance(table_uri, config).run_cycle().compaction_commits >= 1
    assert t.dataset().count_rows() == 20
    t.close()


def test_a_fold_planned_before_a_widening_and_committed_after_it_is_a_lost_race(table_uri):
    """A compaction round plans (its rows cast to the narrow columns), a widening begins and
    ends, then the round commits: Lance refuses the narrow rows, and the compactor takes that
    for a lost race, not for damage; the next round folds the rows as the wide columns."""
    from memwal import StaleCompactionError
    from memwal.maintain.evolve import SchemaUpdate

    t = Table.create(table_uri, WIDE, ["id"], "unsharded")
    t.write(pa.Table.from_pylist(wide_rows(range(30), 1), schema=WIDE))
    t.flush()
    compactor = Compactor(t.state)
    (shard,) = t.state.manifests.list_shards()
    plan = compactor.plan(shard)
    assert plan is not None and plan.live.schema.field("qty").type == pa.int32()
    SchemaUpdate(TableState.load(table_uri)).widen_column("qty", pa.int64()).commit()
    with pytest.raises(StaleCompactionError):
        compactor.commit(plan)
    assert len(Compactor(TableState.load(table_uri)).run_once()) == 1
    base = lance.dataset(table_uri)
    assert base.schema.field("qty").type == pa.int64()
    got = {r["id"]: r["qty"] for r in base.to_table(columns=["id", "qty"]).to_pylist()}
    assert got == {r["id"]: r["qty"] for r in wide_rows(range(30), 1)}
    t.close()


def test_a_reader_opened_before_a_change_reads_the_new_columns(table_uri):
    t = Table.create(table_uri, SCHEMA, ["id"], "bucket(id, 2)")
    t.write(pa.Table.from_pylist(rows(range(10), "a", SCHEMA.names), schema=SCHEMA))
    t.flush()
    strong = readers.open(table_uri, consistency="strong")
    eventual = readers.open(table_uri, refresh_interval_ms=0)
    assert strong.get(1)["legacy"] == "old1" and eventual.get(1)["legacy"] == "old1"
    with t.update_schema() as u:
        u.add_column("note", pa.string()).drop_column("legacy")
    t.write(pa.Table.from_pylist(rows([1], "b", t.schema.names), schema=t.schema))
    assert strong.get(1) == rows([1], "b", t.schema.names)[0]
    assert eventual.get(2) == {c: v for c, v in rows([2], "a", ["id", "name", "amount", "day"])[0].items()} | {"note": None}
    assert strong.scan().schema.names == eventual.scan().schema.names == ["id", "name", "amount", "day", "note"]
    t.close()


class EvolvingTableMachine(RuleBasedStateMachine):
    """Columns added, widened and dropped among writes by two handles (each knows the columns of
    when it was opened, until it is reopened), flushes, writer crashes and compactions. After every step
    a strong reader opened at the start (it follows the changes) equals the model: per key, the
    values its last write carried, null for every current column that write did not know."""

    FRESH = ("c1", "c2", "c3")

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="memwal-evolve-")
        self.uri = f"{self.dir}/t"
        Table.create(self.uri, pa.schema([("id", pa.int64()), ("v", pa.string()), ("w", pa.string()), ("n", pa.int16())]), ["id"],
                     "bucket(id, 2)", writer=WriterConfig(max_memtable_rows=100_000), bounds=Bounds.unbounded()).close()
        self.writers = [Table.open(self.uri), Table.open(self.uri)]
        self.crashed: list[Table] = []
        self.compactor = Compactor(TableState.load(self.uri))
        self.reader = readers.open(self.uri, consistency="strong")
        self.model: dict[int, dict] = {}
        self.counter = 0
        self.fresh = list(self.FRESH)

    def columns(self) -> list[str]:
        return [c for c in lance.dataset(self.uri).schema.names if not c.startswith("_")]

    @rule(w=st.sampled_from([0, 1]), keys=st.lists(st.integers(0, 9), min_size=1, max_size=5))
    def upsert(self, w, keys):
        self.counter += 1
        t = self.writers[w]
        names = t.schema.names  # what this handle knows
        batch = [{"id": k, **{c: self.counter * 10 + k if c == "n" else f"{c}{k}@{self.counter}" for c in names if c != "id"}}
                 for k in keys]
        t.write(pa.Table.from_pylist(batch, schema=t.schema))
        self.model.update((r["id"], r) for r in batch)

    @rule(w=st.sampled_from([0, 1]), keys=st.lists(st.integers(0, 9), min_size=1, max_size=3))
    def delete(self, w, keys):
        self.writers[w].delete({"id": pa.array(keys, pa.int64())})
        for k in keys:
            self.model.pop(k, None)

    @rule(w=st.sampled_from([0, 1]))
    def flush(self, w):
        self.writers[w].flush()

    @rule(w=st.sampled_from([0, 1]))
    def crash_and_reopen(self, w):
        self.crashed.append(self.writers[w])  # acknowledged writes only in its WAL now
        self.writers[w] = Table.open(self.uri)

    @rule()
    def compact(self):
        self.compactor.state.manifests.clear_cache()
        self.compactor.run_once()

    @precondition(lambda self: self.fresh)
    @rule(w=st.sampled_from([0, 1]))
    def add_column(self, w):
        self.writers[w].update_schema().add_column(self.fresh.pop(0), pa.string()).commit()

    @rule(w=st.sampled_from([0, 1]))
    def widen_column(self, w):
        base = lance.dataset(self.uri).schema
        wider = {pa.int16(): pa.int32(), pa.int32(): pa.int64()}
        if "n" in base.names and base.field("n").type in wider:
            self.writers[w].update_schema().widen_column("n", wider[base.field("n").type]).commit()

    @rule(w=st.sampled_from([0, 1]), data=st.data())
    def drop_column(self, w, data):
        droppable = [c for c in self.columns() if c != "id"]
        if len(droppable) > 1:
            self.writers[w].update_schema().drop_column(data.draw(st.sampled_from(droppable))).commit()

    @invariant()
    def strong_reads_equal_the_model(self):
        columns = self.columns()
        want = {k: {c: r.get(c) for c in columns} for k, r in self.model.items()}
        got = self.reader.scan()
        assert got.schema.names == columns
        if "n" in columns:
            assert got.schema.field("n").type == lance.dataset(self.uri).schema.field("n").type
        assert {r["id"]: r for r in got.to_pylist()} == want
        for k in (0, 7):
            assert self.reader.get(k) == want.get(k)

    def teardown(self) -> None:
        try:
            for w in self.writers:
                w.close()
            Table.open(self.uri).flush_stranded()
            columns = self.columns()
            want = {k: {c: r.get(c) for c in columns} for k, r in self.model.items()}
            assert {r["id"]: r for r in readers.open(self.uri).scan().to_pylist()} == want  # eventual, all flushed
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


EvolvingTableMachine.TestCase.settings = settings(max_examples=examples(40), stateful_step_count=30, deadline=None)
TestEvolvingTable = EvolvingTableMachine.TestCase


def test_time_travel_reads_the_past_with_the_columns_it_had(table_uri):
    t = Table.create(table_uri, SCHEMA, ["id"], "bucket(id, 2)")
    t.write(pa.Table.from_pylist(rows(range(4), "a", SCHEMA.names), schema=SCHEMA))
    t.flush()
    Compactor(t.state).run_once()
    before = t.dataset().version
    with t.update_schema() as u:
        u.add_column("note", pa.string()).drop_column("legacy")
    t.write(pa.Table.from_pylist(rows([1, 9], "b", t.schema.names), schema=t.schema))
    t.flush()
    past = readers.open(table_uri, as_of=before)
    assert {r["id"]: r for r in past.scan().to_pylist()} == {r["id"]: r for r in rows(range(4), "a", SCHEMA.names)}
    assert past.get(1)["legacy"] == "old1"
    assert readers.open(table_uri).get(1) == rows([1], "b", t.schema.names)[0]
    t.close()


def test_vector_and_text_search_return_the_new_columns(table_uri):
    schema = pa.schema([("id", pa.int64()), ("body", pa.string()), ("vec", pa.list_(pa.float32(), 4)), ("legacy", pa.string())])
    t = Table.create(table_uri, schema, ["id"], "bucket(id, 2)", indexes=IndexConfig(fts_column="body"))

    def batch(ids, word):
        return pa.table({"id": pa.array(ids, pa.int64()), "body": [f"{word} item {i}" for i in ids],
                         "vec": pa.array([[float(i), 0.0, 1.0, 2.0] for i in ids], pa.list_(pa.float32(), 4)),
                         "legacy": [f"old{i}" for i in ids]})

    t.write(batch(range(10), "apple"))
    t.flush()  # an SSTable with the old columns
    t.write(batch(range(10, 14), "apple"))  # WAL entries with them
    other = Table.open(table_uri)
    with other.update_schema() as u:
        u.add_column("note", pa.string()).drop_column("legacy")
    for consistency in ("strong", "eventual"):
        r = readers.open(table_uri, consistency=consistency)
        found = r.search([3.0, 0.0, 1.0, 2.0], k=3, column="vec")
        assert found.column_names == ["id", "body", "vec", "note", "_distance"]
        assert found.column("id").to_pylist()[0] == 3 and found.column("note").null_count == 3
        hits = r.text_search("apple", k=20, column="body")
        assert "legacy" not in hits.column_names and "note" in hits.column_names
        assert set(hits.column("id").to_pylist()) == set(range(14 if consistency == "strong" else 10))
    t.close()
    other.close()


# -- ingest that follows the source (SinkOptions.evolve) ------------------------------------------


def _source_steps():
    """A default Postgres connector's ``orders`` topic across ``ALTER TABLE orders ADD COLUMN
    gift_wrap boolean, ADD COLUMN weight numeric(8,3), ADD COLUMN qty integer``, then ``ALTER
    qty TYPE bigint, ALTER weight TYPE numeric(12,3), ALTER amount TYPE numeric(14,2)`` with
    values only the wider types hold, then ``DROP COLUMN attrs`` and three inserts after
    ``ALTER amount TYPE text`` whose amounts are no number: per step, its records and the
    source table's state (its columns) after it, without the three inserts: memwal cannot
    store them and sends them to the dead letters."""
    import random

    from debezium_events import Column, PostgresTable, orders_table, random_order

    v1 = orders_table()
    v2 = PostgresTable(v1.columns + [Column("gift_wrap", "boolean"), Column("weight", "numeric(8,3)"), Column("qty", "integer")],
                       ["id"])
    wider = {"qty": "bigint", "weight": "numeric(12,3)", "amount": "numeric(14,2)"}
    v2w = PostgresTable([Column(c.name, wider.get(c.name, c.pg_type), c.nullable) for c in v2.columns], ["id"])
    v3 = PostgresTable([c for c in v2w.columns if c.name != "attrs"], ["id"])
    rng, db, lsn = random.Random(44), {}, 30_000_000
    steps = []
    for table, events in ((v1, 300), (v2, 200), (v2w, 200), (v3, 200)):
        records = []
        if table is v2:  # ADD COLUMN: existing rows read NULL
            for row in db.values():
                row.update(gift_wrap=None, weight=None, qty=None)
        if table is v3:
            for row in db.values():
                row.pop("attrs")
        for i in range(events):
            lsn += 17
            k = rng.randrange(120)
            if rng.random() < 0.15 and k in db:
                records.append((table.key_of(db[k]), table.event("d", db.pop(k), None, lsn=lsn, commit_ms=lsn, txid=i), k % 2))
                continue
            row = random_order(rng, k, i)
            if table is v2:
                row.update(gift_wrap=rng.random() < 0.5, weight=Decimal(rng.randrange(-10**7, 10**7)).scaleb(-3),
                           qty=rng.randrange(-2**31, 2**31))
            elif table is not v1:  # values only the wider types hold
                row.update(gift_wrap=rng.random() < 0.5, weight=Decimal(rng.randrange(-10**11, 10**11)).scaleb(-3),
                           qty=rng.randrange(-2**62, 2**62), amount=Decimal(rng.randrange(-10**13, 10**13)).scaleb(-2))
            if table is v3:
                row.pop("attrs")
            op = "u" if k in db else "c"
            db[k] = row
            records.append((table.key_of(row), table.event(op, None, row, lsn=lsn, commit_ms=lsn, txid=i), k % 2))
        if table is v3:  # ALTER TABLE orders ALTER amount TYPE text: values that are no number cannot be stored
            as_text = PostgresTable([Column("amount", "text") if c.name == "amount" else c for c in v3.columns], ["id"])
            for k in range(500, 503):
                row = {**random_order(rng, k, k), "amount": "n/a", "gift_wrap": None, "weight": None, "qty": None}
                row.pop("attrs")
                lsn += 17
                records.append((as_text.key_of(row), as_text.event("c", None, row, lsn=lsn, commit_ms=lsn, txid=k), k % 2))
        steps.append((records, {k: dict(v) for k, v in db.items()}, [c.name for c in table.columns]))
    return steps


@pytest.mark.spark
@pytest.mark.kafka
def test_debezium_ingest_follows_added_widened_and_dropped_source_columns(spark, kafka, tmp_path):
    from brokers import produce
    from test_debezium_defaults import canonical

    from memwal.streaming import SinkOptions, ingest
    from memwal.streaming.debezium import schema_from_event
    from memwal.write.dead_letters import dead_letter_uri, read_dead_letters

    topic = f"shop.public.orders.evolve.{tmp_path.name}"
    kafka.create_topic(topic, 2)
    uri = str(tmp_path / "orders")
    steps = _source_steps()
    first = steps[0][0][0]
    event = schema_from_event(first[0] + b"\n" + first[1])
    Table.create(uri, event.schema, ["id"], "bucket(id, 2)").close()
    options = SinkOptions(source="kafka-json", value_format="debezium-json")
    for n, (records, source, columns) in enumerate(steps):
        produce(kafka, topic, records)
        job = ingest(spark, bootstrap=kafka.bootstrap, topic=topic, table_uri=uri, checkpoint=str(tmp_path / "ckpt"),
                     available_now=True, max_offsets_per_trigger=150, options=options, kafka_source="spark")
        job.await_termination()
        assert job.query.exception() is None
        got = {r["id"]: r for r in readers.open(uri, consistency="strong").scan().to_pylist()}
        want = {k: canonical(v) for k, v in source.items()}
        assert got.keys() == want.keys(), n
        compared = [c for c in columns if c != "attrs" or n < 3]  # the source dropped attrs at the last step
        diverging = [k for k in want if {c: got[k][c] for c in compared} != {c: want[k][c] for c in compared}]
        assert not diverging, (n, [(got[k], want[k]) for k in diverging[:2]])
    table = Table.open(uri)
    assert table.schema.field("gift_wrap").type == pa.bool_()
    assert [table.schema.field(c).type for c in ("weight", "qty", "amount")] == [pa.decimal128(12, 3), pa.int64(), pa.decimal128(14, 2)]
    assert "attrs" in table.schema.names  # a source's drop drops nothing: rows written since hold null there
    dead = read_dead_letters(dead_letter_uri(uri)).to_pylist()
    # the incompatible change's three records, each with its reason; the rest arrived (above)
    assert sorted(json.loads(d["key"])["payload"]["id"] for d in dead) == [500, 501, 502] and all(d["error"] for d in dead)


@pytest.mark.parametrize("evolve", ["add", "none"])
def test_the_prepare_stage_adds_a_source_field_as_a_column_or_leaves_it(tmp_path, evolve):
    """The batch holds events from before and after ``ALTER TABLE items ADD COLUMN qty integer``."""
    from debezium_events import Column, PostgresTable

    from memwal.streaming import SinkOptions
    from memwal.streaming.exchange import shard_partitions
    from memwal.streaming.prepare import Prepare
    from memwal.write.worker import WORKER

    v1 = PostgresTable([Column("id", "bigint", nullable=False), Column("name", "text")], ["id"], table="items")
    v2 = PostgresTable(v1.columns + [Column("qty", "integer")], ["id"], table="items")
    uri = str(tmp_path / "items")
    Table.create(uri, pa.schema([("id", pa.int64()), ("name", pa.string())]), ["id"], "bucket(id, 2)").close()
    rows = [(v1, {"id": 1, "name": "a"}), (v2, {"id": 2, "name": "b", "qty": 7}), (v1, {"id": 3, "name": "c"}), (v2, {"id": 1, "name": "d", "qty": None})]
    data = pa.table({"key": [t.key_of(r) for t, r in rows], "value": [t.event("c", None, r, lsn=i, commit_ms=i, txid=i) for i, (t, r) in enumerate(rows)],
                     "topic": ["items"] * 4, "partition": pa.array([0] * 4, pa.int32()), "offset": pa.array(range(4), pa.int64())})
    options = SinkOptions(source="kafka-json", value_format="debezium-json", evolve=evolve)
    state = WORKER.table(uri).state
    prepared = Prepare(uri, options).prepare(state, data, 0, 0, shard_partitions(state.spec, options))
    assert prepared.dead.num_rows == 0
    got = sorted(prepared.rows.select([c for c in ("id", "name", "qty") if c in prepared.rows.column_names]).to_pylist(), key=lambda r: (r["id"], r["name"]))
    if evolve == "add":
        assert Table.open(uri).schema.field("qty").type == pa.int32()
        assert got == [{"id": 1, "name": "a", "qty": None}, {"id": 1, "name": "d", "qty": None}, {"id": 2, "name": "b", "qty": 7},
                       {"id": 3, "name": "c", "qty": None}]
    else:
        assert Table.open(uri).schema.names == ["id", "name"]
        assert got == [{"id": 1, "name": "a"}, {"id": 1, "name": "d"}, {"id": 2, "name": "b"}, {"id": 3, "name": "c"}]
    WORKER.clear()


@pytest.mark.parametrize("evolve", ["compatible", "add"])
def test_the_prepare_stage_widens_a_column_the_source_widened(tmp_path, evolve):
    """The batch holds events from before and after ``ALTER TABLE items ALTER qty TYPE bigint``,
    one with a value only bigint holds: widened with ``compatible`` (the default), a dead letter
    naming the column with ``add``."""
    from debezium_events import Column, PostgresTable

    from memwal.streaming import SinkOptions
    from memwal.streaming.exchange import shard_partitions
    from memwal.streaming.prepare import Prepare
    from memwal.write.worker import WORKER

    v1 = PostgresTable([Column("id", "bigint", nullable=False), Column("qty", "integer")], ["id"], table="items")
    v2 = PostgresTable([Column("id", "bigint", nullable=False), Column("qty", "bigint")], ["id"], table="items")
    uri = str(tmp_path / "items")
    Table.create(uri, pa.schema([("id", pa.int64()), ("qty", pa.int32())]), ["id"], "bucket(id, 2)").close()
    rows = [(v1, {"id": 1, "qty": 5}), (v2, {"id": 2, "qty": 2**40}), (v2, {"id": 3, "qty": 6})]
    data = pa.table({"key": [t.key_of(r) for t, r in rows], "value": [t.event("c", None, r, lsn=i, commit_ms=i, txid=i) for i, (t, r) in enumerate(rows)],
                     "topic": ["items"] * 3, "partition": pa.array([0] * 3, pa.int32()), "offset": pa.array(range(3), pa.int64())})
    options = SinkOptions(source="kafka-json", value_format="debezium-json", evolve=evolve)
    assert SinkOptions().evolve == "compatible"
    state = WORKER.table(uri).state
    prepared = Prepare(uri, options).prepare(state, data, 0, 0, shard_partitions(state.spec, options))
    got = {r["id"]: r["qty"] for r in prepared.rows.select(["id", "qty"]).to_pylist()}
    if evolve == "compatible":
        assert Table.open(uri).schema.field("qty").type == pa.int64()
        assert prepared.dead.num_rows == 0 and got == {1: 5, 2: 2**40, 3: 6}
    else:
        assert Table.open(uri).schema.field("qty").type == pa.int32()
        assert got == {1: 5, 3: 6}
        from memwal.write.messages import ERROR, OFFSET

        assert prepared.dead.column(OFFSET).to_pylist() == [1] and prepared.dead.column(ERROR)[0].as_py()
    WORKER.clear()


def test_a_prepare_task_that_loses_the_race_to_add_a_column_still_widens_the_next(tmp_path, monkeypatch):
    """Two tasks of a micro-batch follow the same ``ADD COLUMN note, ALTER qty TYPE bigint``.
    The other task commits the added column between this task's read of the base and its own
    commit of it (a real Lance conflict, the interleaving forced): this task looks again and
    widens ``qty`` itself, so no row of the batch becomes a dead letter."""
    from debezium_events import Column, PostgresTable

    from memwal.maintain.evolve import SchemaUpdate
    from memwal.streaming import SinkOptions
    from memwal.streaming.exchange import shard_partitions
    from memwal.streaming.prepare import Prepare
    from memwal.write.worker import WORKER

    wide = PostgresTable([Column("id", "bigint", nullable=False), Column("qty", "bigint"), Column("note", "text")], ["id"], table="items")
    uri = str(tmp_path / "items")
    Table.create(uri, pa.schema([("id", pa.int64()), ("qty", pa.int32())]), ["id"], "bucket(id, 2)").close()
    rows = [{"id": i, "qty": 2**40 + i, "note": "gift"} for i in range(4)]
    data = pa.table({"key": [wide.key_of(r) for r in rows],
                     "value": [wide.event("c", None, r, lsn=i, commit_ms=i, txid=i) for i, r in enumerate(rows)],
                     "topic": ["items"] * 4, "partition": pa.array([0] * 4, pa.int32()), "offset": pa.array(range(4), pa.int64())})
    original = lance.LanceDataset.add_columns
    raced = []

    def other_task_first(self, *args, **kwargs):
        if not raced:  # the other task's add of the same column lands first
            raced.append(True)
            SchemaUpdate(TableState.load(uri)).add_column("note", pa.string()).commit()
        return original(self, *args, **kwargs)

    monkeypatch.setattr(lance.LanceDataset, "add_columns", other_task_first)
    options = SinkOptions(source="kafka-json", value_format="debezium-json")
    state = WORKER.table(uri).state
    prepared = Prepare(uri, options).prepare(state, data, 0, 0, shard_partitions(state.spec, options))
    assert raced
    schema = Table.open(uri).schema
    assert schema.field("qty").type == pa.int64() and schema.field("note").type == pa.string()
    assert prepared.dead.num_rows == 0
    assert sorted(prepared.rows.select(["id", "qty", "note"]).to_pylist(), key=lambda r: r["id"]) == rows
    WORKER.clear()


@pytest.mark.parametrize("evolve", ["compatible", "none"])
def test_avro_from_a_registry_follows_added_and_widened_source_fields(tmp_path, evolve):
    """Debezium's Avro converter registers a new value schema when the source changes: events of
    both schemas in one batch (``ADD COLUMN note text``, ``ALTER qty TYPE bigint``, ``ALTER amount
    TYPE numeric(14,2)``, with values only the new types hold) land in the evolved table; with
    ``none`` the table stays, and the event whose values it cannot hold is a dead letter."""
    from debezium_events import AvroTopic, Column, PostgresTable
    from registry import Registry

    from memwal.streaming import SinkOptions
    from memwal.streaming.exchange import shard_partitions
    from memwal.streaming.prepare import Prepare
    from memwal.write.worker import WORKER

    v1 = PostgresTable([Column("id", "bigint", nullable=False), Column("qty", "integer"), Column("amount", "numeric(10,2)")],
                       ["id"], table="items")
    v2 = PostgresTable([Column("id", "bigint", nullable=False), Column("qty", "bigint"), Column("amount", "numeric(14,2)"),
                        Column("note", "text")], ["id"], table="items")
    old, new = AvroTopic(v1, 7, 8), AvroTopic(v2, 9, 10)
    registry = Registry({7: old.value_avro, 8: old.key_avro, 9: new.value_avro, 10: new.key_avro})
    try:
        uri = str(tmp_path / "items")
        Table.create(uri, pa.schema([("id", pa.int64()), ("qty", pa.int32()), ("amount", pa.decimal128(10, 2))]), ["id"],
                     "bucket(id, 2)").close()
        rows = [(old, {"id": 1, "qty": 5, "amount": Decimal("10.50")}),
                (new, {"id": 2, "qty": 2**40, "amount": Decimal("123456789012.25"), "note": "gift"}),
                (old, {"id": 3, "qty": 6, "amount": Decimal("-7.00")})]
        data = pa.table({"key": [t.key_of(r) for t, r in rows],
                         "value": [t.event("c", None, r, lsn=i, commit_ms=i, txid=i) for i, (t, r) in enumerate(rows)],
                         "topic": ["items"] * 3, "partition": pa.array([0] * 3, pa.int32()), "offset": pa.array(range(3), pa.int64())})
        options = SinkOptions(source="kafka-json", value_format="avro", schema_registry=registry.url, evolve=evolve)
        state = WORKER.table(uri).state
        prepared = Prepare(uri, options).prepare(state, data, 0, 0, shard_partitions(state.spec, options))
        schema = Table.open(uri).schema
        if evolve == "none":
            from memwal.write.messages import OFFSET

            assert schema.names == ["id", "qty", "amount"] and prepared.dead.column(OFFSET).to_pylist() == [1]
            assert sorted(prepared.rows.column("id").to_pylist()) == [1, 3]
            return
        assert [schema.field(c).type for c in ("qty", "amount", "note")] == [pa.int64(), pa.decimal128(14, 2), pa.string()]
        assert prepared.dead.num_rows == 0
        got = {r["id"]: r for r in prepared.rows.select(["id", "qty", "amount", "note"]).to_pylist()}
        assert got == {1: {"id": 1, "qty": 5, "amount": Decimal("10.50"), "note": None},
                       2: {"id": 2, "qty": 2**40, "amount": Decimal("123456789012.25"), "note": "gift"},
                       3: {"id": 3, "qty": 6, "amount": Decimal("-7.00"), "note": None}}
    finally:
        registry.close()
        WORKER.clear()


def test_a_column_a_view_reads_is_not_dropped_or_widened_under_it(table_uri):
    from memwal.views.view import View

    t = Table.create(table_uri, WIDE, ["id"], "bucket(id, 2)")
    t.write(pa.Table.from_pylist(wide_rows(range(30), 1), schema=WIDE))
    View.create(table_uri, "big", select=["name", "qty * 2 AS q2"], where="price > 10")
    for change in (lambda u: u.drop_column("qty"), lambda u: u.widen_column("price", pa.decimal128(20, 2))):
        with pytest.raises(InvalidArgumentError):
            change(t.update_schema()).commit()
    t.update_schema().drop_column("day").commit()  # a column it does not read
    assert "day" not in t.schema.names and t.schema.field("qty").type == pa.int32()
    View.open(table_uri, "big").refresh()
    t.close()


def test_the_format_and_ingest_pass_the_evolve_mode_on():
    """``memwal ingest --evolve`` reaches the tasks on the one-stage path too (``format("memwal")``'s ``evolve``)."""
    from memwal.spark.format_options import FormatOptions
    from memwal.spark.write import sink_options
    from memwal.core.storage import StorageConfig
    from memwal.streaming import SinkOptions
    from memwal.streaming.job import format_options

    kafka = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    for mode in ("none", "add", "compatible"):
        given = format_options(SinkOptions(source="kafka-json", value_format="debezium-json", evolve=mode), StorageConfig())
        opts = FormatOptions.parse({**given, "path": "/tmp/t"}, environ={})
        assert sink_options(opts, kafka, ["id"], streaming=True).evolve == mode
    with pytest.raises(InvalidArgumentError):
        FormatOptions.parse({"path": "/tmp/t", "evolve": "sometimes"}, environ={})


def test_two_widenings_of_one_column_at_once_make_one_and_a_narrow_handle_keeps_its_writers(table_uri):
    """Tasks of one micro-batch race to widen the same column: one widens it, the others find it
    done. A handle still of the narrow columns then writes through writers claimed after the
    widening without reopening them (its rows are cast)."""
    narrow = Table.create(table_uri, WIDE, ["id"], "bucket(id, 2)")
    model: dict = {}
    batch = wide_rows(range(50), 1)
    narrow.write(pa.Table.from_pylist(batch, schema=WIDE))
    model.update((r["id"], r) for r in batch)
    narrow.flush()
    Compactor(narrow.state).run_once()
    errors: list[Exception] = []

    def widen() -> None:
        try:
            Table.open(table_uri).update_schema().widen_column("qty", pa.int64()).commit()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    racers = [threading.Thread(target=widen) for _ in range(3)]
    for th in racers:
        th.start()
    for th in racers:
        th.join()
    assert not errors, errors
    names = lance.dataset(table_uri).schema.names
    assert sum(n.startswith("_widened_") for n in names) == 1, names
    reports = []
    for tag in range(2, 7):
        batch = wide_rows(range(tag * 5, tag * 5 + 20), tag)
        reports.append(narrow.write(pa.Table.from_pylist(batch, schema=WIDE)))
        model.update((r["id"], r) for r in batch)
    assert sum(r.flushes for r in reports) == 0 and sum(r.writer_opens for r in reports) <= 2
    check(table_uri, model, Table.open(table_uri).schema.names)
    narrow.close()
