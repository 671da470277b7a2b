"""Where one micro-batch's time goes: a typed record joining Spark's progress with the sink's.

Spark times the driver's side of a micro-batch (``StreamingQueryProgress.durationMs``:
``latestOffset``, ``getBatch``, ``queryPlanning``, ``addBatch``, ``walCommit``,
``commitOffsets``, ``triggerExecution``); the sink times the executors' side (the
:class:`~memwal.streaming.sink.BatchReport`: task-seconds reading the source, preparing,
waiting for the exchange, writing shards, and the driver's wait for the job). Joined, they
give one :class:`BatchTiming` per micro-batch. Phases are disjoint by construction, so the
fractions add up to 1 with ``other_ms`` taking what neither side attributes:

- ``planning_ms``: the driver plans the batch (source offsets, partitions, query plan);
- ``read_ms``, ``decode_ms``: the read tasks read Kafka and decode/validate/route;
- ``exchange_ms``: the write task waits for its input (shuffle read, JVM -> Python transfer,
  the payloads' Arrow IPC decoding);
- ``write_ms``: the shard writes;
- ``job_other_ms``: the rest of the Spark job (task launch and scheduling, Python worker
  hand-off, the read stage's shuffle write, results back to the driver);
- ``sink_driver_ms``: ``foreachBatch`` on the driver outside the job (building the write plan);
- ``commit_ms``: Spark's offset log and commit log writes.

Task-seconds are summed over tasks; with tasks in parallel a phase can exceed its share of
wall time, so they are clamped into the job's wall time in that order (the profile is
meant for the one-read-task, one-write-task micro-batches memwal plans below 50k rows).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

#: Phases in the order a micro-batch runs them (the fields of :class:`BatchTiming`).
PHASES = ("planning_ms", "read_ms", "decode_ms", "exchange_ms", "write_ms", "job_other_ms", "sink_driver_ms", "commit_ms", "other_ms")


@dataclass(frozen=True)
class BatchTiming:
    """One micro-batch's wall time (``total_ms``, Spark's ``triggerExecution``) by phase."""

    batch_id: int
    rows: int
    total_ms: float
    planning_ms: float = 0.0
    read_ms: float = 0.0
    decode_ms: float = 0.0
    exchange_ms: float = 0.0
    write_ms: float = 0.0
    job_other_ms: float = 0.0
    sink_driver_ms: float = 0.0
    commit_ms: float = 0.0
    other_ms: float = 0.0

    @classmethod
    def join(cls, batch_id: int, rows: int, duration_ms: Mapping[str, Any], report: Any) -> "BatchTiming":
        """From Spark's ``durationMs`` and the sink's ``BatchReport`` of the same batch."""
        d = {k: float(v or 0) for k, v in duration_ms.items()}
        total = d.get("triggerExecution", 0.0)
        planning = d.get("latestOffset", 0.0) + d.get("getBatch", 0.0) + d.get("queryPlanning", 0.0)
        commit = d.get("walCommit", 0.0) + d.get("commitOffsets", 0.0)
        add_batch = d.get("addBatch", 0.0)
        job = report.job_seconds * 1000
        left = job
        parts = {}
        # The write stage starts after the read stage (a shuffle boundary), so the write
        # task's wait for its input is the shuffle read and the payloads' decoding alone.
        exchange = report.exchange_seconds * 1000
        for name, ms in (("read_ms", report.read_seconds * 1000), ("decode_ms", report.prepare_seconds * 1000),
                         ("exchange_ms", exchange), ("write_ms", report.write_seconds * 1000)):
            parts[name] = min(ms, left)
            left -= parts[name]
        sink_driver = max(0.0, add_batch - job)
        other = max(0.0, total - planning - commit - job - sink_driver)
        return cls(batch_id=batch_id, rows=rows, total_ms=total, planning_ms=planning, job_other_ms=left,
                   sink_driver_ms=sink_driver, commit_ms=commit, other_ms=other, **parts)

    def fractions(self) -> dict[str, float]:
        """Each phase's share of the phases' sum (which is ``total_ms`` unless Spark's
        durations overlap)."""
        values = {p: getattr(self, p) for p in PHASES}
        whole = sum(values.values()) or 1.0
        return {p: v / whole for p, v in values.items()}


def mean_timing(timings: list[BatchTiming]) -> BatchTiming | None:
    """The phase-by-phase mean of ``timings`` (batch_id -1), None if there are none."""
    if not timings:
        return None
    n = len(timings)
    values = {f.name: sum(getattr(t, f.name) for t in timings) / n for f in fields(BatchTiming) if f.name != "batch_id"}
    values["rows"] = int(values["rows"])
    return BatchTiming(batch_id=-1, **values)
