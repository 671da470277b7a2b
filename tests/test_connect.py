"""The memwal sink through a Spark Connect client session (``SparkSession.builder.remote``).

A local Connect server is started from the pip package (``spark-submit`` of the
SparkConnectServer class, bound to 127.0.0.1 on a free port); its Python workers run this
interpreter with this repository on their path. Over Connect the ``foreachBatch`` function is
pickled and run in the server, so the test proves the sink pickles, never needs a
SparkContext, and that the per-micro-batch report (the query's observed metrics) reaches the
client.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from brokers import produce
from test_streaming import SCHEMA, approx, table_rows, workload

import memwal
from memwal import Table
from memwal.streaming import BatchReport, MemwalSink, SinkOptions, ingest
from memwal.streaming.job import observed_metrics
from memwal.streaming.session import default_parallelism, is_connect

REPO = Path(memwal.__file__).resolve().parent.parent
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def test_the_sink_pickles_without_its_lock_or_reports(table_uri):
    """What ``foreachBatch`` ships to a Connect server: no lock, no reports of this process."""
    from pyspark import cloudpickle

    Table.create(table_uri, SCHEMA, ["id"], "bucket(id, 4)").close()
    sink = MemwalSink(table_uri, SinkOptions(source="kafka-json", max_write_tasks=2))
    sink._record(BatchReport(batch_id=0, rows=1))
    copy = pickle.loads(cloudpickle.dumps(sink))
    assert copy.reports == [] and copy.report(0) is None
    assert copy.options == sink.options and copy.storage == sink.storage and copy.partitions == sink.partitions
    assert sink.report(0) is not None  # the original keeps its own


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the Connect server exited ({proc.returncode}):\n{log.read_text()[-4000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise RuntimeError(f"the Connect server did not listen in {timeout:.0f} s:\n{log.read_text()[-4000:]}")


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory):
    """A local Spark Connect server (``local[2]``) on 127.0.0.1; yields its ``sc://`` URL."""
    import pyspark

    spark_home = Path(pyspark.__file__).parent
    port = _free_port()
    log = tmp_path_factory.mktemp("connect") / "server.log"
    env = dict(os.environ)
    env.update(
        SPARK_HOME=str(spark_home),
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p),
        PATH=os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", ""))),
    )
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    conf = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "4",
        "spark.default.parallelism": "2",
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    }
    args = [str(spark_home / "bin" / "spark-submit"), "--class", SERVER_CLASS, "--master", "local[2]"]
    for k, v in conf.items():
        args += ["--conf", f"{k}={v}"]
    with open(log, "wb") as out:
        # Its own process group: the JVM and its Python workers go down together.
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_for_port(port, proc, log, timeout=180)
        yield f"sc://127.0.0.1:{port}"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass  # the server's process group is already gone


@pytest.fixture(scope="module")
def remote(connect_server):
    from pyspark.sql import SparkSession

    # A Connect client switches this whole process to Connect mode (PySpark sets
    # SPARK_CONNECT_MODE_ENABLED / SPARK_REMOTE and keeps spark.remote on the shared builder):
    # undo that afterwards, or every later classic local session would try to connect too.
    saved = {k: os.environ.get(k) for k in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE")}
    session = SparkSession.builder.remote(connect_server).getOrCreate()
    try:
        yield session
    finally:
        session.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        SparkSession.builder._options.pop("spark.remote", None)  # noqa: SLF001 - the builder is a shared singleton


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.kafka
def test_ingest_through_spark_connect_equals_the_model(remote, kafka, tmp_path):
    assert is_connect(remote)
    assert default_parallelism(remote) == 2  # from the server's configuration, no SparkContext
    topic = f"connect-{time.monotonic_ns()}"
    kafka.create_topic(topic, 3)
    records, model = workload(3000, 500, seed=11)
    produce(kafka, topic, records)
    uri = str(tmp_path / "users")
    Table.create(uri, SCHEMA, ["id"], "bucket(id, 4)").close()
    job = ingest(
        remote,
        bootstrap=kafka.bootstrap,
        topic=topic,
        table_uri=uri,
        checkpoint=str(tmp_path / "ckpt"),
        available_now=True,
        max_offsets_per_trigger=1000,
    )
    job.await_termination()
    assert job.query.exception() is None
    assert approx(table_rows(uri)) == approx(model)
    assert len(Table.open(uri).manifests.list_shards()) == 4
    # The records of each micro-batch reached the client in the query's progress ...
    observed = [observed_metrics(p) for p in job.query.recentProgress]
    assert sum(o.get("rows", 0) for o in observed) == len(records)
    assert len([o for o in observed if o.get("rows")]) >= 3
    progress = job.listener.progress
    assert sum(p["observed"].get("rows", 0) for p in progress.values()) == len(records)
    # ... and the write side's reports, made by the commits on the server, through the
    # directory they leave them in (this server shares the client's file system).
    totals = job.reports.totals()
    assert totals["rows"] == len(records) and totals["dead_letters"] == 0
    assert totals["upserts"] + totals["deletes"] >= len(model)  # (newest per key of each write)


@pytest.mark.slow
@pytest.mark.spark
def test_the_memwal_format_reads_and_writes_over_spark_connect(remote, tmp_path):
    """format("memwal") from a Connect client: the server finds the data source by name."""
    from test_spark_format import by_id, layered_table

    from memwal import readers

    uri = str(tmp_path / "t")
    strong = layered_table(uri)
    assert by_id(remote.read.format("memwal").load(uri).collect()) == {r["id"]: r for r in readers.open(uri).scan().to_pylist()}
    remote.createDataFrame([(i,) for i in range(0, 60, 2)], "id long").write.format("memwal") \
        .mode("append").option("operation", "delete").save(uri)
    for i in range(0, 60, 2):
        strong.pop(i, None)
    # (the write's flush also made the WAL tail of the shards it wrote visible to eventual reads)
    assert by_id(remote.read.format("memwal").option("consistency", "strong").load(uri).collect()) == strong
