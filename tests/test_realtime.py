"""Real-time ingest (memwal.streaming.realtime): Spark's Real-Time Mode, Spark's Kafka
connector on a real Kafka 4 broker, the JVM writer handing records to the writer process."""

from __future__ import annotations

import subprocess
import sys
import time

import pyarrow as pa
import pytest
from brokers import produce
from helpers import approx, sigkill_when, table_rows, workload
from hypothesis import given
from hypothesis import strategies as st
from test_streaming import SCHEMA

from memwal import Table, jvm
from memwal.streaming import SinkOptions
from memwal.streaming.partitioning import partitions
from memwal.streaming.realtime import ingest_real_time, kafka_batch, records_frame
from memwal.write.dead_letters import dead_letter_uri, read_dead_letters

needs_jar = pytest.mark.skipif(not jvm.jars("realtime") or not jvm.jars("spark-kafka"),
                               reason="the realtime and spark-kafka jars are not built (python -m memwal.jvm fetch)")

record = st.tuples(st.none() | st.binary(max_size=20), st.none() | st.binary(max_size=60), st.integers(0, 2**31 - 1),
                   st.integers(0, 2**62), st.integers(0, 2**41))


@given(st.lists(record, max_size=30), st.integers(0, 2**40))
def test_a_frame_of_kafka_records_reads_back_as_the_records(records, epoch):
    """The frame the JVM writer sends, read as Spark's Kafka columns: null keys and values kept."""
    keys, values, parts, offsets, stamps = (list(c) for c in zip(*records)) if records else ([], [], [], [], [])
    batch, got_epoch = kafka_batch(records_frame(offsets, stamps, parts, keys, values, epoch), "t")
    assert got_epoch == epoch
    assert batch.column("key").to_pylist() == keys and batch.column("value").to_pylist() == values
    assert batch.column("partition").to_pylist() == parts and batch.column("offset").to_pylist() == offsets
    assert batch.column("timestamp").cast(pa.int64()).to_pylist() == stamps
    assert set(batch.column("topic").to_pylist()) <= {"t"}


def aligned_topic(kafka, uri: str, name: str, n: int, keys: int, seed: int, partitions_: int = 2):
    """A topic of ``n`` upserts and deletes over ``keys`` keys, each shard's records in one
    partition (Real-Time Mode cannot exchange rows), and their model."""
    topic = f"{name}-{time.monotonic_ns()}"
    kafka.create_topic(topic, partitions_)
    records, model = workload(n, keys, seed=seed, partitions=partitions_)
    aligned = partitions(uri, [{"id": int(key)} for key, _, _ in records], partitions_)
    return topic, [(key, value, int(p)) for (key, value, _), p in zip(records, aligned)], model


def wait_until_equal(uri: str, model: dict, job=None, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while approx(table_rows(uri, "strong")) != approx(model):
        if job is not None and job.query.exception() is not None:
            raise AssertionError(f"the real-time query failed: {job.query.exception()}")
        assert time.monotonic() < deadline, "the table never reached the model"
        time.sleep(0.5)


@needs_jar
@pytest.mark.kafka
def test_a_real_time_ingest_equals_the_model_and_a_reader_elsewhere_sees_new_records(spark, kafka, tmp_path):
    """Records reach the table while the query runs, with no micro-batch to wait for: a bad
    record is a dead letter with its reason and the rest arrives; a record sent later is seen
    by a strong reader in another process."""
    uri = str(tmp_path / "users")
    Table.create(uri, SCHEMA, ["id"], "bucket(id, 2)").close()
    topic, records, model = aligned_topic(kafka, uri, "rt", 2000, 400, seed=41)
    produce(kafka, topic, records[:1000] + [(b"bad", b"{not json", 0)] + records[1000:])
    job = ingest_real_time(spark, bootstrap=kafka.bootstrap, topic=topic, table_uri=uri, checkpoint=str(tmp_path / "ckpt"), batch_seconds=5)
    try:
        wait_until_equal(uri, model, job)
        dead = read_dead_letters(dead_letter_uri(uri)).to_pylist()
        assert [d["key"] for d in dead] == [b"bad"] and dead[0]["error"]
        late = {"id": 99_999, "name": "late", "score": 1.5, "vec": [1.0, 2.0, 3.0, 4.0], "op": "upsert"}
        import json

        part = int(partitions(uri, [late], 2)[0])
        sent = time.monotonic()
        produce(kafka, topic, [(b"99999", json.dumps(late).encode(), part)])
        code = ("import sys, time; from memwal import readers\n"
                "deadline = time.monotonic() + 120\n"
                "while not readers.open(sys.argv[1], consistency='strong').get_many([{'id': 99999}]).num_rows:\n"
                "    assert time.monotonic() < deadline\n    time.sleep(0.05)\n")
        subprocess.run([sys.executable, "-c", code, uri], check=True, timeout=300)
        assert time.monotonic() - sent < 120
    finally:
        job.stop()


@needs_jar
@pytest.mark.kafka
def test_a_real_time_ingest_killed_and_restarted_equals_the_model(spark, kafka, tmp_path):
    """`memwal ingest --real-time` SIGKILLed after a checkpoint and with records of the next
    real-time batch written, then restarted from its checkpoint (here, in this process's
    session): the records after the checkpoint are written again, and the table equals the model."""
    uri = str(tmp_path / "users")
    Table.create(uri, SCHEMA, ["id"], "bucket(id, 2)").close()
    topic, records, model = aligned_topic(kafka, uri, "rt-kill", 3000, 500, seed=43)
    produce(kafka, topic, records[:1500])
    ckpt = tmp_path / "ckpt"
    log = (tmp_path / "first.log").open("w")
    first = subprocess.Popen([sys.executable, "-m", "memwal", "ingest", "--real-time", "--real-time-batch", "5", "--bootstrap", kafka.bootstrap,
                              "--topic", topic, "--table", uri, "--checkpoint", str(ckpt)],
                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    commits = ckpt / "commits"

    def into_the_next_batch() -> None:  # records the kill interrupts
        produce(kafka, topic, records[1500:2200])
        time.sleep(1)

    with log:
        sigkill_when(first, lambda: commits.exists() and any(f.name.isdigit() for f in commits.iterdir()), tmp_path / "first.log",
                     "checkpointed real-time batch", before=into_the_next_batch)
    produce(kafka, topic, records[2200:])
    job = ingest_real_time(spark, bootstrap=kafka.bootstrap, topic=topic, table_uri=uri, checkpoint=str(ckpt), batch_seconds=5,
                           options=SinkOptions(source="kafka-json"))
    try:
        wait_until_equal(uri, model, job)
    finally:
        job.stop()
