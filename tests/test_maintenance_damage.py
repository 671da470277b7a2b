"""A damaged file in one shard does not stop maintenance of the others: the cycle skips that
shard, names it and the file in its report, compacts and collects the rest, and only then
fails (``memwal maintain --once`` exits 3)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys

import pytest
from helpers import PEOPLE, people

from memwal import Table
from memwal.core import paths
from memwal.core.errors import TableDamagedError, WalGapError
from memwal.maintain.gc import GcConfig
from memwal.maintain.maintenance import Maintenance, MaintenanceConfig
from memwal.maintain.metrics import MaintenanceMetrics
from memwal.core.state import TableState

NOW = MaintenanceConfig(
    flush_stranded_after_seconds=0,
    views=False,
    gc_config=GcConfig(reader_grace_seconds=0, drain_interval_seconds=0, base_version_retention_seconds=0),
)

#: Writes acknowledged rows (one WAL entry each, to both shards) and dies without flushing.
CRASHING_WRITER = """
import os, sys
sys.path.insert(0, sys.argv[2])
from helpers import people
from memwal import Table
t = Table.open(sys.argv[1])
for i in range(3):
    t.write(people(range(1000 + 10 * i, 1010 + 10 * i)))
os._exit(0)
"""


def damaged_table(uri: str, kind: str) -> tuple[str, str]:
    """A two-shard table with flushed, uncompacted SSTables in both shards and one shard
    damaged; returns (damaged shard, the damaged file)."""
    Table.create(uri, PEOPLE, ["id"], "bucket(id, 2)").close()
    with Table.open(uri) as t:
        for g in range(2):
            t.write(people(range(g * 40, g * 40 + 60), tag=f"g{g}-"))
            t.flush()
    if kind == "wal_gap":
        subprocess.run([sys.executable, "-c", CRASHING_WRITER, uri, os.path.dirname(__file__)], check=True)
    state = TableState.load(uri)
    bad, good = sorted(state.manifests.list_shards())
    m = state.manifests.read_shard(bad)
    sst = paths.sstable_path(uri, bad, m.sstables[0].path)
    if kind == "manifest":
        path = paths.shard_manifest_path(uri, bad, m.version)
        with open(path, "wb") as f:
            f.write(os.urandom(300))
    elif kind == "sstable_missing":
        path = sst
        shutil.rmtree(path)
    elif kind == "sstable_corrupt":
        path = sst
        for data in glob.glob(os.path.join(sst, "data", "*")):
            with open(data, "wb") as f:
                f.write(os.urandom(os.path.getsize(data)))
    elif kind == "wal_gap":
        path = paths.wal_entry_path(uri, bad, m.replay_after_wal_entry_position + 1)
        os.remove(path)
    else:
        raise AssertionError(kind)
    return bad, path


def shard_state(uri: str, shard: str) -> tuple[int, int, list[str]]:
    """(compacted generation, SSTables listed, SSTable directories on disk) of a healthy shard."""
    state = TableState.load(uri)
    index = state.manifests.mem_wal_index(state.dataset().version)
    m = state.manifests.read_shard(shard)
    dirs = [n for n in os.listdir(paths.shard_dir(uri, shard)) if paths.sstable_generation(n) is not None]
    return (index.compacted_generation(shard) if index else 0), len(m.sstables), dirs


KINDS = ["manifest", "sstable_missing", "sstable_corrupt", "wal_gap"]


@pytest.mark.parametrize("kind", KINDS)
def test_maintenance_skips_the_damaged_shard_and_maintains_the_others(table_uri, kind):
    bad, path = damaged_table(table_uri, kind)
    (good,) = [s for s in TableState.load(table_uri).manifests.list_shards() if s != bad]
    service = Maintenance(table_uri, NOW)
    with pytest.raises(WalGapError if kind == "wal_gap" else TableDamagedError, match=path):
        service.run_cycle()
    report = service.last_report
    assert report is not None and [d.shard_id for d in report.damaged_shards] == [bad]
    assert path in report.damaged_shards[0].error
    assert report.damaged_shards[0].stage == ("flush" if kind in ("wal_gap", "manifest") else "compaction")
    # the healthy shard was compacted and its SSTables collected
    compacted, listed, dirs = shard_state(table_uri, good)
    assert compacted >= 2 and listed == 0 and dirs == []
    assert report.compaction_commits >= 1 and report.sstables_removed >= 2
    if kind == "wal_gap":
        # only the flush stops at a gap: the shard's flushed SSTables were compacted too
        assert shard_state(table_uri, bad)[0] >= 2
    # the published record names the shard for `memwal status`
    published = MaintenanceMetrics.from_json(open(paths.maintenance_metrics(table_uri), "rb").read())
    assert published.last_cycle.damaged_shards == report.damaged_shards and published.last_cycle.error is None


@pytest.mark.parametrize("kind", KINDS)
def test_maintain_once_exits_3_naming_shard_and_file_after_doing_the_rest(table_uri, kind):
    bad, path = damaged_table(table_uri, kind)
    (good,) = [s for s in TableState.load(table_uri).manifests.list_shards() if s != bad]
    p = subprocess.run(
        [sys.executable, "-m", "memwal", "maintain", table_uri, "--once", "--flush-stranded-after", "0",
         "--reader-grace", "0", "--drain-interval", "0", "--base-retention", "0"],
        capture_output=True, text=True,
    )
    assert p.returncode == 3, p.stderr
    assert "Traceback" not in p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("memwal: error:")]
    assert len(lines) == 1 and bad in lines[0] and path in lines[0]
    assert "compacted" in p.stdout
    compacted, listed, dirs = shard_state(table_uri, good)
    assert compacted >= 2 and listed == 0 and dirs == []


def test_a_service_keeps_maintaining_the_healthy_shards_cycle_after_cycle(table_uri):
    bad, path = damaged_table(table_uri, "sstable_missing")
    (good,) = [s for s in TableState.load(table_uri).manifests.list_shards() if s != bad]
    service = Maintenance(table_uri, NOW)
    service.config = MaintenanceConfig(**{**NOW.__dict__, "interval_seconds": 0.01})
    service.run_forever(cycles=2)
    # damaged shards do not make cycles fail (no backoff): they are reported and skipped
    assert service.totals.cycles == 2 and service.totals.failures == 0
    assert shard_state(table_uri, good)[1] == 0
    assert [d.shard_id for d in service.last_report.damaged_shards] == [bad]
