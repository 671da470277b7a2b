"""The one owner of the base table's files and versions.

Which base fragments are rewritten, into what size, and which base versions are removed, is
decided here and nowhere else; the maintenance service calls :class:`BaseFiles` twice a cycle:

* :meth:`BaseFiles.compact`, after the cycle's folds and before its index catch-up (Lance's
  ``compact_files`` commit drops the recorded ``index_catchup``, which GC waits for; the
  catch-up records it again). One base-file compaction a cycle, within a row budget, for any
  of: many small fragments (each fold adds one), fragments whose deleted rows (old versions of
  updated keys) pass ``max_deleted_fraction``, more full fragments than ``max_full_fragments``
  (the table outgrew its fragment target: :func:`~memwal.maintain.bounds.fragment_target`), or the
  table's fragment or manifest bound passed. Lance merges only fragments that the same index
  segments cover, so those segments are joined first (:meth:`IndexMaintainer.join_segments`).
* :meth:`BaseFiles.remove_versions`, at the end of the cycle, which also measures the base
  against its bounds: one ``cleanup_old_versions`` under one policy. Versions older than
  ``base_version_retention_seconds`` go (time travel reads them until then), at most once per
  ``base_version_cleanup_interval_seconds`` (a cleanup reads every retained manifest); beyond
  ``max_base_versions``, or with the disk over ``max_disk_ratio`` times the live data, older
  ones go down to the reader grace, at once. None younger than the reader grace ever goes: a
  reader's snapshot may still use it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Sequence

import lance

from memwal.maintain.bounds import BaseFootprint, fragment_target, manifest_bytes, measure_base
from memwal.core.indexes import IndexMaintainer
from memwal.core.metadata import Bounds
from memwal.core.state import TableState

log = logging.getLogger(__name__)


def compact_files_within(
    ds: lance.LanceDataset,
    *,
    target_rows_per_fragment: int,
    materialize_deletions_threshold: float,
    max_source_rows: int,
    take: Callable[[Sequence[Any]], bool] | None = None,
) -> tuple[int, int]:
    """Lance's compaction of a dataset's small and deletion-heavy fragments, rewriting at most
    ``max_source_rows`` rows; returns (fragments removed, fragments added).

    Lance's own ``max_source_rows`` stops planning at the first group of fragments that does
    not fit in what is left of the budget: one large group early in fragment order (old
    fragments whose deleted rows crossed the threshold, say) then blocks every group after it,
    cycle after cycle (docs/bench-log/soak.md: twelve cycles in a row compacted nothing while the
    base's small fragments piled up to its bound). Here every group is planned and the groups
    that fit are taken in fragment order, skipping those that do not; when none fits, the
    smallest runs alone, so that a cycle always makes progress.

    With ``take``, only the groups it accepts (called with each group's fragment metadata)
    are considered: a compaction for one reason (too many full fragments, a deletion-heavy
    fragment) then leaves the small fragments to their own rule, which waits until there are
    many.
    """
    from lance.optimize import Compaction

    plan = Compaction.plan(ds, {"target_rows_per_fragment": target_rows_per_fragment,
                                "materialize_deletions_threshold": materialize_deletions_threshold})
    tasks = [t for t in plan.tasks if take is None or take(t.fragments)]
    sizes = [sum(f.num_rows for f in t.fragments) for t in tasks]  # live rows, as Lance counts them
    if not sizes:
        return 0, 0
    chosen, budget = [], max_source_rows
    for task, rows in zip(tasks, sizes):
        if rows <= budget:
            chosen.append(task)
            budget -= rows
    if not chosen:
        chosen = [tasks[sizes.index(min(sizes))]]
    results = [task.execute(ds) for task in chosen]
    Compaction.commit(ds, results)
    return sum(r.metrics.fragments_removed for r in results), sum(r.metrics.fragments_added for r in results)


#: Below this many bytes on disk the disk bound is not a ratio: a small table's fixed files
#: (indexes, manifests, bloom filters, the MemWAL's) outweigh its rows many times over (the
#: demo's 414 KB table was "over its disk bound" after its first maintenance cycle).
DISK_RATIO_FLOOR_BYTES = 64 << 20


@dataclass(frozen=True)
class BoundsReport:
    """What one end-of-cycle pass over the base's versions did, and the footprint it left."""

    footprint: BaseFootprint
    versions_removed: int = 0
    bytes_removed: int = 0
    #: names of the bounds still exceeded afterwards ("base_fragments", "manifest_bytes",
    #: "base_versions", "disk")
    exceeded: tuple[str, ...] = ()


class BaseFiles:
    """One table's base-file and base-version policy (see the module docstring)."""

    def __init__(
        self,
        state: TableState,
        bounds: Bounds,
        *,
        reader_grace_seconds: float,
        version_retention_seconds: float = 3600.0,
        version_cleanup_interval_seconds: float = 60.0,
        small_fragment_rows: int = 100_000,
        max_small_fragments: int = 32,
        target_rows_per_fragment: int = 1_048_576,
        max_full_fragments: int = 16,
        max_deleted_fraction: float = 0.3,
        max_rows_rewritten: int = 2_000_000,
        disk_check_seconds: float = 60.0,
        indexes: IndexMaintainer | None = None,
    ) -> None:
        self.state = state
        self.bounds = bounds
        self.reader_grace_seconds = reader_grace_seconds
        #: versions younger than this stay (time travel); never less than the reader grace
        self.version_retention_seconds = max(version_retention_seconds, reader_grace_seconds)
        #: ... and are looked for at most this often (never less often than they age out)
        self.version_cleanup_interval_seconds = min(version_cleanup_interval_seconds, self.version_retention_seconds)
        self.small_fragment_rows = small_fragment_rows
        self.max_small_fragments = max_small_fragments
        self.target_rows_per_fragment = target_rows_per_fragment
        #: at most half the fragment bound, so that merging full fragments alone can bring the
        #: base under it; when full and small fragments together pass the bound, both merge
        self.max_full_fragments = max(1, min(max_full_fragments, bounds.max_base_fragments // 2))
        fragment_target(0, target_rows_per_fragment, self.max_full_fragments)  # a bad config fails here, not every cycle
        self.max_deleted_fraction = max_deleted_fraction
        self.max_rows_rewritten = max_rows_rewritten
        self.disk_check_seconds = disk_check_seconds
        #: joins the index segments of the fragments a compaction merges (None: the table's
        #: indexes are not maintained)
        self.indexes = indexes
        self._disk_checked = float("-inf")
        self._cleaned_at = float("-inf")
        #: base version -> its manifest's size (a version's manifest never changes)
        self._manifest_bytes: dict[int, int] = {}

    def fragment_target(self, frags: Sequence[Any]) -> int:
        """The rows the base fragments ``frags`` (their metadata) are compacted up to
        (:func:`~memwal.maintain.bounds.fragment_target`), counting physical rows, as Lance's planner
        counts a fragment against the target: a fragment at the target whose deleted rows
        bring it under is full."""
        return fragment_target(sum(f.physical_rows for f in frags), self.target_rows_per_fragment, self.max_full_fragments)

    def manifest_bytes(self, version: int) -> int:
        size = self._manifest_bytes.get(version)
        if size is None:
            size = self._manifest_bytes[version] = manifest_bytes(self.state, version)
            while len(self._manifest_bytes) > 64:
                del self._manifest_bytes[min(self._manifest_bytes)]
        return size

    # -- base files --------------------------------------------------------------------------

    def compact(self, ds: lance.LanceDataset | None = None) -> int:
        """One base-file compaction of ``ds`` (the base as the cycle left it; latest when
        None) if any rule or bound calls for one; returns the fragments it removed."""
        ds = ds or self.state.dataset()
        frags = [f.metadata for f in ds.get_fragments()]
        small_rows = self.small_fragment_rows
        small = [f for f in frags if f.num_rows < small_rows]
        deleted = [f for f in frags if f.num_deletions > self.max_deleted_fraction * f.physical_rows]
        target = self.fragment_target(frags)
        many_small = len(small) >= self.max_small_fragments
        under = [f.id for f in frags if f.num_rows >= small_rows and f.physical_rows < target]  # full, mergeable
        too_many_full = len(under) > 1 and len(frags) - len(small) > self.max_full_fragments
        over = len(frags) > self.bounds.max_base_fragments or self.manifest_bytes(ds.version) > self.bounds.max_manifest_bytes
        if not (many_small or deleted or too_many_full or over):
            return 0
        deleted_ids = {f.id for f in deleted}
        if over:
            # Over a bound: every group within the row budget; a base far over it gets there
            # over a few cycles (reported as still over meanwhile), not in one rewrite of the table.
            joining = [f.id for f in frags if f.physical_rows < target]
            take = None
        else:
            joining = ([f.id for f in small] if many_small else []) + (under if too_many_full else [])

            def take(group: Sequence[Any]) -> bool:
                """The Lance groups this compaction is for. Without many small fragments, a
                group holding only small ones (the tail fragment and the newest folds) waits:
                otherwise a pending deletion-heavy fragment, or a pair of full ones in two index
                segments too large to join, would make every cycle rewrite that tail."""
                if many_small or any(f.id in deleted_ids for f in group):
                    return True
                return too_many_full and sum(f.num_rows >= small_rows for f in group) >= 2

        if self.indexes is not None and joining:
            # Lance merges only fragments the same index segments cover: join theirs first.
            if self.indexes.join_segments(joining, max_rows=self.max_rows_rewritten):
                ds = self.state.dataset()
        removed, added = compact_files_within(
            ds,
            target_rows_per_fragment=target,
            materialize_deletions_threshold=self.max_deleted_fraction,
            max_source_rows=self.max_rows_rewritten,
            take=take,
        )
        if removed:
            log.info("compacted base files%s: %d fragments removed, %d added", " (over a bound)" if over else "", removed, added)
        return removed

    # -- base versions -----------------------------------------------------------------------

    def _over(self, f: BaseFootprint) -> list[str]:
        b = self.bounds
        over = []
        if f.fragments > b.max_base_fragments:
            over.append("base_fragments")
        if f.manifest_bytes > b.max_manifest_bytes:
            over.append("manifest_bytes")
        if f.versions > b.max_base_versions + 1:  # the bound counts versions kept beyond the newest
            over.append("base_versions")
        if (f.disk_bytes is not None and b.max_disk_ratio is not None and f.disk_bytes > DISK_RATIO_FLOOR_BYTES
                and f.disk_bytes > b.max_disk_ratio * max(f.live_bytes, 1)):
            over.append("disk")
        return over

    def _measure(self, ds: lance.LanceDataset, disk: bool) -> BaseFootprint:
        return measure_base(self.state, ds, disk=disk, manifest=self.manifest_bytes(ds.version))

    def remove_versions(self, ds: lance.LanceDataset | None = None) -> BoundsReport:
        """Measure the base (``ds``: as the cycle left it; latest when None), remove the
        versions the policy says go, and report the footprint and the bounds still exceeded."""
        ds = ds or self.state.dataset()
        now = time.monotonic()
        check_disk = self.bounds.max_disk_ratio is not None and now - self._disk_checked >= self.disk_check_seconds
        if check_disk:
            self._disk_checked = now
        f = self._measure(ds, check_disk)
        over = self._over(f)
        if "disk" in over:
            older_than, retain, why = self.reader_grace_seconds, 1, "disk"
        elif "base_versions" in over:
            older_than, retain, why = self.reader_grace_seconds, self.bounds.max_base_versions + 1, "base_versions"
        elif now - self._cleaned_at >= self.version_cleanup_interval_seconds:
            older_than, retain, why = self.version_retention_seconds, None, ""
        else:
            return BoundsReport(f, exceeded=tuple(over))
        self._cleaned_at = now
        stats = ds.cleanup_old_versions(
            older_than=timedelta(seconds=older_than), retain_versions=retain, error_if_tagged_old_versions=False
        )
        removed, freed = stats.old_versions, stats.bytes_removed
        if removed:
            log.info("removed %d base versions (%d bytes)%s", removed, freed, f" to keep within the {why} bound" if why else "")
            f = self._measure(ds, check_disk)
        return BoundsReport(f, removed, freed, tuple(self._over(f)))
