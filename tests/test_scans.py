"""Streamed scans: the merged view level by level against the LSM model, bounded batches, a
limit that stops reading, and the fresh view read by other engines (DuckDB, Polars,
DataFusion) through the Arrow C stream."""

from __future__ import annotations

import datafusion
import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memwal import Table, WriterConfig, readers
from memwal.core.lsm import newest_per_key
from memwal.readers import ReadConfig
from memwal.readers.sstables import KeySet, SSTableCache
from memwal.readers.stream import ShadowKeys, base_rows, shard_rows
from memwal.core.schema import TOMBSTONE

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64())])


def _level(keys: list[int], key_type: pa.DataType, tombstones: list[bool]) -> tuple[KeySet, pa.Table]:
    """An SSTable of ``keys`` as Lance leaves one (its live rows, the newest of each key): its
    key set and its rows."""
    rows = pa.table({"k": pa.array(keys, key_type), "v": pa.array([f"{k}@{i}" for i, k in enumerate(keys)], pa.string()),
                     TOMBSTONE: pa.array(tombstones, pa.bool_())})
    rows = newest_per_key(rows, ["k"])
    return KeySet.of(rows, ["k"]), rows


@settings(max_examples=150, deadline=None)
@given(
    shards=st.lists(st.lists(st.lists(st.tuples(st.integers(0, 40), st.booleans()), max_size=12), max_size=4), min_size=1, max_size=3),
    base_keys=st.lists(st.integers(-5, 45), max_size=40, unique=True),
    tail=st.one_of(st.none(), st.lists(st.tuples(st.integers(0, 40), st.booleans()), max_size=8)),
    key_type=st.sampled_from([pa.int64(), pa.int16(), pa.string()]),
    base_batch=st.integers(1, 7),
)
def test_the_merge_keeps_the_rows_the_lsm_model_keeps(shards, base_keys, tail, key_type, base_batch):
    """Each shard's levels newest first, each minus the keys of newer ones and the tail's,
    then the base minus every key above it, then the tail: exactly the newest live row of each
    key over base, SSTables (oldest first per shard) and WAL tail. Shards own disjoint keys: a
    shard's keys are made its own."""
    cast = str if key_type == pa.string() else int
    schema = pa.schema([("k", key_type), ("v", pa.string())])
    base = pa.table({"k": pa.array([cast(k) for k in base_keys], key_type), "v": pa.array([f"b{k}" for k in base_keys], pa.string()),
                     TOMBSTONE: pa.array([False] * len(base_keys), pa.bool_())})
    model_parts, levels = [base], []
    for s, sstables in enumerate(shards):
        mine = [_level([cast(k * len(shards) + s) for k, _ in entries], key_type, [t for _, t in entries]) for entries in sstables]
        model_parts += [rows for _, rows in mine]  # oldest first
        levels.append(list(reversed(mine)))  # newest first
    tail_table = None
    tail_keys = ShadowKeys(["k"], schema)
    if tail is not None:
        tail_table = newest_per_key(pa.table({"k": pa.array([cast(k) for k, _ in tail], key_type),
                                              "v": pa.array([f"t{i}" for i in range(len(tail))], pa.string()),
                                              TOMBSTONE: pa.array([t for _, t in tail], pa.bool_())}), ["k"])
        model_parts.append(tail_table)
        tail_keys.add_rows(tail_table)
    everything = newest_per_key(pa.concat_tables(model_parts), ["k"])
    expected = sorted(r["v"] for r in everything.to_pylist() if not r[TOMBSTONE])

    got = [v for shard in levels for rows in shard_rows(iter(shard), tail_keys, ["k"], schema) for v in rows.column("v").to_pylist()]
    shadow = ShadowKeys(["k"], schema)
    shadow.merge(tail_keys)
    for shard in levels:
        for keys, _ in shard:
            shadow.add_key_set(keys)
    for batch in base_rows(base.select(["k", "v"]).to_batches(max_chunksize=base_batch), shadow):
        got += batch.column("v").to_pylist()
    if tail_table is not None:
        got += tail_table.filter(pc.invert(tail_table.column(TOMBSTONE))).column("v").to_pylist()
    assert sorted(got) == expected


def _table_with_sstables(uri: str, flushes: int = 5) -> tuple[Table, dict[int, dict]]:
    base = pa.table({"id": range(1000), "name": [f"b{i}" for i in range(1000)], "score": [float(i) for i in range(1000)]}, schema=SCHEMA)
    t = Table.create(uri, SCHEMA, ["id"], "bucket(id, 2)", writer=WriterConfig(max_memtable_rows=10_000), initial_data=base)
    model = {i: {"id": i, "name": f"b{i}", "score": float(i)} for i in range(1000)}
    for f in range(flushes):
        ids = list(range(f * 150, f * 150 + 300))
        t.write(pa.table({"id": ids, "name": [f"f{f}-{i}" for i in ids], "score": [float(f * 10_000 + i) for i in ids]}, schema=SCHEMA))
        t.delete({"id": [f * 150 + 1]})
        t.flush()
        model.update({i: {"id": i, "name": f"f{f}-{i}", "score": float(f * 10_000 + i)} for i in ids})
        model.pop(f * 150 + 1)
    return t, model


@settings(max_examples=10, deadline=None)
@given(
    steps=st.lists(st.tuples(st.sampled_from(["upsert", "delete", "flush", "compact"]), st.lists(st.integers(0, 80), min_size=1, max_size=20)),
                   min_size=1, max_size=8),
    rows_per_split=st.integers(1, 60),
    where=st.sampled_from([None, "score > 120", "name LIKE 'u%'"]),
)
def test_every_split_read_alone_adds_up_to_the_scan_and_the_model(tmp_path_factory, steps, rows_per_split, where):
    """A plan of splits, pickled as it travels to Spark's executors and each split read alone
    by another process's reads, returns exactly the rows of ``scan()`` and of the model: with
    SSTables, deletes, compacted generations, base fragments split by rows and the WAL tail."""
    import pickle

    from memwal.maintain.compactor import Compactor
    from memwal.readers.process import ProcessReads
    from memwal.core.state import TableState

    uri = str(tmp_path_factory.mktemp("splits") / "t")
    base = pa.table({"id": range(0, 80, 2), "name": [f"b{i}" for i in range(0, 80, 2)], "score": [float(i) for i in range(0, 80, 2)]}, schema=SCHEMA)
    t = Table.create(uri, SCHEMA, ["id"], "bucket(id, 3)", writer=WriterConfig(max_memtable_rows=100_000), initial_data=base)
    model = {r["id"]: r for r in base.to_pylist()}
    with t:
        for n, (kind, keys) in enumerate(steps):
            if kind == "upsert":
                batch = [{"id": k, "name": f"u{n}-{k}", "score": float(n * 100 + k)} for k in dict.fromkeys(keys)]
                t.write(pa.Table.from_pylist(batch, schema=SCHEMA))
                model.update({r["id"]: r for r in batch})
            elif kind == "delete":
                t.delete({"id": keys})
                for k in keys:
                    model.pop(k, None)
            elif kind == "flush":
                t.flush()
            else:
                t.flush()
                Compactor(TableState.load(uri)).run_once()
        r = readers.open(uri, consistency="strong")
        plan = pickle.loads(pickle.dumps(r.plan_scan(["id", "name", "score"], where, rows_per_split)))
        executor = ProcessReads().split_reader(uri, None, plan)
        parts = [row for split in plan.splits for b in executor.read(split) for row in b.to_pylist()]
        scanned = r.scan(where=where).to_pylist()
    keep = {"score > 120": lambda m: m["score"] > 120, "name LIKE 'u%'": lambda m: m["name"].startswith("u")}.get(where, lambda m: True)
    want = sorted(m["id"] for m in model.values() if keep(m))
    assert sorted(row["id"] for row in parts) == want  # each live key in exactly one split
    assert {row["id"]: row for row in parts} == {row["id"]: row for row in scanned} == {k: m for k, m in model.items() if keep(m)}


def test_to_batches_streams_bounded_batches_of_the_merged_view(table_uri):
    t, model = _table_with_sstables(table_uri)
    with t:
        r = readers.open(table_uri, config=ReadConfig(scan_batch_rows=100))
        stream = r.to_batches(columns=["name", "score"], where="score > 500")
        assert stream.schema.names == ["name", "score"]
        batches = list(stream)
        assert batches and all(b.num_rows <= 100 for b in batches)
        got = sorted((row["name"], row["score"]) for b in batches for row in b.to_pylist())
        assert got == sorted((m["name"], m["score"]) for m in model.values() if m["score"] > 500)
        assert r.count("score > 500") == len(got)
        assert sorted(row["id"] for row in r.scan(columns=["id"]).to_pylist()) == sorted(model)


def test_a_limited_scan_stops_at_the_newest_sstable(table_uri, monkeypatch):
    """A limit met inside the newest SSTable reads no other level: none of the older SSTables
    and not the base."""
    t, model = _table_with_sstables(table_uri, flushes=6)
    with t:
        r = readers.open(table_uri)
        assert r.snapshot.num_live_sstables >= 6
        opened = []
        for name in ("rows", "read"):
            real = getattr(SSTableCache, name)
            monkeypatch.setattr(SSTableCache, name, lambda self, path, *a, _real=real, **k: opened.append(path) or _real(self, path, *a, **k))
        base_scans = []
        ds = r.snapshot.dataset
        real_scanner = ds.scanner
        monkeypatch.setattr(ds, "scanner", lambda *a, **k: base_scans.append(k) or real_scanner(*a, **k))
        got = r.scan(limit=5).to_pylist()
        assert len(got) == 5 and all(model[row["id"]] == row for row in got)
        assert len(set(opened)) == 1 and not base_scans, (opened, base_scans)


@pytest.fixture()
def fresh_view(table_uri):
    t, model = _table_with_sstables(table_uri)
    with t:
        t.write(pa.table({"id": [5000], "name": ["unflushed"], "score": [1.0]}, schema=SCHEMA))  # in the WAL tail only
        yield readers.open(table_uri, consistency="strong"), model | {5000: {"id": 5000, "name": "unflushed", "score": 1.0}}


def _rows(table: pa.Table) -> list[tuple]:
    return sorted((r["id"], r["name"], r["score"]) for r in table.to_pylist())


def test_duckdb_reads_the_fresh_view(fresh_view):
    r, model = fresh_view
    want = _rows(r.scan())
    assert want == sorted((m["id"], m["name"], m["score"]) for m in model.values())
    assert _rows(duckdb.sql("SELECT * FROM r").arrow().read_all()) == want  # the reader itself: an Arrow C stream
    view = r.to_arrow()  # noqa: F841 - DuckDB's replacement scan finds it by its name
    assert duckdb.sql("SELECT count(*), sum(score) FROM view").fetchall()[0] == (len(want), sum(s for _, _, s in want))
    top = duckdb.sql("SELECT id FROM r WHERE name LIKE 'f4-%' ORDER BY score DESC LIMIT 3").fetchall()
    assert [i for (i,) in top] == [i for i, _, _ in sorted((x for x in want if x[1].startswith("f4-")), key=lambda x: -x[2])[:3]]


def test_polars_reads_the_fresh_view(fresh_view):
    r, _ = fresh_view
    want = _rows(r.scan())
    assert _rows(pl.from_arrow(r.to_arrow()).to_arrow()) == want
    assert _rows(pl.DataFrame(r).to_arrow()) == want  # through the C stream
    agg = pl.from_arrow(r.to_arrow(columns=["score"], where="score > 100")).select(pl.col("score").sum()).item()
    assert agg == pytest.approx(sum(s for _, _, s in want if s > 100))


def test_datafusion_reads_the_fresh_view(fresh_view):
    r, _ = fresh_view
    ctx = datafusion.SessionContext()
    df = ctx.from_arrow(r)
    assert _rows(df.to_arrow_table()) == _rows(r.scan())


def test_each_engine_query_reads_a_new_stream_of_the_latest_snapshot(table_uri):
    """A reader handed to an engine is a source, not a copy: every query reads the view as it
    is then (a new stream per call)."""
    with Table.create(table_uri, SCHEMA, ["id"], "unsharded") as t:
        r = readers.open(table_uri, refresh_interval_ms=0)  # noqa: F841 - DuckDB finds it by its name
        assert duckdb.sql("SELECT count(*) FROM r").fetchall()[0] == (0,)
        t.write(pa.table({"id": np.arange(3), "name": ["a", "b", "c"], "score": [1.0, 2.0, 3.0]}, schema=SCHEMA))
        t.flush()
        assert duckdb.sql("SELECT count(*) FROM r").fetchall()[0] == (3,)
