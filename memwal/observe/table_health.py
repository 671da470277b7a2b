"""The table as it is on storage, as gauges: a :class:`TableSample` taken when scraped, at
most every ``interval`` seconds (health, which reads what ``memwal check`` reads, at most every
``health_interval``), so scrapes cost the table a few listings, not a walk per scrape.

What it reads is what ``memwal status`` reads (:func:`memwal.maintain.status.table_status`) plus each
shard's WAL listing (its bytes) and its uncompacted SSTables' rows and bytes from the
manifests (the compaction debt), and :func:`memwal.maintain.health.table_health`. It reflects every
writer and maintenance service of the table, not only the ones in this process.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from memwal.core import paths
from memwal.maintain.health import CHECKS, HealthConfig, HealthReport, table_health
from memwal.core.state import TableState
from memwal.maintain.status import TableStatus, table_status
from memwal.core.storage import StorageConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShardSample:
    shard_id: str
    #: bytes of the shard's WAL files on storage (GC removes those an SSTable covers)
    wal_bytes: int
    #: rows and in-memory bytes of the SSTables not yet compacted into the base
    debt_rows: int
    debt_bytes: int


@dataclass(frozen=True)
class TableSample:
    """One look at the table: its status, per shard what status lacks, and its health."""

    taken_at: float
    status: TableStatus
    shards: tuple[ShardSample, ...]
    health: HealthReport | None


def sample_table(state: TableState, health: HealthReport | None = None) -> TableSample:
    """Status, WAL bytes and compaction debt per shard, read from storage now."""
    state.manifests.clear_cache()
    status = table_status(state)
    snap = state.snapshot()
    live = {s.shard_id: s.live_sstables for s in snap.shards}
    shards = []
    for s in status.shards:
        wal = sum(o.size for o in state.io.list_prefix(paths.wal_dir(state.uri, s.shard_id)))
        pending = live.get(s.shard_id, ())
        shards.append(ShardSample(s.shard_id, wal, sum(t.physical_rows for t in pending), sum(t.in_memory_bytes for t in pending)))
    return TableSample(time.time(), status, tuple(shards), health)


@dataclass(frozen=True)
class TableMetricsConfig:
    #: A scrape reads the table again once the last sample is this old (a few listings and
    #: manifest reads per shard; on an object store, requests).
    interval_seconds: float = 5.0
    #: The health checks to run (None: no ``memwal_health_*`` series) ...
    health: HealthConfig | None = field(default_factory=HealthConfig)
    #: ... at most this often: a deep check reads every listed SSTable's keys.
    health_interval_seconds: float = 60.0


class TableCollector(Collector):
    """Exports the latest :class:`TableSample` of one table, sampling again when a scrape
    finds it older than ``config.interval_seconds``. A sample that fails sets ``memwal_table_up`` to 0
    and keeps the previous values out (a scrape never shows numbers from a failed read)."""

    def __init__(self, uri: str, storage: StorageConfig | None = None, config: TableMetricsConfig | None = None,
                 registry: CollectorRegistry | None = None) -> None:
        self.uri = uri
        self.storage = storage
        self.config = config or TableMetricsConfig()
        self._state: TableState | None = None
        self._sample: TableSample | None = None
        self._health: HealthReport | None = None
        self._failed = False
        self._lock = threading.Lock()
        if registry is not None:
            registry.register(self)

    def sample(self) -> TableSample | None:
        """The current sample (taken now if the last one is older than ``interval``)."""
        with self._lock:
            now = time.time()
            if self._sample is not None and now - self._sample.taken_at < self.config.interval_seconds and not self._failed:
                return self._sample
            try:
                # A handle of its own: the table's other users (a maintenance thread) clear and
                # fill their manifest caches on their own schedule.
                if self._state is None:
                    self._state = TableState.load(self.uri, self.storage)
                sample = sample_table(self._state)
                health = self.config.health
                if health is not None and (self._health is None or now - self._health.checked_at >= self.config.health_interval_seconds):
                    self._health = table_health(self._state, health, sample.status)
                self._sample = TableSample(sample.taken_at, sample.status, sample.shards, self._health)
                self._failed = False
            except Exception:  # noqa: BLE001 - a scrape must answer; the failure is the memwal_table_up series
                log.exception("sampling table %s for metrics failed", self.uri)
                self._failed = True
            return None if self._failed else self._sample

    def collect(self) -> Iterator[GaugeMetricFamily]:
        sample = self.sample()
        yield GaugeMetricFamily("memwal_table_up", "1 when the table could be read for this scrape", value=0 if sample is None else 1)
        if sample is None:
            return
        yield from _families(sample, time.time())


def _gauge(name: str, doc: str, value: float | None = None, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value, labels=labels)


def _families(sample: TableSample, now: float) -> Iterator[GaugeMetricFamily]:
    st = sample.status
    yield _gauge("memwal_table_sample_timestamp_seconds", "When the table was last read for these gauges", sample.taken_at)
    yield _gauge("memwal_base_version", "Version of the base table", st.base_version)
    yield _gauge("memwal_base_rows", "Rows in the base table (compacted data)", st.base_rows)
    yield _gauge("memwal_shards", "Shards of the table", st.num_shards)
    if st.base is not None:
        yield _gauge("memwal_base_fragments", "Fragments of the base table", st.base.fragments)
        yield _gauge("memwal_base_versions", "Base table versions on storage", st.base.versions)
        yield _gauge("memwal_base_manifest_bytes", "Size of the base table's manifest", st.base.manifest_bytes)
        yield _gauge("memwal_base_live_bytes", "Bytes of the base's current data and index files", st.base.live_bytes)
    if st.bounds is not None:
        b = st.bounds
        yield _gauge("memwal_bounds_max_sstables", "Uncompacted SSTables per shard maintenance keeps shards under", b.max_sstables)
        yield _gauge("memwal_bounds_slowdown_sstables", "Uncompacted SSTables per shard from which writes slow down", b.slowdown_sstables)
        yield _gauge("memwal_bounds_stop_sstables", "Uncompacted SSTables per shard from which writes wait for compaction", b.stop_sstables)

    per_shard = {
        "pending_sstables": ("SSTables not yet compacted into the base (what readers merge)", lambda s, x: s.pending_sstables),
        "generation": ("The shard's current (next) SSTable generation", lambda s, x: s.current_generation),
        "compacted_generation": ("The highest generation compacted into the base", lambda s, x: s.compacted_generation),
        "writer_epoch": ("The shard's writer epoch (each claim adds one, fencing the previous writer)", lambda s, x: s.writer_epoch),
        "unflushed_wal_entries": ("WAL entries not yet covered by an SSTable", lambda s, x: max(0, s.wal_tail_position - s.wal_flushed_position)),
        "wal_bytes": ("Bytes of the shard's WAL files on storage", lambda s, x: x.wal_bytes),
        "compaction_debt_rows": ("Rows in SSTables not yet compacted into the base", lambda s, x: x.debt_rows),
        "compaction_debt_bytes": ("In-memory bytes of SSTables not yet compacted into the base", lambda s, x: x.debt_bytes),
        "writes_slowed": ("1 when writes into the shard are delayed (pending SSTables at the slowdown bound)", lambda s, x: int(s.slowed)),
        "writes_stalled": ("1 when writes into the shard wait for compaction (the stop bound)", lambda s, x: int(s.stalled)),
    }
    extra = {x.shard_id: x for x in sample.shards}
    for name, (doc, value) in per_shard.items():
        g = _gauge(f"memwal_shard_{name}", doc, labels=["shard"])
        for s in st.shards:
            g.add_metric([s.shard_id], value(s, extra[s.shard_id]))
        yield g
    yield _gauge("memwal_compaction_debt_rows", "Rows in SSTables not yet compacted, all shards", sum(x.debt_rows for x in sample.shards))
    yield _gauge("memwal_compaction_debt_bytes", "In-memory bytes of SSTables not yet compacted, all shards", sum(x.debt_bytes for x in sample.shards))

    lag = _gauge("memwal_index_lag_generations", "Generations a base index is behind compaction, summed over shards", labels=["index"])
    for index, per in sorted(st.index_lag_generations.items()):
        lag.add_metric([index], sum(per.values()))
    yield lag

    m = st.maintenance.metrics if st.maintenance is not None else None
    if m is not None:
        c = m.last_cycle
        yield _gauge("memwal_maintenance_last_cycle_timestamp_seconds", "When the last maintenance cycle published (Unix time)", m.updated_at)
        yield _gauge("memwal_maintenance_last_cycle_age_seconds", "Seconds since the last maintenance cycle published", max(0.0, now - m.updated_at))
        yield _gauge("memwal_maintenance_last_cycle_failed", "1 when the last maintenance cycle failed", int(bool(c.error)))
        yield _gauge("memwal_maintenance_last_cycle_duration_seconds", "Duration of the last maintenance cycle", c.seconds)
        yield _gauge("memwal_maintenance_service_cycles", "Cycles of the service that published last, since it started", m.totals.cycles)
        yield _gauge("memwal_maintenance_service_failures", "Failed cycles of the service that published last", m.totals.failures)
        if c.disk_bytes is not None:
            yield _gauge("memwal_disk_bytes", "Bytes under the table's directory (measured by the last cycle)", c.disk_bytes)
            if c.live_bytes:
                yield _gauge("memwal_disk_over_live_ratio", "Disk use over the live base data (bounded by max_disk_ratio)", c.disk_bytes / c.live_bytes)
        over = _gauge("memwal_bounds_exceeded", "1 for each bound the base exceeded after the last cycle", labels=["bound"])
        for bound in c.bounds_exceeded:
            over.add_metric([bound], 1)
        yield over

    h = sample.health
    if h is not None:
        checks = _gauge("memwal_health_check", "1 when the health check passes, 0 when it fails (memwal health)", labels=["check"])
        for name in CHECKS:
            result = h.check(name)
            if result.ok is not None:
                checks.add_metric([name], int(result.ok))
        yield checks
        yield _gauge("memwal_healthy", "1 when every health check that ran passes", int(h.ok))
        yield _gauge("memwal_health_timestamp_seconds", "When the health checks last ran (Unix time)", h.checked_at)
