"""Enforcing a table's :class:`~memwal.metadata.Bounds` from the maintenance service.

What grows while a table streams, and what keeps each bounded:

* uncompacted SSTables per shard: compaction, shards with the most first
  (:func:`compaction_order`), and the writers' back-pressure (:mod:`memwal.writer`) when it
  falls behind anyway;
* base fragments and the base manifest (each compaction commit adds a fragment, and its
  row-id metadata sits inline in the manifest): Lance's compaction once either is over its
  bound, into fragments of :func:`fragment_target` rows, which grows with the table so that
  the bound holds at any size;
* retained base versions: removed beyond ``max_base_versions``, never one younger than the
  reader grace (a reader's snapshot may still use it);
* disk: measured at most every ``disk_check_seconds``; above ``max_disk_ratio`` times the
  live base data, base versions are removed down to the reader grace.

Every measurement is a :class:`BaseFootprint`, which ``memwal status`` shows too.

How often maintenance folds SSTables into the base is a :class:`FoldSchedule`: it waits while
the pending rows are a small share of the base, within its own bounds on SSTables per shard
and on how long an SSTable waits.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Collection, Mapping, Sequence

import lance

from memwal import paths
from memwal.errors import InvalidArgumentError
from memwal.manifest import MEM_WAL_INDEX_NAME
from memwal.metadata import Bounds
from memwal.state import TableState

log = logging.getLogger(__name__)


def fragment_target(live_rows: int, target_rows_per_fragment: int, max_full_fragments: int) -> int:
    """The rows a base fragment is compacted up to, for a base of ``live_rows``:
    ``target_rows_per_fragment`` doubled as often as needed for ``max_full_fragments``
    fragments of that size to hold the base.

    Invariant: a base compacted to this target holds about ``max_full_fragments`` full
    fragments or fewer, whatever its size (a fixed target lets their number grow with the
    table, past any bound on fragments). Why the cost follows the table's growth and not its
    size: the target doubles only once the table has doubled since the last doubling, and a
    fragment at the target is not rewritten for its size again until then.
    """
    if target_rows_per_fragment < 1 or max_full_fragments < 1:
        raise InvalidArgumentError(
            f"fragment target: target_rows_per_fragment ({target_rows_per_fragment}) and "
            f"max_full_fragments ({max_full_fragments}) must be >= 1"
        )
    target = target_rows_per_fragment
    while live_rows > target * max_full_fragments:
        target *= 2
    return target


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


@dataclass(frozen=True)
class BaseFootprint:
    """The base table's size as the bounds count it."""

    version: int
    fragments: int
    manifest_bytes: int
    #: base versions on disk (manifest files)
    versions: int
    #: bytes of the current version's data and index files (what a fully cleaned table would hold)
    live_bytes: int
    #: bytes under the table's directory (everything: base, versions, SSTables, WAL); None
    #: when not measured this time
    disk_bytes: int | None = None


def measure_base(state: TableState, ds: lance.LanceDataset | None = None, *, disk: bool = False) -> BaseFootprint:
    """The base table's footprint: one manifest stat and one listing of its versions (and,
    with ``disk``, one walk of the whole table)."""
    ds = ds or state.dataset()
    frags = ds.get_fragments()
    live = sum(f.file_size_bytes or 0 for frag in frags for f in frag.metadata.files)
    # An index is part of the live table (a BTREE on an int64 key is ~40% of its data files);
    # its superseded segments are not, and are what the disk bound should see as excess.
    live += sum(d.total_size_bytes or 0 for d in ds.describe_indices() if d.name != MEM_WAL_INDEX_NAME)
    manifest = 0
    for path in (paths.base_manifest_path(state.uri, ds.version), paths.base_manifest_path_v1(state.uri, ds.version)):
        try:
            manifest = state.io.stat(path)[0]
            break
        except FileNotFoundError:
            continue
    versions_dir = paths.join(state.uri, paths.BASE_VERSIONS_DIR)
    versions = sum(1 for name in state.io.list_dir(versions_dir) if name.endswith(".manifest"))
    return BaseFootprint(
        version=ds.version,
        fragments=len(frags),
        manifest_bytes=manifest,
        versions=versions,
        live_bytes=live,
        disk_bytes=state.io.tree_size(state.uri) if disk else None,
    )


@dataclass(frozen=True)
class FoldSchedule:
    """When a maintenance cycle folds the uncompacted SSTables into the base.

    A fold's commit costs about what the base rows its updates span cost, whatever the
    number of rows it folds (bench/fold_cost.py: 0.57 s for 50k upserts into a soaked
    19M-row base, 0.10 s into a 1M-row one; bench/commit_size.py: one commit of eight
    cycles' rows takes 0.34x the time of eight commits). Folding every cycle therefore
    makes compaction's cost per row grow with the base. Waiting until the pending rows are
    ``fraction`` of the base's rows pays that span once per ``fraction`` x base rows, so the
    cost per folded row stays about flat as the table grows. It is off by default (0: fold
    every cycle): in the soak hour 1% halved maintenance's busy time but left lookups where
    they were, and the uncompacted SSTables then grow with the base up to ``at_sstables``
    (docs/bench-log/soak.md, "Soak").

    Invariant: a cycle never waits while a shard holds ``at_sstables`` uncompacted SSTables or
    more (maintenance clamps it to the table's ``max_sstables``, so no writer is slowed by a
    wait), nor once an SSTable has been pending ``max_wait_seconds`` as the deciding process
    counts (from the cycle that first saw it: up to one cycle interval more, twice that across
    a restart). Views and GC follow the folds, so this bounds their lag too. Readers see every
    SSTable either way.
    """

    #: Fold once the uncompacted rows reach this share of the base's live rows (0: every cycle).
    fraction: float = 0.0
    #: ... or once the oldest uncompacted SSTable has waited this long ...
    max_wait_seconds: float = 60.0
    #: ... or once a shard has this many uncompacted SSTables.
    at_sstables: int = 16

    def __post_init__(self) -> None:
        if self.fraction < 0 or self.max_wait_seconds < 0 or self.at_sstables < 1:
            raise InvalidArgumentError(
                f"fold schedule: fraction ({self.fraction}) and max_wait_seconds ({self.max_wait_seconds}) "
                f"must be >= 0 and at_sstables ({self.at_sstables}) >= 1"
            )

    def due(self, pending_rows: int, base_rows: int, most_sstables: int, oldest_wait_seconds: float) -> str | None:
        """Why a cycle should fold now, or None to wait (also None when nothing is pending).

        ``most_sstables`` is the largest number of uncompacted SSTables in one shard and
        ``oldest_wait_seconds`` how long the oldest of them has been pending.
        """
        if pending_rows <= 0 and most_sstables <= 0:
            return None
        if most_sstables >= self.at_sstables:
            return f"a shard has {most_sstables} uncompacted SSTables (fold at {self.at_sstables})"
        if oldest_wait_seconds >= self.max_wait_seconds:
            return f"an SSTable waited {oldest_wait_seconds:.0f}s (fold after {self.max_wait_seconds:g}s)"
        threshold = self.fraction * base_rows
        if pending_rows >= threshold:
            return f"{pending_rows:,} pending rows >= {self.fraction:g} of the base's {base_rows:,}"
        return None


def compaction_order(backlogs: Mapping[str, int], bounds: Bounds) -> list[str]:
    """Shards in the order compaction should take them: those over ``max_sstables`` first,
    each group by backlog, largest first (a stalled shard is the one writers wait on)."""
    return sorted(backlogs, key=lambda s: (backlogs[s] <= bounds.max_sstables, -backlogs[s], s))


@dataclass(frozen=True)
class BoundsReport:
    """What one enforcement did, and the footprint it left."""

    footprint: BaseFootprint
    fragments_compacted: int = 0
    versions_removed: int = 0
    bytes_removed: int = 0
    #: names of the bounds still exceeded afterwards ("base_fragments", "manifest_bytes",
    #: "base_versions", "disk")
    exceeded: tuple[str, ...] = ()


class BoundsEnforcer:
    """Keeps one table's base within its bounds; maintenance runs :meth:`enforce` every cycle."""

    def __init__(
        self,
        state: TableState,
        bounds: Bounds,
        *,
        reader_grace_seconds: float,
        target_rows_per_fragment: int = 1_048_576,
        max_full_fragments: int = 16,
        max_deleted_fraction: float = 0.3,
        max_rows_rewritten: int = 2_000_000,
        disk_check_seconds: float = 60.0,
        before_compaction: Callable[[list[int]], object] | None = None,
    ) -> None:
        self.state = state
        self.bounds = bounds
        self.reader_grace_seconds = reader_grace_seconds
        self.target_rows_per_fragment = target_rows_per_fragment
        #: at most half the fragment bound, so that merging full fragments alone can bring the
        #: base under it; the small fragments' rule is maintenance's, and when full and small
        #: fragments together pass the bound, :meth:`enforce` compacts both
        self.max_full_fragments = max(1, min(max_full_fragments, bounds.max_base_fragments // 2))
        fragment_target(0, target_rows_per_fragment, self.max_full_fragments)  # a bad config fails here, not every cycle
        self.max_deleted_fraction = max_deleted_fraction
        self.max_rows_rewritten = max_rows_rewritten
        self.disk_check_seconds = disk_check_seconds
        self._disk_checked = float("-inf")
        #: Called with the ids of the fragments a compaction may merge, first: Lance merges only
        #: fragments the same index segments cover (memwal.indexes joins them).
        self.before_compaction = before_compaction

    def fragment_target(self, frags: Sequence[Any]) -> int:
        """The rows the base fragments ``frags`` (their metadata) are compacted up to
        (:func:`fragment_target`), counting physical rows, as Lance's planner counts a fragment
        against the target: a fragment at the target whose deleted rows bring it under is full."""
        return fragment_target(sum(f.physical_rows for f in frags), self.target_rows_per_fragment, self.max_full_fragments)

    def compact(
        self,
        frags: Sequence[Any] | None = None,
        *,
        join: Collection[int] | None = None,
        take: Callable[[Sequence[Any]], bool] | None = None,
    ) -> tuple[int, int]:
        """One base-file compaction within the row budget, into fragments of the table's
        current :meth:`fragment_target`; returns (fragments removed, fragments added).

        ``frags``: the base's fragment metadata, if the caller has listed it. ``join``: the
        fragments whose index segments are joined first (default: all under the target).
        ``take``: which of Lance's groups to run (:func:`compact_files_within`).
        """
        ds = self.state.dataset()
        frags = [f.metadata for f in ds.get_fragments()] if frags is None else frags
        target = self.fragment_target(frags)
        ids = [f.id for f in frags if f.physical_rows < target] if join is None else list(join)
        if self.before_compaction is not None and ids:
            self.before_compaction(ids)
            ds = self.state.dataset()
        return compact_files_within(
            ds,
            target_rows_per_fragment=target,
            materialize_deletions_threshold=self.max_deleted_fraction,
            max_source_rows=self.max_rows_rewritten,
            take=take,
        )

    def _over(self, f: BaseFootprint) -> list[str]:
        b = self.bounds
        over = []
        if f.fragments > b.max_base_fragments:
            over.append("base_fragments")
        if f.manifest_bytes > b.max_manifest_bytes:
            over.append("manifest_bytes")
        if f.versions > b.max_base_versions + 1:  # the bound counts versions kept beyond the newest
            over.append("base_versions")
        if f.disk_bytes is not None and b.max_disk_ratio is not None and f.disk_bytes > b.max_disk_ratio * max(f.live_bytes, 1):
            over.append("disk")
        return over

    def _remove_versions(self, retain: int) -> tuple[int, int]:
        """Remove base versions but the newest ``retain`` and those younger than the reader grace."""
        stats = self.state.dataset().cleanup_old_versions(
            older_than=timedelta(seconds=self.reader_grace_seconds),
            retain_versions=retain,
            error_if_tagged_old_versions=False,
        )
        return stats.old_versions, stats.bytes_removed

    def enforce(self) -> BoundsReport:
        """Measure the base, act on each bound it exceeds, and report what is still exceeded."""
        now = time.monotonic()
        check_disk = self.bounds.max_disk_ratio is not None and now - self._disk_checked >= self.disk_check_seconds
        if check_disk:
            self._disk_checked = now
        f = measure_base(self.state, disk=check_disk)
        over = self._over(f)
        compacted = removed = freed = 0
        if "base_fragments" in over or "manifest_bytes" in over:
            # Within the row budget: a base far over its bound gets there over a few cycles
            # (reported as still over meanwhile) rather than in one rewrite of the table.
            compacted, added = self.compact()
            log.info("base over its bounds (%s): compaction removed %d fragments, added %d",
                     ", ".join(over), compacted, added)
        if "disk" in over:
            removed, freed = self._remove_versions(1)
        elif "base_versions" in over:
            removed, freed = self._remove_versions(self.bounds.max_base_versions + 1)
        if removed:
            log.info("removed %d base versions (%d bytes) to keep within the bounds", removed, freed)
        if compacted or removed:
            f = measure_base(self.state, disk=check_disk)
        return BoundsReport(f, compacted, removed, freed, tuple(self._over(f)))
