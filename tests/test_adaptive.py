"""Adaptive micro-batches: the policy's bounds (against its simple model), and a backlog
drained through a real broker and a real SparkSession in micro-batches that grow and then
shrink back, with the decisions read from the query's progress."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memwal.streaming.adaptive import BYTE_BOUND, GROW, ROW_BOUND, STEADY, AdaptiveSizing, decision_of
from memwal.streaming.timing import PHASES, BatchTiming


@given(
    steady=st.integers(1, 10_000),
    max_rows=st.integers(1, 100_000),
    max_bytes=st.integers(1, 10**8),
    record_bytes=st.integers(1, 10_000),
    growth=st.floats(1.0, 4.0),
    backlogs=st.lists(st.integers(0, 10**6), min_size=1, max_size=20),
)
def test_bounds_stay_between_steady_and_ceiling_and_grow_only_under_backlog(steady, max_rows, max_bytes, record_bytes, growth, backlogs):
    policy = AdaptiveSizing(steady, max_rows, max_bytes, record_bytes, growth)
    previous = None
    for backlog in backlogs:
        d = policy.decide(previous, backlog)
        assert steady <= d.limit <= policy.ceiling
        if backlog <= steady:
            assert (d.kind, d.limit) == (STEADY, steady)
        else:
            # the model: grow by `growth` from the previous bound, clamped to the ceiling
            want = min(policy.ceiling, max(steady, int((previous or steady) * growth)))
            assert d.limit == want
            assert d.kind in ((ROW_BOUND, BYTE_BOUND) if want == policy.ceiling else (GROW,))
        assert d.rows == min(d.limit, backlog)
        previous = d.limit


def test_the_byte_bound_wins_when_it_is_the_smaller():
    policy = AdaptiveSizing(steady_rows=100, max_rows=10_000, max_bytes=1_000_000, record_bytes=1000, growth=100)
    d = policy.decide(None, 50_000)
    assert (d.kind, d.limit) == (BYTE_BOUND, 1000)
    assert decision_of(json.dumps({"t": {"0": 5}, "memwal:readLimit": policy(None, 50_000)})) == d
    assert decision_of(json.dumps({"t": {"0": 5}})) is None


def test_a_timing_splits_the_whole_batch_into_phases():
    from memwal.streaming.sink import BatchReport

    report = BatchReport(batch_id=3, job_seconds=0.2, read_seconds=0.05, prepare_seconds=0.04, exchange_seconds=0.03, write_seconds=0.01)
    spark = {"latestOffset": 10, "getBatch": 1, "queryPlanning": 9, "addBatch": 230, "walCommit": 15, "commitOffsets": 15, "triggerExecution": 300}
    t = BatchTiming.join(3, 10_000, spark, report)
    assert (t.planning_ms, t.commit_ms, t.sink_driver_ms) == (20, 30, 30)
    assert t.read_ms == pytest.approx(50) and t.decode_ms == pytest.approx(40) and t.exchange_ms == pytest.approx(30)
    assert sum(getattr(t, p) for p in PHASES) == pytest.approx(t.total_ms)
    assert sum(t.fractions().values()) == pytest.approx(1.0)


@pytest.mark.spark
@pytest.mark.kafka
def test_a_backlog_drains_in_bounded_batches_then_steady_ones(spark, kafka, tmp_path, kafka_source):
    from test_streaming import SCHEMA, approx, table_rows, workload
    from brokers import produce

    from memwal import Table
    from memwal.streaming import ingest

    topic = f"backlog-{time.monotonic_ns()}"
    kafka.create_topic(topic, 3)
    records, _ = workload(6000, 3000, seed=5)
    produce(kafka, topic, records)
    uri = str(tmp_path / "users")
    Table.create(uri, SCHEMA, ["id"], "bucket(id, 4)").close()
    policy = AdaptiveSizing(steady_rows=500, max_rows=2000, growth=2.0)
    job = ingest(spark, bootstrap=kafka.bootstrap, topic=topic, table_uri=uri, checkpoint=str(tmp_path / "ckpt"),
                 trigger_interval=0.2, adaptive=policy, kafka_source=kafka_source)
    try:
        deadline = time.monotonic() + 240
        while sum(d.rows for d in job.listener.sizes.values()) < len(records) and time.monotonic() < deadline:
            time.sleep(0.2)
        more, _ = workload(300, 3000, seed=6)
        produce(kafka, topic, more)
        while sum(d.rows for d in job.listener.sizes.values()) < len(records) + len(more) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        job.stop()
    assert job.query.exception() is None
    sizes = [job.listener.sizes[b] for b in sorted(job.listener.sizes)]
    if kafka_source == "python":
        # 6000 waiting: 1000 (grow), 2000 (row bound), 2000, then the last 1000 under the ceiling
        assert [(d.kind, d.limit, d.rows) for d in sizes[:3]] == [(GROW, 1000, 1000), (ROW_BOUND, 2000, 2000), (ROW_BOUND, 2000, 2000)]
    else:
        # Spark's source takes one bound, the policy's ceiling, and splits it over the partitions
        # (rounding may leave a record): ~2000 a batch while the backlog lasts
        assert [d.kind for d in sizes[:2]] == [ROW_BOUND] * 2
        assert all(1990 <= d.rows <= 2000 for d in sizes[:2])
    steady = [d for d in sizes if d.kind == STEADY]
    assert steady and all(d.limit == (500 if kafka_source == "python" else 2000) and d.rows <= 500 for d in steady)
    assert min(d.rows for d in sizes[:3]) > max(d.rows for d in steady)
    assert sum(d.rows for d in sizes) == len(records) + len(more)
    # every batch's reason reached its sink report, and every batch has its timing
    for b, d in job.listener.sizes.items():
        assert job.reports.report(b).size_reason == d.reason
        assert job.listener.timings[b].rows == d.rows
    model: dict[int, dict] = {}
    for _, value, _ in records + more:  # one key's records stay in one partition, in order
        row = json.loads(value)
        if row.pop("op") == "delete":
            model.pop(row["id"], None)
        else:
            model[row["id"]] = row
    assert approx(table_rows(uri, "strong")) == approx(model)


@given(bound=st.one_of(st.none(), st.integers(0, 10_000_000)), min_rows=st.one_of(st.none(), st.integers(1, 1_000_000)), slots=st.integers(1, 64))
def test_read_tasks_of_spark_kafka_micro_batches(bound, min_rows, slots):
    """Spark's source's partitions are merged into one wave of tasks (at most the slots), each
    with at least ``min_rows`` of the bound when the bound allows; None leaves Spark's plan."""
    from memwal.streaming.job import read_tasks

    tasks = read_tasks(bound, min_rows, slots)
    if min_rows is None:
        assert tasks is None
        return
    assert 1 <= tasks <= slots
    if bound:
        assert (tasks - 1) * min_rows < bound  # no task more than the bound needs
        assert tasks == slots or tasks * min_rows >= bound  # fewer than the slots only when each task is full enough
    else:
        assert tasks == slots


def test_read_tasks_examples():
    from memwal.streaming.job import MIN_ROWS_PER_TASK, read_tasks

    assert read_tasks(10_000, MIN_ROWS_PER_TASK, 2) == 1  # a steady micro-batch: one Python task
    assert read_tasks(400_000, MIN_ROWS_PER_TASK, 2) == 2  # a catch-up's: every slot
    assert read_tasks(None, MIN_ROWS_PER_TASK, 2) == 2
    assert read_tasks(10_000, None, 2) is None
