"""A missing WAL entry followed by later entries is corruption: reads, flushes, maintenance
and writers refuse the shard with a WalGapError naming the missing file, and nothing after
the gap is dropped."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers import PEOPLE, people

from memwal import readers, Table
from memwal.core import paths
from memwal.core.errors import TableDamagedError, WalGapError
from memwal.maintain.maintenance import Maintenance, MaintenanceConfig
from memwal.core.wal import first_missing

#: Writes three acknowledged rows (one WAL entry each) and dies without flushing.
CRASHING_WRITER = """
import os, sys
sys.path.insert(0, sys.argv[2])
from helpers import people
from memwal import Table
t = Table.open(sys.argv[1])
for i in range(3):
    t.write(people([i]))
os._exit(0)
"""


def stranded(uri: str) -> tuple[Table, str, int]:
    """A table whose one shard holds three unflushed WAL entries; (table, shard, first position)."""
    Table.create(uri, PEOPLE, ["id"], "unsharded").close()
    tests = os.path.dirname(__file__)
    subprocess.run([sys.executable, "-c", CRASHING_WRITER, uri, tests], check=True)
    t = Table.open(uri)
    (shard,) = t.manifests.list_shards()
    return t, shard, t.manifests.read_shard(shard).replay_after_wal_entry_position + 1


def remove_entry(uri: str, shard: str, position: int) -> str:
    path = paths.wal_entry_path(uri, shard, position)
    os.remove(path)
    return path


def test_first_missing():
    assert first_missing(0, []) is None
    assert first_missing(0, [1, 2, 3]) is None
    assert first_missing(4, [5, 6]) is None
    assert first_missing(0, [2, 3]) == 1
    assert first_missing(3, [4, 6]) == 5


def test_a_trailing_hole_is_no_gap(table_uri):
    t, shard, first = stranded(table_uri)
    remove_entry(table_uri, shard, first + 2)  # the last entry: as if never written
    rows = readers.open(table_uri, consistency="strong").scan().to_pylist()
    assert sorted(r["id"] for r in rows) == [0, 1]


def test_strong_reads_refuse_a_gap(table_uri):
    t, shard, first = stranded(table_uri)
    path = remove_entry(table_uri, shard, first)
    with pytest.raises(WalGapError) as e:
        readers.open(table_uri, consistency="strong").scan()
    assert path in str(e.value) and shard in str(e.value)
    assert isinstance(e.value, TableDamagedError)


def test_flush_stranded_and_maintenance_refuse_to_flush_past_a_gap(table_uri):
    t, shard, first = stranded(table_uri)
    path = remove_entry(table_uri, shard, first)
    with pytest.raises(WalGapError, match=path):
        t.flush_stranded(0)
    with pytest.raises(WalGapError, match=path):
        Maintenance(t.state, MaintenanceConfig(flush_stranded_after_seconds=0)).run_cycle()
    # Nothing was flushed past the gap: the entries after it are still there, unflushed.
    m = Table.open(table_uri).manifests.read_shard(shard)
    assert m.replay_after_wal_entry_position == first - 1
    assert os.path.exists(paths.wal_entry_path(table_uri, shard, first + 2))


def test_a_writer_never_claims_a_shard_with_a_gap(table_uri):
    t, shard, first = stranded(table_uri)
    path = remove_entry(table_uri, shard, first)
    epoch = t.manifests.read_shard(shard).writer_epoch
    with pytest.raises(WalGapError, match=path):
        t.write(people([10]))
    # refused before Lance's writer opened: no claim, the shard's epoch is unchanged
    t.state.manifests.clear_cache()
    assert t.manifests.read_shard(shard).writer_epoch == epoch


def test_the_cli_names_the_missing_file(table_uri):
    t, shard, first = stranded(table_uri)
    path = remove_entry(table_uri, shard, first)
    for args in (["scan", table_uri, "--consistency", "strong"], ["maintain", table_uri, "--once", "--flush-stranded-after", "0"]):
        p = subprocess.run([sys.executable, "-m", "memwal", *args], capture_output=True, text=True)
        assert p.returncode == 3, p.stderr
        assert "Traceback" not in p.stderr
        assert path in p.stderr.splitlines()[0]
    # the acknowledged writes after the gap are still on disk, for a restore to make whole
    assert os.path.exists(paths.wal_entry_path(table_uri, shard, first + 1))


def test_without_a_gap_everything_is_flushed(table_uri):
    t, shard, first = stranded(table_uri)
    assert t.flush_stranded(0) == [shard]
    assert sorted(r["id"] for r in readers.open(table_uri).scan().to_pylist()) == [0, 1, 2]
