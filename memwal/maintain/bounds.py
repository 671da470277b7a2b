"""A table's :class:`~memwal.core.metadata.Bounds`: measuring the base against them, the fragment
size, and the compaction order and fold schedule of the maintenance service.

What grows while a table streams, and what keeps each bounded:

* uncompacted SSTables per shard: compaction, shards with the most first
  (:func:`compaction_order`), and the writers' back-pressure (:mod:`memwal.write.pool`) when it
  falls behind anyway;
* base fragments and the base manifest (each compaction commit adds a fragment, and its
  row-id metadata sits inline in the manifest): Lance's compaction once either is over its
  bound, into fragments of :func:`fragment_target` rows, which grows with the table so that
  the bound holds at any size;
* retained base versions: removed beyond ``max_base_versions``, never one younger than the
  reader grace (a reader's snapshot may still use it);
* disk: above ``max_disk_ratio`` times the live base data, base versions are removed down to
  the reader grace.

Acting on the base's files and versions is :mod:`memwal.maintain.basefiles`' (the one owner of that
policy); every measurement is a :class:`BaseFootprint`, which ``memwal status`` shows too.

How often maintenance folds SSTables into the base is a :class:`FoldSchedule`: it waits while
the pending rows are a small share of the base, within its own bounds on SSTables per shard
and on how long an SSTable waits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import lance

from memwal.core import paths
from memwal.core.errors import InvalidArgumentError
from memwal.core.manifest import MEM_WAL_INDEX_NAME
from memwal.core.metadata import Bounds
from memwal.core.state import TableState

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


def manifest_bytes(state: TableState, version: int) -> int:
    """The size of base version ``version``'s manifest file (0 if it is gone): one stat."""
    for path in (paths.base_manifest_path(state.uri, version), paths.base_manifest_path_v1(state.uri, version)):
        try:
            return state.io.stat(path)[0]
        except FileNotFoundError:
            continue
    return 0


def measure_base(state: TableState, ds: lance.LanceDataset | None = None, *, disk: bool = False, manifest: int | None = None) -> BaseFootprint:
    """The base table's footprint: one manifest stat (none when ``manifest``, its size, is
    given: a version's manifest never changes) and one listing of its versions (and, with
    ``disk``, one walk of the whole table)."""
    ds = ds or state.dataset()
    frags = ds.get_fragments()
    live = sum(f.file_size_bytes or 0 for frag in frags for f in frag.metadata.files)
    # An index is part of the live table (a BTREE on an int64 key is ~40% of its data files);
    # its superseded segments are not, and are what the disk bound should see as excess.
    live += sum(d.total_size_bytes or 0 for d in ds.describe_indices() if d.name != MEM_WAL_INDEX_NAME)
    manifest = manifest_bytes(state, ds.version) if manifest is None else manifest
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
