"""Partial updates (merge="partial"): absent columns keep their stored values, explicit nulls
set null, records of one key fold in order, deletes reset the row."""

from __future__ import annotations

import json
import tempfile
import time

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from memwal import Table
from memwal.core.errors import InvalidArgumentError
from memwal.core.metadata import WriterConfig
from memwal.core.partial import fold, presence_of_columns, presence_of_dicts, presence_type, resolve
from memwal.streaming.decode import JsonDecoder, json_presence

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64()), ("vec", pa.list_(pa.float32(), 2))])
PK = ["id"]
VALUES = ["name", "score", "vec"]


def rows_of(table: Table) -> dict[int, dict]:
    return {r["id"]: r for r in table.reader("strong").scan().to_pylist()}


def write_schema() -> pa.Schema:
    from memwal.core.schema import with_primary_key

    return with_primary_key(pa.schema([f if f.name in PK else f.with_nullable(True) for f in SCHEMA]), PK)


def folded(records: list[dict], deletes: list[bool], stored: list[dict] | None = None) -> tuple[list, dict]:
    """(deleted keys, upserted rows by key) of ``records`` folded and resolved over ``stored``."""
    ws = write_schema()
    rows = pa.Table.from_pylist(records, schema=ws)
    f = fold(rows, presence_of_dicts(records, presence_type(ws, PK)), np.array(deletes, bool), PK)
    dels, ups = resolve(f, pa.Table.from_pylist(stored or [], schema=ws), PK)
    return sorted(dels.column("id").to_pylist()), {r["id"]: r for r in ups.to_pylist()}


# -- folding (pure) ---------------------------------------------------------------------------


def test_later_fields_win_and_earlier_fields_persist():
    dels, ups = folded([{"id": 1, "name": "a"}, {"id": 1, "score": 2.0}, {"id": 1, "name": "b"}], [False] * 3)
    assert dels == [] and ups == {1: {"id": 1, "name": "b", "score": 2.0, "vec": None}}


def test_absent_keeps_the_stored_value_and_null_sets_null():
    stored = [{"id": 1, "name": "old", "score": 1.0, "vec": [1.0, 2.0]}]
    _, ups = folded([{"id": 1, "name": None, "score": 5.0}], [False], stored)
    assert ups == {1: {"id": 1, "name": None, "score": 5.0, "vec": [1.0, 2.0]}}


def test_a_delete_resets_the_row_and_the_stored_row_is_not_merged():
    stored = [{"id": 1, "name": "old", "score": 1.0, "vec": [1.0, 2.0]}]
    recs = [{"id": 1, "name": "x"}, {"id": 1}, {"id": 1, "score": 3.0}]
    dels, ups = folded(recs, [False, True, False], stored)
    assert dels == [] and ups == {1: {"id": 1, "name": None, "score": 3.0, "vec": None}}
    dels, ups = folded(recs[:2], [False, True], stored)
    assert dels == [1] and ups == {}


def test_a_key_not_stored_is_inserted_with_absent_columns_null():
    _, ups = folded([{"id": 7, "score": 1.5}], [False], [{"id": 1, "name": "other", "score": 0.0, "vec": None}])
    assert ups == {7: {"id": 7, "name": None, "score": 1.5, "vec": None}}


def test_presence_of_an_arrow_table_is_its_columns():
    p = presence_of_columns(2, presence_type(write_schema(), PK), ["id", "score"])
    assert p.to_pylist() == [{"name": False, "score": True, "vec": False}] * 2


def test_json_presence_tells_a_missing_key_from_an_explicit_null():
    values = [b'{"id": 1, "name": null}', b'{"id": 2, "score": 1.0, "name": "x", "vec": [1, 2]}', b'{"id": 3, "vec": null}']
    parsed, positions, errors = JsonDecoder(SCHEMA).decode(values)
    assert not errors
    p = json_presence(values, parsed, positions, presence_type(write_schema(), PK))
    assert p.to_pylist() == [
        {"name": True, "score": False, "vec": False},
        {"name": True, "score": True, "vec": True},
        {"name": False, "score": False, "vec": True},
    ]


OPS = st.lists(
    st.tuples(
        st.integers(0, 3),  # key
        st.sampled_from(["partial", "delete"]),
        st.dictionaries(st.sampled_from(VALUES), st.one_of(st.none(), st.integers(0, 9))),
    ),
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(ops=OPS, stored_keys=st.sets(st.integers(0, 3)))
def test_fold_and_resolve_equal_applying_records_one_by_one(ops, stored_keys):
    def typed(col, v):
        if v is None:
            return None
        return {"name": f"s{v}", "score": float(v), "vec": [float(v), 0.0]}[col]

    stored = {k: {"id": k, "name": f"st{k}", "score": -1.0, "vec": [9.0, 9.0]} for k in stored_keys}
    model = {k: dict(v) for k, v in stored.items()}
    records, deletes = [], []
    for k, kind, cols in ops:
        rec = {"id": k, **{c: typed(c, v) for c, v in cols.items()}}
        records.append(rec)
        deletes.append(kind == "delete")
        if kind == "delete":
            model.pop(k, None)
        else:
            # A partial record after a delete (or of a new key) starts from an empty row.
            model[k] = {**model.get(k, {"id": k, "name": None, "score": None, "vec": None}), **rec}
    if not records:
        return
    dels, ups = folded(records, deletes, list(stored.values()))
    touched = {r["id"] for r in records}
    result = {k: v for k, v in stored.items() if k not in touched}
    result.update(ups)
    assert set(dels) == {k for k in touched if k not in model}
    assert result == model


# -- Table.write(merge="partial") --------------------------------------------------------------


def test_table_partial_updates_across_writes_flushes_and_deletes(table_uri):
    with Table.create(table_uri, SCHEMA, PK, "bucket(id, 2)") as t:
        t.write([{"id": i, "name": f"n{i}", "score": float(i), "vec": [1.0, 2.0]} for i in range(4)])
        t.write([{"id": 0, "score": 10.0}, {"id": 1, "name": None}, {"id": 9, "name": "new"}], merge="partial")
        t.flush()  # the next write reads SSTables, not the WAL
        t.write(pa.table({"id": [2, 0], "name": ["two", "zero"]}), merge="partial")
        t.delete({"id": [3]})
        t.write([{"id": 3, "score": 3.5}], merge="partial")
        got = rows_of(t)
    assert got == {
        0: {"id": 0, "name": "zero", "score": 10.0, "vec": [1.0, 2.0]},
        1: {"id": 1, "name": None, "score": 1.0, "vec": [1.0, 2.0]},
        2: {"id": 2, "name": "two", "score": 2.0, "vec": [1.0, 2.0]},
        3: {"id": 3, "name": None, "score": 3.5, "vec": None},
        9: {"id": 9, "name": "new", "score": None, "vec": None},
    }
    assert rows_of(Table.open(table_uri)) == got  # flushed on close: eventual readers agree


def test_composite_keys_across_the_base_sstables_and_the_wal(table_uri):
    schema = pa.schema([("org", pa.string()), ("n", pa.int32()), ("x", pa.int64()), ("y", pa.string())])
    with Table.create(table_uri, schema, ["org", "n"], "bucket(org, 2)",
                      initial_data=[{"org": "a", "n": 1, "x": 1, "y": "base"}, {"org": "b", "n": 1, "x": 2, "y": "base"}]) as t:
        t.write([{"org": "a", "n": 2, "x": 3, "y": "sst"}])
        t.flush()
        t.write([{"org": "b", "n": 2, "x": 4, "y": "wal"}])
        t.write([{"org": o, "n": n, "x": 10 * n} for o in "ab" for n in (1, 2, 3)], merge="partial")
        got = {(r["org"], r["n"]): (r["x"], r["y"]) for r in t.reader("strong").scan().to_pylist()}
    assert got == {("a", 1): (10, "base"), ("b", 1): (10, "base"), ("a", 2): (20, "sst"), ("b", 2): (20, "wal"),
                   ("a", 3): (30, None), ("b", 3): (30, None)}


def test_a_partial_record_without_its_key_is_refused_naming_it(table_uri):
    with Table.create(table_uri, SCHEMA, PK) as t:
        with pytest.raises(InvalidArgumentError, match="record 1"):
            t.write([{"id": 1, "name": "a"}, {"name": "no key"}], merge="partial")
        with pytest.raises(InvalidArgumentError):
            t.write(pa.table({"name": ["x"]}), merge="partial")
        with pytest.raises(InvalidArgumentError):
            t.write([{"id": 1}], merge="sideways")
        assert rows_of(t) == {}  # nothing of a refused write was applied


def test_partial_needs_a_durable_table(table_uri):
    with Table.create(table_uri, SCHEMA, PK, writer=WriterConfig(durable_write=False)) as t:
        with pytest.raises(InvalidArgumentError):
            t.write([{"id": 1, "name": "a"}], merge="partial")


class PartialModel(RuleBasedStateMachine):
    """Partial updates interleaved with full upserts, deletes and flushes, through
    Table.write, against a dict of rows."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="memwal-partial-")
        self.table = Table.create(f"{self.dir}/t", SCHEMA, PK, "bucket(id, 2)")
        self.model: dict[int, dict] = {}

    @staticmethod
    def _value(col: str, v: int | None):
        if v is None:
            return None
        return {"name": f"v{v}", "score": float(v), "vec": [float(v), 1.0]}[col]

    @rule(keys=st.lists(st.integers(0, 5), min_size=1, max_size=6), v=st.integers(0, 99))
    def full_upsert(self, keys, v):
        rows = [{"id": k, "name": f"f{v}", "score": float(v), "vec": [0.0, float(v)]} for k in keys]
        self.table.write(rows)
        for r in rows:
            self.model[r["id"]] = dict(r)

    @rule(
        records=st.lists(
            st.tuples(st.integers(0, 5), st.dictionaries(st.sampled_from(VALUES), st.one_of(st.none(), st.integers(0, 99)))),
            min_size=1,
            max_size=6,
        )
    )
    def partial_update(self, records):
        recs = [{"id": k, **{c: self._value(c, v) for c, v in cols.items()}} for k, cols in records]
        self.table.write(recs, merge="partial")
        for r in recs:
            self.model[r["id"]] = {**self.model.get(r["id"], {"id": r["id"], "name": None, "score": None, "vec": None}), **r}

    @rule(columns=st.sets(st.sampled_from(VALUES)), keys=st.sets(st.integers(0, 5), min_size=1, max_size=3), v=st.integers(0, 99))
    def partial_arrow(self, columns, keys, v):
        ks = sorted(keys)
        data = {"id": pa.array(ks, pa.int64())}
        for c in sorted(columns):
            data[c] = pa.array([self._value(c, v)] * len(ks), SCHEMA.field(c).type)
        self.table.write(pa.table(data), merge="partial")
        for k in ks:
            self.model[k] = {**self.model.get(k, {"id": k, "name": None, "score": None, "vec": None}), "id": k,
                             **{c: self._value(c, v) for c in columns}}

    @rule(keys=st.sets(st.integers(0, 5), min_size=1, max_size=3))
    def delete(self, keys):
        self.table.delete({"id": sorted(keys)})
        for k in keys:
            self.model.pop(k, None)

    @rule()
    def flush(self):
        self.table.flush()

    @invariant()
    def equals_the_model(self):
        assert rows_of(self.table) == self.model

    def teardown(self) -> None:
        self.table.close()


TestPartialModel = PartialModel.TestCase
TestPartialModel.settings = settings(
    max_examples=12, stateful_step_count=8, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def test_cli_put_merge_partial_from_json_lines_and_parquet(tmp_path):
    import subprocess
    import sys

    import pyarrow.parquet as pq

    uri = str(tmp_path / "t")
    with Table.create(uri, SCHEMA, PK) as t:
        t.write([{"id": i, "name": f"n{i}", "score": float(i), "vec": [1.0, 1.0]} for i in range(3)])
    part = tmp_path / "part.jsonl"
    part.write_text(json.dumps({"id": 0, "score": 9.5}) + "\n" + json.dumps({"id": 1, "name": None}) + "\n")
    pq.write_table(pa.table({"id": pa.array([2], pa.int64()), "vec": pa.array([[5.0, 5.0]], pa.list_(pa.float32(), 2))}), tmp_path / "cols.parquet")

    def memwal(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "memwal", *args], capture_output=True, text=True)

    assert memwal("put", uri, str(part), "--merge", "partial").returncode == 0
    assert memwal("put", uri, str(tmp_path / "cols.parquet"), "--merge", "partial").returncode == 0
    (tmp_path / "nokey.jsonl").write_text(json.dumps({"name": "x"}) + "\n")
    assert memwal("put", uri, str(tmp_path / "nokey.jsonl"), "--merge", "partial").returncode == 2
    assert rows_of(Table.open(uri)) == {
        0: {"id": 0, "name": "n0", "score": 9.5, "vec": [1.0, 1.0]},
        1: {"id": 1, "name": None, "score": 1.0, "vec": [1.0, 1.0]},
        2: {"id": 2, "name": "n2", "score": 2.0, "vec": [5.0, 5.0]},
    }


# -- the sink's stages, run in this process as Spark runs them in a worker -------------------------


def _kafka_batch(values: list[dict | None], first_offset: int) -> pa.Table:
    n = len(values)
    return pa.table({
        "key": pa.array([None] * n, pa.binary()),
        "value": pa.array([None if v is None else json.dumps(v).encode() for v in values], pa.binary()),
        "topic": ["t"] * n,
        "partition": pa.array([0] * n, pa.int32()),
        "offset": pa.array(range(first_offset, first_offset + n), pa.int64()),
    })


def _run_stages(uri: str, options, batch: pa.Table, batch_id: int):
    from helpers import run_sink_batch

    return run_sink_batch(uri, options, batch, batch_id)


def test_sink_stages_fold_json_records_and_a_replayed_batch_changes_nothing(table_uri):
    from memwal.streaming import SinkOptions
    from memwal.write.worker import WORKER

    with Table.create(table_uri, SCHEMA, PK, "bucket(id, 2)") as t:
        t.write([{"id": i, "name": f"n{i}", "score": float(i), "vec": [1.0, 1.0]} for i in range(3)])
    options = SinkOptions(source="kafka-json", merge="partial", max_write_tasks=1, flush_interval_seconds=None, writer_process=False)
    first = _kafka_batch([
        {"id": 0, "score": 5.0}, {"id": 1, "name": None}, {"id": 1, "vec": [3.0, 3.0]},
        {"id": 2, "op": "delete"}, {"id": 2, "score": 2.5}, {"id": 7, "name": "new"}, {"name": "no key"},
    ], 0)
    second = _kafka_batch([{"id": 7, "score": 7.0}, {"id": 0, "op": "delete"}], 7)
    try:
        report = _run_stages(table_uri, options, first, 0)
        _run_stages(table_uri, options, first, 0)  # a replay of the same batch after a crash
        _run_stages(table_uri, options, second, 1)
    finally:
        WORKER.clear()
    assert report.dead_letters == 1
    assert rows_of(Table.open(table_uri)) == {
        1: {"id": 1, "name": None, "score": 1.0, "vec": [3.0, 3.0]},
        2: {"id": 2, "name": None, "score": 2.5, "vec": None},
        7: {"id": 7, "name": "new", "score": 7.0, "vec": None},
    }


# -- end to end: Kafka -> Spark -> memwal --------------------------------------------------------


@pytest.mark.spark
@pytest.mark.kafka
def test_ingest_partial_json_records_end_to_end(spark, kafka, tmp_path):
    from brokers import produce

    from memwal.streaming import SinkOptions, ingest

    topic = f"partial-{time.monotonic_ns()}"
    kafka.create_topic(topic, 2)
    uri = str(tmp_path / "t")
    with Table.create(uri, SCHEMA, PK, "bucket(id, 2)") as t:
        t.write([{"id": i, "name": f"n{i}", "score": float(i), "vec": [1.0, 1.0]} for i in range(6)])

    def rec(value: dict, partition: int):
        return (str(value["id"]).encode(), json.dumps(value).encode(), partition)

    opts = SinkOptions(source="kafka-json", merge="partial")
    ckpt = str(tmp_path / "ckpt")
    # batch 1: partial updates, explicit nulls, a delete then a partial insert, a new key,
    # several records of one key folding in order, a record without its key
    produce(kafka, topic, [
        rec({"id": 0, "score": 10.0}, 0),
        rec({"id": 1, "name": None}, 1),
        rec({"id": 2, "name": "a"}, 0), rec({"id": 2, "vec": [2.0, 2.0]}, 0), rec({"id": 2, "name": "b"}, 0),
        rec({"id": 3, "op": "delete"}, 1), rec({"id": 3, "score": 3.5}, 1),
        rec({"id": 4, "op": "delete"}, 0),
        rec({"id": 9, "name": "new"}, 1),
        (b"nokey", json.dumps({"name": "orphan"}).encode(), 0),
    ])
    job = ingest(spark, bootstrap=kafka.bootstrap, topic=topic, table_uri=uri, checkpoint=ckpt, available_now=True, options=opts, kafka_source="spark")
    job.await_termination()
    assert job.query.exception() is None
    # batch 2 (a second query run): merges over what batch 1 stored
    produce(kafka, topic, [rec({"id": 9, "score": 9.0}, 1), rec({"id": 0, "name": None, "vec": [0.0, 0.0]}, 0)])
    job = ingest(spark, bootstrap=kafka.bootstrap, topic=topic, table_uri=uri, checkpoint=ckpt, available_now=True, options=opts, kafka_source="spark")
    job.await_termination()
    assert job.query.exception() is None
    got = {r["id"]: r for r in Table.open(uri).reader().scan().to_pylist()}
    assert got == {
        0: {"id": 0, "name": None, "score": 10.0, "vec": [0.0, 0.0]},
        1: {"id": 1, "name": None, "score": 1.0, "vec": [1.0, 1.0]},
        2: {"id": 2, "name": "b", "score": 2.0, "vec": [2.0, 2.0]},
        3: {"id": 3, "name": None, "score": 3.5, "vec": None},
        5: {"id": 5, "name": "n5", "score": 5.0, "vec": [1.0, 1.0]},
        9: {"id": 9, "name": "new", "score": 9.0, "vec": None},
    }
    from memwal.write.dead_letters import dead_letter_uri, read_dead_letters

    assert [d["key"] for d in read_dead_letters(dead_letter_uri(uri)).to_pylist()] == [b"nokey"]
