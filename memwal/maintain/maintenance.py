"""The maintenance service: compaction, index catch-up, GC (and view refresh), in a loop.

Run it as ``memwal maintain URI`` or as a thread inside an ingest process
(:meth:`Maintenance.start`). Every cycle writes its metrics (a versioned
:class:`~memwal.maintain.metrics.MaintenanceMetrics`) to ``{table}/_memwal/maintenance.json``,
which ``memwal status`` shows.

A damaged file in one shard does not stop the others. Each per-shard stage (flushing
stranded writes, compaction, GC) runs shard by shard; a shard whose manifest cannot be
decoded, whose listed SSTable cannot be read, or whose WAL has a gap is skipped and listed in
the cycle's report (:class:`~memwal.maintain.metrics.ShardDamage`, naming the file), and the cycle goes
on with the rest. A WAL gap only stops the flush (flushing would drop the writes after the
gap); compaction and GC of the shard's flushed data go on, since they never read the WAL above
the flushed position. Any other damage takes the shard out of the remaining stages. The
cycle publishes its report, then raises the first shard's :class:`TableDamagedError`, so a
caller (``memwal maintain --once``: exit 3) learns of it only after the rest is done.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import lance

from memwal.core import paths
from memwal.maintain.basefiles import BaseFiles
from memwal.maintain.bounds import FoldSchedule, compaction_order
from memwal.maintain.compactor import CompactionResult, Compactor
from memwal.core.errors import TableDamagedError, WalGapError
from memwal.maintain.gc import GarbageCollector, GcConfig
from memwal.core.indexes import IndexMaintainer, index_lag, index_segments
from memwal.core.lance_errors import lance_message, memwal_errors, storage_failure
from memwal.core.metadata import Bounds
from memwal.maintain.metrics import CycleReport, MaintenanceMetrics, MaintenanceTotals, ShardDamage
from memwal.core.snapshot import ShardState, Snapshot
from memwal.core.state import TableState
from memwal.views import View, ViewBusyError, list_views
from memwal.write.pool import ShardWriterPool

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MaintenanceConfig:
    interval_seconds: float = 5.0
    max_backoff_seconds: float = 60.0
    compact: bool = True
    indexes: bool = True
    gc: bool = True
    #: Refresh the table's materialized views after every cycle that committed to the base
    #: (a fold, or a base-file compaction).
    views: bool = True
    #: Up to this many consecutive generations of a shard go into one commit (with a fold
    #: schedule that waits, at least its ``at_sstables``, so one fold is one commit; the
    #: compactor's row limit still bounds a commit's memory).
    max_generations_per_commit: int = 8
    #: When a cycle folds SSTables into the base (every cycle with ``FoldSchedule(fraction=0)``).
    fold: FoldSchedule = field(default_factory=FoldSchedule)
    #: Flush acknowledged writes that sat unflushed this long with no writer (None: never).
    flush_stranded_after_seconds: float | None = 60.0
    gc_config: GcConfig = field(default_factory=GcConfig)
    #: Base fragments below this many rows count as small ...
    small_fragment_rows: int = 100_000
    #: ... and once there are this many, they are merged (Lance compact_files).
    max_small_fragments: int = 32
    #: Base fragments are compacted up to this many rows, doubled as often as it takes for
    #: ``max_full_fragments`` fragments to hold the base (memwal.maintain.bounds.fragment_target), so
    #: their number stays bounded as the table grows. Fewer, larger fragments mean fewer files
    #: for a reader to open and a smaller manifest. The price: merging two full fragments
    #: rewrites about twice the target (a sixteenth of the table's rows with the defaults) in
    #: one cycle, over ``max_rows_rewritten_per_cycle`` once the target has doubled, so such a
    #: cycle's cost grows with the table; they come about once per new full fragment. With
    #: ``max_small_fragments`` on top, the base stays under the table's default
    #: ``max_base_fragments`` where fragments can merge; the fragment bound covers the rest.
    target_rows_per_fragment: int = 1_048_576
    max_full_fragments: int = 16
    #: ... and so are fragments once this share of their rows is deleted (the old versions of
    #: updated keys). A point lookup no longer pays for deleted rows (the base point read takes
    #: them and drops them itself); what they cost is disk and scan work, against a rewrite of
    #: the fragment and a remap of its index segment. Rewrites per second are about the update
    #: rate / (this share x rows per fragment), so a higher share rewrites less.
    max_deleted_fraction: float = 0.3
    #: At most this many rows are rewritten by one cycle's base-file compaction (the groups
    #: that fit, in fragment order), or one group alone, the smallest, when none fits (two full
    #: fragments once the fragment target has doubled: see ``target_rows_per_fragment``).
    max_rows_rewritten_per_cycle: int = 2_000_000
    #: Enforce the bounds on the base (fragments, manifest size, versions, disk) every cycle.
    enforce_bounds: bool = True
    #: The bounds to enforce; None: the table's own (``metadata.bounds``, which writers use too).
    bounds: Bounds | None = None
    #: ``memwal maintain`` lowers its own CPU priority by this much (``os.nice``), so that on a
    #: busy machine the readers and writers beside it get the cores first: a third to a half of
    #: a soak's slowest lookups overlapped a compaction. An hour at 10k rows/s with 10 (the
    #: default) kept lookup p99 within 1.19x of its start (1.54x without) while SSTables stayed
    #: flat (docs/bench-log/soak.md, "Soak"); when compaction does fall behind, the writers' stall
    #: bounds the backlog. A service run in a user's own process (``Maintenance.run``) never
    #: changes that process's priority.
    nice: int = 10


class Maintenance:
    """Keeps one table compacted, indexed and collected."""

    def __init__(self, state: TableState | str, config: MaintenanceConfig | None = None) -> None:
        self.state = TableState.load(state) if isinstance(state, str) else state
        self.config = config or MaintenanceConfig()
        per_commit = self.config.max_generations_per_commit
        if self.config.fold.fraction > 0:
            per_commit = max(per_commit, self.config.fold.at_sstables)
        self.compactor = Compactor(self.state, max_generations_per_commit=per_commit)
        self.indexes = IndexMaintainer(self.state)
        self.gc = GarbageCollector(self.state, self.config.gc_config)
        #: Claims shards whose writers died with unflushed writes, to flush them.
        self.writers = ShardWriterPool(self.state)
        self.writers.owner = f"maintenance {self.writers.owner}"  # how a fenced writer's error names it
        self.bounds = self.config.bounds or self.state.metadata.bounds
        #: the config's schedule, its SSTable cap held to the table's (waiting never slows a writer)
        self.fold = replace(self.config.fold, at_sstables=min(self.config.fold.at_sstables, self.bounds.max_sstables))
        gc_config = self.config.gc_config
        #: the one owner of the base's files and versions
        self.base_files = BaseFiles(
            self.state,
            self.bounds,
            reader_grace_seconds=gc_config.reader_grace_seconds,
            version_retention_seconds=gc_config.base_version_retention_seconds,
            version_cleanup_interval_seconds=gc_config.base_version_cleanup_interval_seconds,
            small_fragment_rows=self.config.small_fragment_rows,
            max_small_fragments=self.config.max_small_fragments,
            target_rows_per_fragment=self.config.target_rows_per_fragment,
            max_full_fragments=self.config.max_full_fragments,
            max_deleted_fraction=self.config.max_deleted_fraction,
            max_rows_rewritten=self.config.max_rows_rewritten_per_cycle,
            indexes=self.indexes if self.config.indexes else None,
        )
        self.totals = MaintenanceTotals()
        #: Called with every record the service publishes (each cycle's, a failed one's too),
        #: e.g. :class:`memwal.observe.maintenance.MaintenanceObserver` for Prometheus.
        self.observers: list[Callable[[MaintenanceMetrics], None]] = []
        #: The report of the last cycle that ran to its end (damaged shards skipped), if any.
        self.last_report: CycleReport | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: (shard id, generation) -> when a cycle first found that SSTable uncompacted
        #: (monotonic; a restarted service starts counting again, so it waits at most twice)
        self._pending_since: dict[tuple[str, int], float] = {}

    def run_cycle(self, *, fold_now: bool = True) -> CycleReport:
        """One pass: flush stranded writes, compact every shard, create/catch up indexes,
        collect garbage, keep the base within its bounds.

        With ``fold_now`` every pending SSTable is compacted (one cycle run by hand); without
        it, only when the config's :class:`~memwal.maintain.bounds.FoldSchedule` says so (the service's
        loop), and the report's ``fold_reason`` says why.

        The cycle reads the table once, at its start (:meth:`_view`: the base, and every
        shard's latest manifest), and hands that down: what is pending is computed once, and a
        cycle with nothing to do costs a few object requests per shard (docs/benchmarks.md,
        "Object-store requests"). The base is opened again only after a stage committed to it.

        Damaged shards are skipped and reported (see the module docstring); after the cycle's
        report is published (and kept in :attr:`last_report`), the first one's
        :class:`TableDamagedError` is raised. A failure of the storage itself (the object store
        past its retries, a full disk) is no damage: it ends the cycle with memwal's error for
        it (:class:`~memwal.core.errors.StorageError`), and the service's next cycle starts over.
        """
        with memwal_errors():
            return self._cycle(fold_now)

    def _cycle(self, fold_now: bool) -> CycleReport:
        started_at = time.time()
        t0 = time.perf_counter()
        self.last_report = None
        done: dict[str, Any] = {}  # CycleReport fields, in the order the cycle learns them
        damage: dict[str, tuple[ShardDamage, TableDamagedError]] = {}  # shard id -> first damage found

        def damaged(stage: str) -> Callable[[str, Exception], None]:
            def record(shard_id: str, e: Exception) -> None:
                failed = storage_failure(e)
                if failed is not None:  # the store, not the shard: end the cycle
                    if failed is e:
                        raise e
                    raise failed from e
                error = e if isinstance(e, TableDamagedError) else self._diagnose(shard_id, e)
                log.error("maintenance skips shard %s (%s): %s", shard_id, stage, error)
                damage.setdefault(shard_id, (ShardDamage(shard_id, stage, " ".join(str(error).split())), error))

            return record

        def healthy(view: Snapshot) -> list[ShardState]:
            """Shards no stage has found damaged, but for a WAL gap (which stops only the flush)."""
            return [s for s in view.shards if s.shard_id not in damage or isinstance(damage[s.shard_id][1], WalGapError)]

        flushing = self.config.flush_stranded_after_seconds is not None
        # A shard whose manifest cannot be read is found here, by the first stage that needs it.
        view = self._view(damaged("flush" if flushing else "compaction"))
        if flushing:
            # A live writer that is merely idle keeps its shard (its lease says so): fencing it
            # would only make it reopen, and fight this service over the shard.
            flushed = self.writers.flush_stranded(
                self.config.flush_stranded_after_seconds, skip_live_writers=True, on_damage=damaged("flush"),
                manifests={s.shard_id: s.manifest for s in view.shards},
            )
            done["stranded_shards_flushed"] = len(flushed)
            if flushed:
                view = self._view(damaged("flush"), view, flushed)
        ds = view.dataset
        paused = self.state.base_paused()
        if paused:  # nothing but the schema change may commit to the base (memwal.maintain.evolve)
            log.info("maintenance of %s commits nothing to the base this cycle: %s", self.state.uri, paused)
        if self.config.compact and not paused:
            results, done["fold_reason"], done["fold_deferred_rows"] = self._compact_by_backlog(
                Snapshot(ds, view.index, tuple(healthy(view))), damaged("compaction"), fold_now
            )
            rows = sum(r.rows_upserted + r.keys_deleted for r in results)
            busy = sum(r.seconds for r in results)
            done.update(
                compaction_commits=len({r.base_version for r in results}),  # joint commits count once
                generations_compacted=sum(len(r.generations) for r in results),
                rows_compacted=rows,
                rows_per_second=rows / busy if busy else 0.0,
            )
            if results:
                ds = self.state.dataset()
            # also when nothing was folded: a doubling of the fragment target takes several cycles
            done["base_fragments_compacted"] = self.base_files.compact(ds)
            if done["base_fragments_compacted"]:
                ds = self.state.dataset()
        if self.config.indexes and not paused:
            # After the base-file compaction: Lance's compact_files commit drops the recorded
            # index catch-up, and GC waits for it; a catch-up then records it again.
            done["indexes_created"] = tuple(self.indexes.ensure_indexes(ds))
            if done["indexes_created"]:
                ds = self.state.dataset()
            done["indexes_caught_up"] = self.indexes.catch_up(ds)
            if done["indexes_caught_up"]:
                ds = self.state.dataset()
        if self.config.gc:
            collected = self.gc.run_once(
                [s.shard_id for s in healthy(view)], on_shard_error=damaged("gc"), base=ds,
                manifests={s.shard_id: s.manifest for s in view.shards},
            )
            done.update(
                sstables_removed=sum(len(r.sstables_removed) for r in collected),
                wal_entries_removed=sum(r.wal_entries_removed for r in collected),
                bytes_reclaimed=sum(r.bytes_reclaimed for r in collected),
            )
        if self.config.enforce_bounds:
            done.update(self._enforce_bounds(done, ds))
        report = CycleReport(started_at=started_at, **done)
        if self.config.views and (report.compaction_commits or report.base_fragments_compacted):
            # A base-file compaction changes no row but moves the base version: refreshed, a
            # view records the version it reflects (its freshness), and an aggregate view's next
            # refresh reads old values from this version rather than one GC may remove meanwhile.
            report = replace(report, views_refreshed=self._refresh_views())
        # What the cycle leaves pending: the manifests it read, above what the base now holds
        # (SSTables flushed since are the next cycle's).
        index = self.state.manifests.mem_wal_index(ds.version)
        report = replace(
            report,
            pending_sstables={
                s.shard_id: sum(1 for t in s.manifest.sstables if t.generation > (index.compacted_generation(s.shard_id) if index else 0))
                for s in healthy(view)
            },
            index_lag={lg.index: lg.total for lg in index_lag(ds, index)},
            index_segments=index_segments(ds),
            damaged_shards=tuple(d for d, _ in damage.values()),
            seconds=time.perf_counter() - t0,
        )
        self.totals = self.totals.after_cycle(report)
        self._publish(report)
        self.last_report = report
        log.info(
            "maintenance of %s: %d commits (%d generations, %d rows, %.0f rows/s; %s), %d sstables and %d bytes "
            "reclaimed, %d sstables pending, index lag %s, %d damaged shard(s) skipped, in %.2fs",
            self.state.uri, report.compaction_commits, report.generations_compacted, report.rows_compacted,
            report.rows_per_second, report.fold_reason or "no fold due", report.sstables_removed, report.bytes_reclaimed,
            sum(report.pending_sstables.values()), report.index_lag or "none", len(report.damaged_shards),
            report.seconds,
        )
        if damage:
            raise next(iter(damage.values()))[1]
        return report

    def _view(
        self, on_damage: Callable[[str, Exception], None], previous: Snapshot | None = None, reread: list[str] | None = None
    ) -> Snapshot:
        """The table as this cycle sees it: the latest base, its MemWAL index and every shard's
        latest manifest, read once; a shard whose manifest cannot be read goes to ``on_damage``.
        With ``previous``, only the ``reread`` shards are read again (the rest kept)."""
        store = self.state.manifests
        if previous is not None:
            ds, index, ids = previous.dataset, previous.index, reread or []
            kept = {s.shard_id: s for s in previous.shards if s.shard_id not in set(ids)}
        else:
            ds = self.state.dataset()
            index, ids, kept = store.mem_wal_index(ds.version), store.list_shards(), {}
        for shard_id in ids:
            try:
                m = store.read_shard(shard_id)
            except TableDamagedError as e:  # an undecodable manifest (an I/O error fails the cycle)
                on_damage(shard_id, e)
                continue
            if m is not None:
                kept[shard_id] = ShardState(m, index.compacted_generation(shard_id) if index is not None else 0)
        order = {sid: i for i, sid in enumerate(ids if previous is None else [s.shard_id for s in previous.shards])}
        return Snapshot(ds, index, tuple(sorted(kept.values(), key=lambda s: order.get(s.shard_id, len(order)))))

    def _diagnose(self, shard_id: str, e: Exception) -> TableDamagedError:
        """The damaged file behind a foreign error on ``shard_id``: the first uncompacted SSTable
        its manifest lists that cannot be read (Lance's own message often names no file)."""
        reason = f"{type(e).__name__}: {lance_message(e)}"
        try:
            _compacted, todo = self.compactor.pending(shard_id)
        except TableDamagedError as damaged:
            return damaged
        for sst in todo:
            path = paths.sstable_path(self.state.uri, shard_id, sst.path)
            try:
                self.state.lance_dataset(path).to_table()
            except (OSError, ValueError, RuntimeError) as bad:
                return TableDamagedError(
                    f"shard {shard_id}: SSTable generation {sst.generation} ({path}) cannot be read "
                    f"({type(bad).__name__}: {lance_message(bad)}); the table needs repair"
                )
        return TableDamagedError(f"shard {shard_id}: maintenance failed ({reason})")

    def _compact_by_backlog(
        self, view: Snapshot, on_damage: Callable[[str, Exception], None], fold_now: bool
    ) -> tuple[list[CompactionResult], str | None, int]:
        """Compact every shard of ``view`` (the cycle's, its damaged shards left out), those
        furthest over the SSTable bound first: they are the ones whose writers are slowed or
        stalled (memwal.maintain.bounds.compaction_order), if a fold is due (or ``fold_now``). What is
        pending is the view's: computed once, and handed to the compactor. A shard whose files
        cannot be read goes to ``on_damage`` and the others are still compacted. Returns the
        results, why the fold ran (None: it did not) and the pending rows it left waiting (0
        unless the schedule waited)."""
        backlog: dict[str, int] = {}
        newest: dict[str, int] = {}  # the fold takes these generations, not what is flushed meanwhile
        pending: dict[str, tuple[int, list]] = {}
        rows = 0
        now = time.monotonic()
        pending_since: dict[tuple[str, int], float] = {}
        for shard in view.shards:
            todo = list(shard.live_sstables)
            pending[shard.shard_id] = (shard.compacted_generation, todo)
            backlog[shard.shard_id] = len(todo)
            if todo:
                newest[shard.shard_id] = todo[-1].generation
            rows += sum(s.physical_rows for s in todo)
            for s in todo:
                key = (shard.shard_id, s.generation)
                pending_since[key] = self._pending_since.get(key, now)
        self._pending_since = pending_since  # forgets what was compacted meanwhile
        oldest = now - min(pending_since.values(), default=now)
        base_rows = view.dataset.count_rows() if rows and self.fold.fraction > 0 else 0  # only a share needs it
        reason = self.fold.due(rows, base_rows, max(backlog.values(), default=0), oldest)
        if fold_now and reason is None and newest:
            reason = "run by hand"
        if reason is None:
            return [], None, rows
        shards = [s for s in compaction_order(backlog, self.bounds) if s in newest]
        return self.compactor.compact_shards(shards, on_damage, upto=newest, pending={s: pending[s] for s in shards}), reason, 0

    def _enforce_bounds(self, done: dict[str, Any], ds: lance.LanceDataset) -> dict[str, Any]:
        """Remove the base versions the policy says go, and measure the base against its bounds;
        the CycleReport fields of what that did and left."""
        r = self.base_files.remove_versions(ds)
        f = r.footprint
        if r.exceeded:
            log.warning("table %s is over its bounds after maintenance: %s", self.state.uri, ", ".join(r.exceeded))
        return {
            "bytes_reclaimed": done.get("bytes_reclaimed", 0) + r.bytes_removed,
            "base_versions_removed": r.versions_removed,
            "base_fragments": f.fragments,
            "base_manifest_bytes": f.manifest_bytes,
            "base_versions": f.versions,
            "live_bytes": f.live_bytes,
            "disk_bytes": f.disk_bytes,
            "bounds_exceeded": r.exceeded,
        }

    def _refresh_views(self) -> int:
        """Refresh every view of the table; a view that fails is logged, the others go on."""
        done = 0
        for name in list_views(self.state):
            try:
                if View.open(self.state, name).refresh() is not None:
                    done += 1
            except ViewBusyError as e:
                log.info("view %s: %s", name, e)
            except Exception as e:  # noqa: BLE001 - one broken view must not stop maintenance
                failed = storage_failure(e)
                if failed is None:
                    log.exception("refreshing view %s failed", name)
                else:  # the store's failure, not the view's: one line; the next cycle refreshes it
                    log.warning("refreshing view %s failed: %s", name, failed)
        return done

    def _publish(self, report: CycleReport) -> None:
        metrics = MaintenanceMetrics(last_cycle=report, totals=self.totals, updated_at=time.time())
        for observe in self.observers:
            try:
                observe(metrics)
            except Exception:  # noqa: BLE001 - an observer's failure must not fail maintenance
                log.exception("maintenance observer %r failed", observe)
        try:
            self.state.io.write(paths.maintenance_metrics(self.state.uri), metrics.to_json().encode())
        except OSError as e:  # metrics are informational; never fail maintenance over them
            log.warning("could not write maintenance metrics: %s", e)

    def run_forever(self, cycles: int | None = None) -> None:
        """Run cycles every ``interval_seconds`` until :meth:`stop` (or ``cycles`` cycles),
        backing off exponentially while cycles fail."""
        failures = 0
        done = 0
        while not self._stop.is_set() and (cycles is None or done < cycles):
            try:
                self.run_cycle(fold_now=False)
                failures = 0
            except TableDamagedError as e:
                if self.last_report is None:  # the cycle did not get to its end
                    failures += 1
                    self.totals = self.totals.after_failure()
                    self._publish(CycleReport(started_at=time.time(), error=f"{type(e).__name__}: {e}"))
                    self._stop.wait(min(self.config.interval_seconds * 2**failures, self.config.max_backoff_seconds))
                    continue
                # The other shards were maintained and the report names the damaged ones: a
                # person must repair them; until then every cycle skips them.
                failures = 0
            except Exception as e:  # noqa: BLE001 - a service must survive a failed cycle
                failures += 1
                self.totals = self.totals.after_failure()
                delay = min(self.config.interval_seconds * 2**failures, self.config.max_backoff_seconds)
                log.exception("maintenance cycle failed (%s); retrying in %.1fs", e, delay)
                self._publish(CycleReport(started_at=time.time(), error=f"{type(e).__name__}: {lance_message(e)}"))
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

