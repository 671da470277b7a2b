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
from helpers import sigkill_when
from test_streaming import SCHEMA, approx, workload

from memwal import Table, jvm, readers
from memwal.core.state import TableState
from memwal.core.storage import ENVIRONMENT_VARIABLES, StorageConfig
from memwal.streaming import SinkOptions, ingest
from memwal.write.dead_letters import dead_letter_uri, read_dead_letters
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
def test_ingest_into_an_s3_table_equals_the_model(spark, kafka, s3_server, tmp_path, monkeypatch):
    """The store configured only by the standard AWS_* variables of the driver's process (set
    after its JVM and Python workers started, so only what the driver resolves reaches them)."""
    for var, _key in ENVIRONMENT_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    opts = s3_server.storage_options()
    for var, value in s3_server.env().items():
        monkeypatch.setenv(var, value)
    topic = f"s3-{time.monotonic_ns()}"
    kafka.create_topic(topic, 3)
    records, model = workload(3000, 400, seed=11)
    bad = (b"bad", b"{not json", 1)
    mixed = records[:1500] + [bad] + records[1500:]
    placed = produce(kafka, topic, mixed)
    bad_partition, bad_offset = placed[1500]

    uri = s3_server.fresh_uri("users")
    Table.create(uri, SCHEMA, ["id"], "bucket(id, 2)", storage_options=opts).close()
    job = ingest(
        spark,
        bootstrap=kafka.bootstrap,
        topic=topic,
        table_uri=uri,
        checkpoint=str(tmp_path / "ckpt"),  # Spark's own files: a local path (s3a:// needs hadoop-aws)
        available_now=True,
        max_offsets_per_trigger=1000,
        kafka_source="spark",
    )
    job.await_termination()
    assert job.query.exception() is None
    totals = job.reports.totals()
    assert totals["batches"] >= 3 and totals["dead_letters"] == 1

    state = TableState.load(uri, opts)
    rows = {r["id"]: r for r in readers.Reader(state, consistency="eventual").scan().to_pylist()}
    assert approx(rows) == approx(model)  # eventual: the end of the query flushed everything
    assert len(state.manifests.list_shards()) == 2

    dlq = read_dead_letters(dead_letter_uri(uri), opts).to_pylist()
    assert [(d["topic"], d["partition"], d["offset"], d["key"]) for d in dlq] == [(topic, bad_partition, bad_offset, b"bad")]
    assert "not valid JSON" in dlq[0]["error"] and dlq[0]["target"] == state.uri


def committed_batches(s3_server, checkpoint: str) -> int:
    """Micro-batches the query committed to its checkpoint on S3 (``commits/<batch id>``)."""
    import boto3

    client = boto3.client("s3", endpoint_url=s3_server.endpoint, aws_access_key_id=s3_server.access_key_id,
                          aws_secret_access_key=s3_server.secret_access_key, region_name=s3_server.region)
    prefix = checkpoint.removeprefix(f"s3a://{s3_server.bucket}/") + "/commits/"
    listed = client.list_objects_v2(Bucket=s3_server.bucket, Prefix=prefix).get("Contents", [])
    return sum(1 for o in listed if o["Key"].rsplit("/", 1)[-1].isdigit())


@pytest.mark.s3
@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.skipif(not jvm.jars("s3a") or not jvm.jars("spark-kafka"), reason="the s3a and spark-kafka jars are not fetched (python -m memwal.jvm fetch)")
def test_memwal_ingest_with_an_s3a_checkpoint_survives_a_kill(kafka, s3_server, tmp_path):
    """`memwal ingest --kafka-source spark` into an s3:// table with its checkpoint on s3a://,
    both configured only by the AWS_* variables: SIGKILLed mid-stream (micro-batches committed,
    more to come), then run again with --available-now, configured only by `--storage-option`
    flags (no AWS_* variable anywhere): the table equals the model, and the second run went on
    from the checkpoint rather than starting over."""
    bare = {k: v for k, v in os.environ.items() if k not in {var for var, _key in ENVIRONMENT_VARIABLES}}
    env = {**bare, **s3_server.env()}
    topic = f"s3a-{time.monotonic_ns()}"
    kafka.create_topic(topic, 2)
    records, model = workload(4000, 500, seed=13, partitions=2)
    produce(kafka, topic, records)
    opts = s3_server.storage_options()
    uri = s3_server.fresh_uri("users")
    checkpoint = s3_server.fresh_uri("ckpt").replace("s3://", "s3a://")
    Table.create(uri, SCHEMA, ["id"], "bucket(id, 2)", storage_options=opts).close()
    command = [sys.executable, "-m", "memwal", "ingest", "--kafka-source", "spark", "--bootstrap", kafka.bootstrap, "--topic", topic,
               "--table", uri, "--checkpoint", checkpoint, "--max-offsets-per-trigger", "250"]
    log = (tmp_path / "first.log").open("w")
    first = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path, start_new_session=True)
    with log:
        sigkill_when(first, lambda: committed_batches(s3_server, checkpoint) >= 3, tmp_path / "first.log", "three committed micro-batches")
    killed_at = committed_batches(s3_server, checkpoint)
    assert killed_at < len(records) // 250, "the first run ended before the kill"
    flags = [arg for k, v in opts.items() for arg in ("--storage-option", f"{k}={v}")]
    second = subprocess.run([*command, "--available-now", *flags], capture_output=True, text=True, env=bare, cwd=tmp_path, timeout=600)
    assert second.returncode == 0, second.stderr[-4000:]
    ingested = int(second.stdout.split("ingested ", 1)[1].split(" ", 1)[0])
    assert 0 < ingested < len(records)  # resumed from the checkpoint on S3
    assert committed_batches(s3_server, checkpoint) > killed_at
    rows = {r["id"]: r for r in readers.Reader(TableState.load(uri, opts), consistency="eventual").scan().to_pylist()}
    assert approx(rows) == approx(model)
