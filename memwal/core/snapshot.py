"""Snapshots: exactly which data a reader must merge for one consistent read.

A snapshot is one base table version plus, for every shard, the SSTables whose generation
is above the shard's compacted generation *in that base version*. Passing an SSTable that
is already compacted would be wrong, not just slow: Lance ranks any SSTable above the base
table, so an old compacted row would shadow a newer value written to the base since.

Order of reads matters for safety: the base version is pinned first, then the shard
manifests are read. A manifest read later can only list more SSTables, and those above the
pinned compacted generation are exactly the ones this base version lacks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable

import lance
import lance.mem_wal

from memwal.core import paths
from memwal.core.manifest import ManifestStore, MemWalIndex, ShardManifest, SsTable


@dataclass(frozen=True)
class ShardState:
    """One shard as a reader sees it."""

    manifest: ShardManifest
    compacted_generation: int
    #: Read SSTables above this generation instead of above the compacted one: lower for
    #: the indexed read plan, which also reads the compacted generations a base index does
    #: not cover yet (see :meth:`Snapshot.with_index_gap`).
    read_after: int | None = None

    @property
    def shard_id(self) -> str:
        return self.manifest.shard_id

    @property
    def live_sstables(self) -> tuple[SsTable, ...]:
        """SSTables the read merges (by default: not yet compacted into the base), oldest first."""
        after = self.compacted_generation if self.read_after is None else self.read_after
        return tuple(
            sorted(
                (s for s in self.manifest.sstables if s.generation > after),
                key=lambda s: s.generation,
            )
        )

    def lance_snapshot(self) -> lance.mem_wal.ShardSnapshot:
        snap = (
            lance.mem_wal.ShardSnapshot(self.shard_id)
            .with_spec_id(self.manifest.shard_spec_id)
            .with_current_generation(self.manifest.current_generation)
        )
        for s in self.live_sstables:
            snap = snap.with_sstable(s.generation, s.path)
        return snap


@dataclass(frozen=True)
class Snapshot:
    """A base table version and the live part of every shard's LSM tree."""

    dataset: lance.LanceDataset
    index: MemWalIndex | None
    shards: tuple[ShardState, ...]

    @property
    def base_version(self) -> int:
        return self.dataset.version

    def shard(self, shard_id: str) -> ShardState | None:
        for s in self.shards:
            if s.shard_id == shard_id:
                return s
        return None

    def with_index_gap(self, index_name: str) -> "Snapshot":
        """This snapshot also reading, per shard, the compacted SSTables that base index
        ``index_name`` does not cover yet (``index_catchup``): the indexed read plan.

        Safe where reading compacted SSTables otherwise is not: a generation above the
        index's catch-up is newer than anything the index covers, and every generation
        newer than it is read too (it is in the gap, or live). GC keeps these SSTables
        until the index catches up.
        """
        if self.index is None:
            return self
        caught = self.index.index_catchup.get(index_name, {})
        shards = tuple(
            replace(s, read_after=min(s.compacted_generation, caught.get(s.shard_id, 0)))
            for s in self.shards
        )
        return Snapshot(self.dataset, self.index, shards)

    def restrict(self, shard_ids: Iterable[str]) -> "Snapshot":
        """The same snapshot with only the given shards (shard pruning)."""
        wanted = set(shard_ids)
        return Snapshot(self.dataset, self.index, tuple(s for s in self.shards if s.shard_id in wanted))

    def lance_snapshots(self, shard_ids: Iterable[str] | None = None) -> list[lance.mem_wal.ShardSnapshot]:
        """Lance ``ShardSnapshot``s for the given shards (all when None), compacted SSTables left out."""
        wanted = None if shard_ids is None else set(shard_ids)
        return [s.lance_snapshot() for s in self.shards if wanted is None or s.shard_id in wanted]

    def sstable_paths(self) -> list[str]:
        return [
            paths.sstable_path(self.dataset.uri, s.shard_id, t.path) for s in self.shards for t in s.live_sstables
        ]

    @property
    def num_live_sstables(self) -> int:
        return sum(len(s.live_sstables) for s in self.shards)


def take_snapshot(
    dataset: lance.LanceDataset,
    store: ManifestStore,
    shard_ids: Iterable[str] | None = None,
) -> Snapshot:
    """Snapshot of ``dataset``'s version (pinned by the caller) and the shards' latest manifests.

    ``shard_ids`` restricts the snapshot (shard pruning); unknown shards are skipped.
    """
    index = store.mem_wal_index(dataset.version)
    ids = store.list_shards() if shard_ids is None else list(shard_ids)
    shards = []
    for sid in ids:
        m = store.read_shard(sid)
        if m is None:
            continue
        compacted = index.compacted_generation(sid) if index is not None else 0
        shards.append(ShardState(m, compacted))
    return Snapshot(dataset, index, tuple(shards))
