"""The memwal CLI, run as a real process, against values computed from the input files alone."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from memwal.core import paths


def memwal(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-m", "memwal", *args], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"memwal {' '.join(args)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p


@pytest.fixture
def inputs(tmp_path):
    """A Parquet file of 200 people, a CSV of updates and new rows, a JSON-lines file of deletes."""
    people = tmp_path / "people.parquet"
    pq.write_table(
        pa.table(
            {
                "id": pa.array(range(200), pa.int64()),
                "name": [f"person {i}" for i in range(200)],
                "score": [i * 1.5 for i in range(200)],
                "city": [["Lisbon", "Oslo", "Quito"][i % 3] for i in range(200)],
            }
        ),
        people,
    )
    updates = tmp_path / "updates.csv"
    with open(updates, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "name", "score", "city"])
        for i in list(range(0, 200, 7)) + list(range(200, 230)):
            w.writerow([i, f"updated {i}", "" if i % 2 else i * 10.0, "Nairobi"])
    deletes = tmp_path / "deletes.jsonl"
    with open(deletes, "w") as f:
        for i in list(range(3, 200, 11)) + [999]:
            f.write(json.dumps({"id": i}) + "\n")
    return people, updates, deletes


def model_from_files(people, updates, deletes) -> dict[int, dict]:
    """The expected table, read with the standard library and pyarrow's Parquet reader only."""
    model = {r["id"]: r for r in pq.read_table(people).to_pylist()}
    with open(updates, newline="") as f:
        for r in csv.DictReader(f):
            i = int(r["id"])
            model[i] = {"id": i, "name": r["name"], "score": float(r["score"]) if r["score"] else None, "city": r["city"]}
    with open(deletes) as f:
        for line in f:
            model.pop(json.loads(line)["id"], None)
    return model


def test_cli_round_trip_on_four_shards(tmp_path, inputs):
    people, updates, deletes = inputs
    uri = str(tmp_path / "table")
    memwal("init", uri, "--schema-from", str(people), "--primary-key", "id", "--shard-by", "bucket(id,4)")
    assert "upserted 200 rows" in memwal("put", uri, str(people)).stdout
    n_updates = len(updates.read_text().splitlines()) - 1
    n_deletes = len(deletes.read_text().splitlines())
    assert f"upserted {n_updates} rows" in memwal("put", uri, str(updates)).stdout
    assert f"deleted {n_deletes} key(s)" in memwal("delete", uri, str(deletes)).stdout
    model = model_from_files(people, updates, deletes)

    scanned = [json.loads(line) for line in memwal("scan", uri, "--json").stdout.splitlines()]
    assert {r["id"]: r for r in scanned} == model
    assert len(scanned) == len(model)

    where = [json.loads(x) for x in memwal("scan", uri, "--json", "--where", "city = 'Nairobi' AND score > 500", "--columns", "id,score").stdout.splitlines()]
    assert sorted(r["id"] for r in where) == sorted(
        i for i, r in model.items() if r["city"] == "Nairobi" and r["score"] is not None and r["score"] > 500
    )
    assert all(set(r) == {"id", "score"} for r in where)

    assert json.loads(memwal("get", uri, "7", "--json").stdout) == model[7]
    assert json.loads(memwal("get", uri, "215", "--json").stdout) == model[215]
    missing = memwal("get", uri, "3", check=False)  # deleted
    assert missing.returncode == 1 and "not found" in missing.stderr
    assert memwal("get", uri, "12345", check=False).returncode == 1
    assert "person 1" in memwal("get", uri, "1").stdout  # the human-readable form

    status = json.loads(memwal("status", uri, "--json").stdout)
    assert status["num_shards"] == 4 and len(status["shards"]) == 4
    for shard in status["shards"]:
        shard_dir = paths.shard_dir(uri, shard["shard_id"])
        on_disk = [d for d in os.listdir(shard_dir) if paths.sstable_generation(d) is not None]
        # put, put and delete each flushed every shard they touched: one SSTable per command
        assert len(shard["sstables"]) == len(on_disk) == 3
        assert shard["pending_sstables"] == 3 and shard["compacted_generation"] == 0
        wal_entries = os.listdir(paths.wal_dir(uri, shard["shard_id"]))
        assert shard["wal_tail_position"] == len(wal_entries)
        assert shard["writer_epoch"] == 3
    assert sorted(s["shard_values"]["bucket"] for s in status["shards"]) == [0, 1, 2, 3]
    text = memwal("status", uri).stdout
    assert "bucket(id, 4)" in text and text.count("bucket=") == 4

    out = memwal("maintain", uri, "--once", "--reader-grace", "0", "--base-retention", "0").stdout
    assert "compacted 12 generation(s)" in out
    status = json.loads(memwal("status", uri, "--json").stdout)
    assert all(s["compacted_generation"] == 3 and s["pending_sstables"] == 0 for s in status["shards"])
    assert status["base_rows"] == len(model)
    assert status["extra"]["maintenance"]["last_cycle"]["rows_compacted"] > 0
    assert {r["id"]: r for r in map(json.loads, memwal("scan", uri, "--json").stdout.splitlines())} == model


def test_cli_errors_are_clear(tmp_path, inputs):
    people, updates, _ = inputs
    uri = str(tmp_path / "table")
    bad = memwal("init", uri, "--schema-from", str(people), "--primary-key", "nope", check=False)
    assert bad.returncode == 2 and "'nope'" in bad.stderr
    bad = memwal("init", uri, "--schema-from", str(people), "--primary-key", "id", "--shard-by", "bucket(city,4)", check=False)
    assert bad.returncode == 2 and "not part of the primary key" in bad.stderr
    memwal("init", uri, "--schema-from", str(people), "--primary-key", "id", "--shard-by", "unsharded")
    wrong = tmp_path / "wrong.csv"
    wrong.write_text("id,name,score\n1,a,not-a-number\n")
    bad = memwal("put", uri, str(wrong), check=False)
    assert bad.returncode == 2 and "'score'" in bad.stderr
    bad = memwal("get", uri, "abc", check=False)
    assert bad.returncode == 2 and "'abc' is not a valid value" in bad.stderr
    bad = memwal("scan", str(tmp_path / "nothing"), check=False)
    assert bad.returncode == 2 and "no table" in bad.stderr


def test_cli_init_from_jsonl_and_arrow_and_composite_keys(tmp_path):
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps({"region": r, "id": i, "v": i * 2}) + "\n" for r in ("eu", "us") for i in range(5)))
    uri = str(tmp_path / "t")
    memwal("init", uri, "--schema-from", str(src), "--primary-key", "region", "--primary-key", "id", "--shard-by", "identity(region)")
    memwal("put", uri, str(src))
    assert json.loads(memwal("get", uri, "region=us,id=3", "--json").stdout) == {"region": "us", "id": 3, "v": 6}
    assert json.loads(memwal("get", uri, '{"region": "eu", "id": 4}', "--json").stdout)["v"] == 8
    arrow = tmp_path / "rows.arrow"
    with pa.ipc.new_file(arrow, pa.schema([("k", pa.string()), ("x", pa.float32())])) as w:
        w.write_table(pa.table({"k": ["a"], "x": pa.array([1.0], pa.float32())}))
    memwal("init", str(tmp_path / "t2"), "--schema-from", str(arrow), "--primary-key", "k")
    memwal("put", str(tmp_path / "t2"), str(arrow))
    assert json.loads(memwal("get", str(tmp_path / "t2"), "a", "--json").stdout) == {"k": "a", "x": 1.0}


def test_help_everywhere():
    for cmd in ([], ["init"], ["put"], ["delete"], ["get"], ["scan"], ["status"], ["maintain"]):
        p = memwal(*cmd, "--help")
        assert "usage: memwal" in p.stdout


def test_cli_internal_errors_are_one_line_with_a_debug_hint(tmp_path):
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps({"id": i, "v": i}) + "\n" for i in range(3)))
    uri = str(tmp_path / "t")
    memwal("init", uri, "--schema-from", str(src), "--primary-key", "id")
    memwal("put", uri, str(src))
    # A damaged table (a shard manifest of random bytes) is not the user's input: exit 3, one
    # line naming the file, and a hint to re-run with --debug.
    (shard,) = os.listdir(os.path.join(uri, "_mem_wal"))
    manifest_dir = os.path.join(uri, "_mem_wal", shard, "manifest")
    newest = max((n for n in os.listdir(manifest_dir) if n.endswith(".binpb")), key=lambda n: int(n[:-6][::-1], 2))
    with open(os.path.join(manifest_dir, newest), "wb") as f:
        f.write(os.urandom(64))

    bad = memwal("scan", uri, check=False)
    assert bad.returncode == 3
    lines = bad.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("memwal: error:") and newest in lines[0], lines
    assert lines[1] == "memwal: re-run with --debug to see the traceback"
    debug = memwal("--debug", "scan", uri, check=False)
    assert debug.returncode == 3 and "Traceback (most recent call last)" in debug.stderr
    assert debug.stderr.splitlines()[-1].startswith("memwal: error:")

    usage = memwal("get", uri, "{not json", check=False)  # the user's input: exit 2, no hint
    assert usage.returncode == 2 and len(usage.stderr.splitlines()) == 1
    assert usage.stderr.startswith("memwal: error: key '{not json' is not a valid JSON object")


def test_cli_status_reports_metrics_of_a_newer_format_instead_of_misreading_them(tmp_path):
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps({"id": i, "v": i}) + "\n" for i in range(3)))
    uri = str(tmp_path / "t")
    memwal("init", uri, "--schema-from", str(src), "--primary-key", "id")
    memwal("put", uri, str(src))
    memwal("maintain", uri, "--once", "--reader-grace", "0", "--base-retention", "0")
    metrics_file = paths.maintenance_metrics(uri)
    written = json.loads(open(metrics_file).read())
    assert written["format_version"] == 1 and written["totals"]["cycles"] == 1
    assert "1 cycles (0 failed)" in memwal("status", uri).stdout

    written["format_version"] = 99
    written["totals"] = {"renamed": 1}
    with open(metrics_file, "w") as f:
        json.dump(written, f)
    text = memwal("status", uri).stdout
    assert "format version 99" in text and "upgrade memwal" in text and "cycles" not in text
    status = json.loads(memwal("status", uri, "--json").stdout)
    assert "format version 99" in status["extra"]["maintenance"]["unreadable"]


def test_maintain_lowers_its_own_cpu_priority_when_asked(tmp_path):
    """``memwal maintain --nice N``: the running service's niceness is the caller's + N (read
    from /proc, the kernel's own account of the process); a value outside 0-19 is refused."""
    import time

    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps({"id": i, "v": i}) + "\n" for i in range(3)))
    uri = str(tmp_path / "t")
    memwal("init", uri, "--schema-from", str(src), "--primary-key", "id")
    service = subprocess.Popen([sys.executable, "-m", "memwal", "maintain", uri, "--interval", "0.2", "--nice", "7"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        niceness, want = None, min(19, os.nice(0) + 7)  # the kernel caps niceness at 19
        while time.monotonic() < deadline and service.poll() is None:
            with open(f"/proc/{service.pid}/stat") as f:
                niceness = int(f.read().rsplit(")", 1)[1].split()[16])
            if niceness == want:
                break
            time.sleep(0.1)
        assert service.poll() is None, service.stderr.read() if service.stderr else ""
        assert niceness == want
    finally:
        service.terminate()
        service.wait(30)
    assert memwal("maintain", uri, "--once", "--nice", "20", check=False).returncode == 2


def test_get_and_scan_read_without_a_table_handle(tmp_path, monkeypatch, capsys):
    """Reading commands open a reader on the table's state: no ``Table``, which holds a writer
    pool (and would flush it when closed)."""
    from memwal import cli, Table

    uri = str(tmp_path / "t")
    with Table.create(uri, pa.schema([("id", pa.int64()), ("name", pa.string())]), ["id"], "bucket(id, 2)") as t:
        t.write(pa.table({"id": pa.array([1, 2], pa.int64()), "name": ["ada", "bob"]}))

    def no_table(self, state):
        raise AssertionError("a reading command opened a Table")

    monkeypatch.setattr(Table, "__init__", no_table)
    assert cli.main(["get", uri, "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"id": 2, "name": "bob"}
    assert cli.main(["scan", uri, "--json", "--where", "id = 1"]) == 0
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == [{"id": 1, "name": "ada"}]
