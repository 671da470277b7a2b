"""Ingest metrics scraped over real HTTP during a real ingest (Apache Kafka 4, Spark, both
Kafka sources), checked against what was produced; and the Grafana dashboard's queries
against the series that scrape exported."""

from __future__ import annotations

import json
import time

import pytest
from brokers import produce
from helpers import submit_args, workload
from prometheus_client import CollectorRegistry
from test_observe import dashboard_series, scrape, value
from test_streaming import SCHEMA

from memwal import Table
from memwal.maintain.maintenance import Maintenance
from memwal.observe.ingest import IngestMetrics
from memwal.observe.maintenance import MaintenanceObserver
from memwal.observe.server import MetricsServer
from memwal.observe.table_health import TableCollector, TableMetricsConfig
from memwal.streaming import ingest
from memwal.streaming.batch_progress import BatchProgress

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

#: How long before the ingest the records were produced (their CreateTime): every record's
#: offset-to-visible latency is at least this.
AGE_SECONDS = 120


def test_ingest_metrics_during_an_ingest_equal_what_was_produced(spark, kafka, tmp_path):
    topic = f"observed-{time.monotonic_ns()}"
    kafka.create_topic(topic, 2)
    records, _model = workload(1200, 300, seed=7, partitions=2)
    bad = [(b"x1", b"{not json", 0), (b"x2", json.dumps({"name": "no key"}).encode(), 1)]
    produced = records[:600] + bad + records[600:]
    created = int((time.time() - AGE_SECONDS) * 1000)
    produce(kafka, topic, produced, timestamps_ms=[created] * len(produced))
    uri = str(tmp_path / "users")
    Table.create(uri, SCHEMA, ["id"], "bucket(id, 4)").close()

    registry = CollectorRegistry()
    metrics = IngestMetrics(registry)
    TableCollector(uri, registry=registry, config=TableMetricsConfig(interval_seconds=0, health_interval_seconds=0))
    seen: list[tuple[BatchProgress, dict]] = []
    with MetricsServer(registry, 0) as server:

        def scrape_now(batch: BatchProgress) -> None:
            """Runs after IngestMetrics saw the batch: what a scraper sees mid-ingest."""
            seen.append((batch, scrape(server.url)))

        job = ingest(spark, bootstrap=kafka.bootstrap, topic=topic, table_uri=uri, checkpoint=str(tmp_path / "ckpt"),
                     available_now=True, max_offsets_per_trigger=400, kafka_source="spark",
                     observers=[metrics, scrape_now])
        job.await_termination()
        assert job.query.exception() is None

        # Mid-ingest: after each batch, the lag gauges are what the topic still held beyond it.
        batches = [b for b, _ in seen if b.records]
        assert len(batches) >= 3
        read = 0
        for batch, samples in seen:
            read += batch.records
            lags = {dict(labels)["partition"]: v for (name, labels), v in samples.items() if name == "memwal_ingest_kafka_lag_records"}
            assert set(lags) == {"0", "1"}
            assert sum(lags.values()) == len(produced) - read == value(samples, "memwal_ingest_kafka_lag_total_records")
            assert value(samples, "memwal_ingest_last_batch_records") == batch.records
        assert read == len(produced)

        final = scrape(server.url)

    totals = job.reports.totals()
    assert value(final, "memwal_ingest_records_total") == len(produced) == totals["rows"]
    assert value(final, "memwal_ingest_dead_letters_total") == len(bad)
    assert value(final, "memwal_ingest_upserts_total") == totals["upserts"] > 0
    assert value(final, "memwal_ingest_deletes_total") == totals["deletes"] > 0
    assert value(final, "memwal_ingest_batches_total") == totals["batches"] == len(batches)
    assert value(final, "memwal_ingest_writer_opens_total") == totals["writer_opens"] >= 4  # four shards, each claimed
    assert value(final, "memwal_ingest_batch_seconds_count") == len(batches)
    phases = {dict(labels)["phase"] for (name, labels) in final if name == "memwal_ingest_phase_seconds_count"}
    assert {"planning", "read", "decode", "write", "commit"} <= phases
    # Offset-to-visible: one observation per batch (its oldest record), each at least the records' age.
    assert value(final, "memwal_ingest_offset_to_visible_seconds_count") == len(batches)
    assert value(final, "memwal_ingest_offset_to_visible_seconds_bucket", le="60.0") == 0
    assert value(final, "memwal_ingest_offset_to_visible_seconds_sum") >= AGE_SECONDS * len(batches)
    assert AGE_SECONDS <= value(final, "memwal_ingest_last_batch_newest_record_visible_seconds") < AGE_SECONDS + 600
    assert value(final, "memwal_ingest_kafka_lag_total_records") == 0
    assert value(final, "memwal_table_up") == 1


def test_every_series_the_dashboard_queries_is_exported(spark, kafka, tmp_path):
    """One endpoint with everything an ingest process with ``--maintain`` serves, after a real
    ingest and a maintenance cycle: every name in the dashboard's queries is in the scrape."""
    topic = f"dashboard-{time.monotonic_ns()}"
    kafka.create_topic(topic, 2)
    records, _ = workload(600, 200, seed=8, partitions=2)
    produce(kafka, topic, records)
    uri = str(tmp_path / "users")
    Table.create(uri, SCHEMA, ["id"], "bucket(id, 2)").close()
    registry = CollectorRegistry()
    TableCollector(uri, registry=registry, config=TableMetricsConfig(interval_seconds=0, health_interval_seconds=0))
    service = Maintenance(uri)
    service.observers.append(MaintenanceObserver(registry))
    with MetricsServer(registry, 0) as server:
        job = ingest(spark, bootstrap=kafka.bootstrap, topic=topic, table_uri=uri, checkpoint=str(tmp_path / "ckpt"),
                     available_now=True, max_offsets_per_trigger=300, observers=[IngestMetrics(registry)])
        job.await_termination()
        service.run_cycle()
        exported = {name for name, _labels in scrape(server.url)}
    wanted = dashboard_series()
    assert len(wanted) >= 25
    assert wanted <= exported, sorted(wanted - exported)


@pytest.mark.slow
def test_one_endpoint_answers_for_a_cluster(kafka, tmp_path):
    """``memwal ingest --master local-cluster[2,1,1024] --metrics-port 0 --maintain``: the write
    tasks run in two executor JVMs' Python workers, and the driver's endpoint counts every
    record they wrote (from the batches' summary rows), with the table's and maintenance's
    series beside them."""
    import os
    import re
    import signal
    import subprocess
    import sys
    import threading
    from pathlib import Path

    from test_cluster import executor_pids
    from test_observe import wait_for

    topic = f"cluster-metrics-{time.monotonic_ns()}"
    kafka.create_topic(topic, 4)
    records, _ = workload(2000, 400, seed=23, partitions=4)
    produce(kafka, topic, records)
    uri = str(tmp_path / "users")
    Table.create(uri, SCHEMA, ["id"], "bucket(id, 4)").close()
    here = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYSPARK_SUBMIT_ARGS": submit_args(f"spark.executorEnv.PYTHONPATH={here}"),
           "SPARK_WORKER_DIR": str(tmp_path / "spark-work")}
    p = subprocess.Popen(
        [sys.executable, "-m", "memwal", "ingest", "--master", "local-cluster[2,1,1024]", "--bootstrap", kafka.bootstrap,
         "--topic", topic, "--table", uri, "--checkpoint", str(tmp_path / "ckpt"), "--trigger-interval", "1",
         "--max-offsets-per-trigger", "500", "--max-write-tasks", "2", "--maintain", "--metrics-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
    )
    found: list[str] = []
    log: list[str] = []

    def drain() -> None:
        for line in p.stderr:
            log.append(line)
            m = re.search(r"metrics on (http://127\.0\.0\.1:\d+/metrics)", line)
            if m:
                found.append(m.group(1))

    threading.Thread(target=drain, daemon=True).start()
    try:
        deadline = time.monotonic() + 300
        while not found:
            assert p.poll() is None and time.monotonic() < deadline, "".join(log[-50:])
            time.sleep(0.2)
        samples = wait_for(found[0], lambda s: s.get(("memwal_ingest_records_total", ()), 0) >= len(records), timeout=600)
        assert value(samples, "memwal_ingest_records_total") == len(records)
        assert len(executor_pids(p.pid)) == 2
        assert value(samples, "memwal_ingest_writer_opens_total") >= 4
        assert value(samples, "memwal_shards") == 4
        wait_for(found[0], lambda s: s.get(("memwal_maintenance_cycles_total", ()), 0) >= 1, timeout=300)
        p.send_signal(signal.SIGINT)
        out, _ = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, "".join(log[-50:])
    assert f"ingested {len(records)} records" in out


def test_ingest_draws_a_progress_bar_on_a_terminal(kafka, tmp_path):
    """``memwal ingest --available-now`` over a backlog: a bar of records out of the backlog
    (the Kafka lag) on a terminal. (Into a pipe, none: the command-line ingest of
    tests/test_debezium_defaults.py.)"""
    from test_terminal import Terminal

    topic = f"progress-{time.monotonic_ns()}"
    kafka.create_topic(topic, 2)
    records, _ = workload(1500, 300, seed=9, partitions=2)
    produce(kafka, topic, records)
    uri = str(tmp_path / "users")
    Table.create(uri, SCHEMA, ["id"], "bucket(id, 2)").close()
    term = Terminal("ingest", "--bootstrap", kafka.bootstrap, "--topic", topic, "--table", uri, "--checkpoint", str(tmp_path / "tty"),
                    "--available-now", "--max-offsets-per-trigger", "500")
    assert term.finish(timeout=600) == 0
    assert f"ingesting {topic}" in term.text and f"{len(records):,}/{len(records):,} records" in term.text
    assert f"ingested {len(records)} records" in term.text
