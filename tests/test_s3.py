"""The core flows on a real S3 API (moto's server on 127.0.0.1): create, write and delete,
flush, eventual and strong reads, compaction with racing compactors, GC while a writer
writes, a view refresh under its lease, and the CLI round trip. Kept small: every
metadata call is an HTTP request here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pyarrow as pa
import pytest

from memwal import StaleCompactionError, Table, readers
from memwal.maintain.compactor import Compactor
from memwal.maintain.gc import GarbageCollector, GcConfig
from memwal.core.indexes import IndexMaintainer
from memwal.core.state import TableState
from memwal.views import View, list_views

pytestmark = pytest.mark.s3

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64())])
NOW = GcConfig(reader_grace_seconds=0, manifest_retention_seconds=0, manifest_versions_kept=1, drain_interval_seconds=0)


def rows(ids, tag="v"):
    return pa.table({"id": ids, "name": [f"{tag}{i}" for i in ids], "score": [float(i) for i in ids]}, schema=SCHEMA)


def live(uri, consistency="eventual"):
    r = readers.Reader(TableState.load(uri), consistency=consistency)
    return {row["id"]: row for row in r.scan().to_pylist()}


def test_table_lifecycle_on_s3_from_the_environment(s3_env, s3_uri):
    """Only the standard AWS_* variables are set: every memwal and Lance call finds the bucket."""
    with Table.create(s3_uri, SCHEMA, ["id"], "bucket(id, 2)") as t:
        t.write(rows(range(10)))
        t.delete({"id": [3]})
    model = {i: {"id": i, "name": f"v{i}", "score": float(i)} for i in range(10) if i != 3}
    assert live(s3_uri) == model
    t = Table.open(s3_uri)
    t.write(rows([20, 21], "w"))  # unflushed: only a strong reader sees it
    strong = live(s3_uri, "strong")
    assert strong[20]["name"] == "w20" and 20 not in live(s3_uri)
    t.close()

    # two compactors race; one commit per generation wins, the other sees a stale compaction or nothing
    state = TableState.load(s3_uri)
    errors: list[BaseException] = []

    def compact():
        try:
            Compactor(TableState.load(s3_uri)).run_once()
        except StaleCompactionError as e:  # lost the race on a generation: fine
            errors.append(e)

    threads = [threading.Thread(target=compact) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    Compactor(state).run_once()
    assert state.snapshot().num_live_sstables == 0
    IndexMaintainer(state).catch_up()
    model.update({20: {"id": 20, "name": "w20", "score": 20.0}, 21: {"id": 21, "name": "w21", "score": 21.0}})
    assert live(s3_uri) == model

    before = sum(o.size for o in state.io.list_prefix(s3_uri + "/_mem_wal"))
    GarbageCollector(state, NOW).run_once()
    after = sum(o.size for o in state.io.list_prefix(s3_uri + "/_mem_wal"))
    assert after < before
    assert live(s3_uri) == model

    View.create(state, "big", select=["id", "score"], where="score >= 5")
    assert list_views(s3_uri) == ["big"]
    with Table.open(s3_uri) as t:
        t.write(rows([30]))
    Compactor(state).run_once()
    record = View.open(state, "big").refresh()
    assert record is not None and record.mode == "incremental"
    assert sorted(r["id"] for r in View.open(s3_uri, "big").to_table().to_pylist()) == sorted(
        [i for i in model if model[i]["score"] >= 5] + [30]
    )


def test_explicit_storage_options_without_environment(s3_server, monkeypatch):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT", "AWS_ALLOW_HTTP"):
        monkeypatch.delenv(var, raising=False)
    uri = s3_server.fresh_uri("explicit")
    opts = s3_server.storage_options()
    with Table.create(uri, SCHEMA, ["id"], "unsharded", storage_options=opts) as t:
        t.write(rows([1, 2]))
    state = TableState.load(uri, opts)
    assert {r["id"] for r in readers.Reader(state).scan().to_pylist()} == {1, 2}
    # readers.open takes the same options Table.open does (the environment has none here)
    with readers.open(uri, storage_options=opts) as r:
        assert r.get(2) is not None and r.count() == 2


def test_cli_round_trip_on_s3(s3_server, tmp_path):
    """`memwal` gives the same outputs on s3:// as on a local path, each command on s3://
    configured either only by the AWS_* variables or only by --storage-option flags (in turn)."""
    s3_uri = s3_server.fresh_uri("cli")
    bare = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GOOGLE_", "AZURE_"))}
    opts = s3_server.storage_options()
    flag_args = [arg for k, v in opts.items() for arg in ("--storage-option", f"{k}={v}")]
    turn = iter(range(1_000_000))
    local = str(tmp_path / "local")
    data = tmp_path / "rows.jsonl"
    data.write_text("\n".join(json.dumps({"id": i, "name": f"n{i}", "score": i / 2}) for i in range(6)) + "\n")
    schema = tmp_path / "schema.jsonl"
    schema.write_text(data.read_text())
    more = tmp_path / "more.jsonl"
    more.write_text(json.dumps({"id": 9, "name": "n9", "score": 4.5}) + "\n")
    keys = tmp_path / "keys.jsonl"
    keys.write_text(json.dumps({"id": 2}) + "\n")

    def run(*args):
        if not any(a.startswith("s3://") for a in args):
            return subprocess.run([sys.executable, "-m", "memwal", *args], capture_output=True, text=True, env=bare)
        if next(turn) % 2:  # by the environment alone
            return subprocess.run([sys.executable, "-m", "memwal", *args], capture_output=True, text=True, env={**bare, **s3_server.env()})
        return subprocess.run([sys.executable, "-m", "memwal", *args, *flag_args], capture_output=True, text=True, env=bare)

    outputs = []
    for uri in (s3_uri, local):
        steps = [
            ("init", uri, "--schema-from", str(schema), "--primary-key", "id", "--shard-by", "bucket(id, 2)"),
            ("put", uri, str(data)),
            ("delete", uri, str(keys)),
            ("get", uri, "4", "--json"),
            ("scan", uri, "--json"),
            ("maintain", uri, "--once"),
            ("scan", uri, "--json"),
            ("view", "create", uri, "half", "--select", "id", "--select", "score * 2 AS double", "--where", "score >= 1"),
            ("view", "list", uri),
            ("put", uri, str(more)),
            ("maintain", uri, "--once"),
            ("view", "refresh", uri, "half"),
            ("scan", uri, "--json"),
        ]
        out = []
        for step in steps:
            p = run(*step)
            assert p.returncode == 0, (step, p.stderr)
            # rows come shard by shard, and shard ids differ per table: compare as sets of lines
            out.append(sorted(p.stdout.replace(uri, "URI").splitlines()))
        status = json.loads(run("status", uri, "--json").stdout)
        out.append((status["base_rows"], status["num_shards"], [s["pending_sstables"] for s in status["shards"]]))
        view = View.open(TableState.load(uri, opts if uri.startswith("s3://") else None), "half").to_table().sort_by("id").to_pylist()
        out.append(view)
        outputs.append(out)
    assert outputs[0] == outputs[1]
