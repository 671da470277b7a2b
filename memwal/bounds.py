"""Enforcing a table's :class:`~memwal.metadata.Bounds` from the maintenance service.

What grows while a table streams, and what keeps each bounded:

* uncompacted SSTables per shard: compaction, shards with the most first
  (:func:`compaction_order`), and the writers' back-pressure (:mod:`memwal.writer`) when it
  falls behind anyway;
* base fragments and the base manifest (each compaction commit adds a fragment, and its
  row-id metadata sits inline in the manifest): Lance ``compact_files`` once either is over
  its bound;
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
from typing import Callable, Mapping

import lance

from memwal import paths
from memwal.errors import InvalidArgumentError
from memwal.manifest import MEM_WAL_INDEX_NAME
from memwal.metadata import Bounds
from memwal.state import TableState

log = logging.getLogger(__name__)


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
    (docs/benchmarks.md, "Soak").

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
        disk_check_seconds: float = 60.0,
        before_compaction: Callable[[list[int]], object] | None = None,
    ) -> None:
        self.state = state
        self.bounds = bounds
        self.reader_grace_seconds = reader_grace_seconds
        self.target_rows_per_fragment = target_rows_per_fragment
        self.disk_check_seconds = disk_check_seconds
        self._disk_checked = float("-inf")
        #: Called with the ids of the fragments a compaction may merge, first: Lance merges only
        #: fragments the same index segments cover (memwal.indexes joins them).
        self.before_compaction = before_compaction

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
            if self.before_compaction is not None:
                ds = self.state.dataset()
                self.before_compaction(
                    [f.fragment_id for f in ds.get_fragments() if f.metadata.physical_rows < self.target_rows_per_fragment]
                )
            m = self.state.dataset().optimize.compact_files(target_rows_per_fragment=self.target_rows_per_fragment)
            compacted = m.fragments_removed
            log.info("base over its bounds (%s): compact_files removed %d fragments, added %d",
                     ", ".join(over), m.fragments_removed, m.fragments_added)
        if "disk" in over:
            removed, freed = self._remove_versions(1)
        elif "base_versions" in over:
            removed, freed = self._remove_versions(self.bounds.max_base_versions + 1)
        if removed:
            log.info("removed %d base versions (%d bytes) to keep within the bounds", removed, freed)
        if compacted or removed:
            f = measure_base(self.state, disk=check_disk)
        return BoundsReport(f, compacted, removed, freed, tuple(self._over(f)))
