"""`memwal upgrade`: a table made by the previous version (base with stable row ids, views
keyed on the stable row id and fed by ``delta()``), written to by this version, moved to a
base without stable row ids; rows, WAL replay and views stay exact, and a crash at any step
is repaired by a rerun."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import lance
import pyarrow as pa
import pytest
from test_view_changes import make_previous_table
from test_views import REGIONS, SCHEMA, change, check_groups_view, check_rows_view

from memwal import Table
from memwal.core import paths
from memwal.cli import main as cli_main
from memwal.maintain.compactor import Compactor
from memwal.core.errors import ConcurrencyError
from memwal.core.failpoints import DIR_ENV as FAILPOINT_DIR_ENV
from memwal.core.failpoints import ENV as FAILPOINTS_ENV
from memwal.core.failpoints import EXIT_CODE
from memwal.maintain.upgrade import UPGRADE_DIR, UpgradeBlockedError, plan_upgrade, purge_upgrades, upgrade
from memwal.views import View
from memwal.views.layout import ROW_ID
from memwal.write.lease import WriterLease

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)

# Writes through this version's memwal and dies without flushing: the writes are in the WAL only.
WRITE_AND_DIE = """
import os, sys
sys.path.insert(0, sys.argv[2])
import pyarrow as pa
from test_views import REGIONS, SCHEMA
from memwal import Table
t = Table.open(sys.argv[1])
lo, hi = int(sys.argv[3]), int(sys.argv[4])
t.write(pa.Table.from_pylist(
    [{"id": i, "region": REGIONS[i % 3], "name": f"wal{i}", "score": 30 + i % 3, "weight": 2.5} for i in range(lo, hi)],
    schema=SCHEMA))
t.delete({"id": [int(x) for x in sys.argv[5].split(",")]})
os._exit(0)
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "PYTHONPATH": REPO, **extra}


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> str:
    """A table and two views made by the previous version's own code."""
    tmp = tmp_path_factory.mktemp("previous")
    uri = str(tmp / "table")
    make_previous_table(uri, tmp, rows=400)
    return uri


def expire_leases(uri: str) -> None:
    """The leases of writers that died long ago: expired."""
    t = Table.open(uri)
    for sid in t.manifests.list_shards():
        held = t.writers.lease(sid)
        if held is not None:
            t.io.write(paths.writer_lease(uri, sid), WriterLease(held.owner, 0.0).to_json())


def write_and_die(uri: str, lo: int, hi: int, deleted: list[int]) -> None:
    out = subprocess.run([sys.executable, "-c", WRITE_AND_DIE, uri, TESTS, str(lo), str(hi), ",".join(map(str, deleted))],
                         capture_output=True, text=True, env=_env())
    assert out.returncode == 0, out.stderr[-3000:]
    expire_leases(uri)


def live_rows(uri: str) -> list[dict]:
    """Every live row, strongly consistent (base, SSTables, unflushed WAL)."""
    return sorted(Table.open(uri).reader(consistency="strong").scan().to_pylist(), key=lambda r: r["id"])


def base_rows(uri: str) -> list[dict]:
    return sorted(lance.dataset(uri).to_table().to_pylist(), key=lambda r: r["id"])


@pytest.fixture
def old_table(template, tmp_path) -> str:
    """The previous version's table, then written to by this one: compacted SSTables, an
    SSTable not compacted, upserts and deletes across shards in the WAL only."""
    uri = str(tmp_path / "table")
    shutil.copytree(template, uri)
    t = Table.open(uri)
    change(t, list(range(30, 90)), "new")  # flushed and compacted
    t.delete({"id": [1, 2, 33]})
    t.write(pa.Table.from_pylist(
        [{"id": i, "region": REGIONS[i % 3], "name": f"sst{i}", "score": 11, "weight": 0.5} for i in range(200, 230)], schema=SCHEMA))
    t.close()  # flushed, not compacted
    write_and_die(uri, 380, 420, [3, 4, 201])  # unflushed: in the WAL only
    return uri


def check_views_exact(uri: str) -> None:
    for name, check in (("rows", check_rows_view), ("groups", check_groups_view)):
        view = View.open(uri, name)
        assert ROW_ID not in view.dataset().schema.names
        check(view)


def check_upgraded(uri: str, before: list[dict]) -> None:
    assert not lance.dataset(uri).has_stable_row_ids
    assert base_rows(uri) == before  # everything flushed and compacted into the new base
    assert live_rows(uri) == before
    check_views_exact(uri)


def test_upgrade_moves_an_old_table_to_a_base_without_stable_row_ids(old_table, tmp_path):
    uri = old_table
    assert lance.dataset(uri).has_stable_row_ids
    plan = plan_upgrade(uri)
    assert not plan.current and plan.stable_row_ids and plan.row_id_views == ("rows",)  # aggregate views never keyed on it
    before = live_rows(uri)
    assert {r["id"] for r in before} >= {380, 419} and not {1, 3, 201} & {r["id"] for r in before}

    assert upgrade(uri, dry_run=True).outcome == "dry-run"
    assert lance.dataset(uri).has_stable_row_ids  # a dry run changes nothing

    report = Table.upgrade(uri)
    assert report.outcome == "upgraded" and set(report.views_recreated) == {"rows", "groups"}
    check_upgraded(uri, before)
    assert os.path.isdir(report.moved_aside)
    assert cli_main(["check", uri]) == 0

    # writes after the upgrade: through the LSM, compacted, read back; views follow exactly
    t = Table.open(uri)
    change(t, list(range(100, 160)), "post")
    t.delete({"id": [5, 150]})
    t.close()
    Compactor(t.state).run_once()
    want = {r["id"]: r for r in before}
    for i in range(100, 160):
        want[i] = {"id": i, "region": REGIONS[i % 3], "name": f"post{i}", "score": 20 + i % 5, "weight": 1.5}
    for i in (5, 150):
        want.pop(i, None)
    assert base_rows(uri) == sorted(want.values(), key=lambda r: r["id"])
    for name in ("rows", "groups"):
        assert View.open(uri, name).refresh().mode == "incremental"
    check_views_exact(uri)

    # a writer that dies with unflushed writes: its WAL replays exactly on the upgraded base
    write_and_die(uri, 500, 530, [6, 101])
    t = Table.open(uri)
    assert t.flush_stranded()
    Compactor(t.state).run_once()
    for i in range(500, 530):
        want[i] = {"id": i, "region": REGIONS[i % 3], "name": f"wal{i}", "score": 30 + i % 3, "weight": 2.5}
    for i in (6, 101):
        want.pop(i, None)
    assert base_rows(uri) == live_rows(uri) == sorted(want.values(), key=lambda r: r["id"])

    # already current: a no-op that says so; the moved-aside base goes only after the grace period
    again = upgrade(uri)
    assert again.outcome == "noop" and plan_upgrade(uri).current
    assert purge_upgrades(uri).purged == ()
    assert purge_upgrades(uri, grace_seconds=0).purged == (report.stamp,)
    assert not os.path.exists(report.moved_aside)
    assert base_rows(uri) == sorted(want.values(), key=lambda r: r["id"])


def test_upgrade_refuses_while_a_writer_is_live(old_table, capsys):
    uri = old_table
    t = Table.open(uri)
    t.write(pa.Table.from_pylist([{"id": 7, "region": "eu", "name": "live", "score": 1, "weight": 1.0}], schema=SCHEMA))
    with pytest.raises(UpgradeBlockedError) as e:
        upgrade(uri)
    assert isinstance(e.value, ConcurrencyError)
    assert cli_main(["upgrade", uri]) == 4
    assert lance.dataset(uri).has_stable_row_ids
    assert not os.path.isdir(os.path.join(uri, UPGRADE_DIR)) or not os.listdir(os.path.join(uri, UPGRADE_DIR))
    t.close()
    expire_leases(uri)
    assert cli_main(["upgrade", uri, "--dry-run"]) == 0
    assert cli_main(["upgrade", uri]) == 0
    assert not lance.dataset(uri).has_stable_row_ids
    assert cli_main(["upgrade", uri]) == 0
    assert "nothing" in capsys.readouterr().out


@pytest.mark.parametrize(
    "point", ["upgrade.mid_build", "upgrade.before_swap", "upgrade.mid_swap", "upgrade.before_views", "upgrade.view_dropped"],
)
def test_a_crash_at_any_step_is_repaired_by_a_rerun(old_table, point):
    uri = old_table
    before = live_rows(uri)
    crashed = subprocess.run(
        [sys.executable, "-m", "memwal", "upgrade", uri], capture_output=True, text=True,
        env=_env(**{FAILPOINTS_ENV: f"{point}=exit"}),
    )
    assert crashed.returncode == EXIT_CODE, crashed.stderr[-3000:]
    if point in ("upgrade.mid_build", "upgrade.before_swap"):
        # the table is as it was (flushed and compacted), plus a stray directory; it stays
        # writable, and a rerun copies what was written since, not the stale copy
        assert lance.dataset(uri).has_stable_row_ids and base_rows(uri) == before
        t = Table.open(uri)
        change(t, list(range(300, 320)), "between")
        t.close()
        before = live_rows(uri)
        assert base_rows(uri) == before and {r["name"] for r in before} >= {"between300"}
    assert not plan_upgrade(uri).current
    report = upgrade(uri)
    assert report.outcome == "upgraded"
    check_upgraded(uri, before)
    assert upgrade(uri).outcome == "noop"


def test_a_commit_to_the_old_base_during_the_copy_stops_the_swap(old_table, tmp_path):
    """Maintenance left running: a compaction that commits to the old base while the copy is
    built would be lost by the swap, so the upgrade stops with the table unchanged."""
    uri = old_table
    points = tmp_path / "points"
    points.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "memwal", "upgrade", uri], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=_env(**{FAILPOINTS_ENV: "upgrade.before_swap=wait", FAILPOINT_DIR_ENV: str(points)}),
    )
    reached = points / "upgrade.before_swap"
    deadline = time.monotonic() + 600
    while not reached.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the upgrade never reached the swap"
        time.sleep(0.1)
    t = Table.open(uri)
    change(t, list(range(300, 320)), "during")  # flushed and compacted into the old base
    t.close()
    expire_leases(uri)
    before = live_rows(uri)
    reached.unlink()
    _, err = proc.communicate()
    assert proc.returncode == 4, err
    assert lance.dataset(uri).has_stable_row_ids and base_rows(uri) == before
    assert upgrade(uri).outcome == "upgraded"
    check_upgraded(uri, before)


def test_upgrade_reports_the_rows_it_copies(old_table):
    from memwal.core.progress import Progress

    heard: list[Progress] = []
    report = upgrade(old_table, progress=heard.append)  # (compacts the pending SSTables first)
    assert report.outcome == "upgraded"
    assert heard and {p.task for p in heard} == {"copying the base"}
    assert heard[-1].done == heard[-1].total == report.rows
    assert [p.done for p in heard] == sorted(p.done for p in heard)
