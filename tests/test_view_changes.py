"""Views fed by compaction: base tables without stable row ids, views keyed on the primary
key, the SSTables as the change log, GC waiting for views, and views made by the previous
version (keyed by stable row id, fed by ``delta()``) still refreshing."""

from __future__ import annotations

import datetime
import decimal
import os
import shutil
import subprocess
import sys
import tarfile
import io

import lance
import pyarrow as pa
import pytest
from test_views import LABEL, REGIONS, SCHEMA, change, check_groups_view, check_rows_view, create_views, seeded

from memwal import Table
from memwal.core import paths
from memwal.maintain.compactor import Compactor
from memwal.readers.feed import rows_by_key
from memwal.maintain.gc import GarbageCollector, GcConfig
from memwal.core.holds import read_hold
from memwal.core.indexes import IndexMaintainer
from memwal.views import View
from memwal.views.layout import ROW_ID, SOURCE_KEY

NOW = GcConfig(reader_grace_seconds=0, manifest_retention_seconds=0, base_version_retention_seconds=0, drain_interval_seconds=0)


def sstables(uri: str) -> dict[str, list[int]]:
    t = Table.open(uri)
    return {s: sorted(x.generation for x in t.manifests.read_shard(s).sstables) for s in t.manifests.list_shards()}


def test_new_tables_have_no_stable_row_ids_and_views_are_keyed_on_the_primary_key(table_uri):
    seeded(table_uri, 200)
    assert not lance.dataset(table_uri).has_stable_row_ids
    rows, groups = create_views(table_uri)
    assert SOURCE_KEY in rows.dataset().schema.names and ROW_ID not in rows.dataset().schema.names
    keys = rows.to_table(hidden=True).column(SOURCE_KEY).to_pylist()
    assert len(keys) == len(set(keys))


def test_refresh_between_the_two_passes_of_a_compaction_is_exact(table_uri):
    """A generation with tombstones and live rows is compacted in two commits, the first
    without the marker: a refresh pinned between them sees the deletes, one after both the upserts."""
    t = seeded(table_uri, 300)
    rows, groups = create_views(table_uri)
    t.delete({"id": list(range(10, 30))})
    t.write(pa.Table.from_pylist(
        [{"id": i, "region": REGIONS[i % 3], "name": f"w{i}", "score": 30, "weight": 2.5} for i in [*range(30, 50), *range(500, 520)]],
        schema=SCHEMA,
    ))
    t.flush()
    c = Compactor(t.state)
    shard_plans = [p for p in (c.plan(s) for s in t.manifests.list_shards()) if p is not None]
    assert any(p.dead.num_rows and p.live.num_rows for p in shard_plans)
    for p in shard_plans:
        c.delete_pass(p)
    between = lance.dataset(table_uri).version
    rows.refresh(between)
    groups.refresh(between)
    assert rows.last_refresh().mode == groups.last_refresh().mode == "incremental"
    check_rows_view(rows)
    check_groups_view(groups)
    for p in shard_plans:
        c.upsert_pass(p)
    assert rows.refresh().mode == groups.refresh().mode == "incremental"
    check_rows_view(rows)
    check_groups_view(groups)


def test_gc_keeps_the_sstables_a_view_has_not_consumed(table_uri):
    t = seeded(table_uri, 400)
    rows = View.create(table_uri, "rows", select=["name", "score * 2 AS s2"], where="score >= 10", udfs=[LABEL])
    for k in range(3):
        change(t, list(range(k * 40, k * 40 + 60)), f"r{k}")
    IndexMaintainer(t.state).catch_up()
    compacted = sstables(table_uri)
    assert any(compacted.values())
    GarbageCollector(t.state, NOW).run_once()
    assert sstables(table_uri) == compacted  # the view has consumed none of them
    rec = rows.refresh()
    assert rec.mode == "incremental"
    check_rows_view(rows)
    assert read_hold(t.io, paths.view_hold(table_uri, "rows")) == rec.compacted
    GarbageCollector(t.state, NOW).run_once()
    assert all(not g for g in sstables(table_uri).values())
    # dropping the view releases its hold
    change(t, [1, 2, 3], "d")
    IndexMaintainer(t.state).catch_up()
    rows.drop()
    GarbageCollector(t.state, NOW).run_once()
    assert all(not g for g in sstables(table_uri).values())


def test_a_view_whose_change_log_is_gone_refreshes_in_full(table_uri):
    t = seeded(table_uri, 300)
    rows, groups = create_views(table_uri)
    change(t, list(range(0, 90)), "x")
    IndexMaintainer(t.state).catch_up()
    for name in ("rows", "groups"):
        os.remove(paths.view_hold(table_uri, name))  # as if the hold had never been written
    GarbageCollector(t.state, NOW).run_once()
    assert rows.refresh().mode == groups.refresh().mode == "full"
    check_rows_view(rows)
    check_groups_view(groups)
    change(t, list(range(50, 120)), "y")
    assert rows.refresh().mode == groups.refresh().mode == "incremental"
    check_rows_view(rows)
    check_groups_view(groups)


# -- a table and views made by the previous version ----------------------------------------------

PREVIOUS = "a88abdb"  # the last commit whose tables had stable row ids and views fed by delta()

MAKE_OLD = """
import sys
sys.path.insert(0, sys.argv[2])
sys.path.insert(1, sys.argv[3])
from test_views import seeded, create_views, change
import memwal, lance
assert memwal.__file__.startswith(sys.argv[2]), memwal.__file__
t = seeded(sys.argv[1], int(sys.argv[4]))
create_views(sys.argv[1])
change(t, list(range(0, 50)), "old")
assert lance.dataset(sys.argv[1]).has_stable_row_ids
"""


def _previous_version(tmp_path) -> str | None:
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if shutil.which("git") is None:
        return None
    out = subprocess.run(["git", "-C", repo, "archive", PREVIOUS, "memwal", "tests"], capture_output=True)
    if out.returncode != 0:
        return None
    dest = tmp_path / "previous"
    with tarfile.open(fileobj=io.BytesIO(out.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return str(dest)


def make_previous_table(uri: str, tmp_path, rows: int = 500) -> None:
    """A table of ``rows`` rows and two views at ``uri``, made by the previous version's own
    code in a process of its own (skips the test without the repository's git history)."""
    old = _previous_version(tmp_path)
    if old is None:
        pytest.skip("needs the repository's git history (the previous version's code)")
    made = subprocess.run(
        [sys.executable, "-c", MAKE_OLD, uri, old, os.path.join(old, "tests"), str(rows)],
        capture_output=True, text=True, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert made.returncode == 0, made.stderr[-3000:]


def test_table_and_views_made_by_the_previous_version_keep_refreshing(table_uri, tmp_path):
    make_previous_table(table_uri, tmp_path)
    rows, groups = View.open(table_uri, "rows"), View.open(table_uri, "groups")
    assert ROW_ID in rows.dataset().schema.names  # keyed by stable row id: stays on delta()
    t = Table.open(table_uri)
    change(t, list(range(30, 90)), "new")
    t.delete({"id": [1, 2]})
    t.flush()
    Compactor(t.state).run_once()
    assert rows.refresh().mode == groups.refresh().mode == "incremental"
    check_rows_view(rows)
    check_groups_view(groups)
    # a view created now on the old table is keyed on the primary key and works there too
    fresh = View.create(table_uri, "fresh", select=["name", "score * 2 AS s2"], where="score >= 10")
    change(t, list(range(80, 140)), "newer")
    assert fresh.refresh().mode == "incremental" and rows.refresh().mode == "incremental"
    got = sorted((r["name"], r["s2"]) for r in fresh.to_table().to_pylist())
    assert got == sorted((r["name"], r["s2"]) for r in rows.to_table().to_pylist())


@pytest.mark.parametrize(
    "keys",
    [
        pa.array(range(0, 600, 3), pa.int64()),
        pa.array(range(0, 600, 3), pa.uint64()),  # no Substrait form: filtered as SQL text
        pa.array([f"k-{i:05d}'" for i in range(0, 600, 3)], pa.string()),
        pa.array([decimal.Decimal(i) / 100 for i in range(0, 600, 3)], pa.decimal128(12, 2)),
        pa.array([datetime.date(2020, 1, 1) + datetime.timedelta(days=i) for i in range(0, 600, 3)], pa.date32()),
    ],
    ids=["int64", "uint64", "string", "decimal", "date"],
)
def test_rows_by_key_finds_exactly_the_keys_rows_for_every_key_type(tmp_path, keys):
    table = pa.table({"k": keys, "v": pa.array(range(len(keys)), pa.int64())})
    ds = lance.write_dataset(table, str(tmp_path / "d"), max_rows_per_file=64)
    ds.create_scalar_index("k", "BTREE")
    wanted = pa.table({"k": keys.take(pa.array(range(1, len(keys), 7)))})
    found = rows_by_key(ds, wanted, ["v"], ["k"]).sort_by("v")
    assert found.column("k").to_pylist() == wanted.column("k").to_pylist()
    assert found.column("v").to_pylist() == list(range(1, len(keys), 7))
