"""Garbage collection of what compaction made redundant.

Per shard, GC removes

1. **SSTables** that are compacted, covered by every base index (``index_catchup``) and
   consumed by every view fed by compaction (its hold, :mod:`memwal.holds`), judged at a
   base version at least ``reader_grace_seconds`` old, so a reader that pinned a snapshot shortly before keeps finding the SSTables it was told to read;
2. the **WAL entries** those SSTables cover: position at or below the manifest's
   ``replay_after_wal_entry_position`` and tagged with a collected generation. Fence
   sentinels are always kept: a stalled writer of an old epoch discovers it is fenced when
   its next WAL append collides with the sentinel its successor wrote. Deleting sentinels
   would let it append into the hole, acknowledging writes no one ever replays;
3. **shard manifest versions** older than both the newest ``manifest_versions_kept`` and
   ``manifest_retention_seconds``;
4. **orphan** ``*_gen_*`` directories listed in no manifest: from failed flush attempts,
   or left by a GC that crashed between draining a manifest and deleting;
5. **base table versions** older than ``base_version_retention_seconds`` (Lance's
   ``cleanup_old_versions``), which is what frees the files compaction rewrote.

Time travel reads a retained base version alone (see ``memwal.readers``), so retained
base versions need nothing from the MemWAL.

How GC drains ``sstables`` from a shard manifest, which no Lance API edits: it commits
the next manifest version (put-if-not-exists) with the collected SSTables left out and the
writer epoch *claimed* (+1), as Lance's own tools do. Only then are the directories
deleted, so no manifest a reader can load lists a deleted SSTable. Claiming the epoch
fences the live writer; that is what makes it safe, because a writer whose next manifest
(a MemTable flush) were computed from its own memory would list the drained SSTables
again. The fenced writer's acknowledged writes are in WAL entries after
``replay_after_wal_entry_position``, which the drain keeps as they were; memwal's writer
pool reopens the shard on the next write (claiming it back and replaying those entries),
and a writer being closed reopens and flushes. A lost race on the manifest version just
reloads and recomputes.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from datetime import timedelta

import pyarrow as pa

from memwal import paths
from memwal.errors import CommitConflictError
from memwal.holds import held_through, view_holds
from memwal.indexes import base_indexes
from memwal.manifest import MemWalIndex, ShardManifest
from memwal.state import TableState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GcConfig:
    #: A reader may keep using a snapshot this long; SSTables compacted more recently stay.
    reader_grace_seconds: float = 300.0
    #: Shard manifest versions: keep at least this many newest ...
    manifest_versions_kept: int = 20
    #: ... and every version younger than this.
    manifest_retention_seconds: float = 3600.0
    #: Unlisted SSTable directories of the current generation may be a flush in progress.
    orphan_grace_seconds: float = 3600.0
    #: Each drain fences the shard's writer, which then reopens (claim + WAL replay), so a
    #: shard is drained at most once per ``drain_interval_seconds`` ...
    drain_interval_seconds: float = 60.0
    #: ... unless this many of its SSTables can go already.
    min_sstables_to_drain: int = 64
    #: Base table versions younger than this stay (time travel); never less than the reader grace.
    base_version_retention_seconds: float = 3600.0


@dataclass
class ShardGcResult:
    shard_id: str
    sstables_removed: list[int] = field(default_factory=list)
    wal_entries_removed: int = 0
    manifests_removed: int = 0
    orphans_removed: list[str] = field(default_factory=list)
    bytes_reclaimed: int = 0


def _collectable_through(index: MemWalIndex | None, indexes: list[str], shard_id: str) -> int:
    """Highest generation of ``shard_id`` that is compacted and covered by every base index."""
    if index is None:
        return 0
    limit = index.compacted_generation(shard_id)
    for name in indexes:
        # Lance reads "shard absent from index_catchup" as caught up; GC does not: until an
        # index has recorded its catch-up, the SSTables are what keeps reads indexed.
        limit = min(limit, index.index_catchup.get(name, {}).get(shard_id, 0))
    return limit


def _is_fence_sentinel_or_newer(meta: dict[bytes, bytes] | None, generation: int) -> bool:
    meta = meta or {}
    if meta.get(b"fence_sentinel") == b"true":
        return True
    gen = meta.get(b"generation")
    return gen is None or int(gen) > generation


class GarbageCollector:
    """Collects one table's garbage; safe to run while writers, readers and compactors run."""

    def __init__(self, state: TableState, config: GcConfig | None = None) -> None:
        self.state = state
        self.config = config or GcConfig()
        self.bytes_reclaimed = 0
        self.base_bytes_reclaimed = 0
        self._last_drain: dict[str, float] = {}  # shard id -> monotonic time of its last drain

    def safe_base_version(self) -> int | None:
        """The newest base version committed at least ``reader_grace_seconds`` ago, if any."""
        cutoff = time.time() - self.config.reader_grace_seconds
        safe = None
        for v in self.state.dataset().versions():
            ts = v["timestamp"].timestamp() if hasattr(v["timestamp"], "timestamp") else float(v["timestamp"])
            if ts <= cutoff:
                safe = v["version"]
        return safe

    def run_once(self) -> list[ShardGcResult]:
        """Collect every shard, then old base table versions."""
        version = self.safe_base_version()
        index = self.state.manifests.mem_wal_index(version) if version is not None else None
        indexes = base_indexes(self.state.dataset())
        holds = view_holds(self.state.io, self.state.uri)  # read after the index: holds only move up
        results = []
        for shard_id in self.state.manifests.list_shards():
            r = self.collect_shard(shard_id, held_through(holds, shard_id, _collectable_through(index, indexes, shard_id)))
            if r.sstables_removed or r.wal_entries_removed or r.manifests_removed or r.orphans_removed:
                results.append(r)
        self.base_bytes_reclaimed = self._clean_base()
        self.bytes_reclaimed += self.base_bytes_reclaimed
        return results

    def _clean_base(self) -> int:
        """Remove base table versions (and the files only they use) past the retention window."""
        keep = max(self.config.base_version_retention_seconds, self.config.reader_grace_seconds)
        stats = self.state.dataset().cleanup_old_versions(older_than=timedelta(seconds=keep))
        if stats.old_versions:
            log.info("removed %d old base versions (%d bytes)", stats.old_versions, stats.bytes_removed)
        return stats.bytes_removed

    # -- one shard -------------------------------------------------------------------------------

    def collect_shard(self, shard_id: str, through: int) -> ShardGcResult:
        """Collect one shard: SSTables up to generation ``through``, their WAL, old manifests, orphans."""
        r = ShardGcResult(shard_id)
        manifest = self._drain(shard_id, through, r)
        if manifest is None:
            return r
        # Drained SSTables are now listed nowhere: the orphan sweep removes their directories.
        self._sweep_orphans(manifest, r)
        if r.sstables_removed:
            self._remove_wal(manifest, max(r.sstables_removed), r)
        self._remove_old_manifests(manifest, r)
        self.bytes_reclaimed += r.bytes_reclaimed
        if r.sstables_removed or r.orphans_removed or r.wal_entries_removed:
            log.info(
                "gc shard %s: %d sstables, %d orphans, %d wal entries, %d manifests, %d bytes",
                shard_id, len(r.sstables_removed), len(r.orphans_removed), r.wal_entries_removed,
                r.manifests_removed, r.bytes_reclaimed,
            )
        return r

    def _drain(self, shard_id: str, through: int, r: ShardGcResult) -> ShardManifest | None:
        """Commit a manifest without SSTables <= ``through`` (claiming the epoch); returns the
        latest manifest afterwards (the drained one, or the unchanged latest)."""
        store = self.state.manifests
        for _ in range(100):
            m = store.read_shard(shard_id)
            if m is None:
                return None
            drop = [s for s in m.sstables if s.generation <= through]
            due = time.monotonic() - self._last_drain.get(shard_id, float("-inf")) >= self.config.drain_interval_seconds
            if not drop or (len(drop) < self.config.min_sstables_to_drain and not due):
                return m
            drained = replace(
                m,
                version=m.version + 1,
                writer_epoch=m.writer_epoch + 1,
                sstables=tuple(s for s in m.sstables if s.generation > through),
            )
            if store.write_shard_if_absent(drained):
                self._last_drain[shard_id] = time.monotonic()
                r.sstables_removed = sorted(s.generation for s in drop)
                return drained
            store.clear_cache()  # a writer committed first: recompute from its version
        raise CommitConflictError(
            f"shard {shard_id}: could not commit a drained manifest after 100 attempts; writers kept committing first"
        )

    def _sweep_orphans(self, manifest: ShardManifest, r: ShardGcResult) -> None:
        io, uri = self.state.io, self.state.uri
        listed = {s.path for s in manifest.sstables}
        shard_dir = paths.shard_dir(uri, manifest.shard_id)
        now = time.time()
        for name in io.list_dir(shard_dir):
            gen = paths.sstable_generation(name)
            if gen is None or name in listed:
                continue
            path = paths.join(shard_dir, name)
            if gen >= manifest.current_generation:
                # The current generation's directory may be a flush in progress.
                # Object stores have no directory times: the newest object inside tells the
                # age (an empty directory is a flush that has written nothing yet).
                newest = io.newest_modified_time(path)
                if newest is None or now - newest < self.config.orphan_grace_seconds:
                    continue
            size = io.tree_size(path)
            io.remove_tree(path)
            r.bytes_reclaimed += size
            if gen not in r.sstables_removed:
                r.orphans_removed.append(name)

    def _remove_wal(self, manifest: ShardManifest, generation: int, r: ShardGcResult) -> None:
        io, uri = self.state.io, self.state.uri
        wal = paths.wal_dir(uri, manifest.shard_id)
        for name in io.list_dir(wal):
            try:
                pos = paths.parse_bitrev64(name)
            except ValueError:
                continue
            if pos > manifest.replay_after_wal_entry_position:
                continue  # not flushed yet: replay and strong readers need it
            path = paths.join(wal, name)
            try:
                data = io.read(path)
                with pa.ipc.open_stream(data) as reader:
                    meta = reader.schema.metadata
            except (FileNotFoundError, pa.ArrowInvalid):
                continue
            if _is_fence_sentinel_or_newer(meta, generation):
                continue
            size = len(data)
            io.remove(path)
            r.wal_entries_removed += 1
            r.bytes_reclaimed += size

    def _remove_old_manifests(self, manifest: ShardManifest, r: ShardGcResult) -> None:
        io, store = self.state.io, self.state.manifests
        versions = store.retained_versions(manifest.shard_id)
        keep_from = max(1, manifest.version - self.config.manifest_versions_kept + 1)
        cutoff = time.time() - self.config.manifest_retention_seconds
        for v in versions:
            if v >= keep_from:
                break
            path = paths.shard_manifest_path(self.state.uri, manifest.shard_id, v)
            try:
                size, mtime = io.stat(path)
            except FileNotFoundError:
                continue
            if mtime > cutoff:
                continue
            io.remove(path)
            r.manifests_removed += 1
            r.bytes_reclaimed += size

