"""Garbage collection: what it removes, what it must keep, and GC during live ingestion."""

from __future__ import annotations

import os
import threading
import time

import pyarrow as pa
from helpers import PEOPLE, people

from memwal import Table, paths, readers
from memwal.compactor import Compactor
from memwal.state import TableState
from memwal.gc import GarbageCollector, GcConfig
from memwal.indexes import IndexMaintainer
from memwal.maintenance import Maintenance, MaintenanceConfig

NOW = GcConfig(
    reader_grace_seconds=0,
    manifest_retention_seconds=0,
    manifest_versions_kept=3,
    orphan_grace_seconds=3600,
    base_version_retention_seconds=0,
    drain_interval_seconds=0,
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
        # WAL: only fence sentinels (a writer claim each flush) remain
        left = wal_entries(t, r.shard_id)
        assert len(left) < len(before[r.shard_id][1])
        for pos in left:
            with pa.ipc.open_stream(open(paths.wal_entry_path(table_uri, r.shard_id, pos), "rb").read()) as rd:
                assert rd.schema.metadata.get(b"fence_sentinel") == b"true"
        # manifests: only the newest few versions are kept
        assert len(t.manifests.retained_versions(r.shard_id)) == NOW.manifest_versions_kept
    assert live(table_uri) == model
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
