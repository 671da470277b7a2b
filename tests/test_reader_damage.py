"""Readers on a shard whose listed SSTable is missing or does not decode.

Every read that reaches the damaged SSTable (strong and eventual scans and point lookups,
through the Python API and the CLI) raises :class:`TableDamagedError` naming the shard's
SSTable by its full path, never Lance's own error; the CLI exits 3 with one line and no
traceback. ``memwal repair`` then restores reads (tests/test_repair.py covers what it loses).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from helpers import PEOPLE, people

from memwal import readers, Table
from memwal.core import paths
from memwal.core.errors import TableDamagedError


def memwal(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memwal", *map(str, args)], capture_output=True, text=True)


def damaged_table(uri: str, kind: str) -> str:
    """Rows 1-2 in generation 1 (damaged), 3 in generation 2, 4 unflushed; returns the
    damaged SSTable's path."""
    with Table.create(uri, PEOPLE, ["id"], "unsharded") as t:
        t.write(people([1, 2]))
        t.flush()
        t.write(people([3]))
        t.flush()
        t.write(people([4]))
    shard = t.manifests.list_shards()[0]
    sst = min(t.manifests.read_shard(shard).sstables, key=lambda s: s.generation)
    path = paths.sstable_path(uri, shard, sst.path)
    if kind == "missing":
        shutil.rmtree(path)
    else:
        for root, _dirs, files in os.walk(path):
            for name in files:
                if name.endswith(".lance") and "data" in root:
                    with open(os.path.join(root, name), "r+b") as f:
                        f.write(os.urandom(os.path.getsize(os.path.join(root, name))))
    return path


@pytest.mark.parametrize("kind", ["missing", "corrupt"])
@pytest.mark.parametrize("consistency", ["strong", "eventual"])
def test_python_reads_raise_table_damaged_naming_the_sstable(table_uri, kind, consistency):
    path = damaged_table(table_uri, kind)
    reader = readers.open(table_uri, consistency=consistency)
    for read in (reader.scan, lambda: reader.get(1), lambda: reader.get_many([1, 3])):
        with pytest.raises(TableDamagedError) as info:
            read()
        assert path in str(info.value)


@pytest.mark.parametrize("kind", ["missing", "corrupt"])
def test_cli_reads_exit_3_naming_the_sstable_and_repair_restores_them(table_uri, kind):
    path = damaged_table(table_uri, kind)
    for args in (["scan", table_uri], ["scan", table_uri, "--consistency", "strong"], ["get", table_uri, "1"]):
        p = memwal(*args)
        assert p.returncode == 3, (args, p.stdout, p.stderr)
        assert path in p.stderr and "Traceback" not in p.stderr
        assert len([line for line in p.stderr.splitlines() if line.startswith("memwal: error:")]) == 1
    assert memwal("repair", table_uri).returncode == 0
    p = memwal("scan", table_uri, "--consistency", "strong", "--json")
    assert p.returncode == 0, p.stderr
    assert {3, 4} <= {json.loads(line)["id"] for line in p.stdout.splitlines()}
