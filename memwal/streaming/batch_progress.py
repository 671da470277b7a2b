"""One micro-batch of an ingest query as observers see it: a typed record joining Spark's
progress with the sink's report, and the Kafka lag it leaves per partition.

The driver's :class:`~memwal.streaming.job.MemwalProgressListener` builds a
:class:`BatchProgress` for every micro-batch and hands it to its observers (the Prometheus
adapter :class:`memwal.observe.ingest.IngestMetrics`, the CLI's progress bar). Everything in
it was measured on the driver or came back from the executors inside the batch's summary rows
(:class:`~memwal.write.api.WriteReport`), so on a cluster one process sees it all.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from memwal.streaming.adaptive import SizeDecision
from memwal.write.messages import WriteReport
from memwal.streaming.timing import BatchTiming


@dataclass(frozen=True)
class PartitionLag:
    """How far one topic-partition's reader is behind the broker after a micro-batch."""

    topic: str
    partition: int
    #: the offset the micro-batch read up to (exclusive)
    end_offset: int
    #: the partition's end (high watermark) when the source planned the batch
    latest_offset: int

    @property
    def records(self) -> int:
        """Records the broker held beyond the batch: what the next batches still owe."""
        return max(0, self.latest_offset - self.end_offset)


def _offsets(doc: str | Mapping[str, Any] | None) -> dict[tuple[str, int], int]:
    """``{"topic": {"0": n, ...}, ...}`` (Spark's Kafka offsets JSON, which both sources
    report) as (topic, partition) -> offset; keys that are not topics (memwal's
    ``memwal:readLimit``) are left out."""
    if not doc:
        return {}
    parsed = json.loads(doc) if isinstance(doc, str) else doc
    out = {}
    for topic, parts in parsed.items():
        if not isinstance(parts, Mapping):
            continue
        for partition, offset in parts.items():
            if isinstance(offset, int) and not isinstance(offset, bool):
                out[(str(topic), int(partition))] = offset
    return out


def partition_lag(end_offset: str | Mapping[str, Any] | None, latest_offset: str | Mapping[str, Any] | None) -> tuple[PartitionLag, ...]:
    """The lag of every partition in both documents (a source progress's ``endOffset`` and
    ``latestOffset``), ordered by topic and partition."""
    end, latest = _offsets(end_offset), _offsets(latest_offset)
    return tuple(PartitionLag(t, p, end[(t, p)], latest[(t, p)]) for t, p in sorted(end.keys() & latest.keys()))


@dataclass(frozen=True)
class BatchProgress:
    """One micro-batch of an ingest query, after Spark reported its progress."""

    batch_id: int
    #: rows the source produced (Spark's ``numInputRows``): Kafka records for Spark's source,
    #: the prepare stage's exchange rows for memwal's (which prepares inside its read tasks)
    input_rows: int
    #: the sink's counters (None over Spark Connect, where the sink runs in the server)
    report: WriteReport | None
    #: where the batch's time went (None without a report)
    timing: BatchTiming | None
    #: the adaptive size decision (None with fixed sizes)
    size: SizeDecision | None
    #: per topic-partition lag after the batch (empty when the source reports no offsets)
    lag: tuple[PartitionLag, ...] = ()
    #: a whole-database ingest's batch: what it wrote to each table (:attr:`WriteReport.table`)
    tables: tuple[WriteReport, ...] = ()

    @property
    def records(self) -> int:
        """Kafka records the micro-batch took: the sink's count (written rows, dead letters,
        skipped), else the source's."""
        return self.report.rows if self.report is not None else self.input_rows

    @property
    def lag_records(self) -> int:
        return sum(p.records for p in self.lag)

    def visible_latency_seconds(self) -> tuple[float, float] | None:
        """(oldest, newest) record's offset-to-visible latency: from its Kafka timestamp to the
        moment the batch's shard writes had all returned (durable in the WAL, so strong readers
        see it; eventual readers after the next flush). None without Kafka timestamps."""
        r = self.report
        if r is None or r.oldest_record_ms is None or r.newest_record_ms is None or not r.written_at:
            return None
        return r.written_at - r.oldest_record_ms / 1000, r.written_at - r.newest_record_ms / 1000


#: What observes an ingest query: called on the driver once per micro-batch, in order.
BatchObserver = Callable[[BatchProgress], None]
