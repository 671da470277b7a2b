"""``memwal check`` and ``memwal repair`` against each kind of damage.

A writer process writes acknowledged rows to two shards (two flushed generations each,
then single-row WAL entries left unflushed) and is killed. One file of one shard is then
damaged. For each kind: ``check`` exits 3 naming the file; ``repair --dry-run`` changes
nothing; ``repair`` exits 0; ``check`` is clean afterwards; every acknowledged row not
reported as possibly lost reads back (strong and, after a flush, eventual reads); the
report's lost keys are only keys of the damaged file; and a new ``put`` works.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from memwal import cli, Table
from memwal.core import paths
from memwal.maintain.check import check_table
from memwal.core.errors import TableDamagedError
from memwal.maintain.repair import repair_table
from memwal.core.state import TableState

#: The writer: rows 0-39 flushed (gen 1), 40-59 flushed (gen 2), then 60-71 as one WAL
#: entry per row, unflushed; killed. Prints, per shard, what holds which ids.
WRITER = r"""
import json, os, sys
import pyarrow as pa
import lance
from memwal import Table
from memwal.core import paths
from memwal.core.wal import WalEntry, wal_positions

uri = sys.argv[1]
t = Table.create(uri, pa.schema([("id", pa.int64()), ("name", pa.string())]), ["id"], "bucket(id,2)")
rows = lambda ids: pa.table({"id": pa.array(ids, pa.int64()), "name": [f"n{i}" for i in ids]})
t.write(rows(range(0, 40)))
t.flush()
t.write(rows(range(40, 60)))
t.flush()
for i in range(60, 72):
    t.write(rows([i]))
out = {}
for shard in sorted(t.manifests.list_shards()):
    m = t.manifests.read_shard(shard)
    wal = {}
    for pos in wal_positions(t.io, uri, shard, m.replay_after_wal_entry_position):
        e = WalEntry.parse(pos, t.io.read(paths.wal_entry_path(uri, shard, pos)))
        wal[pos] = [] if e.rows is None else e.rows.column("id").to_pylist()
    ssts = {s.generation: [paths.sstable_path(uri, shard, s.path),
                           lance.dataset(paths.sstable_path(uri, shard, s.path)).to_table().column("id").to_pylist()]
            for s in m.sstables}
    out[shard] = {"manifest": paths.shard_manifest_path(uri, shard, m.version), "wal": wal, "sstables": ssts}
print(json.dumps(out))
sys.stdout.flush()
os._exit(0)  # killed: the WAL entries stay unflushed
"""

ACKED = {i: f"n{i}" for i in range(72)}


def memwal(*args) -> subprocess.CompletedProcess:
    """The CLI, run in this process: a fresh interpreter per call made this file the suite's
    slowest (tests/test_cli_errors.py runs every command as a real subprocess)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main([str(a) for a in args])
        except SystemExit as e:  # argparse's usage errors
            code = e.code if isinstance(e.code, int) else 2
    return subprocess.CompletedProcess(["memwal", *map(str, args)], code, out.getvalue(), err.getvalue())


def written(uri: str) -> dict:
    p = subprocess.run([sys.executable, "-c", WRITER, uri], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def rows_of(uri: str, consistency: str = "strong") -> dict:
    p = memwal("scan", uri, "--json", "--consistency", consistency)
    assert p.returncode == 0, p.stderr
    return {r["id"]: r["name"] for r in map(json.loads, p.stdout.splitlines())}


def _overwrite_lance_files(directory: str) -> None:
    for root, _dirs, files in os.walk(directory):
        for name in files:
            if name.endswith(".lance") and "data" in root:
                path = os.path.join(root, name)
                with open(path, "wb") as f:
                    f.write(os.urandom(os.path.getsize(path)))


def damage(kind: str, info: dict) -> tuple[str, set[int]]:
    """Damage one file of the first shard with unflushed entries; returns (the file, the ids
    that may be lost with it)."""
    shard = next(s for s, v in info.items() if sum(1 for ids in v["wal"].values() if ids) >= 3)
    v = info[shard]
    data_positions = sorted(int(p) for p, ids in v["wal"].items() if ids)
    middle = data_positions[len(data_positions) // 2]
    after = {i for p, ids in v["wal"].items() if int(p) >= middle for i in ids}
    if kind in ("manifest-random", "manifest-empty"):
        with open(v["manifest"], "wb") as f:
            f.write(os.urandom(300) if kind == "manifest-random" else b"")
        return v["manifest"], set()
    wal_path = os.path.join(os.path.dirname(v["manifest"]), "..", "wal", paths.bitrev64(middle) + paths.WAL_SUFFIX)
    wal_path = os.path.normpath(wal_path)
    if kind == "wal-corrupt":
        with open(wal_path, "r+b") as f:
            f.write(os.urandom(64))
        return wal_path, after
    if kind == "wal-gap":
        os.remove(wal_path)
        return wal_path, after
    path, ids = v["sstables"]["2"]
    if kind == "sstable-missing":
        shutil.rmtree(path)
    else:
        _overwrite_lance_files(path)
    # generation 2 held these ids; the newer values of none of them exist elsewhere
    return path, set(ids)


KINDS = ["manifest-random", "manifest-empty", "wal-corrupt", "wal-gap", "sstable-missing", "sstable-corrupt"]


@pytest.mark.parametrize("kind", KINDS)
def test_check_and_repair(tmp_path, kind):
    uri = str(tmp_path / "t")
    info = written(uri)
    assert memwal("check", uri).returncode == 0
    bad, may_lose = damage(kind, info)

    p = memwal("check", uri)
    assert p.returncode == 3, (p.stdout, p.stderr)
    assert bad in p.stdout
    doc = json.loads(memwal("check", uri, "--json").stdout)
    assert not doc["clean"] and bad in {d["path"] for s in doc["shards"] for d in s["damage"]}

    before = sorted(os.path.relpath(os.path.join(r, f), uri) for r, _, fs in os.walk(uri) for f in fs)
    p = memwal("repair", uri, "--dry-run", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["actions"]
    p = memwal("repair", uri, "--dry-run")
    assert p.returncode == 0 and bad in p.stdout, p.stderr
    assert sorted(os.path.relpath(os.path.join(r, f), uri) for r, _, fs in os.walk(uri) for f in fs) == before
    assert memwal("check", uri).returncode == 3

    p = memwal("repair", uri, "--json")
    assert p.returncode == 0, (p.stdout, p.stderr)
    report = json.loads(p.stdout)
    assert report["ok"] and report["after"]["clean"]
    lost_files = {x["path"] for x in report["possibly_lost"]}
    listed = {k["id"] for x in report["possibly_lost"] for k in (x["keys"] or [])}
    assert listed <= may_lose
    if may_lose:
        assert bad in lost_files  # the damaged file itself is reported
    else:
        assert not report["possibly_lost"]
    if kind.startswith("sstable"):
        # the SSTable's keys, read from it or from the WAL entries it was flushed from
        assert listed == may_lose
    assert memwal("check", uri).returncode == 0

    # every acknowledged row not reported as possibly lost still reads
    got = rows_of(uri)
    for i, name in ACKED.items():
        if i not in may_lose:
            assert got.get(i) == name, i
    # a quarantined file keeps its path relative to the table; only a repaired manifest
    # version may take the place of a quarantined one
    rewritten = {a["path"] for a in report["actions"] if a["kind"] == "manifest"}
    for a in report["actions"]:
        if a["kind"] == "quarantine":
            assert os.path.exists(a["to"])
            assert not os.path.exists(a["path"]) or a["path"] in rewritten

    # writes work, and so do eventual reads once what the repair left is flushed
    pq.write_table(pa.table({"id": pa.array([1000, 1001], pa.int64()), "name": ["new", "new"]}), tmp_path / "new.parquet")
    p = memwal("put", uri, tmp_path / "new.parquet")
    assert p.returncode == 0, p.stderr
    Table.open(uri).flush_stranded()  # the killed writer's lease is still live: maintenance would wait for it
    assert memwal("check", uri).returncode == 0
    got = rows_of(uri, "eventual")
    assert got[1000] == "new" and got[1001] == "new"
    for i, name in ACKED.items():
        if i not in may_lose:
            assert got.get(i) == name, i


def test_repair_of_a_clean_table_does_nothing(tmp_path):
    uri = str(tmp_path / "t")
    written(uri)
    report = repair_table(TableState.load(uri))
    assert report.before.clean and report.ok and not report.actions and not report.possibly_lost
    assert not os.path.exists(paths.quarantine_dir(uri, "x").rsplit("/", 1)[0])
    assert rows_of(uri) == ACKED


def test_put_into_a_shard_with_an_unreadable_wal_entry_names_it(tmp_path):
    uri = str(tmp_path / "t")
    info = written(uri)
    bad, _ = damage("wal-corrupt", info)
    pq.write_table(pa.table({"id": pa.array(range(100, 110), pa.int64()), "name": ["x"] * 10}), tmp_path / "p.parquet")
    p = memwal("put", uri, tmp_path / "p.parquet")
    assert p.returncode == 3, p.stderr
    assert "Traceback" not in p.stderr
    (line,) = [x for x in p.stderr.splitlines() if x.startswith("memwal: error:")]
    assert bad in line and "memwal repair" in line
    t = Table.open(uri)
    with pytest.raises(TableDamagedError, match=bad):
        t.write(pa.table({"id": pa.array(range(100, 110), pa.int64()), "name": ["x"] * 10}))
    assert not check_table(t.state).clean


def test_damaged_older_manifest_version_is_quarantined_without_loss(tmp_path):
    uri = str(tmp_path / "t")
    info = written(uri)
    shard = sorted(info)[0]
    state = TableState.load(uri)
    oldest = state.manifests.retained_versions(shard)[0]
    path = paths.shard_manifest_path(uri, shard, oldest)
    with open(path, "wb") as f:
        f.write(b"\x00garbage")
    report = check_table(state)
    assert [d.path for d in report.damage] == [path]
    fixed = repair_table(state)
    assert fixed.ok and not fixed.possibly_lost and fixed.after is not None and fixed.after.clean
    assert rows_of(uri) == ACKED


def test_shard_directory_gone_after_compaction(tmp_path):
    """The MemWAL index records compaction of a shard whose directory is gone: check names
    it; repair gives the shard a first manifest numbered above the compacted generation, so
    a new write to it is read (a manifest from generation 1 would be skipped as compacted)."""
    uri = str(tmp_path / "t")
    info = written(uri)
    # the killed writer's lease is still live, so maintenance would leave its WAL alone
    Table.open(uri).flush_stranded()
    p = memwal("maintain", uri, "--once", "--no-gc")
    assert p.returncode == 0, p.stderr
    state = TableState.load(uri)
    index = state.manifests.mem_wal_index(state.dataset().version)
    shard = sorted(info)[0]
    assert index.compacted_generation(shard) == state.manifests.read_shard(shard).current_generation - 1
    shutil.rmtree(paths.shard_dir(uri, shard))

    p = memwal("check", uri)
    assert p.returncode == 3 and shard in p.stdout
    report = repair_table(TableState.load(uri))
    assert report.ok, report
    assert [lost.shard_id for lost in report.possibly_lost] == [shard]
    assert rows_of(uri) == ACKED  # everything was compacted
    t = Table.open(uri)
    new = pa.table({"id": pa.array(range(200, 240), pa.int64()), "name": ["new"] * 40})
    t.write(new)
    t.flush()
    assert check_table(t.state).clean
    got = rows_of(uri, "eventual")
    assert all(got[i] == "new" for i in range(200, 240))
    assert all(got[i] == name for i, name in ACKED.items())
