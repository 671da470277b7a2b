"""The compactor: generation order, tombstones, multi-generation runs, races and crashes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import lance
import pytest
from helpers import PEOPLE, people

from memwal import StaleCompactionError, Table, readers
from memwal.maintain.compactor import Compactor
from memwal.core.state import TableState
from memwal.core.failpoints import DIR_ENV, ENV


def live(uri: str) -> dict[int, str]:
    return {r["id"]: r["name"] for r in readers.open(uri).scan().to_pylist()}


def base(uri: str) -> dict[int, str]:
    return {r["id"]: r["name"] for r in lance.dataset(uri).to_table().to_pylist()}


def generations(uri: str, n: int, shard_by: str = "bucket(id, 2)") -> dict[int, str]:
    """n flushed generations per shard of overlapping upserts and some deletes; returns the model."""
    model: dict[int, str] = {}
    with Table.create(uri, PEOPLE, ["id"], shard_by) as t:
        for g in range(n):
            rows = people(range(g * 5, g * 5 + 12), tag=f"g{g}-")
            t.write(rows)
            model.update({i: f"g{g}-{i}" for i in range(g * 5, g * 5 + 12)})
            if g % 3 == 1:
                dead = [g * 5 + 1, g * 5 + 2, 999]
                t.delete({"id": dead})
                for i in dead:
                    model.pop(i, None)
            t.flush()
    return model


def test_compaction_moves_everything_into_the_base(table_uri):
    model = generations(table_uri, 7)
    t = Table.open(table_uri)
    assert live(table_uri) == model
    Compactor(t.state).run_once()
    assert base(table_uri) == model  # the base alone now holds the table
    assert live(table_uri) == model
    snap = t.snapshot()
    assert snap.num_live_sstables == 0
    for s in snap.shards:
        assert s.compacted_generation == max(g.generation for g in s.manifest.sstables)


def test_a_bounded_compaction_takes_no_generation_above_its_bound(table_uri):
    model = generations(table_uri, 6)
    t = Table.open(table_uri)
    shards = t.state.manifests.list_shards()
    upto = {}
    for s in t.snapshot().shards:
        gens = sorted(g.generation for g in s.manifest.sstables)
        upto[s.shard_id] = gens[2]  # three of each shard's six
    done = Compactor(t.state).compact_shards(shards, upto=upto)
    assert {r.shard_id: max(r.generations) for r in done} == upto
    for s in t.snapshot().shards:
        assert s.compacted_generation == upto[s.shard_id] and len(s.live_sstables) == 3
    assert live(table_uri) == model  # the rest is still read from the SSTables
    Compactor(t.state).compact_shards(shards)
    assert base(table_uri) == model


def test_runs_are_in_generation_order_and_tombstone_generations_alone(table_uri):
    generations(table_uri, 7, shard_by="unsharded")
    c = Compactor(TableState.load(table_uri), max_generations_per_commit=8)
    results = c.run_once()
    runs = [r.generations for r in results]
    flat = [g for run in runs for g in run]
    assert flat == list(range(1, 8))  # every generation once, ascending
    for r in results:
        if r.keys_deleted:
            assert len(r.generations) == 1  # two-pass runs are single generations
    assert any(len(r.generations) > 1 for r in results)  # upsert-only runs were merged


def test_one_generation_per_commit_gives_the_same_table(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    model = generations(a, 6)
    generations(b, 6)
    ra = Compactor(TableState.load(a), max_generations_per_commit=1).run_once()
    rb = Compactor(TableState.load(b), max_generations_per_commit=8).run_once()
    assert base(a) == base(b) == model
    assert len(ra) > len(rb)  # merging runs saves commits


def test_compacting_while_new_generations_arrive(table_uri):
    model = generations(table_uri, 3)
    t = Table.open(table_uri)
    c = Compactor(t.state)
    c.compact_shard(t.manifests.list_shards()[0], max_commits=1)
    t.write(people([1, 2, 3], tag="late-"))
    t.delete({"id": [4]})
    t.flush()
    model.update({i: f"late-{i}" for i in (1, 2, 3)})
    model.pop(4, None)
    assert live(table_uri) == model
    c.run_once()
    assert live(table_uri) == model == base(table_uri)


def test_stale_plan_loses_cleanly(table_uri):
    model = generations(table_uri, 4, shard_by="unsharded")
    t = Table.open(table_uri)
    (shard,) = t.manifests.list_shards()
    slow, fast = Compactor(TableState.load(table_uri)), Compactor(TableState.load(table_uri))
    plan = slow.plan(shard)
    fast.run_once()  # compacts everything, including the slow one's run
    with pytest.raises(StaleCompactionError):
        slow.commit(plan)
    assert base(table_uri) == model
    slow.compact_shard(shard)  # reloads, finds nothing left
    assert base(table_uri) == model


def test_a_shorter_run_between_two_passes_cannot_resurrect_a_deleted_key(table_uri):
    """Key 1 is live in generation 1 and deleted in generation 2. Had the slow compactor
    planned generations 1-2 as one run (delete pass for key 1, then upsert), the fast one's
    run of generation 1 alone, committed between those passes, would re-insert key 1 for
    good. Runs with tombstones are single generations, so both plan the same run."""
    t = Table.create(table_uri, PEOPLE, ["id"], "unsharded")
    t.write(people([1, 2], tag="a"))
    t.flush()
    t.delete({"id": [1]})
    t.write(people([3], tag="b"))
    t.flush()
    (shard,) = t.manifests.list_shards()
    slow = Compactor(TableState.load(table_uri), max_generations_per_commit=4)
    fast = Compactor(TableState.load(table_uri), max_generations_per_commit=1)
    slow_plan = slow.plan(shard)
    fast_plan = fast.plan(shard)
    assert slow_plan.generations == fast_plan.generations == (1,)
    slow.delete_pass(slow_plan)
    fast.commit(fast_plan)
    with pytest.raises(StaleCompactionError):
        slow.upsert_pass(slow_plan)
    slow.compact_shard(shard)
    assert base(table_uri) == {2: "a2", 3: "b3"} == live(table_uri)


def test_crash_between_passes_is_repaired_by_a_rerun(table_uri):
    model = generations(table_uri, 2, shard_by="unsharded")
    t = Table.open(table_uri)
    (shard,) = t.manifests.list_shards()
    c = Compactor(t.state)
    c.compact_shard(shard, max_commits=1)
    plan = c.plan(shard)  # generation 2 has tombstones: two passes
    assert plan.dead.num_rows and plan.live.num_rows
    c.delete_pass(plan)  # ... and the process dies here
    assert live(table_uri) == model  # readers do not notice
    Compactor(TableState.load(table_uri)).run_once()
    assert base(table_uri) == model == live(table_uri)


def test_two_compactors_racing_in_threads(table_uri):
    model = generations(table_uri, 9)
    errors = []

    def run(c):
        try:
            c.run_once()
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    cs = [Compactor(TableState.load(table_uri), max_generations_per_commit=k) for k in (1, 3)]
    threads = [threading.Thread(target=run, args=(c,)) for c in cs]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    assert base(table_uri) == model == live(table_uri)


# -- real process kills at exact steps -----------------------------------------------------------

COMPACT = ("import sys; from memwal.core.state import TableState; from memwal.maintain.compactor import Compactor; "
           "Compactor(TableState.load(sys.argv[1])).run_once()")


def run_until_failpoint(uri: str, point: str, marker_dir: str) -> subprocess.Popen:
    env = dict(os.environ, **{ENV: f"{point}=pause", DIR_ENV: marker_dir})
    p = subprocess.Popen([sys.executable, "-c", COMPACT, uri], env=env, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(marker_dir, point)):
        if p.poll() is not None:
            raise AssertionError(f"compactor exited before {point}: {p.stderr.read().decode()}")
        if time.monotonic() > deadline:
            p.kill()
            raise AssertionError(f"compactor never reached {point}")
        time.sleep(0.05)
    return p


@pytest.mark.parametrize("point", ["compactor.between_passes", "compactor.after_commit"])
def test_sigkill_of_a_compactor_process_then_rerun_converges(tmp_path, point):
    uri = str(tmp_path / "table")
    model = generations(uri, 5, shard_by="unsharded")
    version_before = lance.dataset(uri).version
    p = run_until_failpoint(uri, point, str(tmp_path))
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert p.returncode == -signal.SIGKILL
    after = lance.dataset(uri).version
    assert after > version_before  # the kill came after a commit
    if point == "compactor.between_passes":
        # the delete pass of a tombstone generation committed without the marker
        state = Table.open(uri).snapshot().shards[0]
        assert state.live_sstables and state.live_sstables[0].generation == state.compacted_generation + 1
    assert live(uri) == model  # readers see the same table while the compactor is dead
    Compactor(TableState.load(uri)).run_once()
    assert base(uri) == live(uri) == model
    assert Table.open(uri).snapshot().num_live_sstables == 0


def deleted_fractions(uri: str) -> list[float]:
    return [f.metadata.num_deletions / f.metadata.physical_rows for f in lance.dataset(uri).get_fragments()]


@pytest.mark.parametrize("threshold", [0.1, 1.0])
def test_maintenance_rewrites_base_fragments_whose_deleted_rows_pile_up(table_uri, threshold):
    """Updates leave the old rows deleted in their base fragment, and a point lookup pays for
    every deleted row of the fragment it reads; maintenance rewrites a fragment past the
    threshold even when no small fragments pile up, and the table reads the same after."""
    from memwal.maintain.maintenance import Maintenance, MaintenanceConfig

    with Table.create(table_uri, PEOPLE, ["id"], "bucket(id, 1)", initial_data=people(range(1000), tag="base-")) as t:
        t.write(people(range(0, 1000, 4), tag="upd-"))  # 250 of 1000 rows updated: 25% deleted
        t.flush()
    model = {i: f"upd-{i}" if i % 4 == 0 else f"base-{i}" for i in range(1000)}
    cfg = MaintenanceConfig(gc=False, views=False, indexes=False, flush_stranded_after_seconds=None, max_deleted_fraction=threshold)
    report = Maintenance(table_uri, cfg).run_cycle()
    assert report.compaction_commits == 1
    assert live(table_uri) == model
    assert base(table_uri) == model
    if threshold < 1.0:
        assert report.base_fragments_compacted >= 1
        assert max(deleted_fractions(table_uri)) <= threshold
    else:
        assert report.base_fragments_compacted == 0  # one small fragment, deletions under the threshold
        assert max(deleted_fractions(table_uri)) == pytest.approx(0.25)


# -- several shards in one commit ----------------------------------------------------------------


def upserts(uri: str, n: int, shards: int = 4) -> dict[int, str]:
    """n flushed generations per shard of overlapping upserts (no deletes); returns the model."""
    with Table.create(uri, PEOPLE, ["id"], f"bucket(id, {shards})") as t:
        for g in range(n):
            t.write(people(range(g * 50, g * 50 + 80), tag=f"g{g}-"))
            t.flush()
    return {i: f"g{g}-{i}" for g in range(n) for i in range(g * 50, g * 50 + 80)}


def test_single_pass_runs_of_every_shard_share_one_commit(table_uri):
    model = upserts(table_uri, 3)
    before = lance.dataset(table_uri).version
    c = Compactor(TableState.load(table_uri))
    results = c.run_once()
    assert len(results) == 4 and c.stats.commits == 1
    assert lance.dataset(table_uri).version == before + 1
    assert {r.base_version for r in results} == {before + 1}
    assert base(table_uri) == model == live(table_uri)
    assert all(s.compacted_generation == 3 for s in Table.open(table_uri).snapshot().shards)


def test_a_joint_commit_with_one_stale_run_commits_nothing(table_uri):
    model = upserts(table_uri, 3)
    shards = Table.open(table_uri).manifests.list_shards()
    slow, fast = Compactor(TableState.load(table_uri)), Compactor(TableState.load(table_uri))
    plans = [slow.plan(s) for s in shards]
    fast.compact_shards(shards[2:3])  # one shard's run lands first
    after_fast = base(table_uri)
    with pytest.raises(StaleCompactionError):
        slow.commit_joint(plans)
    assert base(table_uri) == after_fast  # none of the other shards' rows landed either
    slow.run_once()  # reloads: the other three shards in one commit
    assert slow.stats.lost_races == 0 and slow.stats.commits == 1
    assert base(table_uri) == model == live(table_uri)


def test_runs_with_tombstones_commit_alone_beside_a_joint_commit(table_uri):
    model = generations(table_uri, 5, shard_by="bucket(id, 3)")
    c = Compactor(TableState.load(table_uri))
    results = c.run_once()
    joint = [r for r in results if sum(q.base_version == r.base_version for q in results) > 1]
    assert joint and all(not r.keys_deleted for r in joint)
    assert any(r.keys_deleted for r in results)  # the generations with deletes, each on its own
    assert base(table_uri) == model == live(table_uri)


def test_a_round_plans_shards_only_up_to_the_row_budget(table_uri):
    model = upserts(table_uri, 3)  # ~45 rows per shard and run
    c = Compactor(TableState.load(table_uri), max_rows_per_commit=100)
    results = c.run_once()
    assert len(results) == 4 and 1 < c.stats.commits < 4  # two joined, the rest in later commits
    assert base(table_uri) == model == live(table_uri)
