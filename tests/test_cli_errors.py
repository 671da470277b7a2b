"""Bad inputs against every CLI command: the right exit code (2 input, 3 damaged), one
``memwal: error:`` line naming what is wrong, no traceback, and the acknowledged data
still readable afterwards. Plus the Python API raising the same memwal error classes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from memwal import readers, Table
from memwal.core import paths
from memwal.core.errors import InvalidArgumentError, PrimaryKeyError, TableDamagedError, UnknownColumnError
from memwal.core.metadata import WriterConfig

N = 50


def memwal(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memwal", *map(str, args)], capture_output=True, text=True)


def assert_refused(p: subprocess.CompletedProcess, code: int, *named: str) -> None:
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr
    errors = [line for line in p.stderr.splitlines() if line.startswith("memwal: error:")]
    assert len(errors) == 1, p.stderr
    for text in named:
        assert str(text) in errors[0], (text, errors[0])


def rows_of(uri) -> dict:
    p = memwal("scan", uri, "--json", "--consistency", "strong")
    assert p.returncode == 0, p.stderr
    return {r["id"]: r["name"] for r in map(json.loads, p.stdout.splitlines())}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A table holding N acknowledged rows, and the bad inputs."""
    d = tmp_path_factory.mktemp("cli_errors")
    good = d / "people.parquet"
    pq.write_table(pa.table({"id": pa.array(range(N), pa.int64()), "name": [f"n{i}" for i in range(N)]}), good)
    uri = d / "table"
    assert memwal("init", uri, "--schema-from", good, "--primary-key", "id", "--shard-by", "bucket(id,2)").returncode == 0
    assert memwal("put", uri, good).returncode == 0
    (d / "dir.parquet").mkdir()
    (d / "plain").write_text("not a table")
    (d / "rows.xlsx").write_text("id\n1\n")
    damaged = d / "damaged.parquet"
    pq.write_table(pa.table({"id": list(range(2000)), "name": [f"x{i}" for i in range(2000)]}), damaged, compression="snappy")
    data = bytearray(damaged.read_bytes())
    for i in range(8, len(data) // 2, 7):  # the body, not the footer
        data[i] ^= 0x5A
    damaged.write_bytes(bytes(data))
    # a bad row (a null key) in the second 65,536-row batch: nothing of the file may be written
    ids = pa.array([*range(1000, 1000 + 69_000), None, 99_999], pa.int64())
    pq.write_table(pa.table({"id": ids, "name": ["late"] * len(ids)}), d / "bad_second_batch.parquet")
    return d, uri


CASES = [
    # (name, args (with {t} the table, {d} the inputs' directory), exit code, what the message names)
    ("get unknown column", ["get", "{t}", "1", "--columns", "nope"], 2, ["nope"]),
    ("scan unknown column", ["scan", "{t}", "--columns", "id,nope"], 2, ["nope"]),
    ("get non-integer key", ["get", "{t}", "abc"], 2, ["abc"]),
    ("scan negative limit", ["scan", "{t}", "--limit", "-1"], 2, ["limit", "-1"]),
    ("scan two statements", ["scan", "{t}", "--where", "id = 1; DROP TABLE t"], 2, ["id = 1; DROP TABLE t"]),
    ("scan unknown filter column", ["scan", "{t}", "--where", "nope = 1"], 2, ["nope"]),
    ("put a directory", ["put", "{t}", "{d}/dir.parquet"], 2, ["dir.parquet", "directory"]),
    ("put a damaged parquet", ["put", "{t}", "{d}/damaged.parquet"], 2, ["damaged.parquet"]),
    ("put an unknown extension", ["put", "{t}", "{d}/rows.xlsx"], 2, ["rows.xlsx"]),
    ("put a bad row in the 2nd batch", ["put", "{t}", "{d}/bad_second_batch.parquet"], 2, ["null"]),
    ("delete a directory", ["delete", "{t}", "{d}/dir.parquet"], 2, ["dir.parquet"]),
    ("init on a plain file", ["init", "{d}/plain", "--schema-from", "{d}/rows.xlsx", "--primary-key", "id"], 2, ["plain"]),
    ("init negative memtable", ["init", "{d}/neg", "--schema-from", "{d}/damaged.parquet", "--primary-key", "id",
                                "--max-memtable-rows", "-5"], 2, ["max_memtable_rows", "-5"]),
    ("init zero memtable", ["init", "{d}/zero", "--schema-from", "{d}/damaged.parquet", "--primary-key", "id",
                            "--max-memtable-rows", "0"], 2, ["max_memtable_rows", "0"]),
    ("check no table", ["check", "{d}/plain"], 2, ["plain"]),
    ("repair no table", ["repair", "{d}/nowhere", "--dry-run"], 2, ["nowhere"]),
    ("init schema from a directory", ["init", "{d}/new", "--schema-from", "{d}/dir.parquet", "--primary-key", "id"], 2,
     ["dir.parquet"]),
    ("ingest real time available now", ["ingest", "--real-time", "--available-now", "--bootstrap", "127.0.0.1:1", "--topic", "t",
                                        "--table", "{t}", "--checkpoint", "{d}/ckpt"], 2, ["--real-time", "--available-now"]),
]


@pytest.mark.parametrize("name,args,code,named", CASES, ids=[c[0] for c in CASES])
def test_bad_input(env, name, args, code, named):
    d, uri = env
    p = memwal(*(a.format(t=uri, d=d) for a in args))
    assert_refused(p, code, *named)
    # nothing acknowledged was lost, nothing of a refused input was written
    assert rows_of(uri) == {i: f"n{i}" for i in range(N)}
    for refused in ("neg", "zero", "new"):
        assert not (d / refused).exists()


def test_damaged_shard_manifest_names_the_file(tmp_path):
    uri = tmp_path / "t"
    t = Table.create(str(uri), pa.schema([("id", pa.int64()), ("name", pa.string())]), ["id"], "unsharded")
    t.write(pa.table({"id": [1, 2], "name": ["a", "b"]}))
    t.close()
    (shard,) = t.manifests.list_shards()
    version = t.manifests.latest_version(shard)
    path = paths.shard_manifest_path(str(uri), shard, version)
    with open(path, "wb") as f:
        f.write(os.urandom(300))
    for args in (["status", uri], ["get", uri, "1"], ["scan", uri], ["put", uri, tmp_path / "none.parquet"],
                 ["maintain", uri, "--once"]):
        if args[0] == "put":
            pq.write_table(pa.table({"id": [3], "name": ["c"]}), args[2])
        assert_refused(memwal(*args), 3, path)
    with pytest.raises(TableDamagedError, match=path):
        readers.open(str(uri)).scan()
    with open(path, "wb"):
        pass  # a 0-byte manifest
    with pytest.raises(TableDamagedError, match=path):
        readers.open(str(uri)).scan()


def test_python_api_raises_memwal_errors(tmp_path):
    uri = str(tmp_path / "t")
    t = Table.create(uri, pa.schema([("id", pa.int64()), ("name", pa.string())]), ["id"], "unsharded")
    t.write(pa.table({"id": [1], "name": ["a"]}))
    t.close()
    r = readers.open(uri)
    with pytest.raises(PrimaryKeyError):
        r.get("abc")
    with pytest.raises(PrimaryKeyError):
        r.get_many(["x"])
    assert r.get(1) == {"id": 1, "name": "a"}
    with pytest.raises(UnknownColumnError):
        r.get(1, columns=["nope"])
    with pytest.raises(InvalidArgumentError):
        r.scan(limit=-1)
    with pytest.raises(InvalidArgumentError):
        r.count(where="id = 1; DROP TABLE t")
    for bad in (0, -5):
        with pytest.raises(InvalidArgumentError):
            WriterConfig(max_memtable_rows=bad)
    assert not os.path.exists(tmp_path / "never")
    with pytest.raises(InvalidArgumentError):
        Table.create(str(tmp_path / "never"), pa.schema([("id", pa.int64())]), ["id"], writer=WriterConfig(max_memtable_rows=0))


def test_put_says_how_many_rows_were_applied_when_writing_fails(tmp_path, monkeypatch, capsys):
    from memwal import cli

    uri = str(tmp_path / "t")
    Table.create(uri, pa.schema([("id", pa.int64()), ("name", pa.string())]), ["id"], "unsharded").close()
    src = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"id": pa.array(range(70_000), pa.int64()), "name": ["x"] * 70_000}), src)
    real_write, calls = Table.write, []

    def failing_write(self, data, **kw):
        calls.append(data.num_rows)
        if len(calls) == 2:
            raise OSError("the disk is full")
        return real_write(self, data, **kw)

    monkeypatch.setattr(Table, "write", failing_write)
    assert cli.main(["put", uri, str(src)]) == 3
    err = capsys.readouterr().err
    assert f"65536 of 70000 rows of {src} were applied" in err and "the disk is full" in err
    assert "Traceback" not in err
    monkeypatch.setattr(Table, "write", real_write)
    assert readers.open(uri).count() == 65_536
