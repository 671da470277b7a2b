"""The Kafka broker (a real Apache Kafka 4) stopped and started again while ``ingest`` runs,
with each Kafka source memwal reads with. The query rides it out (or, if it fails, a restart
from its checkpoint completes the table); the table equals the model, and no record is applied
twice: every Kafka offset is in exactly one committed micro-batch.
"""

from __future__ import annotations

import time

import pytest
from brokers import produce, start_broker
from helpers import approx, table_rows, workload
from test_streaming import SCHEMA

from memwal import Table, readers
from memwal.streaming import ingest
from memwal.write.dead_letters import dead_letter_uri

# soak: 130-140 s a source on the loaded 2-core machine (a broker stopped and restarted, a query
# riding it out), so it runs with the long soak (make soak-tests), not in the default suite.
pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow, pytest.mark.soak]


def _consumed(job) -> int:
    """Records the sink took, over every micro-batch it ran (a replayed one counts again)."""
    return int(job.reports.totals().get("rows", 0))


def _wait(condition, seconds: float, what: str, job) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert job.query.exception() is None, job.query.exception()
        assert time.monotonic() < deadline, f"{what} (consumed {_consumed(job)} records)"
        time.sleep(0.2)


def test_ingest_survives_a_broker_restart(spark, tmp_path, kafka_source):
    with start_broker(tmp_path / "broker") as broker:
        topic = "orders"
        broker.create_topic(topic, 3)
        records, model = workload(6000, 900, seed=37)
        before, after = records[:4000], records[4000:]
        produce(broker, topic, before)
        uri = str(tmp_path / "orders")
        Table.create(uri, SCHEMA, ["id"], "bucket(id, 4)").close()
        job = ingest(
            spark, bootstrap=broker.bootstrap, topic=topic, table_uri=uri, checkpoint=str(tmp_path / "ckpt"),
            trigger_interval=0.2, max_offsets_per_trigger=400, kafka_source=kafka_source,
        )
        try:
            _wait(lambda: _consumed(job) >= 800, 300, "no micro-batch before the restart", job)
            assert _consumed(job) < len(before), "the restart must come mid-ingest"
            broker.restart(down_seconds=5.0)  # same ports, same data
            produce(broker, topic, after)
            _wait(lambda: _consumed(job) >= len(records), 600, "the query did not catch up after the restart", job)
        finally:
            job.stop()
        assert job.query.exception() is None
    # every record in exactly one micro-batch the sink ran: none skipped, none applied twice
    assert _consumed(job) == len(records)
    assert approx(table_rows(uri)) == approx(model)
    scan = readers.open(uri).scan(columns=["id"])
    assert scan.num_rows == len(set(scan.column("id").to_pylist())), "a key appears twice"
    assert job.reports.totals()["dead_letters"] == 0
    assert not readers_dead_letters(uri)


def readers_dead_letters(uri: str) -> list:
    import os

    path = dead_letter_uri(uri)
    if not os.path.exists(path):
        return []
    import lance

    return lance.dataset(path).to_table().to_pylist()
