"""The maintenance service: compaction, index catch-up, GC (and view refresh), in a loop.

Run it as ``memwal maintain URI`` or as a thread inside an ingest process
(:meth:`Maintenance.start`). Every cycle writes its metrics to
``{table}/_memwal/maintenance.json``, which ``memwal status`` shows.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from memwal import paths
from memwal.compactor import Compactor
from memwal.gc import GarbageCollector, GcConfig
from memwal.indexes import IndexMaintainer, index_lag
from memwal.state import TableState
from memwal.writer import ShardWriterPool

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MaintenanceConfig:
    interval_seconds: float = 5.0
    max_backoff_seconds: float = 60.0
    compact: bool = True
    indexes: bool = True
    gc: bool = True
    #: Refresh the table's materialized views after every cycle that compacted something.
    views: bool = True
    max_generations_per_commit: int = 8
    #: Flush acknowledged writes that sat unflushed this long with no writer (None: never).
    flush_stranded_after_seconds: float | None = 60.0
    gc_config: GcConfig = field(default_factory=GcConfig)
    #: Base fragments below this many rows count as small ...
    small_fragment_rows: int = 100_000
    #: ... and once there are this many, they are merged (Lance compact_files).
    max_small_fragments: int = 32
    target_rows_per_fragment: int = 1_048_576


@dataclass
class CycleReport:
    """What one maintenance cycle did, and the table's state after it."""

    started_at: float
    seconds: float = 0.0
    stranded_shards_flushed: int = 0
    compaction_commits: int = 0
    generations_compacted: int = 0
    rows_compacted: int = 0
    rows_per_second: float = 0.0
    base_fragments_compacted: int = 0
    views_refreshed: int = 0
    indexes_caught_up: bool = False
    indexes_created: list[str] = field(default_factory=list)
    index_lag: dict[str, int] = field(default_factory=dict)
    sstables_removed: int = 0
    wal_entries_removed: int = 0
    bytes_reclaimed: int = 0
    pending_sstables: dict[str, int] = field(default_factory=dict)
    error: str | None = None


class Maintenance:
    """Keeps one table compacted, indexed and collected."""

    def __init__(self, state: TableState | str, config: MaintenanceConfig | None = None) -> None:
        self.state = TableState.load(state) if isinstance(state, str) else state
        self.config = config or MaintenanceConfig()
        self.compactor = Compactor(self.state, max_generations_per_commit=self.config.max_generations_per_commit)
        self.indexes = IndexMaintainer(self.state)
        self.gc = GarbageCollector(self.state, self.config.gc_config)
        #: Claims shards whose writers died with unflushed writes, to flush them.
        self.writers = ShardWriterPool(self.state)
        #: Called after every cycle that committed a compaction (views refresh from here).
        self.after_compaction: list[Callable[[CycleReport], None]] = []
        self.totals = {"cycles": 0, "failures": 0, "rows_compacted": 0, "bytes_reclaimed": 0}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_cycle(self) -> CycleReport:
        """One pass: compact every shard, create/catch up indexes, collect garbage."""
        report = CycleReport(started_at=time.time())
        t0 = time.perf_counter()
        self.state.manifests.clear_cache()
        if self.config.flush_stranded_after_seconds is not None:
            report.stranded_shards_flushed = len(self.writers.flush_stranded(self.config.flush_stranded_after_seconds))
        if self.config.compact:
            results = self.compactor.run_once()
            report.compaction_commits = len(results)
            report.generations_compacted = sum(len(r.generations) for r in results)
            report.rows_compacted = sum(r.rows_upserted + r.keys_deleted for r in results)
            busy = sum(r.seconds for r in results)
            report.rows_per_second = report.rows_compacted / busy if busy else 0.0
        if self.config.indexes:
            report.indexes_created = self.indexes.ensure_indexes()
            report.indexes_caught_up = self.indexes.catch_up()
        if self.config.compact and report.compaction_commits:
            report.base_fragments_compacted = self._compact_base_files()
        if self.config.gc:
            for r in self.gc.run_once():
                report.sstables_removed += len(r.sstables_removed)
                report.wal_entries_removed += r.wal_entries_removed
                report.bytes_reclaimed += r.bytes_reclaimed
            report.bytes_reclaimed += self.gc.base_bytes_reclaimed
        if report.compaction_commits:
            if self.config.views:
                report.views_refreshed = self._refresh_views()
            for hook in self.after_compaction:
                hook(report)
        snap = self.state.snapshot()
        report.pending_sstables = {s.shard_id: len(s.live_sstables) for s in snap.shards}
        report.index_lag = {lg.index: lg.total for lg in index_lag(snap.dataset, snap.index)}
        report.seconds = time.perf_counter() - t0
        self.totals["cycles"] += 1
        self.totals["rows_compacted"] += report.rows_compacted
        self.totals["bytes_reclaimed"] += report.bytes_reclaimed
        self._publish(report)
        log.info(
            "maintenance of %s: %d commits (%d generations, %d rows, %.0f rows/s), %d sstables and %d bytes "
            "reclaimed, %d sstables pending, index lag %s, in %.2fs",
            self.state.uri, report.compaction_commits, report.generations_compacted, report.rows_compacted,
            report.rows_per_second, report.sstables_removed, report.bytes_reclaimed,
            sum(report.pending_sstables.values()), report.index_lag or "none", report.seconds,
        )
        return report

    def _refresh_views(self) -> int:
        """Refresh every view of the table; a view that fails is logged, the others go on."""
        from memwal.views import View, ViewBusyError, list_views

        done = 0
        for name in list_views(self.state.uri):
            try:
                if View.open(self.state.uri, name).refresh() is not None:
                    done += 1
            except ViewBusyError as e:
                log.info("view %s: %s", name, e)
            except Exception:  # noqa: BLE001 - one broken view must not stop maintenance
                log.exception("refreshing view %s failed", name)
        return done

    def _compact_base_files(self) -> int:
        """Merge the small base fragments that each compaction commit adds, once there are many."""
        ds = self.state.dataset()
        small = [f for f in ds.get_fragments() if f.count_rows() < self.config.small_fragment_rows]
        if len(small) < self.config.max_small_fragments:
            return 0
        metrics = ds.optimize.compact_files(target_rows_per_fragment=self.config.target_rows_per_fragment)
        log.info("compacted base files: %d fragments removed, %d added", metrics.fragments_removed, metrics.fragments_added)
        return metrics.fragments_removed

    def _publish(self, report: CycleReport) -> None:
        doc = {"last_cycle": asdict(report), "totals": self.totals, "updated_at": time.time()}
        try:
            self.state.io.write(paths.maintenance_metrics(self.state.uri), json.dumps(doc, sort_keys=True).encode())
        except OSError as e:  # metrics are informational; never fail maintenance over them
            log.warning("could not write maintenance metrics: %s", e)

    def run_forever(self, cycles: int | None = None) -> None:
        """Run cycles every ``interval_seconds`` until :meth:`stop` (or ``cycles`` cycles),
        backing off exponentially while cycles fail."""
        failures = 0
        done = 0
        while not self._stop.is_set() and (cycles is None or done < cycles):
            try:
                self.run_cycle()
                failures = 0
            except Exception as e:  # noqa: BLE001 - a service must survive a failed cycle
                failures += 1
                self.totals["failures"] += 1
                delay = min(self.config.interval_seconds * 2**failures, self.config.max_backoff_seconds)
                log.exception("maintenance cycle failed (%s); retrying in %.1fs", e, delay)
                self._publish(CycleReport(started_at=time.time(), error=f"{type(e).__name__}: {e}"))
                self._stop.wait(delay)
                continue
            done += 1
            self._stop.wait(self.config.interval_seconds)

    def start(self) -> threading.Thread:
        """Run the service in a daemon thread (e.g. inside an ingest process)."""
        self._stop.clear()
        self._thread = threading.Thread(target=self.run_forever, name="memwal-maintenance", daemon=True)
        self._thread.start()
        return self._thread

    def stop(self, timeout: float | None = 60.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

