"""``memwal_ingest_*``: an ingest query's micro-batches, one update per batch on the driver.

Every number comes from the batch's :class:`~memwal.streaming.batch_progress.BatchProgress`: the
sink's :class:`~memwal.streaming.sink.BatchReport` (built on the driver from the summary rows
each write task returns, so on a cluster the executors' counters arrive here and one endpoint
answers), Spark's progress (phases, offsets) and the size decision.

Offset-to-visible latency is measured from a record's Kafka timestamp (CreateTime, or
LogAppendTime on topics that set it) to the moment every shard write of its micro-batch had
returned on the driver: the record is then durable in its shard's WAL and strong readers see
it; eventual readers see it after the shard's next flush (``SinkOptions.flush_interval_seconds``,
2 s by default). Each batch observes its oldest record's latency (the batch's worst) in the
histogram; the newest record's is a gauge.

With your own Spark job::

    metrics = IngestMetrics(registry)
    spark.streams.addListener(MemwalProgressListener(sink, "my-query", observers=[metrics]))
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from memwal.core import paths
from memwal.streaming.batch_progress import BatchProgress
from memwal.streaming.timing import PHASES

#: Micro-batch and phase durations: tens of milliseconds (a steady small batch's phase) to minutes.
SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
#: Offset-to-visible latency: sub-second when caught up, minutes to hours behind a backlog.
LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0)

#: BatchReport counters exported as ``memwal_ingest_<name>_total`` (name, field, help).
_COUNTERS = (
    ("records", "rows", "Kafka records the sink took (written rows, dead letters, skipped)"),
    ("upserts", "upserts", "Rows upserted"),
    ("deletes", "deletes", "Keys deleted"),
    ("dead_letters", "dead_letters", "Records sent to the dead-letter table"),
    ("skipped", "skipped", "Records the format skips on purpose (Debezium tombstones)"),
    ("stale_dropped", "stale_dropped", "Records dropped as older than the stored version (--drop-stale)"),
    ("fenced_retries", "fenced_retries", "Shard writes retried after another writer fenced this one"),
    ("writer_opens", "writer_opens", "Shard writers opened (claims: each fences the previous writer)"),
    ("flushes", "flushes", "MemTable flushes to SSTables"),
    ("backpressure_waits", "backpressure_waits", "Shard writes delayed or stalled by the table's SSTable bounds"),
    ("backpressure_seconds", "stall_seconds", "Seconds shard writes waited for compaction (back-pressure)"),
)


class IngestMetrics:
    """An observer of an ingest query (``ingest(..., observers=[metrics])``) exporting its
    micro-batches to ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.batches = Counter("memwal_ingest_batches", "Micro-batches written", registry=registry)
        self.counters = {
            field: Counter(f"memwal_ingest_{name}", doc, registry=registry) for name, field, doc in _COUNTERS
        }
        self.batch_seconds = Histogram("memwal_ingest_batch_seconds", "Wall time of a micro-batch (Spark's triggerExecution)",
                                       buckets=SECONDS_BUCKETS, registry=registry)
        self.phase_seconds = Histogram("memwal_ingest_phase_seconds", "A micro-batch's time by phase (memwal.streaming.timing)",
                                       ["phase"], buckets=SECONDS_BUCKETS, registry=registry)
        self.batch_records = Gauge("memwal_ingest_last_batch_records", "Records of the last micro-batch", registry=registry)
        self.size_limit = Gauge("memwal_ingest_batch_limit_records", "The adaptive size bound of the last micro-batch",
                                registry=registry)
        self.lag = Gauge("memwal_ingest_kafka_lag_records",
                         "Records in the partition beyond the last micro-batch's end offset (when it was planned)",
                         ["topic", "partition"], registry=registry)
        self.lag_total = Gauge("memwal_ingest_kafka_lag_total_records", "Kafka lag summed over partitions", registry=registry)
        self.visible = Histogram("memwal_ingest_offset_to_visible_seconds",
                                 "Per micro-batch, its oldest record's Kafka timestamp to the end of the batch's shard writes",
                                 buckets=LATENCY_BUCKETS, registry=registry)
        self.newest_visible = Gauge("memwal_ingest_last_batch_newest_record_visible_seconds",
                                    "The last micro-batch's newest record: Kafka timestamp to the end of the batch's writes",
                                    registry=registry)
        self.written_at = Gauge("memwal_ingest_last_batch_written_timestamp_seconds",
                                "When the last micro-batch's writes ended (Unix time)", registry=registry)
        #: A whole-database ingest: the same counters per table (``table``: its name under the root).
        self.table_counters = {
            field: Counter(f"memwal_ingest_table_{name}", f"{doc}, per table of a whole-database ingest", ["table"], registry=registry)
            for name, field, doc in _COUNTERS[:5]
        }
        #: partitions seen, so one that vanishes from the offsets is not left at an old value
        self._partitions: set[tuple[str, str]] = set()

    def __call__(self, batch: BatchProgress) -> None:
        r = batch.report
        self.batch_records.set(batch.records)
        if batch.size is not None:
            self.size_limit.set(batch.size.limit)
        if batch.lag:
            seen = set()
            for p in batch.lag:
                labels = (p.topic, str(p.partition))
                self.lag.labels(*labels).set(p.records)
                seen.add(labels)
            for gone in self._partitions - seen:
                self.lag.remove(*gone)
            self._partitions = seen
            self.lag_total.set(batch.lag_records)
        if r is None:  # over Spark Connect the sink reports in the server
            return
        self.batches.inc()
        for field, counter in self.counters.items():
            counter.inc(getattr(r, field))
        for t in batch.tables:
            name = paths.basename(t.table)
            for field, counter in self.table_counters.items():
                counter.labels(name).inc(getattr(t, field))
        if batch.timing is not None:
            self.batch_seconds.observe(batch.timing.total_ms / 1000)
            for phase in PHASES:
                self.phase_seconds.labels(phase.removesuffix("_ms")).observe(getattr(batch.timing, phase) / 1000)
        latency = batch.visible_latency_seconds()
        if latency is not None:
            self.visible.observe(max(0.0, latency[0]))
            self.newest_visible.set(latency[1])
        if r.written_at:
            self.written_at.set(r.written_at)
