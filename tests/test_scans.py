"""Streamed scans: the merged view level by level against the LSM model, bounded batches, a
limit that stops reading, and the fresh view read by other engines (DuckDB, Polars,
DataFusion) through the Arrow C stream."""

from __future__ import annotations

import datafusion
import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memwal import Table, WriterConfig, readers
from memwal.lsm import newest_per_key
from memwal.readers import ReadConfig
from memwal.readers.sstables import KeySet, SSTableCache
from memwal.readers.stream import Level, MergedScan, take
from memwal.schema import TOMBSTONE

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64())])


def _level(keys: list[int], key_type: pa.DataType, tombstones: list[bool], tag: str) -> Level:
    """An SSTable of ``keys`` as Lance leaves one: its live rows, the newest of each key."""
    rows = pa.table({"k": pa.array(keys, key_type), "v": pa.array([f"{tag}{i}" for i in range(len(keys))], pa.string()),
                     TOMBSTONE: pa.array(tombstones, pa.bool_())})
    rows = newest_per_key(rows, ["k"])
    return Level(tag, lambda: (KeySet.of(rows, ["k"]), rows))


@settings(max_examples=150, deadline=None)
@given(
    shards=st.lists(st.lists(st.lists(st.tuples(st.integers(0, 40), st.booleans()), max_size=12), max_size=4), min_size=1, max_size=3),
    base_keys=st.lists(st.integers(-5, 45), max_size=40, unique=True),
    tail=st.one_of(st.none(), st.lists(st.tuples(st.integers(0, 40), st.booleans()), max_size=8)),
    key_type=st.sampled_from([pa.int64(), pa.int16(), pa.string()]),
    batch_rows=st.integers(1, 7),
    ahead=st.integers(1, 3),
)
def test_a_streamed_scan_keeps_the_rows_the_lsm_merge_keeps(shards, base_keys, tail, key_type, batch_rows, ahead):
    """Levels newest first, each minus the keys of newer ones: exactly the newest live row of
    each key over base, SSTables (oldest first per shard) and WAL tail, whatever the batch
    size and read-ahead. Shards own disjoint keys: a shard's keys are made its own."""
    cast = str if key_type == pa.string() else int
    levels, model_parts = [], []
    base = pa.table({"k": pa.array([cast(k) for k in base_keys], key_type), "v": pa.array([f"b{k}" for k in base_keys], pa.string()),
                     TOMBSTONE: pa.array([False] * len(base_keys), pa.bool_())})
    model_parts.append(base)
    for s, sstables in enumerate(shards):
        mine = []
        for g, entries in enumerate(sstables):  # oldest first
            keys = [cast(k * len(shards) + s) for k, _ in entries]  # disjoint across shards
            tag = f"s{s}g{g}-"
            level = _level(keys, key_type, [t for _, t in entries], tag)
            model_parts.append(level.read()[1])
            mine.append(level)
        levels.append(list(reversed(mine)))  # newest first
    tail_table = None
    if tail is not None:
        tail_table = newest_per_key(pa.table({"k": pa.array([cast(k) for k, _ in tail], key_type),
                                              "v": pa.array([f"t{i}" for i in range(len(tail))], pa.string()),
                                              TOMBSTONE: pa.array([t for _, t in tail], pa.bool_())}), ["k"])
        model_parts.append(tail_table)
    everything = newest_per_key(pa.concat_tables(model_parts), ["k"])
    expected = sorted(r["v"] for r in everything.to_pylist() if not r[TOMBSTONE])

    schema = pa.schema([("k", key_type), ("v", pa.string())])
    scan = MergedScan(levels, lambda: pa.RecordBatchReader.from_batches(schema, base.select(["k", "v"]).to_batches(max_chunksize=3)),
                      tail_table, ["k", "v"], ["k"], schema, None, batch_rows, ahead)
    batches = list(scan)
    assert all(0 < b.num_rows <= max(batch_rows, 3) for b in batches)
    got = sorted(v for b in batches for v in b.column("v").to_pylist())
    assert got == expected
    limited = list(take(iter(MergedScan(levels, lambda: pa.RecordBatchReader.from_batches(schema, base.select(["k", "v"]).to_batches()),
                                        tail_table, ["k", "v"], ["k"], schema, None, batch_rows, ahead)), 3))
    assert sum(b.num_rows for b in limited) == min(3, len(expected))


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
