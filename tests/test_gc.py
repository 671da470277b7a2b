"""Garbage collection: what it removes, what it must keep, and GC during live ingestion."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time

from helpers import PEOPLE, people
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from memwal import readers, Table
from memwal.core import paths
from memwal.maintain.compactor import Compactor
from memwal.core.state import TableState
from memwal.maintain.gc import GarbageCollector, GcConfig, _WalMeta
from memwal.core.indexes import IndexMaintainer
from memwal.maintain.basefiles import BaseFiles
from memwal.maintain.maintenance import Maintenance, MaintenanceConfig

NOW = GcConfig(
    reader_grace_seconds=0,
    manifest_retention_seconds=0,
    manifest_versions_kept=3,
    orphan_grace_seconds=3600,
    base_version_retention_seconds=0,
    drain_interval_seconds=0,
    wal_retention_seconds=0,
)


def fill(uri: str, generations: int, shard_by: str = "bucket(id, 2)") -> dict[int, str]:
    model = {}
    with Table.create(uri, PEOPLE, ["id"], shard_by) as t:
        for g in range(generations):
            t.write(people(range(g * 50, g * 50 + 100), tag=f"g{g}-"))
            model.update({i: f"g{g}-{i}" for i in range(g * 50, g * 50 + 100)})
            t.delete({"id": [g * 50 + 7]})
            model.pop(g * 50 + 7, None)
            t.flush()
    return model


def live(uri: str, **kw) -> dict[int, str]:
    return {r["id"]: r["name"] for r in readers.open(uri, **kw).scan().to_pylist()}


def sstable_dirs(t: Table, shard_id: str) -> list[str]:
    return [n for n in os.listdir(paths.shard_dir(t.uri, shard_id)) if paths.sstable_generation(n) is not None]


def wal_names(t: Table, shard_id: str) -> list[tuple[int, str]]:
    return sorted((paths.parse_bitrev64(n), n) for n in os.listdir(paths.wal_dir(t.uri, shard_id)))


def wal_entries(t: Table, shard_id: str) -> list[int]:
    return sorted(paths.parse_bitrev64(n) for n in os.listdir(paths.wal_dir(t.uri, shard_id)))


def test_gc_removes_compacted_sstables_their_wal_and_old_manifests(table_uri):
    model = fill(table_uri, 5)
    t = Table.open(table_uri)
    disk_before = t.io.tree_size(table_uri)
    Compactor(t.state).run_once()
    IndexMaintainer(t.state).catch_up()
    before = {s: (sstable_dirs(t, s), wal_entries(t, s)) for s in t.manifests.list_shards()}
    results = GarbageCollector(t.state, NOW).run_once()
    assert {r.shard_id for r in results} == set(before)
    for r in results:
        m = t.manifests.read_shard(r.shard_id)
        assert m.sstables == () and sstable_dirs(t, r.shard_id) == []
        assert sorted(r.sstables_removed) == list(range(1, 6))
        # WAL: everything at or below the flushed position went, fence sentinels included
        assert before[r.shard_id][1] and wal_entries(t, r.shard_id) == []
        # manifests: only the newest few versions are kept
        assert len(t.manifests.retained_versions(r.shard_id)) == NOW.manifest_versions_kept
    assert live(table_uri) == model
    # Old base versions, which hold the files compaction rewrote, are memwal.maintain.basefiles' to remove.
    BaseFiles(t.state, t.metadata.bounds, reader_grace_seconds=0, version_retention_seconds=0).remove_versions()
    assert t.io.tree_size(table_uri) < disk_before
    # and the table still takes writes: the fenced writer epoch is claimed back
    with Table.open(table_uri) as again:
        again.write(people([10_000]))
    assert len(live(table_uri)) == len(model) + 1


def test_gc_paces_drains_so_a_busy_writer_is_not_fenced_every_cycle(table_uri):
    from dataclasses import replace

    fill(table_uri, 2, shard_by="unsharded")
    t = Table.open(table_uri)
    shard = t.manifests.list_shards()[0]
    paced = replace(NOW, drain_interval_seconds=3600, min_sstables_to_drain=3)
    gc = GarbageCollector(t.state, paced)

    def compact_more(generations: int) -> int:
        with Table.open(table_uri) as w:
            for g in range(generations):
                w.write(people([1_000 + g]))
                w.flush()
        Compactor(t.state).run_once()
        IndexMaintainer(t.state).catch_up()
        t.manifests.clear_cache()
        return t.manifests.read_shard(shard).writer_epoch

    compact_more(0)
    assert [r.sstables_removed for r in gc.run_once()] == [[1, 2]]  # first drain of the shard: due
    epoch = compact_more(1)
    gc.run_once()  # one collectable SSTable, drained a moment ago: left for later, writer not fenced
    assert len(sstable_dirs(t, shard)) == 1 and t.manifests.read_shard(shard).writer_epoch == epoch
    compact_more(2)  # three collectable: enough to drain now
    assert [r.sstables_removed for r in gc.run_once()] == [[3, 4, 5]]
    assert sstable_dirs(t, shard) == []


def test_gc_keeps_sstables_that_indexes_have_not_caught_up_with(table_uri):
    fill(table_uri, 3)
    t = Table.open(table_uri)
    Compactor(t.state).run_once()  # compacted, but the BTREE on id does not cover the new rows yet
    assert GarbageCollector(t.state, NOW).run_once() == [] or all(
        not r.sstables_removed for r in GarbageCollector(t.state, NOW).run_once()
    )
    assert all(len(sstable_dirs(t, s)) == 3 for s in t.manifests.list_shards())
    IndexMaintainer(t.state).catch_up()
    GarbageCollector(t.state, NOW).run_once()
    assert all(sstable_dirs(t, s) == [] for s in t.manifests.list_shards())


def test_gc_keeps_what_recent_readers_may_still_read(table_uri):
    fill(table_uri, 3)
    t = Table.open(table_uri)
    Compactor(t.state).run_once()
    IndexMaintainer(t.state).catch_up()
    GarbageCollector(t.state, GcConfig(reader_grace_seconds=300)).run_once()
    assert all(len(sstable_dirs(t, s)) == 3 for s in t.manifests.list_shards())


def test_gc_sweeps_orphans_but_not_a_flush_in_progress(table_uri):
    fill(table_uri, 2, shard_by="unsharded")
    t = Table.open(table_uri)
    (shard,) = t.manifests.list_shards()
    m = t.manifests.read_shard(shard)
    shard_dir = paths.shard_dir(table_uri, shard)
    failed = os.path.join(shard_dir, f"deadbeef_gen_{m.current_generation - 1}")  # an older failed attempt
    in_progress = os.path.join(shard_dir, f"0badcafe_gen_{m.current_generation}")
    stale_attempt = os.path.join(shard_dir, f"0ddba11a_gen_{m.current_generation}")
    for d in (failed, in_progress, stale_attempt):
        os.makedirs(os.path.join(d, "data"))
        with open(os.path.join(d, "data", "x.lance"), "wb") as f:
            f.write(b"x" * 100)
    old = time.time() - 7200
    # An SSTable directory's age is that of its newest file (object stores have no directory times).
    os.utime(os.path.join(stale_attempt, "data", "x.lance"), (old, old))
    r = GarbageCollector(t.state, NOW).collect_shard(shard, 0)
    assert sorted(r.orphans_removed) == sorted([os.path.basename(failed), os.path.basename(stale_attempt)])
    assert os.path.exists(in_progress) and not os.path.exists(failed)
    assert r.bytes_reclaimed >= 200


def test_gc_during_active_ingestion(table_uri):
    """A writer keeps writing and a reader keeps reading while maintenance compacts and collects."""
    Table.create(table_uri, PEOPLE, ["id"], "bucket(id, 2)").close()
    stop = threading.Event()
    errors: list[BaseException] = []
    model: dict[int, str] = {}
    writer = Table.open(table_uri)
    maintenance = Maintenance(
        TableState.load(table_uri),
        MaintenanceConfig(
            interval_seconds=0.05,
            gc_config=GcConfig(reader_grace_seconds=2, manifest_retention_seconds=0, manifest_versions_kept=5, drain_interval_seconds=0),
        ),
    )
    reads = 0

    def write():
        i = 0
        try:
            while not stop.is_set():
                ids = list(range(i % 500, i % 500 + 40))
                writer.write(people(ids, tag=f"w{i}-"))
                model.update({k: f"w{i}-{k}" for k in ids})
                if i % 3 == 0:
                    writer.delete({"id": [ids[0]]})
                    model.pop(ids[0], None)
                if i % 4 == 0:
                    writer.flush()
                i += 1
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    def read():
        nonlocal reads
        r = readers.open(table_uri, refresh_interval_ms=0)
        try:
            while not stop.is_set():
                r.scan(columns=["id"])
                r.get(3)
                reads += 1
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=write), threading.Thread(target=read)]
    for th in threads:
        th.start()
    maintenance.start()
    time.sleep(12)
    stop.set()
    for th in threads:
        th.join(60)
    maintenance.stop()
    assert not errors, errors
    writer.close()
    assert reads > 5
    assert writer.writers.stats.fenced_retries > 0  # GC drains fenced the writer, which carried on
    assert maintenance.totals.bytes_reclaimed > 0 and maintenance.totals.failures == 0
    assert live(table_uri) == model
    # and once everything is compacted and collected, the disk holds little more than the base
    final = Maintenance(TableState.load(table_uri), MaintenanceConfig(gc_config=NOW))
    t = Table.open(table_uri)
    # A cycle's own commits (index catch-up, base file compaction) can make more collectable
    # than its GC saw at its start; a second cycle collects that.
    for _ in range(3):
        time.sleep(0.1)
        final.run_cycle()
        t.manifests.clear_cache()
        if all(sstable_dirs(t, s) == [] for s in t.manifests.list_shards()):
            break
    assert t.snapshot().num_live_sstables == 0
    left = {s: (sstable_dirs(t, s), t.manifests.read_shard(s)) for s in t.manifests.list_shards()}
    assert all(dirs == [] for dirs, _ in left.values()), {s: (d, m.current_generation, [x.generation for x in m.sstables]) for s, (d, m) in left.items()}
    assert live(table_uri) == model


# -- WAL entries and fence sentinels ---------------------------------------------------------------


def compact_and_collect(state: TableState, gc: GarbageCollector) -> None:
    state.manifests.clear_cache()
    Compactor(state).run_once()
    IndexMaintainer(state).catch_up()
    gc.run_once()


def wal_files(uri: str, t: Table) -> dict[str, int]:
    return {s: len(os.listdir(paths.wal_dir(uri, s))) for s in t.manifests.list_shards()}


def test_wal_files_stay_bounded_however_many_claims(table_uri):
    """Each flush closes the writer and the next write claims the shard again (a fence sentinel
    each time); after compaction and GC the WAL holds no more files after 30 claims than after 3."""
    Table.create(table_uri, PEOPLE, ["id"], "bucket(id, 2)").close()
    t = Table.open(table_uri)
    gc = GarbageCollector(t.state, NOW)
    model: dict[int, str] = {}
    after_gc = []
    for rnd in range(3):
        for i in range(3 if rnd == 0 else 27 if rnd == 1 else 3):
            ids = list(range(i * 7, i * 7 + 20))
            t.write(people(ids, tag=f"r{rnd}.{i}-"))
            model.update({k: f"r{rnd}.{i}-{k}" for k in ids})
            t.flush()
        compact_and_collect(t.state, gc)
        after_gc.append(max(wal_files(table_uri, t).values()))
        assert live(table_uri) == model
    assert after_gc[1] <= after_gc[0] and after_gc[2] <= after_gc[0] and after_gc[0] <= 1
    # a new writer still claims the shards and writes, and strong readers see its unflushed rows
    with Table.open(table_uri) as again:
        again.write(people([10_000, 10_001], tag="new-"))
        assert live(table_uri, consistency="strong") == {**model, 10_000: "new-10000", 10_001: "new-10001"}
    assert live(table_uri) == {**model, 10_000: "new-10000", 10_001: "new-10001"}


def test_sentinels_wait_for_the_retention_while_data_entries_go_with_their_sstables(table_uri):
    """With the default retention no sentinel flushed moments ago goes (a stale writer may still
    collide with it), while the data entries of collected SSTables go with them (nothing reads
    them, and no stale writer ever appends at their positions)."""
    fill(table_uri, 3)
    t = Table.open(table_uri)
    before = {s: wal_entries(t, s) for s in t.manifests.list_shards()}
    kinds = {
        s: {p: _WalMeta.parse(open(os.path.join(paths.wal_dir(t.uri, s), n), "rb").read()).sentinel for p, n in wal_names(t, s)}
        for s in before
    }
    from dataclasses import replace

    compact_and_collect(t.state, GarbageCollector(t.state, replace(NOW, wal_retention_seconds=600)))
    assert all(sstable_dirs(t, s) == [] for s in before)  # the SSTables went ...
    sentinels = {s: sorted(p for p, sentinel in kinds[s].items() if sentinel) for s in before}
    assert any(sentinels.values()) and any(len(v) > len(sentinels[s]) for s, v in before.items())
    assert {s: wal_entries(t, s) for s in before} == sentinels  # ... with their data entries; the sentinels wait
    assert live(table_uri) == live(table_uri, consistency="strong")


def test_a_stale_writer_acknowledges_into_a_collected_sentinel_unless_reopened(table_uri):
    """Why sentinels wait for ``wal_retention_seconds`` and pools reopen idle writers.

    A Lance writer learns it was fenced when its next WAL append collides with its successor's
    sentinel. With that sentinel collected, Lance acknowledges the append below the flushed
    position, where no replay reads it: the row is lost. memwal's pool, which reopens a writer
    idle longer than ``max_idle_seconds``, claims the shard back instead and the row survives."""
    import lance

    Table.create(table_uri, PEOPLE, ["id"], "unsharded").close()
    with Table.open(table_uri) as t:
        t.write(people([1]))
    shard = t.manifests.list_shards()[0]
    stale = lance.dataset(table_uri).mem_wal_writer(shard, durable_write=True)  # Lance's own handle
    stale.put(people([2]))
    pooled = Table.open(table_uri)
    pooled.writers.max_idle_seconds = 0.0  # what the zero retention below requires
    pooled.write(people([3]))  # claims: fences `stale`
    with Table.open(table_uri) as other:  # claims: fences `pooled`, sentinel at its next position
        other.write(people([4]))
    gc = GarbageCollector(t.state, NOW)
    compact_and_collect(t.state, gc)
    assert wal_files(table_uri, t)[shard] == 0  # every sentinel went
    stale.put(people([5], tag="lost-"))  # acknowledged by Lance ...
    pooled.write(people([6], tag="kept-"))  # reopened (idle), not written through the stale handle
    pooled.flush()
    rows = live(table_uri, consistency="strong")
    assert rows[6] == "kept-6" and {1, 2, 3, 4} <= set(rows)
    assert 5 not in rows  # ... and never replayed: the hazard the retention rules out
    try:
        stale.close()
    except OSError:
        pass  # fenced: it cannot flush


def test_gc_collects_a_shard_whose_rows_were_all_deleted(table_uri):
    """Compacting a delete that empties the base leaves Lance nothing to index, so its
    ``optimize_indices`` never records the catch-up; an empty base still counts as covered,
    or the shard's SSTables and their WAL would stay for as long as the table stays empty."""
    Table.create(table_uri, PEOPLE, ["id"], "unsharded").close()
    with Table.open(table_uri) as t:
        t.write(people([1, 2]))
        t.flush()
        t.delete({"id": [1, 2]})
        t.flush()
    shard = t.manifests.list_shards()[0]
    gc = GarbageCollector(t.state, NOW)
    compact_and_collect(t.state, gc)
    compact_and_collect(t.state, gc)
    assert t.state.dataset().count_rows() == 0
    assert sstable_dirs(t, shard) == [] and wal_files(table_uri, t)[shard] == 0
    assert live(table_uri, consistency="strong") == {}
    with Table.open(table_uri) as again:  # writes and compaction carry on as before
        again.write(people([3]))
        again.flush()
    compact_and_collect(t.state, gc)
    compact_and_collect(t.state, gc)
    assert live(table_uri) == {3: "v3"} and sstable_dirs(t, shard) == []


OPS = st.lists(
    st.tuples(
        st.sampled_from(["put", "put", "delete", "flush", "maintain"]),
        st.integers(0, 1),  # which of two writer pools (two processes, say)
        st.lists(st.integers(0, 9), min_size=1, max_size=4),
    ),
    min_size=1,
    max_size=16,
)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS)
@example(ops=[("put", 0, [0]), ("put", 0, [0]), ("delete", 0, [0])])  # leaves the base empty
def test_claims_writes_flushes_and_wal_gc_against_a_model(ops):
    """Two pools take the shards from each other (every use claims), maintenance compacts and
    collects every WAL entry it may: strong reads always equal the model, and at the end the
    WAL holds at most two files per shard, however many claims there were.

    What may remain is the unflushed tail, and after the final flushes that tail holds only
    fence sentinels: a pool whose ``flush()`` claims a shard it has nothing to flush for
    writes a sentinel that no later manifest covers (one per pool, so at most two). Every
    flushed entry goes once its SSTable is compacted, indexed and drained -- an SSTable whose
    compaction left the base empty included -- so files that grew with the claims, or with
    the generations flushed, would exceed the bound."""
    uri = os.path.join(tempfile.mkdtemp(prefix="memwal-walgc-"), "t")
    Table.create(uri, PEOPLE, ["id"], "bucket(id, 2)").close()
    pools = [Table.open(uri), Table.open(uri)]
    for p in pools:
        p.writers.max_idle_seconds = 0.0  # required by the zero WAL retention below
    state = TableState.load(uri)
    gc = GarbageCollector(state, NOW)
    model: dict[int, str] = {}
    try:
        for n, (op, w, keys) in enumerate(ops):
            if op == "put":
                pools[w].write(people(keys, tag=f"{n}-"))
                model.update({k: f"{n}-{k}" for k in keys})
            elif op == "delete":
                pools[w].delete({"id": keys})
                for k in keys:
                    model.pop(k, None)
            elif op == "flush":
                pools[w].flush()
            else:
                compact_and_collect(state, gc)
            assert live(uri, consistency="strong") == model, (n, op)
        for p in pools:
            p.flush()
        compact_and_collect(state, gc)
        compact_and_collect(state, gc)
        assert live(uri) == model
        assert all(count <= 2 for count in wal_files(uri, pools[0]).values()), wal_files(uri, pools[0])
    finally:
        for p in pools:
            p.close()
        shutil.rmtree(os.path.dirname(uri), ignore_errors=True)


def test_the_newest_old_enough_manifest_version_is_found_by_bisection(table_uri):
    """GC finds the newest manifest version at least ``wal_retention_seconds`` old with a few
    stats; whichever prefix of the versions is old enough, it agrees with reading them all."""
    with Table.create(table_uri, PEOPLE, ["id"], "unsharded") as t:
        for g in range(9):
            t.write(people([g]))
            t.flush()
    state = TableState.load(table_uri)
    (shard,) = state.manifests.list_shards()
    versions = state.manifests.retained_versions(shard)
    flushed = {v: state.manifests.read_shard(shard, v).replay_after_wal_entry_position for v in versions}
    assert len(set(flushed.values())) > 5  # the answer differs with the prefix
    gc = GarbageCollector(state, GcConfig(wal_retention_seconds=100))
    now = time.time()
    for old in range(len(versions) + 1):  # the first `old` versions are old enough
        for i, v in enumerate(versions):
            when = now - 1000 + i if i < old else now - 10 + i * 0.01
            os.utime(paths.shard_manifest_path(table_uri, shard, v), (when, when))
        expected = flushed[versions[old - 1]] if old else 0
        assert gc.wal_collectable_through(shard) == expected


def test_the_newest_base_version_old_enough_for_readers_is_found_by_bisection(table_uri, monkeypatch):
    """Whatever the reader grace, GC's safe base version is the newest version committed
    before the cutoff, as reading every version's commit time would say; None before the first."""
    import lance

    with Table.create(table_uri, PEOPLE, ["id"], "bucket(id, 2)") as t:
        for g in range(6):
            t.write(people(range(g * 3, g * 3 + 5), tag=f"g{g}-"))
            t.flush()
            Compactor(t.state).run_once()  # one base commit or more per generation
    versions = [(v["version"], v["timestamp"].timestamp()) for v in lance.dataset(table_uri).versions()]
    assert len(versions) > 6
    gc = GarbageCollector(TableState.load(table_uri), GcConfig(reader_grace_seconds=100))
    cutoffs = [versions[0][1] - 1] + [(a[1] + b[1]) / 2 for a, b in zip(versions, versions[1:])] + [versions[-1][1] + 1]
    for cutoff in cutoffs:
        monkeypatch.setattr(time, "time", lambda c=cutoff: c + 100)
        expected = max((v for v, ts in versions if ts <= cutoff), default=None)
        assert gc.safe_base_version() == expected
    # The oldest versions cleaned up (as base-version cleanup does): they no longer qualify.
    from datetime import timedelta

    monkeypatch.undo()
    kept = len(versions) // 2
    lance.dataset(table_uri).cleanup_old_versions(older_than=timedelta(seconds=0), retain_versions=kept, delete_unverified=True)
    left = versions[-kept:]
    assert [v for v, _ in left] == [v["version"] for v in lance.dataset(table_uri).versions()]
    for cutoff in cutoffs:
        monkeypatch.setattr(time, "time", lambda c=cutoff: c + 100)
        expected = max((v for v, ts in left if ts <= cutoff), default=None)
        assert gc.safe_base_version() == expected
