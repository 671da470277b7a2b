"""Materialized views: always equal to their query from scratch at the base version they claim."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import lance
import pyarrow as pa
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from helpers import examples
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from memwal import Table, WriterConfig
from memwal.maintain.compactor import Compactor
from memwal.core.state import TableState
from memwal.core.failpoints import DIR_ENV, ENV
from memwal.views import View, ViewBusyError, ViewError, UdfColumn, list_views
from viewudfs import CALLS_FILE, calls

SCHEMA = pa.schema([("id", pa.int64()), ("region", pa.string()), ("name", pa.string()), ("score", pa.int64()), ("weight", pa.float64())])
REGIONS = ["eu", "us", "ap"]
LABEL = UdfColumn("label", "viewudfs:label", ("name", "s2"), "string", "1")


# -- oracles: the definitions below, evaluated from scratch in plain Python ----------------------


def rows_at(uri: str, version: int) -> list[dict]:
    return lance.dataset(uri, version=version).to_table().to_pylist()


def expected_rows(base: list[dict]) -> list[tuple]:
    """select name, score * 2 AS s2, label(name, s2) where score >= 10"""
    return sorted(
        (r["name"], r["score"] * 2, f"{r['name'].upper()}:{r['score'] * 2}") for r in base if r["score"] >= 10
    )


def expected_groups(base: list[dict]) -> dict:
    """select region, count(*), sum(score), min(score), max(weight), avg(weight) where score >= 0 group by region"""
    out: dict = {}
    for r in base:
        if r["score"] < 0:
            continue
        g = out.setdefault(r["region"], {"n": 0, "total": 0, "lo": None, "hi": None, "ws": 0.0, "wc": 0})
        g["n"] += 1
        g["total"] += r["score"]
        g["lo"] = r["score"] if g["lo"] is None else min(g["lo"], r["score"])
        if r["weight"] is not None:
            g["hi"] = r["weight"] if g["hi"] is None else max(g["hi"], r["weight"])
            g["ws"] += r["weight"]
            g["wc"] += 1
    return {k: (v["n"], v["total"], v["lo"], v["hi"], v["ws"] / v["wc"] if v["wc"] else None) for k, v in out.items()}


def create_views(uri: str) -> tuple[View, View]:
    rows = View.create(uri, "rows", select=["name", "score * 2 AS s2"], where="score >= 10", udfs=[LABEL], shuffle_seed=7)
    groups = View.create(
        uri, "groups",
        select=["region", "count(*) AS n", "sum(score) AS total", "min(score) AS lo", "max(weight) AS hi", "avg(weight) AS mean"],
        where="score >= 0", group_by=["region"],
    )
    return rows, groups


def check_rows_view(view: View) -> None:
    rec = view.last_refresh()
    got = sorted((r["name"], r["s2"], r["label"]) for r in view.to_table().to_pylist())
    assert got == expected_rows(rows_at(view.table_uri, rec.base_version))


def check_groups_view(view: View) -> None:
    rec = view.last_refresh()
    want = expected_groups(rows_at(view.table_uri, rec.base_version))
    got = {r["region"]: r for r in view.to_table().to_pylist()}
    assert set(got) == set(want)
    for k, (n, total, lo, hi, mean) in want.items():
        g = got[k]
        assert (g["n"], g["total"], g["lo"]) == (n, total, lo)
        assert (g["hi"] is None and hi is None) or math.isclose(g["hi"], hi)
        assert (g["mean"] is None and mean is None) or math.isclose(g["mean"], mean, rel_tol=1e-9, abs_tol=1e-9)


class ViewMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="memwal-views-")
        self.uri = f"{self.dir}/t"
        self.table = Table.create(self.uri, SCHEMA, ["id"], "bucket(id, 2)", writer=WriterConfig(max_memtable_rows=100_000))
        self.compactor = Compactor(TableState.load(self.uri))
        self.rows_view, self.groups_view = create_views(self.uri)
        self.n = 0

    @rule(keys=st.lists(st.integers(0, 10), min_size=1, max_size=6), score=st.integers(-5, 40), weight=st.one_of(st.none(), st.floats(0, 10)))
    def upsert(self, keys, score, weight):
        self.n += 1
        self.table.write(pa.Table.from_pylist(
            [{"id": k, "region": REGIONS[(k + self.n) % 3], "name": f"n{k}v{self.n}", "score": score + k % 3, "weight": weight} for k in keys],
            schema=SCHEMA,
        ))

    @rule(keys=st.lists(st.integers(0, 10), min_size=1, max_size=4))
    def delete(self, keys):
        self.table.delete({"id": keys})

    @rule(keys=st.lists(st.integers(0, 10), min_size=1, max_size=5), dead=st.lists(st.integers(0, 10), max_size=3),
          score=st.integers(-5, 40), weight=st.one_of(st.none(), st.floats(0, 10)))
    def cycle(self, keys, dead, score, weight):
        """What a pipeline does: writes and deletes, compaction, then both views refreshed."""
        self.upsert(keys, score, weight)
        if dead:
            self.delete(dead)
        self.flush_and_compact()
        self.refresh("both", False)

    @rule()
    def flush_and_compact(self):
        self.table.flush()
        self.compactor.state.manifests.clear_cache()
        self.compactor.run_once()

    @rule()
    def compact_base_files(self):
        ds = lance.dataset(self.uri)
        if len(ds.get_fragments()) > 1:
            ds.optimize.compact_files()

    @rule(which=st.sampled_from(["rows", "groups", "both"]), pin=st.booleans())
    def refresh(self, which, pin):
        version = lance.dataset(self.uri).version
        if pin and version > 2:
            version -= 1  # refresh to an older (pinned) base version than the latest
        for view in ([self.rows_view] if which != "groups" else []) + ([self.groups_view] if which != "rows" else []):
            last = view.last_refresh()
            if last is not None and last.base_version > version:
                with pytest.raises(ViewError, match="not supported"):
                    view.refresh(version)
                continue
            view.refresh(version)

    @invariant()
    def views_equal_their_query_at_the_claimed_version(self):
        check_rows_view(self.rows_view)
        check_groups_view(self.groups_view)

    def teardown(self) -> None:
        self.table.close()
        shutil.rmtree(self.dir, ignore_errors=True)


ViewMachine.TestCase.settings = settings(max_examples=examples(40), stateful_step_count=20, deadline=None)
TestViewsEqualTheirQuery = ViewMachine.TestCase


# -- incremental cost, UDF versions, crashes, conflicts ----------------------------------------------


def seeded(uri: str, n: int = 2000) -> Table:
    base = pa.Table.from_pylist(
        [{"id": i, "region": REGIONS[i % 3], "name": f"p{i}", "score": i % 50, "weight": float(i % 7)} for i in range(n)],
        schema=SCHEMA,
    )
    return Table.create(uri, SCHEMA, ["id"], "bucket(id, 4)", initial_data=base)


def change(table: Table, ids: list[int], tag: str) -> None:
    table.write(pa.Table.from_pylist(
        [{"id": i, "region": REGIONS[i % 3], "name": f"{tag}{i}", "score": 20 + i % 5, "weight": 1.5} for i in ids], schema=SCHEMA
    ))
    table.flush()
    Compactor(table.state).run_once()


def test_incremental_refresh_touches_only_the_change(table_uri, tmp_path, monkeypatch):
    monkeypatch.setenv(CALLS_FILE, str(tmp_path / "calls"))
    t = seeded(table_uri)
    rows, groups = create_views(table_uri)
    full_calls = sum(calls(str(tmp_path / "calls")))
    assert full_calls == sum(1 for i in range(2000) if i % 50 >= 10)
    change(t, list(range(100, 130)) + [5000, 5001], "c")
    t.delete({"id": [3, 4]})
    t.flush()
    Compactor(t.state).run_once()
    before = len(calls(str(tmp_path / "calls")))
    rec = rows.refresh()
    assert rec.mode == "incremental"
    # UDF rows computed: exactly the inserted and updated rows that pass the filter
    assert sum(calls(str(tmp_path / "calls"))[before:]) == 32
    assert groups.refresh().mode == "incremental"
    check_rows_view(rows)
    check_groups_view(groups)
    assert [r.mode for r in rows.history()] == ["full", "incremental"]
    f = rows.freshness()
    assert f.versions_behind == 0 and f.uncompacted_sstables == 0


def test_changed_udf_version_recomputes_the_column_everywhere(table_uri, tmp_path, monkeypatch):
    monkeypatch.setenv(CALLS_FILE, str(tmp_path / "calls"))
    seeded(table_uri, 300)
    View.create(table_uri, "v", select=["name", "score * 2 AS s2"], udfs=[LABEL])
    assert View.open(table_uri, "v").refresh() is None  # nothing changed
    v2 = View(table_uri, View.open(table_uri, "v").definition.__class__(
        **{**View.open(table_uri, "v").definition.__dict__, "udfs": (UdfColumn("label", "viewudfs:label_v2", ("name", "s2"), "string", "2"),)}
    ))
    before = sum(calls(str(tmp_path / "calls")))
    rec = v2.refresh()
    assert rec.mode == "full" and rec.udf_versions["label"].startswith("2:")
    assert sum(calls(str(tmp_path / "calls"))) - before == 300
    assert all(r["label"] == f"{r['name'].lower()}/{r['s2']}" for r in v2.to_table().to_pylist())


REFRESH = """
import sys
from memwal.views import View
View.CHUNK_ROWS = 50
View.open(sys.argv[1], "rows").refresh()
"""


def test_sigkill_mid_refresh_then_rerun_reuses_finished_udf_work(table_uri, tmp_path):
    calls_file = str(tmp_path / "calls")
    env = dict(os.environ, **{CALLS_FILE: calls_file, "PYTHONPATH": os.path.dirname(__file__)})
    t = seeded(table_uri, 1000)
    View.create(table_uri, "rows", select=["name", "score * 2 AS s2"], where="score >= 10", udfs=[LABEL])
    change(t, list(range(0, 400)), "k")  # 400 updated rows, all passing the filter
    os.remove(calls_file) if os.path.exists(calls_file) else None
    marker = tmp_path / "markers"
    marker.mkdir()
    p = subprocess.Popen(
        [sys.executable, "-c", REFRESH, table_uri],
        env={**env, ENV: "view.udf_chunk_done=pause", DIR_ENV: str(marker)}, stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while not (marker / "view.udf_chunk_done").exists():
        assert p.poll() is None, p.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    view = View.open(table_uri, "rows")
    assert [r.mode for r in view.history()] == ["full"]  # the killed refresh committed nothing
    first = calls(calls_file)
    assert first == [50]  # one chunk finished (and was checkpointed) before the kill
    out = subprocess.run([sys.executable, "-c", REFRESH, table_uri], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert sum(calls(calls_file)) == 400  # the rerun computed only the 350 rows left
    check_rows_view(View.open(table_uri, "rows"))


def test_concurrent_refresh_is_refused_cleanly(table_uri, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(__file__))
    t = seeded(table_uri, 500)
    View.create(table_uri, "rows", select=["name", "score * 2 AS s2"], where="score >= 10", udfs=[LABEL])
    change(t, list(range(0, 300)), "z")
    marker = tmp_path / "markers"
    marker.mkdir()
    p = subprocess.Popen(
        [sys.executable, "-c", REFRESH, table_uri], env={**env, ENV: "view.before_commit=pause", DIR_ENV: str(marker)},
    )
    try:
        deadline = time.monotonic() + 120
        while not (marker / "view.before_commit").exists():
            assert p.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        with pytest.raises(ViewBusyError, match="another refresh"):
            View.open(table_uri, "rows").refresh()
    finally:
        p.kill()
        p.wait()
    # the holder died: its lease is taken over and the refresh goes through
    assert View.open(table_uri, "rows").refresh().mode == "incremental"
    check_rows_view(View.open(table_uri, "rows"))


def test_refresh_racing_compaction_and_base_file_compaction(table_uri):
    t = seeded(table_uri, 1000)
    rows, groups = create_views(table_uri)
    pinned = lance.dataset(table_uri).version
    change(t, list(range(0, 200)), "a")  # compaction commits after the pinned version
    lance.dataset(table_uri).optimize.compact_files(target_rows_per_fragment=10_000)
    rows.refresh(pinned + 1)
    check_rows_view(rows)
    change(t, list(range(150, 260)), "b")
    rows.refresh()
    groups.refresh()
    check_rows_view(rows)
    check_groups_view(groups)


def test_maintenance_refreshes_registered_views(table_uri):
    from memwal.maintain.maintenance import Maintenance

    t = seeded(table_uri, 300)
    rows, groups = create_views(table_uri)
    assert list_views(table_uri) == ["groups", "rows"]
    t.write(pa.Table.from_pylist([{"id": 7, "region": "eu", "name": "new", "score": 33, "weight": 2.0}], schema=SCHEMA))
    t.flush()
    report = Maintenance(table_uri).run_cycle()
    assert report.views_refreshed == 2
    assert rows.last_refresh().base_version == lance.dataset(table_uri).version
    check_rows_view(rows)
    check_groups_view(groups)


def test_a_cycle_that_only_compacts_base_files_brings_the_views_to_its_version(table_uri):
    """No SSTable to fold, but a base-file compaction moves the base version: the views follow
    it (their freshness, and the version an aggregate view reads old values from next)."""
    from memwal.maintain.maintenance import Maintenance, MaintenanceConfig

    t = seeded(table_uri, 300)
    rows, groups = create_views(table_uri)
    change(t, list(range(0, 40)), "a")
    change(t, list(range(20, 60)), "b")
    for v in (rows, groups):
        v.refresh()
    folded = lance.dataset(table_uri).version
    assert len(lance.dataset(table_uri).get_fragments()) >= 2
    report = Maintenance(table_uri, MaintenanceConfig(max_small_fragments=2, gc=False)).run_cycle()
    assert report.compaction_commits == 0 and report.base_fragments_compacted > 0
    now = lance.dataset(table_uri).version
    assert now > folded
    assert report.views_refreshed == 2
    assert rows.last_refresh().base_version == groups.last_refresh().base_version == now
    check_rows_view(rows)
    check_groups_view(groups)
    change(t, list(range(50, 90)), "c")  # the next refresh reads old values from the compacted version
    assert groups.refresh().mode == "incremental"
    check_groups_view(groups)
    assert rows.refresh().mode == "incremental"
    check_rows_view(rows)


def test_view_cli(table_uri, tmp_path):
    seeded(table_uri, 200)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(__file__))

    def memwal(*args):
        p = subprocess.run([sys.executable, "-m", "memwal", *args], capture_output=True, text=True, env=env)
        assert p.returncode == 0, p.stderr
        return p.stdout

    memwal("view", "create", table_uri, "top", "--select", "name", "--select", "score * 2 AS s2", "--where", "score >= 10",
           "--udf", "label=viewudfs:label(name,s2)->string@1")
    memwal("view", "create", table_uri, "agg", "--select", "region", "--select", "count(*) AS n", "--group-by", "region")
    assert memwal("view", "list", table_uri).split() == ["agg", "top"]
    assert "up to date" in memwal("view", "refresh", table_uri, "top")
    status = json.loads(memwal("view", "status", table_uri, "top", "--json"))
    assert status["rows"] == sum(1 for i in range(200) if i % 50 >= 10)
    assert status["refreshes"][0]["mode"] == "full" and status["freshness"]["versions_behind"] == 0
    assert "reflects base version" in memwal("view", "status", table_uri, "agg")
    memwal("view", "drop", table_uri, "agg")
    assert memwal("view", "list", table_uri).split() == ["top"]
    assert lance.dataset(View.open(table_uri, "top").uri).count_rows() == status["rows"]  # a plain Lance table


def test_refresh_reads_only_the_columns_the_view_uses():
    from memwal.views import ViewDefinition

    names = ["id", "val", "name", "vec", "Region"]
    defn = ViewDefinition("v", "t", select=("name", "val * 2 AS v2", "upper(\"Region\") AS r"), where="id > 3",
                          udfs=(UdfColumn("f", "m:f", ("name",), "int32"),))
    assert defn.columns_used(names) == ["id", "val", "name", "Region"]
    agg = ViewDefinition("a", "t", select=("k AS k", "count(*) AS n"), group_by=("k",))
    assert agg.columns_used(["k", "vec"]) == ["k"]
    assert ViewDefinition("s", "t").columns_used(names) == names
    assert ViewDefinition("s", "t", select=("*",)).columns_used(names) == names
