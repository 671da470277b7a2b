"""A Spark ingest of Kafka records into a table on a real S3 API (moto's server on 127.0.0.1).

The driver's environment names no object store: the storage options given to ``ingest`` are
all the executors, their writers and the dead-letter table get, so the table equals the model
only if they travel with the sink.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time

import pytest
from brokers import produce
from test_streaming import SCHEMA, approx, workload

from memwal import Table, readers
from memwal.state import TableState
from memwal.storage import ENVIRONMENT_VARIABLES, StorageConfig
from memwal.streaming import SinkOptions, ingest
from memwal.streaming.dead_letters import dead_letter_uri, read_dead_letters
from memwal.streaming.sink import Prepare, Write


def test_the_stages_carry_the_drivers_storage():
    """What the executors get: the storage resolved on the driver, in the prepare stage's JSON
    config (the Kafka source's option) and in the pickled write stage."""
    storage = StorageConfig.resolve({"aws_region": "eu-west-1", "aws_secret_access_key": "s3cr=t"}, environ={})
    prepare = Prepare("s3://b/t", SinkOptions(source="kafka-json"), storage)
    assert Prepare.from_json(prepare.to_json()).storage == storage
    write = pickle.loads(pickle.dumps(Write("s3://b/t", SinkOptions(), 3, "s3://b/t_dead_letters", storage)))
    assert write.storage == storage
    # a config written before storage travelled: the executor's own environment
    assert Prepare.from_json('{"uri": "/t", "options": {}}').storage is None


@pytest.mark.s3
@pytest.mark.spark
@pytest.mark.kafka
def test_ingest_into_an_s3_table_equals_the_model(spark, noida, s3_server, tmp_path, monkeypatch):
    for var, _key in ENVIRONMENT_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    opts = s3_server.storage_options()
    topic = f"s3-{time.monotonic_ns()}"
    noida.create_topic(topic, 3)
    records, model = workload(3000, 400, seed=11)
    bad = (b"bad", b"{not json", 1)
    mixed = records[:1500] + [bad] + records[1500:]
    placed = produce(noida, topic, mixed)
    bad_partition, bad_offset = placed[1500]

    uri = s3_server.fresh_uri("users")
    Table.create(uri, SCHEMA, ["id"], "bucket(id, 2)", storage_options=opts).close()
    job = ingest(
        spark,
        bootstrap=noida.bootstrap,
        topic=topic,
        table_uri=uri,
        checkpoint=str(tmp_path / "ckpt"),  # Spark's own files: a local path (s3a:// needs hadoop-aws)
        available_now=True,
        max_offsets_per_trigger=1000,
        storage_options=opts,
    )
    job.await_termination()
    assert job.query.exception() is None
    totals = job.sink.totals()
    assert totals["batches"] >= 3 and totals["dead_letters"] == 1

    state = TableState.load(uri, opts)
    rows = {r["id"]: r for r in readers.Reader(state, consistency="eventual").scan().to_pylist()}
    assert approx(rows) == approx(model)  # eventual: the end of the query flushed everything
    assert len(state.manifests.list_shards()) == 2

    dlq = read_dead_letters(dead_letter_uri(uri), opts).to_pylist()
    assert [(d["topic"], d["partition"], d["offset"], d["key"]) for d in dlq] == [(topic, bad_partition, bad_offset, b"bad")]
    assert "not valid JSON" in dlq[0]["error"] and dlq[0]["target"] == state.uri


@pytest.mark.s3
@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.parametrize("configured_by", ["flags", "environment"])
def test_memwal_ingest_into_s3(noida, s3_server, tmp_path, configured_by):
    """`memwal ingest --available-now` configured only by `--storage-option` flags (no AWS_*
    variable anywhere), or only by the standard AWS_* variables (no flag)."""
    env = {k: v for k, v in os.environ.items() if k not in {var for var, _key in ENVIRONMENT_VARIABLES}}
    opts = s3_server.storage_options()
    if configured_by == "flags":
        flags = [arg for k, v in opts.items() for arg in ("--storage-option", f"{k}={v}")]
    else:
        flags, env = [], {**env, **s3_server.env()}
    topic = f"s3-cli-{time.monotonic_ns()}"
    noida.create_topic(topic, 2)
    records, model = workload(2000, 300, seed=12, partitions=2)
    produce(noida, topic, records)
    uri = s3_server.fresh_uri("users")
    Table.create(uri, SCHEMA, ["id"], "bucket(id, 2)", storage_options=opts).close()
    p = subprocess.run(
        [sys.executable, "-m", "memwal", "ingest", "--bootstrap", noida.bootstrap, "--topic", topic, "--table", uri,
         "--checkpoint", str(tmp_path / "ckpt"), "--available-now", "--max-offsets-per-trigger", "1000", *flags],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600,
    )
    assert p.returncode == 0, p.stderr[-4000:]
    assert f"ingested {len(records)} records" in p.stdout
    rows = {r["id"]: r for r in readers.Reader(TableState.load(uri, opts), consistency="eventual").scan().to_pylist()}
    assert approx(rows) == approx(model)
