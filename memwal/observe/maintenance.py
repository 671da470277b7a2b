"""``memwal_maintenance_*``: what a maintenance service running in this process did, cycle by
cycle (``Maintenance.observers``). The table's state after the cycles (SSTables pending, the
age of the last cycle, whoever ran it) is :mod:`memwal.observe.table_health`'s."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from memwal.maintain.metrics import MaintenanceMetrics

#: Cycle durations: from an idle cycle's tens of milliseconds to a large base-file compaction's minutes.
CYCLE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class MaintenanceObserver:
    """Counters over every :class:`MaintenanceMetrics` a service publishes:
    ``service.observers.append(observer)``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        def counter(name: str, doc: str) -> Counter:
            return Counter(f"memwal_maintenance_{name}", doc, registry=registry)

        self.cycles = counter("cycles", "Maintenance cycles that ran to their end (damaged shards skipped)")
        self.failures = counter("cycle_failures", "Maintenance cycles that failed (the service retries with backoff)")
        self.seconds = Histogram("memwal_maintenance_cycle_seconds", "Duration of a maintenance cycle",
                                 buckets=CYCLE_BUCKETS, registry=registry)
        self.commits = counter("compaction_commits", "Compaction commits into the base table")
        self.generations = counter("generations_compacted", "SSTable generations folded into the base table")
        self.rows = counter("compacted_rows", "Rows (upserts and deleted keys) folded into the base table")
        self.base_fragments = counter("base_fragments_compacted", "Base fragments removed by base-file compaction")
        self.stranded = counter("stranded_shards_flushed", "Shards whose dead writers' unflushed writes maintenance flushed")
        self.sstables_removed = counter("sstables_removed", "Compacted SSTables garbage-collected")
        self.wal_removed = counter("wal_entries_removed", "WAL entries garbage-collected")
        self.reclaimed = counter("reclaimed_bytes", "Bytes garbage collection and the bounds reclaimed")
        self.views = counter("views_refreshed", "Materialized view refreshes")
        self.damaged = Gauge("memwal_maintenance_damaged_shards", "Shards the last cycle skipped as damaged", registry=registry)

    def __call__(self, metrics: MaintenanceMetrics) -> None:
        c = metrics.last_cycle
        if c.error:
            self.failures.inc()
            return
        self.cycles.inc()
        self.seconds.observe(c.seconds)
        self.commits.inc(c.compaction_commits)
        self.generations.inc(c.generations_compacted)
        self.rows.inc(c.rows_compacted)
        self.base_fragments.inc(c.base_fragments_compacted)
        self.stranded.inc(c.stranded_shards_flushed)
        self.sstables_removed.inc(c.sstables_removed)
        self.wal_removed.inc(c.wal_entries_removed)
        self.reclaimed.inc(c.bytes_reclaimed)
        self.views.inc(c.views_refreshed)
        self.damaged.set(len(c.damaged_shards))
