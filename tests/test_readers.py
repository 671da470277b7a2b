"""The read API against a model: a differential stateful test and cross-process strong reads."""

from __future__ import annotations

import gc
import math
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from decimal import Decimal

import lance
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from helpers import examples
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from memwal import IndexConfig, readers, Table, WriterConfig
from memwal.core import paths
from memwal.core.errors import InvalidArgumentError
from memwal.maintain.compactor import Compactor
from memwal.core.state import TableState
from memwal.core.indexes import IndexMaintainer
from memwal.readers.bm25 import CorpusStats, score, tokenize
from memwal.readers import reader as reader_module
from memwal.readers.sstables import KeySet, MergedKeys
from memwal.core.schema import TOMBSTONE

WORDS = ["lance", "spark", "kafka", "arrow", "shard", "merge", "delta", "vector"]
CATS = ["a", "b", "c"]
SCHEMA = pa.schema([("id", pa.int64()), ("cat", pa.string()), ("body", pa.string()), ("vec", pa.list_(pa.float32(), 4))])
KEYS = st.lists(st.integers(0, 30), min_size=1, max_size=8)


def brute_knn(model: dict[int, dict], q: np.ndarray, k: int) -> list[float]:
    d = sorted(float(np.sum((np.asarray(r["vec"], np.float32) - q) ** 2)) for r in model.values())
    return d[:k]


def brute_bm25(model: dict[int, dict], query: str, k: int) -> dict[int, float]:
    stats = CorpusStats.of(r["body"] for r in model.values())
    terms = tokenize(query)
    scored = {i: score(terms, tokenize(r["body"]), stats) for i, r in model.items() if set(terms) & set(tokenize(r["body"]))}
    return scored


class ReadMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="memwal-readers-")
        self.uri = f"{self.dir}/t"
        self.table = Table.create(
            self.uri, SCHEMA, ["id"], "bucket(id, 2)",
            writer=WriterConfig(max_memtable_rows=100_000), indexes=IndexConfig(fts_column="body"),
        )
        self.compactor = Compactor(TableState.load(self.uri))
        self.strong = readers.open(self.uri, consistency="strong")
        # point lookups of the base by row id from a key map, built at a version's first lookup
        self.mapped = readers.open(self.uri, consistency="strong", config=readers.ReadConfig(lookup_key_map_after=1))
        self.model: dict[int, dict] = {}
        self.flushed = True
        self.indexed = False
        self.step = 0

    @rule(keys=KEYS, seed=st.integers(0, 2**16))
    def upsert(self, keys, seed):
        rng = np.random.default_rng(seed)
        rows = []
        for k in keys:
            self.step += 1
            rows.append({
                "id": k,
                "cat": CATS[int(rng.integers(3))],
                "body": " ".join(rng.choice(WORDS, int(rng.integers(1, 6)))),
                # small integers: exact in float32, so distances compare exactly
                "vec": [float(x) for x in rng.integers(0, 8, 4)],
            })
        self.table.write(pa.Table.from_pylist(rows, schema=SCHEMA))
        for r in rows:
            self.model[r["id"]] = r
        self.flushed = False

    @rule(keys=KEYS)
    def delete(self, keys):
        self.table.delete({"id": keys})
        for k in keys:
            self.model.pop(k, None)
        self.flushed = False

    @rule()
    def flush(self):
        self.table.flush()
        self.flushed = True

    @rule()
    def compact(self):
        self.compactor.state.manifests.clear_cache()
        self.compactor.run_once()

    @precondition(lambda self: not self.indexed)
    @rule()
    def build_vector_index(self):
        ds = lance.dataset(self.uri)
        if ds.count_rows() >= 8:
            # IVF_FLAT: PQ cannot train a codebook on a few rows (see the IVF_PQ test below)
            ds.create_index("vec", "IVF_FLAT", num_partitions=2)
            self.indexed = True

    @rule()
    def catch_up_indexes(self):
        IndexMaintainer(self.compactor.state).catch_up()

    @invariant()
    def scans_and_lookups(self):
        r = self.strong
        assert {row["id"]: row for row in r.scan().to_pylist()} == self.model
        assert r.count() == len(self.model)
        want = {i for i, row in self.model.items() if row["cat"] == "a" and i > 5}
        assert {row["id"] for row in r.scan(columns=["id"], where="cat = 'a' AND id > 5").to_pylist()} == want
        assert r.count("cat = 'a' AND id > 5") == len(want)
        pinned = [1, 2, 17, 29]
        assert {row["id"] for row in r.scan(where=f"id IN ({', '.join(map(str, pinned))})").to_pylist()} == set(pinned) & set(self.model)
        limited = r.scan(columns=["id", "cat"], where="id < 20", limit=3).to_pylist()
        assert len(limited) == min(3, sum(1 for i in self.model if i < 20))
        assert all(self.model[row["id"]]["cat"] == row["cat"] for row in limited)
        for k in (0, 3, 11, 29):
            assert r.get(k) == self.model.get(k)
        for k in range(-1, 32):
            assert self.mapped.get(k) == self.model.get(k)
        got = r.get_many(range(0, 31), columns=["id", "body"]).to_pylist()
        assert {row["id"]: row["body"] for row in got} == {i: row["body"] for i, row in self.model.items()}
        got = r.get_many([*range(40), *range(31)], columns=["body", "id"]).to_pylist()  # > 32 keys, some twice
        assert sorted(row["id"] for row in got) == sorted(self.model)
        assert {row["id"]: row["body"] for row in got} == {i: row["body"] for i, row in self.model.items()}
        if self.flushed:
            eventual = readers.open(self.uri, refresh_interval_ms=0)
            assert {row["id"]: row for row in eventual.scan().to_pylist()} == self.model

    @invariant()
    def vector_search_equals_brute_force(self):
        q = np.array([3.0, 1.0, 4.0, 1.0], np.float32)
        found = self.strong.search(q, k=5, nprobes=2)  # 2 partitions: all of them
        expect = brute_knn(self.model, q, 5)
        assert [round(float(d), 4) for d in found.column("_distance").to_pylist()] == [round(d, 4) for d in expect]
        for row in found.to_pylist():  # only the newest version of a row may appear
            live = self.model[row["id"]]
            assert row["vec"] == live["vec"]
            assert math.isclose(row["_distance"], float(np.sum((np.asarray(live["vec"]) - q) ** 2)), abs_tol=1e-4)

    @invariant()
    def text_search_equals_brute_force_bm25(self):
        for query in ("kafka spark", "vector"):
            found = self.strong.text_search(query, k=6, column="body").to_pylist()
            expect = brute_bm25(self.model, query, 6)
            top = sorted(expect.values(), reverse=True)[:6]
            assert [round(r["_score"], 6) for r in found] == [round(s, 6) for s in top]
            for row in found:
                assert math.isclose(row["_score"], expect[row["id"]], rel_tol=1e-9)
                assert row["body"] == self.model[row["id"]]["body"]

    def teardown(self) -> None:
        self.table.close()
        shutil.rmtree(self.dir, ignore_errors=True)


ReadMachine.TestCase.settings = settings(max_examples=examples(25), stateful_step_count=25, deadline=None)
TestReadsEqualTheModel = ReadMachine.TestCase


# -- cross-process, composite keys, time travel, pruning ------------------------------------------


def test_strong_reader_in_another_process_sees_an_acknowledged_write(table_uri):
    t = Table.create(table_uri, SCHEMA, ["id"], "bucket(id, 2)")
    t.write(pa.Table.from_pylist([{"id": 1, "cat": "a", "body": "first", "vec": [0.0] * 4}], schema=SCHEMA))
    t.flush()
    t.write(pa.Table.from_pylist([{"id": 1, "cat": "b", "body": "second", "vec": [1.0] * 4}], schema=SCHEMA))
    t.delete({"id": [7]})
    t.write(pa.Table.from_pylist([{"id": 2, "cat": "c", "body": "new", "vec": [2.0] * 4}], schema=SCHEMA))
    # acknowledged (in the WAL), not flushed: only this process's MemTable has it
    code = (
        "import sys, json; from memwal import readers\n"
        "s = readers.open(sys.argv[1], consistency='strong'); e = readers.open(sys.argv[1])\n"
        "print(json.dumps([s.get(1)['body'], s.get(2)['body'], e.get(1)['body'], e.get(2), s.count()]))"
    )
    out = subprocess.run([sys.executable, "-c", code, table_uri], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == '["second", "new", "first", null, 2]'
    t.close()


def test_vector_search_with_ivf_pq_equals_brute_force(table_uri):
    rng = np.random.default_rng(7)
    n = 3000

    def rows(ids):
        return pa.table(
            {"id": pa.array(ids, pa.int64()), "cat": ["a"] * len(ids), "body": ["x"] * len(ids),
             "vec": pa.FixedSizeListArray.from_arrays(pa.array(rng.random(len(ids) * 4, dtype=np.float32)), 4)},
        )

    base = rows(list(range(n)))
    t = Table.create(table_uri, SCHEMA, ["id"], "bucket(id, 2)", initial_data=base)
    lance.dataset(table_uri).create_index("vec", "IVF_PQ", num_partitions=4, num_sub_vectors=2)
    model = {r["id"]: r for r in base.to_pylist()}
    newer = rows(list(range(0, 400, 2)))  # overwrite half of the first 400 in SSTables
    t.write(newer)
    t.delete({"id": list(range(1, 400, 4))})
    t.flush()
    model.update({r["id"]: r for r in newer.to_pylist()})
    for i in range(1, 400, 4):
        model.pop(i)
    unflushed = rows([5, 7])  # the writer stays open: these are in the WAL tail only
    t.write(unflushed)
    model.update({r["id"]: r for r in unflushed.to_pylist()})
    r = readers.open(table_uri, consistency="strong")
    assert {row["id"]: row for row in r.scan().to_pylist()} == model
    for q in rng.random((5, 4), dtype=np.float32):
        found = r.search(q, k=10, nprobes=4)
        assert [round(d, 4) for d in found.column("_distance").to_pylist()] == [round(d, 4) for d in brute_knn(model, q, 10)]
        for row in found.to_pylist():
            assert row["vec"] == model[row["id"]]["vec"]
    t.close()


def test_strong_reads_see_each_shards_new_tail_and_a_new_base_version(table_uri):
    """A strong reader keeps what it built from each shard's WAL tail and from the base while
    they do not change: a write to one shard's tail, a flush, and a compaction (a new base
    version) are each seen by the next read, whatever was reused."""
    rng = np.random.default_rng(11)

    def rows(ids):
        return pa.table(
            {"id": pa.array(ids, pa.int64()), "cat": ["a"] * len(ids), "body": ["x"] * len(ids),
             "vec": pa.FixedSizeListArray.from_arrays(pa.array(rng.random(len(ids) * 4, dtype=np.float32)), 4)},
        )

    def apply(batch):
        t.write(batch)
        model.update({r["id"]: r for r in batch.to_pylist()})

    base = rows(list(range(200)))
    t = Table.create(table_uri, SCHEMA, ["id"], "bucket(id, 4)", initial_data=base)
    model = {r["id"]: r for r in base.to_pylist()}
    apply(rows(list(range(150, 260))))  # updates and new keys in every shard's tail
    r = readers.open(table_uri, consistency="strong")

    def check():
        assert {row["id"]: row for row in r.scan().to_pylist()} == model
        for q in rng.random((3, 4), dtype=np.float32):
            found = r.search(q, k=10)
            assert [round(d, 4) for d in found.column("_distance").to_pylist()] == [round(d, 4) for d in brute_knn(model, q, 10)]
            for row in found.to_pylist():
                assert row["vec"] == model[row["id"]]["vec"]

    check()
    check()  # the same tails and base: reused
    for i in (3, 7, 255):  # one key at a time: one shard's tail changes
        apply(rows([i]))
        check()
    t.flush()
    check()
    version = lance.dataset(table_uri).version
    Compactor(t.state).run_once()
    assert lance.dataset(table_uri).version > version
    check()
    assert r._view()[0].base_version == lance.dataset(table_uri).version  # the new base, not the one reused before
    apply(rows([1, 2]))
    t.delete({"id": [4]})
    model.pop(4)
    check()
    t.close()


def test_vector_search_while_the_index_lags_behind_compaction(table_uri):
    """Rows compacted since the index last caught up are in base fragments it does not cover:
    Lance searches those exactly, beside the index."""
    rng = np.random.default_rng(3)

    def rows(ids):
        return pa.table(
            {"id": pa.array(ids, pa.int64()), "cat": ["a"] * len(ids), "body": ["x"] * len(ids),
             "vec": pa.FixedSizeListArray.from_arrays(pa.array(rng.integers(0, 16, len(ids) * 4).astype(np.float32)), 4)},
        )

    base = rows(list(range(1000)))
    t = Table.create(table_uri, SCHEMA, ["id"], "bucket(id, 2)", initial_data=base)
    lance.dataset(table_uri).create_index("vec", "IVF_FLAT", num_partitions=4)
    model = {r["id"]: r for r in base.to_pylist()}
    for g in range(4):  # compacted generations the index does not cover
        batch = rows(list(range(g * 100, g * 100 + 150)))
        t.write(batch)
        t.delete({"id": [g * 100 + 7]})
        t.flush()
        model.update({r["id"]: r for r in batch.to_pylist()})
        model.pop(g * 100 + 7)
        if g < 3:
            Compactor(t.state).run_once()
    r = readers.open(table_uri)
    assert lance.dataset(table_uri).stats.index_stats("vec_idx")["num_unindexed_rows"] > 0
    for q in rng.integers(0, 16, (5, 4)).astype(np.float32):
        found = r.search(q, k=8, nprobes=4)
        assert [round(d, 4) for d in found.column("_distance").to_pylist()] == [round(d, 4) for d in brute_knn(model, q, 8)]
        assert all(row["vec"] == model[row["id"]]["vec"] for row in found.to_pylist())
    t.close()


def test_vector_search_filters_small_sstables_on_columns_it_does_not_return(table_uri):
    """Small SSTables are scored exactly; ``where`` may name a column the search does not
    return, and a key whose newest version (in an SSTable) fails ``where`` is not found
    through an older version that matches it."""
    rng = np.random.default_rng(5)

    def rows(ids, cat):
        return pa.table({"id": pa.array(ids, pa.int64()), "cat": [cat] * len(ids), "body": ["x"] * len(ids),
                         "vec": pa.FixedSizeListArray.from_arrays(pa.array(rng.integers(0, 16, len(ids) * 4).astype(np.float32)), 4)})

    base = rows(list(range(300)), "a")
    with Table.create(table_uri, SCHEMA, ["id"], "bucket(id, 2)", initial_data=base) as t:
        lance.dataset(table_uri).create_index("vec", "IVF_FLAT", num_partitions=2)
        newer = rows(list(range(0, 300, 3)), "b")  # a third of the keys move to cat b
        t.write(newer)
        t.flush()
        model = {r["id"]: r for r in base.to_pylist()} | {r["id"]: r for r in newer.to_pylist()}
        wanted = {i: r for i, r in model.items() if r["cat"] == "a"}
        r = readers.open(table_uri)
        assert r.snapshot.num_live_sstables > 0
        for q in rng.integers(0, 16, (4, 4)).astype(np.float32):
            found = r.search(q, k=8, nprobes=2, where="cat = 'a'", columns=["id"])
            assert found.column_names == ["id", "_distance"]
            assert all(model[i]["cat"] == "a" for i in found.column("id").to_pylist())
            assert [round(d, 4) for d in found.column("_distance").to_pylist()] == [round(d, 4) for d in brute_knn(wanted, q, 8)]


def test_composite_keys_point_lookups(table_uri):
    schema = pa.schema([("tenant", pa.string()), ("id", pa.int32()), ("v", pa.int64())])
    with Table.create(table_uri, schema, ["tenant", "id"], "identity(tenant)") as t:
        t.write({"tenant": ["x", "y", "x", "z"], "id": [1, 1, 2, 3], "v": [10, 20, 30, 40]})
        t.flush()
        t.write({"tenant": ["x"], "id": [1], "v": [11]})
        t.delete({"tenant": ["z"], "id": [3]})
    for consistency in ("eventual", "strong"):
        r = readers.open(table_uri, consistency=consistency)
        assert r.get(("x", 1))["v"] == 11
        assert r.get({"tenant": "y", "id": 1})["v"] == 20
        assert r.get(("z", 3)) is None
        many = r.get_many([("x", 1), ("x", 2), ("z", 3), ("q", 9)])
        assert sorted(many.column("v").to_pylist()) == [11, 30]
        keys = [("x", i) for i in range(40)]  # above the point-lookup batch: a filtered scan
        assert sorted(r.get_many(keys).column("v").to_pylist()) == [11, 30]


def test_time_travel_reads_a_base_version(table_uri):
    t = Table.create(table_uri, SCHEMA, ["id"], "unsharded")
    rows = lambda ids, body: pa.Table.from_pylist([{"id": i, "cat": "a", "body": body, "vec": [0.0] * 4} for i in ids], schema=SCHEMA)  # noqa: E731
    t.write(rows(range(5), "v1"))
    t.flush()
    Compactor(t.state).run_once()
    v1 = t.dataset().version
    t.write(rows(range(3), "v2"))
    t.delete({"id": [4]})
    t.flush()
    Compactor(t.state).run_once()
    past = readers.open(table_uri, version=v1)
    assert {r["id"]: r["body"] for r in past.scan().to_pylist()} == {i: "v1" for i in range(5)}
    assert past.get(4)["body"] == "v1" and past.count() == 5
    now = readers.open(table_uri)
    assert {r["id"]: r["body"] for r in now.scan().to_pylist()} == {0: "v2", 1: "v2", 2: "v2", 3: "v1"}
    with pytest.raises(ValueError, match="time travel"):
        readers.open(table_uri, version=v1, consistency="strong")


def test_shard_pruning_reads_only_matching_shards(table_uri):
    with Table.create(table_uri, SCHEMA, ["id"], "bucket(id, 8)") as t:
        t.write(pa.Table.from_pylist([{"id": i, "cat": "a", "body": "x", "vec": [0.0] * 4} for i in range(200)], schema=SCHEMA))
    r = readers.open(table_uri)
    plan = r.plan("id IN (3, 4) AND cat = 'a'")
    shards = {Table.open(table_uri).shard_of_key({"id": i}) for i in (3, 4)}
    assert set(plan.shards) == shards and len(plan.pruned_shards) == 8 - len(shards)
    assert "pinned to 2 value(s)" in r.plan("id IN (3, 4) AND cat = 'a'").pruning
    assert len(r.plan("id > 3").shards) == 8  # a range cannot be pruned
    assert len(r.plan("id = 3 OR cat = 'b'").shards) == 8  # nor an OR with an open side
    assert sorted(x["id"] for x in r.scan(where="id IN (3, 4) AND cat = 'a'").to_pylist()) == [3, 4]


@pytest.mark.parametrize("stable_row_ids", [False, True])
@pytest.mark.parametrize("indexed", [True, False])
def test_base_point_read_returns_exactly_the_live_rows(tmp_path, stable_row_ids, indexed):
    """Point reads of the base skip Lance's deletion mask and drop deleted versions
    themselves: for every key, the same rows as Lance's own live read, on a base whose keys
    were updated (old versions deleted in place) and deleted, with and without stable row
    ids and the primary-key index."""
    from memwal.readers.points import base_point_read

    uri = str(tmp_path / "b")
    n = 2_000
    ds = lance.write_dataset(pa.table({"id": np.arange(n), "v": np.zeros(n)}), uri, enable_stable_row_ids=stable_row_ids)
    if indexed:
        ds.create_scalar_index("id", "BTREE")
    rng = np.random.default_rng(7)
    for round_ in range(1, 4):
        ids = np.unique(rng.integers(0, n + 200, 300))
        ds = lance.dataset(uri)
        ds.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(
            pa.table({"id": ids, "v": np.full(len(ids), float(round_))}))
        lance.dataset(uri).delete(f"id % 97 = {round_}")
    ds = lance.dataset(uri)
    deleted = sum(f.metadata.physical_rows - f.count_rows() for f in ds.get_fragments())
    assert deleted > 0  # the base holds deleted versions the read must drop
    for key in range(0, n + 200, 7):
        want = ds.to_table(columns=["id", "v"], filter=f"id = {key}")
        assert base_point_read(ds, ["id", "v"], f"id = {key}").to_pylist() == want.to_pylist()


def test_point_reads_of_the_base_use_lances_native_scanner_and_equal_to_table(tmp_path):
    """memwal's point reads call Lance's native scanner with options built once; they return
    what ``to_table`` returns, with and without deleted rows in the base. If a pylance
    upgrade changes the native signature, the reads fall back to ``to_table`` and this test
    fails on ``native``, so the slowdown is seen."""
    from memwal.readers.points import base_point_read, point_lookup

    uri = str(tmp_path / "b")
    ds = lance.write_dataset(pa.table({"id": np.arange(500), "v": np.arange(500) * 2.0, "s": [f"r{i}" for i in range(500)]}), uri)
    ds.create_scalar_index("id", "BTREE")
    for deleted in (False, True):
        if deleted:
            lance.dataset(uri).delete("id % 7 = 0")
        ds = lance.dataset(uri)
        lookup = point_lookup(ds)
        for key in (0, 1, 7, 250, 499, 600):
            for columns in (["id", "v", "s"], ["s"]):
                want = ds.to_table(columns=columns, filter=f"id = {key}")
                assert base_point_read(lookup, columns, f"id = {key}").to_pylist() == want.to_pylist()
        assert lookup.native
        assert ("include_deleted_rows" in lookup.options) == deleted


def _refresh_threads(uri: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"memwal-refresh {uri}" and t.is_alive()]


def _wait_for(condition, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_a_background_refresh_publishes_new_snapshots_with_their_sstable_keys_loaded(table_uri, monkeypatch):
    """Lookups on a background-refreshed reader see later flushes without refreshing in the
    read: the refresh thread swaps in each new snapshot with every live SSTable's key set
    already loaded, and the rows match an inline reader's."""
    # However slow the thread is on a loaded machine, reads must not refresh themselves here.
    monkeypatch.setattr(reader_module, "BACKGROUND_STALE_INTERVALS", 10**9)
    rows = lambda ids, body: pa.Table.from_pylist([{"id": i, "cat": "a", "body": body, "vec": [0.0] * 4} for i in ids], schema=SCHEMA)  # noqa: E731
    with Table.create(table_uri, SCHEMA, ["id"], "bucket(id, 2)") as t:
        t.write(rows(range(10), "v1"))
        t.flush()
        Compactor(t.state).run_once()
        with readers.open(table_uri, refresh_interval_ms=100, refresh_in_background=True) as r:
            first = r._snapshot
            inline_refreshes = []
            refresh = r.refresh
            r.refresh = lambda: inline_refreshes.append(1) or refresh()  # counts, then refreshes
            assert r.get(3)["body"] == "v1"  # from the base: it makes r a lookup reader, warmed ahead
            t.write(rows(range(5, 15), "v2"))
            t.flush()
            inline = readers.open(table_uri)
            flushed = set(inline.snapshot.sstable_paths())
            assert flushed
            # No read of r happens meanwhile: only its thread can take the new snapshot.
            _wait_for(lambda: set(r._snapshot.sstable_paths()) == flushed, "a snapshot with every flushed SSTable")
            snap = r._snapshot
            assert snap is not first
            for shard in snap.shards:
                for sst in shard.live_sstables:
                    path = paths.sstable_path(snap.dataset.uri, shard.shard_id, sst.path)
                    assert ("keys", path) in r.sstables._lru, "published before its SSTable keys were loaded"
            for i in range(16):
                assert r.get(i) == inline.get(i)
            assert r.get(12)["body"] == "v2" and r.get(2)["body"] == "v1" and r.get(15) is None
            Compactor(t.state).run_once()  # a new base version, and the SSTables retire
            _wait_for(lambda: r._snapshot.base_version > snap.base_version, "the compacted base version")
            assert {x["id"]: x["body"] for x in r.scan().to_pylist()} == {i: ("v1" if i < 5 else "v2") for i in range(15)}
            assert inline_refreshes == [], "a read refreshed the snapshot itself"


def test_a_background_refresh_ends_with_close_or_with_its_reader(table_uri):
    t = Table.create(table_uri, SCHEMA, ["id"], "bucket(id, 2)")
    closed = readers.open(table_uri, refresh_interval_ms=50, refresh_in_background=True)
    uri = closed.state.uri
    assert len(_refresh_threads(uri)) == 1
    closed.close()
    assert not _refresh_threads(uri), "close() returned before its refresh thread ended"
    assert closed.get(1) is None
    t.write(pa.Table.from_pylist([{"id": 1, "cat": "a", "body": "x", "vec": [0.0] * 4}], schema=SCHEMA))
    t.flush()
    t.close()
    _wait_for(lambda: closed.get(1) is not None, "a closed reader to refresh in its reads")
    r = readers.open(table_uri, refresh_interval_ms=50, refresh_in_background=True)
    assert len(_refresh_threads(uri)) == 1
    del r
    gc.collect()
    _wait_for(lambda: not _refresh_threads(uri), "the refresh thread of a collected reader to end")


@pytest.mark.parametrize("kwargs", [{"consistency": "strong"}, {"version": 1}, {"refresh_interval_ms": None}])
def test_a_background_refresh_needs_an_eventual_reader_of_the_latest_version(table_uri, kwargs):
    Table.create(table_uri, SCHEMA, ["id"], "bucket(id, 2)").close()
    with pytest.raises(InvalidArgumentError):
        readers.open(table_uri, refresh_in_background=True, **kwargs)


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(st.tuples(st.integers(-(2**63), 2**63 - 1), st.booleans()), max_size=40),
    probes=st.lists(st.integers(-(2**70), 2**70), max_size=10),
    key_type=st.sampled_from([pa.int64(), pa.int32(), pa.uint64(), pa.string()]),
)
def test_an_sstable_key_set_answers_as_a_dict_of_its_rows_would(rows, probes, key_type):
    """Integer key sets are sorted arrays, other keys a dict; both say what a dict built
    from the rows in order says (the later row of a repeated key wins, with its position),
    absent keys included."""
    lo, hi = {pa.int64(): (-(2**63), 2**63 - 1), pa.int32(): (-(2**31), 2**31 - 1), pa.uint64(): (0, 2**64 - 1)}.get(key_type, (None, None))
    cast = (lambda k: str(k)) if key_type == pa.string() else (lambda k: k)  # noqa: E731
    rows = [(cast(k), t) for k, t in rows if lo is None or lo <= k <= hi]
    table = pa.table({"id": pa.array([k for k, _ in rows], key_type), TOMBSTONE: pa.array([t for _, t in rows], pa.bool_())})
    keys = KeySet.of(table, ["id"])
    expected = dict(rows)
    position = {k: i for i, (k, _) in enumerate(rows)}
    for k in [*expected, *(cast(p) for p in probes)]:
        assert keys.tombstone(k) == expected.get(k)
        assert keys.find(k) == ((expected[k], position[k]) if k in expected else None)


@settings(max_examples=200, deadline=None)
@given(
    levels=st.lists(st.lists(st.tuples(st.integers(-5, 20), st.booleans()), max_size=12), min_size=1, max_size=7),
    probes=st.lists(st.integers(-8, 24), max_size=10),
)
def test_a_merged_key_set_answers_as_walking_the_sstables_newest_first(levels, probes):
    """A shard's integer key sets merged into one find, for every key, what walking them
    newest first finds: the newest SSTable holding the key, its tombstone flag and position."""
    sets = [KeySet.of(pa.table({"id": pa.array([k for k, _ in rows], pa.int64()), TOMBSTONE: pa.array([t for _, t in rows], pa.bool_())}), ["id"])
            for rows in levels]
    merged = MergedKeys.of(sets)
    for k in [*(k for rows in levels for k, _ in rows), *probes]:
        walked = next(((i, *hit) for i, ks in enumerate(sets) if (hit := ks.find(k)) is not None), None)
        assert merged.find(k) == walked


def test_a_late_background_refresh_never_replaces_a_newer_snapshot(table_uri):
    """A refresh that started before another but finishes after it (the thread's, slow
    while a read refreshed itself) must not take the reader back to the older state."""
    rows = lambda body: pa.Table.from_pylist([{"id": 7, "cat": "a", "body": body, "vec": [0.0] * 4}], schema=SCHEMA)  # noqa: E731
    with Table.create(table_uri, SCHEMA, ["id"], "bucket(id, 2)") as t:
        t.write(rows("v1"))
        t.flush()
        with readers.open(table_uri, refresh_interval_ms=3_600_000, refresh_in_background=True) as r:
            started, older = time.monotonic(), r.state.snapshot()  # what the slow refresh took
            t.write(rows("v2"))
            t.flush()
            r.refresh()
            assert r.get(7)["body"] == "v2"
            assert r._publish(older, started) is not older  # ... publishing when it finishes
            assert r.get(7)["body"] == "v2"


ANY_VALUE = st.one_of(st.none(), st.integers(-(2**65), 2**65), st.text(max_size=5), st.binary(max_size=5),
                      st.floats(allow_nan=False), st.datetimes(), st.booleans())
KEY_TYPES = {
    pa.int32(): st.integers(-(2**31), 2**31 - 1),
    pa.uint64(): st.integers(0, 2**64 - 1),
    pa.string(): st.text(max_size=5),
    pa.binary(): st.binary(max_size=5),
    pa.bool_(): st.booleans(),
}


@pytest.mark.parametrize("key_type", list(KEY_TYPES), ids=str)
def test_a_point_lookup_types_its_key_as_a_batch_of_keys_does(key_type):
    """``get`` types one key without building a table; what it accepts, and how it types it,
    must be what ``get_many``'s ``keys_table`` does, or a lookup would miss a row a batch
    finds. Values of the column's own type and of any other type, on a composite key."""
    from memwal.core.errors import PrimaryKeyError
    from memwal.readers.keys import keys_table, typed_key

    schema = pa.schema([("k", key_type), ("n", pa.int64())])

    @given(k=st.one_of(KEY_TYPES[key_type], ANY_VALUE), n=st.integers(-(2**63), 2**63 - 1))
    def check(k, n):
        try:
            batch = keys_table([(k, n)], schema.names, schema).to_pylist()[0]
        except PrimaryKeyError:
            with pytest.raises(PrimaryKeyError):
                typed_key((k, n), schema.names, schema)
            return
        got = typed_key((k, n), schema.names, schema)
        assert got == batch

    check()



def test_get_many_reads_every_level_the_same_way_cold_warm_and_from_the_concatenated_sstables(table_uri):
    """A lookup of many keys searches all SSTables' keys at once, and takes the rows from Lance
    (a cache too small for them) or from the SSTables' rows cached and concatenated: either way
    the model's rows (newest version per key, deletes gone)."""
    schema = pa.schema([("id", pa.int64()), ("v", pa.string()), ("d", pa.decimal128(12, 2))])
    model: dict[int, dict] = {}
    with Table.create(table_uri, schema, ["id"], "bucket(id, 2)") as t:
        t.write(pa.Table.from_pylist([{"id": i, "v": f"base{i}", "d": Decimal(i)} for i in range(200)], schema=schema))
        t.flush()
        Compactor(t.state).run_once()
        model.update({i: {"id": i, "v": f"base{i}", "d": Decimal(i)} for i in range(200)})
        for gen in range(6):  # SSTables updating, adding and deleting keys, newest wins
            rows = [{"id": i, "v": f"g{gen}-{i}", "d": Decimal(gen * 1000 + i)} for i in range(gen * 17, 240, 7 + gen)]
            t.write(pa.Table.from_pylist(rows, schema=schema))
            gone = list(range(gen * 5, 240, 31))
            t.delete({"id": gone})
            t.flush()
            model.update({r["id"]: r for r in rows})
            for k in gone:
                model.pop(k, None)
    from memwal.readers.reader import Reader

    keys = list(range(0, 250))
    # A cache too small to hold any SSTable's rows: every lookup takes its rows from Lance.
    for r, concatenated in ((Reader(TableState.load(table_uri), cache_bytes=16 << 10), False),
                            (readers.open(table_uri, refresh_interval_ms=None), True)):
        for _ in range(3):
            got = {row["id"]: row for row in r.get_many(keys).to_pylist()}
            assert got == model
        assert (r._points._delta is not None) == concatenated


@pytest.mark.parametrize("max_rows", [4_000_000, 100])
def test_point_lookups_by_row_id_see_each_base_version_as_the_model(table_uri, max_rows):
    """A base version's key map (its keys with their row ids) answers lookups as the index
    does: rows updated and deleted by compaction (deletion vectors in the base), keys never
    written, and a new version after the next compaction; a base above
    ``lookup_key_map_max_rows`` is read through its index, with the same answers."""
    schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64())])
    base = pa.table({"id": range(0, 400, 2), "name": [f"b{i}" for i in range(0, 400, 2)], "score": [float(i) for i in range(0, 400, 2)]},
                    schema=schema)
    model = {r["id"]: r for r in base.to_pylist()}
    config = readers.ReadConfig(lookup_key_map_after=1, lookup_key_map_max_rows=max_rows)
    with Table.create(table_uri, schema, ["id"], "bucket(id, 2)", initial_data=base) as t:
        compactor = Compactor(TableState.load(table_uri))
        r = readers.open(table_uri, consistency="strong", config=config)
        for step in range(3):
            updated = [{"id": i, "name": f"u{step}-{i}", "score": float(step)} for i in range(step, 400, 7)]
            t.write(pa.Table.from_pylist(updated, schema=schema))
            gone = list(range(step * 3, 400, 11))
            t.delete({"id": gone})
            t.flush()
            compactor.run_once()
            model.update({u["id"]: u for u in updated})
            for k in gone:
                model.pop(k, None)
            assert [r.get(k) for k in range(-3, 403)] == [model.get(k) for k in range(-3, 403)]
            assert r.get(2**62) is None
            many = r.get_many([*range(-3, 403), 4, 6, 2**62]).to_pylist()  # some twice
            assert sorted(row["id"] for row in many) == sorted(model) and {row["id"]: row for row in many} == model
