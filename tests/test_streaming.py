"""The Spark sink end to end: real SparkSession, real brokers, real process kills."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pyarrow as pa
import pytest
from brokers import produce
from helpers import approx, run_sink_batch, table_rows, workload

from memwal import Table, readers
from memwal.core.failpoints import DIR_ENV, ENV
from memwal.core.metadata import Bounds
from memwal.streaming import SinkOptions, ingest
from memwal.write.dead_letters import dead_letter_uri, read_dead_letters
from memwal.streaming.sink import partition_keys
from memwal.write.worker import WORKER

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64()), ("vec", pa.list_(pa.float32(), 4))])


def test_ingest_end_to_end_equals_the_model(spark, kafka, tmp_path, kafka_source):
    """Records as producers write them today: keys, headers and CreateTime timestamps (some
    before 1970, some in the future), through each Kafka source."""
    topic = f"users-{time.monotonic_ns()}"
    kafka.create_topic(topic, 3)
    records, model = workload(6000, 800, seed=1)
    headers = [[("trace-id", f"t{i}".encode()), ("source", b"orders-db")] if i % 3 else None for i in range(len(records))]
    now_ms = int(time.time() * 1000)
    timestamps = [now_ms - 86_400_000 * 365 * 60 if i % 7 == 0 else now_ms + i for i in range(len(records))]
    produce(kafka, topic, records, headers=headers, timestamps_ms=timestamps)
    uri = str(tmp_path / "users")
    Table.create(uri, SCHEMA, ["id"], "bucket(id, 4)").close()
    job = ingest(
        spark,
        bootstrap=kafka.bootstrap,
        topic=topic,
        table_uri=uri,
        checkpoint=str(tmp_path / "ckpt"),
        available_now=True,
        max_offsets_per_trigger=2000,
        kafka_source=kafka_source,
    )
    job.await_termination()
    assert job.kafka_source == kafka_source
    assert job.query.exception() is None
    totals = job.reports.totals()
    assert totals["batches"] >= 3 and totals["dead_letters"] == 0
    assert approx(table_rows(uri)) == approx(model)  # eventual: the end of the query flushed everything
    assert len(Table.open(uri).manifests.list_shards()) == 4
    # the query's progress carries memwal's counters; the listener adds the write side
    progress = job.listener.progress
    assert sum(p["observed"].get("rows", 0) for p in progress.values()) == len(records)
    assert all(p["sink"] is not None and p["sink"]["shards"] == 4 for p in progress.values() if p["input_rows"])
    assert all(p["timestamp"] for p in progress.values())  # each trigger's start, for cadence


def test_dead_letters_of_a_mixed_stream(spark, kafka, tmp_path):
    topic = f"mixed-{time.monotonic_ns()}"
    kafka.create_topic(topic, 3)
    records, model = workload(3000, 500, seed=2)
    bad = [
        (b"b1", b"{not json", 0),
        (b"b2", json.dumps({"id": "twelve", "name": "x"}).encode(), 1),  # wrong type
        (b"b3", json.dumps({"name": "no key"}).encode(), 2),  # null key
        (b"b4", json.dumps({"id": 5, "op": "merge"}).encode(), 0),  # unknown operation
        (b"b5", json.dumps({"id": 6, "name": "x" * 5000}).encode(), 1),  # oversized
        (b"b6", None, 2),  # no value at all
        (b"b7", json.dumps([1, 2, 3]).encode(), 0),  # not an object
    ]
    mixed = records[:1000] + bad[:4] + records[1000:2000] + bad[4:] + records[2000:]
    placed = produce(kafka, topic, mixed)
    coords = {(topic, p, off) for (key, _, _), (p, off) in zip(mixed, placed) if key.startswith(b"b") and not key[1:].isdigit() or key in {b[0] for b in bad}}
    uri = str(tmp_path / "users")
    Table.create(uri, SCHEMA, ["id"], "bucket(id, 4)").close()
    job = ingest(
        spark,
        bootstrap=kafka.bootstrap,
        topic=topic,
        table_uri=uri,
        checkpoint=str(tmp_path / "ckpt"),
        available_now=True,
        max_offsets_per_trigger=1000,
        options=SinkOptions(source="kafka-json", max_row_bytes=4096),
        kafka_source="spark",
    )
    job.await_termination()
    assert job.query.exception() is None
    assert approx(table_rows(uri)) == approx(model)  # every good record arrived
    dlq = read_dead_letters(dead_letter_uri(uri)).to_pylist()
    assert len(dlq) == len(bad) == job.reports.totals()["dead_letters"]
    assert {(d["topic"], d["partition"], d["offset"]) for d in dlq} == coords
    errors = {d["key"]: d["error"] for d in dlq}
    assert "not valid JSON" in errors[b"b1"]
    assert "/id" in errors[b"b2"] and "string" in errors[b"b2"]
    assert "primary key column 'id' is null" in errors[b"b3"]
    assert "unknown operation 'merge'" in errors[b"b4"]
    assert "more than the limit of 4096" in errors[b"b5"]
    assert "no value" in errors[b"b6"]
    assert "not an object" in errors[b"b7"]
    assert all(d["value"] is not None for d in dlq if d["key"] != b"b6")


def test_sequence_field_orders_versions(spark, kafka, tmp_path):
    topic = f"seq-{time.monotonic_ns()}"
    kafka.create_topic(topic, 1)
    schema = pa.schema([("id", pa.int64()), ("v", pa.string()), ("version", pa.int64())])
    uri = str(tmp_path / "t")
    Table.create(uri, schema, ["id"], "bucket(id, 2)").close()

    def rec(k, v, version):
        return (str(k).encode(), json.dumps({"id": k, "v": v, "version": version}).encode(), 0)

    # batch 1: out of order within the batch; batch 2: an older version arrives late
    produce(kafka, topic, [rec(1, "new", 5), rec(1, "old", 3), rec(2, "a", 1)])
    opts = SinkOptions(source="kafka-json", sequence_field="version", drop_stale_across_batches=True)
    ckpt = str(tmp_path / "ckpt")
    run = dict(bootstrap=kafka.bootstrap, topic=topic, table_uri=uri, checkpoint=ckpt, available_now=True, options=opts, kafka_source="spark")
    job = ingest(spark, **run)
    job.await_termination()
    produce(kafka, topic, [rec(1, "late", 4), rec(2, "b", 2)])
    job = ingest(spark, **run)
    job.await_termination()
    got = {r["id"]: (r["v"], r["version"]) for r in readers.open(uri).scan().to_pylist()}
    assert got == {1: ("new", 5), 2: ("b", 2)}
    assert job.reports.totals()["stale_dropped"] == 1


def test_ingest_started_from_another_thread(spark, kafka, tmp_path):
    """A pipeline started from a thread other than the session's (an orchestrator, a bench
    harness): Spark finds Python data sources through the calling thread's active session,
    which such a thread lacks (DATA_SOURCE_NOT_FOUND before ingest made it active)."""
    topic = f"threaded-{time.monotonic_ns()}"
    kafka.create_topic(topic, 2)
    records, model = workload(600, 100, seed=5, partitions=2)
    produce(kafka, topic, records)
    uri = str(tmp_path / "users")
    Table.create(uri, SCHEMA, ["id"], "bucket(id, 2)").close()
    outcome: list = []

    def run() -> None:
        try:
            job = ingest(spark, bootstrap=kafka.bootstrap, topic=topic, table_uri=uri, checkpoint=str(tmp_path / "ckpt"), available_now=True)
            job.await_termination()
            outcome.append(job.reports.totals()["rows"])
        except Exception as e:  # noqa: BLE001 - reported below
            outcome.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(600)
    assert outcome and not isinstance(outcome[0], Exception), outcome
    assert outcome[0] == len(records)
    assert approx(table_rows(uri)) == approx(model)


def test_partition_keys_map_each_shard_to_its_own_task(spark):
    from pyspark.sql import functions as F

    for n in (1, 3, 4, 16):
        keys = partition_keys(n)
        df = spark.createDataFrame([(p, k) for p, k in enumerate(keys)], "want int, k int")
        got = df.repartition(n, "k").withColumn("got", F.spark_partition_id()).collect()
        assert all(r.want == r.got for r in got)


def test_small_micro_batches_run_in_one_stage_and_equal_the_model(spark, kafka, tmp_path):
    """With the writer process and one write task, a micro-batch after a small one runs prepare
    and write in a single Spark stage (the first, with no previous, in two); the table ends
    equal to the model."""
    kafka.create_topic("one_stage", 3)
    records, model = workload(5000, 700, seed=4)
    produce(kafka, "one_stage", records)
    uri = str(tmp_path / "users")
    Table.create(uri, SCHEMA, ["id"], "bucket(id, 4)").close()
    job = ingest(
        spark, bootstrap=kafka.bootstrap, topic="one_stage", table_uri=uri, checkpoint=str(tmp_path / "ckpt"),
        available_now=True, max_offsets_per_trigger=1000,
        options=SinkOptions(source="kafka-json", max_write_tasks=1, single_stage_max_rows=1000, writer_process=True),
        exchange="shard",  # the sink's own single stage (format("memwal") is always one)
    )
    job.await_termination()
    assert job.query.exception() is None
    reports = job.reports.reports
    assert [r.stages for r in reports] == [2] + [1] * (len(reports) - 1)
    assert sum(r.rows for r in reports) == len(records) and len(reports) >= 5
    assert approx(table_rows(uri)) == approx(model)


def test_sink_totals_count_every_batch_beyond_the_reports_it_keeps(tmp_path):
    """A long query runs more micro-batches than the sink keeps reports of; its totals must
    keep counting (a soak benchmark reading them saw ingest "stop" at batch 1,000)."""
    from memwal.streaming.sink import KEPT_REPORTS, BatchReport, MemwalSink

    uri = str(tmp_path / "t")
    Table.create(uri, pa.schema([("id", pa.int64())]), ["id"], "bucket(id, 2)").close()
    sink = MemwalSink(uri, SinkOptions(source="columns"))
    n = KEPT_REPORTS + 5
    for b in range(n):
        sink._record(BatchReport(batch_id=b, rows=10, fenced_retries=b % 2))
    assert len(sink.reports) == KEPT_REPORTS
    totals = sink.totals()
    assert totals["batches"] == n and totals["rows"] == 10 * n and totals["fenced_retries"] == n // 2
    assert sink.report(0) is None and sink.report(n - 1).rows == 10


def test_a_task_writing_several_shards_counts_each_writer_open_once(tmp_path):
    """One write task writes four shards in parallel threads (the prepare and write stages
    run here as Spark runs them in a worker): the batch reports the four real opens, not
    the overlapping differences of a pool-wide counter."""
    uri = str(tmp_path / "t")
    Table.create(uri, SCHEMA, ["id"], "bucket(id, 4)").close()
    options = SinkOptions(source="columns", max_write_tasks=1, flush_interval_seconds=None, writer_process=False)
    rows = pa.table({"id": list(range(400)), "name": [f"n{i}" for i in range(400)],
                     "score": [float(i) for i in range(400)], "vec": [[1.0, 2.0, 3.0, 4.0]] * 400}).cast(SCHEMA)
    try:
        report = run_sink_batch(uri, options, rows, 0)
    finally:
        WORKER.clear()
    assert report.shards == 4 and report.upserts == 400
    assert report.writer_opens == 4
    assert report.fenced_retries == 0
    assert approx(table_rows(uri)) == approx({r["id"]: r for r in rows.to_pylist()})


# -- crashes and competing writers, with real processes ------------------------------------------


def ingest_cli(uri, ckpt, broker, topic, extra_env=None, *args):
    env = dict(os.environ, **(extra_env or {}))
    return subprocess.Popen(
        [sys.executable, "-m", "memwal", "-v", "ingest", "--bootstrap", broker.bootstrap, "--topic", topic,
         "--table", uri, "--checkpoint", ckpt, "--available-now", *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )


def ingest_to_failpoint(kafka, tmp_path, name: str, records: int, keys: int, seed: int, point: str, *cli_args: str):
    """A topic of ``records`` upserts over ``keys`` keys, a 4-shard table, and ``memwal ingest``
    (2,000 records per micro-batch) run until it stands at failpoint ``point`` ("name=action").
    Returns the process, the table's URI, the checkpoint, the topic and the model."""
    topic = f"{name}-{time.monotonic_ns()}"
    kafka.create_topic(topic, 3)
    rows, model = workload(records, keys, seed=seed)
    produce(kafka, topic, rows)
    uri, ckpt = str(tmp_path / "users"), str(tmp_path / "ckpt")
    Table.create(uri, SCHEMA, ["id"], "bucket(id, 4)").close()
    marker_dir = tmp_path / "markers"
    marker_dir.mkdir()
    p = ingest_cli(uri, ckpt, kafka, topic, {ENV: point, DIR_ENV: str(marker_dir)}, "--max-offsets-per-trigger", "2000", *cli_args)
    deadline = time.monotonic() + 300
    while not (marker_dir / point.split("=")[0]).exists():
        assert p.poll() is None, p.stderr.read().decode()[-3000:]
        assert time.monotonic() < deadline, f"the ingest never reached {point}"
        time.sleep(0.1)
    return p, uri, ckpt, topic, model


def restart_here(spark, kafka, topic: str, uri: str, ckpt: str, max_offsets: int = 2000, **sink: object):
    """A query of this process's session run from ``ckpt`` to the end of ``topic`` (a restart
    needs a new query, not a new process: the crash and the stop were the command line's)."""
    job = ingest(spark, bootstrap=kafka.bootstrap, topic=topic, table_uri=uri, checkpoint=ckpt, available_now=True,
                 max_offsets_per_trigger=max_offsets, options=SinkOptions(source="kafka-json", **sink))
    job.await_termination()
    return job


def test_a_writer_process_killed_mid_batch_then_a_restart_from_the_checkpoint(spark, kafka, tmp_path):
    """The executor's writer process is SIGKILLed while it writes micro-batch 2 (two batches
    committed, the third partly written: some shards, not all). The task that sent the write
    fails (WriterProcessError), so the batch is not committed and the query stops; restarted
    from its checkpoint, it runs the batch again through a new writer process, which claims the
    shards and replays their WALs. The table equals the model, no key twice. (A SIGKILL of the
    whole driver mid-stream: tests/test_spark_format.py, tests/test_s3_ingest.py, tests/test_feed_spark.py.)"""
    p, uri, ckpt, topic, model = ingest_to_failpoint(kafka, tmp_path, "crash", 8000, 1000, 3, "write.wrote.batch-2=pause")
    writer = int((tmp_path / "markers" / "write.wrote.batch-2").read_text())  # the failpoint wrote the pid standing at it
    assert writer != p.pid
    os.kill(writer, signal.SIGKILL)
    out, err = p.communicate(timeout=300)
    assert b"WriterProcessError" in err, err.decode()[-3000:]
    half = table_rows(uri, "strong")
    assert half and approx(half) != approx(model)  # the crash left the table partly written
    job = restart_here(spark, kafka, topic, uri, ckpt)
    assert job.reports.report(2) is not None  # Spark replayed the interrupted batch
    assert approx(table_rows(uri)) == approx(model)
    ids = readers.open(uri).scan(columns=["id"]).column("id").to_pylist()
    assert len(ids) == len(set(ids))
    scanned = subprocess.run([sys.executable, "-m", "memwal", "scan", uri, "--json"], capture_output=True, text=True, check=True)
    assert approx({r["id"]: r for r in map(json.loads, scanned.stdout.splitlines())}) == approx(model)


@pytest.mark.parametrize("exchange", ["none", "shard"])
def test_a_query_stopped_mid_batch_stops_cleanly_and_a_restart_completes_the_table(spark, kafka, tmp_path, exchange):
    """`memwal ingest` interrupted while a write of micro-batch 1 is under way: Spark stops the
    query as a stop, not a failure, the process exits cleanly, and a restart from the
    checkpoint completes the table. With an exchange the write runs in the ``foreachBatch``
    sink's job, whose error Spark matches against a regex that recursed once per character of
    the Java stack trace it used to carry and overflowed the stream thread's stack: the sink
    raises a short error instead."""
    p, uri, ckpt, topic, model = ingest_to_failpoint(kafka, tmp_path, "stop", 6000, 800, 5, "write.wrote.batch-1=wait", "--exchange", exchange)
    p.send_signal(signal.SIGINT)  # memwal ingest stops its query on Ctrl-C
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err.decode()[-3000:]
    assert b"StackOverflowError" not in err, err.decode()[-3000:]
    if exchange == "shard":
        assert b"BatchInterruptedError" in err  # the stop reached Spark as the sink's short error
    assert b"ingested" in out
    restart_here(spark, kafka, topic, uri, ckpt)
    assert approx(table_rows(uri)) == approx(model)


def test_two_concurrent_queries_on_the_same_shard(spark, kafka, tmp_path):
    """Two pipelines (two Spark applications) write disjoint keys into one unsharded table at
    the same time: they keep claiming the shard from each other. A write task fenced twice in
    a row fails its query loudly (FencedError: one writer per shard); nothing acknowledged is
    lost, and the failed query, restarted from its checkpoint, completes."""
    uri = str(tmp_path / "t")
    # Each 100-record micro-batch is flushed and no maintenance runs: lift the back-pressure
    # bounds (this test is about fencing; tests/test_bounds.py covers the stall).
    Table.create(uri, SCHEMA, ["id"], "unsharded", bounds=Bounds.unbounded()).close()
    topics = [f"race-a-{time.monotonic_ns()}", f"race-b-{time.monotonic_ns()}"]
    models = []
    for i, topic in enumerate(topics):
        kafka.create_topic(topic, 2)
        records, model = workload(1500, 400, seed=10 + i, partitions=2)
        # disjoint key ranges per pipeline
        records = [(k, json.dumps({**json.loads(v), "id": json.loads(v)["id"] + i * 10_000}).encode(), p) for k, v, p in records]
        models.append({key + i * 10_000: {**row, "id": key + i * 10_000} for key, row in model.items()})
        produce(kafka, topic, records)
    cli_args = ("--max-offsets-per-trigger", "100", "--flush-interval", "0")
    # The two overlap deterministically, however loaded the machine: the other query stops in
    # a write task of its micro-batch 3, after writing the shard (its writer holds the
    # shard's epoch), until this query has written everything; then its cached writer is stale.
    marker_dir = tmp_path / "markers"
    marker_dir.mkdir()
    marker = marker_dir / "write.wrote.batch-3"
    other = ingest_cli(uri, str(tmp_path / "ckpt-b"), kafka, topics[1], {ENV: "write.wrote.batch-3=wait", DIR_ENV: str(marker_dir)}, *cli_args)
    err_lines: list[bytes] = []

    def drain_stderr():
        for line in other.stderr:
            err_lines.append(line)

    reader = threading.Thread(target=drain_stderr, daemon=True)
    reader.start()
    deadline = time.monotonic() + 300
    while not marker.exists():
        assert other.poll() is None, b"".join(err_lines).decode()[-3000:]
        assert time.monotonic() < deadline, "the other query never reached micro-batch 3"
        time.sleep(0.1)

    def run_here():
        job = ingest(
            spark, bootstrap=kafka.bootstrap, topic=topics[0], table_uri=uri, checkpoint=str(tmp_path / "ckpt-a"),
            available_now=True, max_offsets_per_trigger=100, options=SinkOptions(source="kafka-json", flush_interval_seconds=0),
        )
        try:
            job.await_termination()
            return job, None
        except Exception as e:  # noqa: BLE001 - inspected below
            return job, str(e)

    job, failed_here = run_here()
    # The other query goes on, with the writer this one fenced (each of its writes into
    # micro-batch 3 stands at the point once more: let them all through).
    deadline = time.monotonic() + 300
    try:
        while other.poll() is None:
            assert time.monotonic() < deadline, "the other query did not finish"
            marker.unlink(missing_ok=True)
            time.sleep(0.05)
    finally:
        if other.poll() is None:  # a failed assertion leaves no query (and its writer process) behind
            os.killpg(other.pid, signal.SIGKILL)
    reader.join(60)
    err = b"".join(err_lines).decode()
    fenced = job.reports.totals().get("fenced_retries", 0)
    fenced += sum(int(line.split(" fenced retr")[0].rsplit(", ", 1)[1]) for line in err.splitlines() if " fenced retr" in line)
    assert fenced > 0 or failed_here or other.returncode  # they really did take the shard from each other
    for failure in (failed_here, err if other.returncode else None):
        if failure:
            # the error class, not its wording: the put and the flush paths both raise FencedError
            assert "FencedError" in failure, failure[-3000:]
    # whatever failed restarts from its checkpoint, now alone, and completes
    if failed_here:
        job, again = run_here()
        assert again is None, again
    if other.returncode:
        restart_here(spark, kafka, topics[1], uri, str(tmp_path / "ckpt-b"), 100, flush_interval_seconds=0)
    Table.open(uri).flush_stranded(0)
    expected = {**models[0], **models[1]}
    assert approx(table_rows(uri)) == approx(expected)
