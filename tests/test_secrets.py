"""Credentials never leak: a run with a distinctive secret key and session token, given by the
standard environment variables or by ``--storage-option``, greps every output for them.

The run: ``memwal init``, ``memwal ingest`` of Kafka records (some of them bad: dead letters)
into a table on S3 (moto) with its checkpoint on ``s3a://`` (so Spark holds the secret in its
Hadoop settings too), ``memwal maintain --once``, ``status --json``, ``check --json``,
``scan``, and commands that fail (no table; an unreachable endpoint with ``--debug``; an
unknown option). Grepped: each command's stdout and stderr (memwal's ``-vv`` log, Spark's and
Lance's log lines, tracebacks), every object the run left on S3 (the table, its dead-letter
rows, maintenance metrics, leases, Spark's checkpoint), and in-process: the text and repr of
errors, configs, file IO and tables, and the query's progress and metrics.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
import uuid

import pytest
from brokers import produce
from test_streaming import workload

from memwal import Table, jvm
from memwal.core.io import file_io_for
from memwal.core.state import TableState
from memwal.core.storage import ENVIRONMENT_VARIABLES, StorageConfig
from memwal.write.dead_letters import dead_letter_uri, read_dead_letters

# soak: 230-270 s a run on the loaded 2-core machine (a dozen CLI processes and a Spark ingest), so it
# runs with the long soak (make soak-tests), not in the default suite.
pytestmark = [pytest.mark.s3, pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow, pytest.mark.soak]

SECRET = f"SeCrEtKeY{uuid.uuid4().hex}"
TOKEN = f"SeSsIoNtOkEn{uuid.uuid4().hex}"


def leaks(text: str | bytes) -> list[str]:
    """The secrets found in ``text`` (also in part: a prefix long enough to identify them)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return [s for s in (SECRET, TOKEN, SECRET[:20], TOKEN[:24]) if s in text]


def all_objects(s3_server, prefix: str) -> dict[str, bytes]:
    import boto3

    client = boto3.client("s3", endpoint_url=s3_server.endpoint, aws_access_key_id=s3_server.access_key_id,
                          aws_secret_access_key=s3_server.secret_access_key, region_name=s3_server.region)
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=s3_server.bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            out[o["Key"]] = client.get_object(Bucket=s3_server.bucket, Key=o["Key"])["Body"].read()
    return out


@pytest.mark.skipif(not jvm.jars("s3a"), reason="the s3a jars are not fetched (python -m memwal.jvm fetch)")
@pytest.mark.parametrize("given_by", ["environment", "flags"])
def test_no_output_of_a_run_holds_the_secret(kafka, s3_server, tmp_path, monkeypatch, given_by):
    base = {k: v for k, v in os.environ.items() if k not in {var for var, _ in ENVIRONMENT_VARIABLES}}
    opts = {**s3_server.storage_options(), "aws_secret_access_key": SECRET, "aws_session_token": TOKEN}
    if given_by == "environment":
        env = {**base, **s3_server.env(), "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_SESSION_TOKEN": TOKEN}
        flags: list[str] = []
    else:
        env = base
        flags = [a for k, v in opts.items() for a in ("--storage-option", f"{k}={v}")]
    prefix = uuid.uuid4().hex[:12]
    uri = s3_server.uri(prefix, "users")
    checkpoint = s3_server.uri(prefix, "ckpt").replace("s3://", "s3a://")
    outputs: dict[str, str] = {}

    def run(name: str, *args: str, expect: int | None = 0, timeout: float = 900, last: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
        """``memwal *args`` with the run's flags, then ``last`` (a later flag wins)."""
        p = subprocess.run([sys.executable, "-m", "memwal", *args, *flags, *last], capture_output=True, text=True,
                           env=env, cwd=tmp_path, timeout=timeout)
        outputs[f"{name} stdout"], outputs[f"{name} stderr"] = p.stdout, p.stderr
        if expect is not None:
            assert p.returncode == expect, (name, p.returncode, p.stderr[-3000:])
        return p

    schema_file = tmp_path / "schema.jsonl"
    schema_file.write_text(json.dumps({"id": 1, "name": "x", "score": 1.0, "vec": [0.0, 0.0, 0.0, 0.0]}) + "\n")
    run("init", "-vv", "init", uri, "--schema-from", str(schema_file), "--primary-key", "id", "--shard-by", "bucket(id, 2)")

    topic = f"secrets-{given_by}-{time.monotonic_ns()}"
    kafka.create_topic(topic, 2)
    records, _model = workload(1500, 300, seed=41, partitions=2)
    bad = [(b"bad-json", b"{not json", 0), (b"null-key", json.dumps({"id": None, "name": "n"}).encode(), 1)]
    produce(kafka, topic, records[:700] + bad + records[700:])
    run("ingest", "-vv", "ingest", "--bootstrap", kafka.bootstrap, "--topic", topic, "--table", uri,
        "--checkpoint", checkpoint, "--available-now", "--max-offsets-per-trigger", "500", "--maintain")
    run("maintain", "-vv", "maintain", uri, "--once", "--nice", "0", "--flush-stranded-after", "0")
    run("status", "-vv", "status", uri, "--json")
    run("check", "check", uri, "--json")
    run("scan", "scan", uri, "--json", "--limit", "5")
    run("view", "view", "create", uri, "big", "--select", "id", "--where", "score > 1")

    # commands that fail
    run("missing table", "--debug", "get", s3_server.uri(prefix, "nothing"), "1", expect=2)
    dead_endpoint = ("--storage-option", "aws_endpoint=http://127.0.0.1:9", "--storage-option", "client_max_retries=0",
                     "--storage-option", "memwal_operation_retries=0", "--storage-option", "connect_timeout=1s")
    p = run("unreachable store", "-vv", "--debug", "status", uri, expect=None, last=dead_endpoint)
    assert p.returncode != 0 and "Traceback" in p.stderr
    p = run("unknown option", "status", uri, "--storage-option", "aws_no_such_key=1", expect=None)
    assert p.returncode != 0

    # what the run left on S3: the table, its dead letters, metrics, leases, the checkpoint
    objects = all_objects(s3_server, prefix + "/")
    assert any("/ckpt/commits/" in k for k in objects) and any("_dead_letters" in k for k in objects)
    state_opts = opts if given_by == "flags" else None
    for var, _ in ENVIRONMENT_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        if var.startswith("AWS_"):
            monkeypatch.setenv(var, value)
    dead = read_dead_letters(dead_letter_uri(uri), state_opts).to_pylist()
    assert len(dead) == 2
    outputs["dead letters"] = repr(dead)
    state = TableState.load(uri, state_opts)
    outputs["in-process reprs"] = " ".join(
        repr(x) for x in (state.storage, file_io_for(uri, state.storage), state, Table.open(uri, state_opts))
    )
    try:  # an error raised in this process, with its chain
        TableState.load(s3_server.uri(prefix, "nothing"), state_opts)
    except Exception as e:  # noqa: BLE001 - its text is what is checked
        outputs["in-process error"] = "".join(traceback.format_exception(e)) + repr(e)
    outputs["repr of a config"] = repr(StorageConfig.resolve(opts, environ={}))

    assert "ingested" in outputs["ingest stdout"]
    found = {name: context(text) for name, text in outputs.items() if leaks(text)}
    found.update({key: context(data) for key, data in objects.items() if leaks(data)})
    assert not found, f"the secret leaked into: {found}"


def context(text: str | bytes, chars: int = 300) -> list[str]:
    """Where the secrets are in ``text``: the characters around each, the secrets masked (a
    failing test must not print them either)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    out = []
    for secret in (SECRET, TOKEN):
        at = text.find(secret)
        if at >= 0:
            out.append(text[max(0, at - chars): at + len(secret) + chars].replace(SECRET, "<SECRET>").replace(TOKEN, "<TOKEN>"))
    return out
