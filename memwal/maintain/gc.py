"""Garbage collection of what compaction made redundant.

Per shard, GC removes

1. **SSTables** that are compacted, covered by every base index (``index_catchup``) and
   consumed by every view fed by compaction and every registered change-feed consumer
   that committed within ``feed_retention_seconds`` (their holds, :mod:`memwal.core.holds`;
   an expired consumer's hold and anchor tag are removed), judged at a
   base version at least ``reader_grace_seconds`` old, so a reader that pinned a snapshot
   shortly before keeps finding the SSTables it was told to read -- or at least
   ``time_travel_seconds`` old, so a time-travel reader finds the SSTables of any state
   since (:mod:`memwal.readers.timetravel`);
2. **WAL entries** at or below the shard's flushed position (``replay_after_wal_entry_position``):
   data entries of the generations collected in 1 (when their SSTables go), and fence
   sentinels once the flushed position of the newest shard manifest version at least
   ``wal_retention_seconds`` old covers them (see *Why collecting the WAL is safe* below);
3. **shard manifest versions** older than both the newest ``manifest_versions_kept`` and
   ``manifest_retention_seconds``;
4. **orphan** ``*_gen_*`` directories listed in no manifest: from failed flush attempts,
   or left by a GC that crashed between draining a manifest and deleting;
Base table versions (what frees the files compaction rewrote) are not GC's: their one
owner is :mod:`memwal.maintain.basefiles`.

Time travel reads a retained base version with the SSTables the shards' manifests listed
at its time (``memwal.readers.timetravel``): what GC keeps for it is bounded by the base
version and manifest retentions, whichever ends first.

**What an idle pass reads.** A maintenance cycle hands GC the base it left and the shard
manifests it read at its start (:meth:`GarbageCollector.run_once`), so GC resolves no
manifest of its own: a drain starts from the cycle's manifest and, if a writer committed
since, its put-if-absent of the next version fails and it reloads. The timestamps of base
versions (for the reader grace) are remembered, as they never change. A shard's directory is
listed for orphans only when its manifest changed since the last sweep (or half the orphan
grace ago), and its manifest versions and WAL only when something can have become
collectable: its manifest changed, more of it is compacted, or the time comes when the
oldest kept version, or the next fence sentinel, ages out. So a pass over a quiet table reads
almost nothing per shard.

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

Why collecting the WAL is safe. A WAL entry at or below a shard's flushed position is read
by no one: Lance's replay and memwal's strong readers, flush-stranded and WAL-gap check all
start after the flushed position of the manifest they hold, and the rows are in an SSTable.
What such an entry can still do is *occupy a position*. A writer learns it was fenced only
when it commits a manifest or when its next WAL append (put-if-not-exists at the position
after its own last entry) collides with an existing file; every claim writes a data-less
fence sentinel at exactly that position, so a stale writer's first write after the claim
collides and fails. Delete that sentinel while the stale writer still holds its handle, and
its next put lands in the hole and is acknowledged, below the flushed position, where no
replay will ever read it (``tests/test_gc.py`` reproduces this with Lance). Two rules keep
that from happening, and keep the gap check from taking a collected prefix for a gap:

* **Only sentinels can be collided with, and they wait.** A stale writer's next append goes
  to the position right after its own last entry, and whoever claimed the shard after it
  wrote its sentinel exactly there; data entries never sit at such a position, so they go
  with their SSTables, as soon as nothing reads them (their generation is compacted at a
  base version ``reader_grace_seconds`` old, so no reader or writer still plans from a
  manifest older than their flush). A fence sentinel goes only once it is at or below the
  flushed position of the newest manifest version written at least ``wal_retention_seconds``
  ago. Whatever planned from a manifest that was the latest less than
  ``wal_retention_seconds`` ago (a reader's strong read, a writer's gap check before a
  claim) starts at or above that position, so it never sees a collected entry missing: a
  collected prefix lies below every flushed position anyone still uses, and a gap (a
  missing entry *above* the flushed position with later entries after it) is never made by
  GC. A sentinel, in turn, is written before the flush that covers it, so it lives at least
  ``wal_retention_seconds``.
* **memwal's writers never sit on a stale handle that long.** ``ShardWriterPool`` reopens,
  instead of writing through, a cached writer unused for ``max_idle_seconds`` (120 s). A
  fenced writer's next append therefore starts within ``max_idle_seconds`` of its previous
  one, which came before the sentinel it would collide with: it collides as long as
  ``wal_retention_seconds`` exceeds ``max_idle_seconds`` plus the longest a single append
  may stall (480 s with the defaults), the same kind of bound as ``reader_grace_seconds``.
  A Lance writer held outside memwal's pools is not covered; keep its handles short-lived.

So only the unflushed tail, the data entries of SSTables not yet collected and the sentinels
of the last ``wal_retention_seconds`` stay on disk, however many claims a shard has seen; GC reads an
entry's metadata once per collector and lists a shard's WAL only when its collectable
position or its SSTables changed, so a drain never rereads the whole history.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

import lance
import pyarrow as pa

from memwal.core import paths
from memwal.core.errors import CommitConflictError, ConcurrencyError, MemwalError
from memwal.core.holds import FEED_TAG_PREFIX, feed_holds, held_through, view_holds
from memwal.core.indexes import base_indexes, covered_generation
from memwal.core.lance_errors import is_not_found
from memwal.core.manifest import MemWalIndex, ShardManifest
from memwal.core.state import TableState

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
    #: Base table versions younger than this stay (time travel); never less than the reader
    #: grace. Read by memwal.maintain.basefiles, the one owner of base versions, like the next one.
    base_version_retention_seconds: float = 3600.0
    #: Time travel across the LSM (``readers.open(uri, as_of=...)``): compacted SSTables stay
    #: until they were compacted this long ago, so the state of any moment since is readable
    #: (its base version, the shards' manifests then and the SSTables they list). Capped by
    #: the base version and manifest retentions: a state whose base version or manifests are
    #: gone cannot be read, so its SSTables need not stay either. The disk cost is this long a
    #: stretch of the table's writes, kept as SSTables after compaction.
    time_travel_seconds: float = 3600.0
    #: Old base versions are looked for at most this often (a cleanup reads every retained
    #: base manifest), and never less often than the retention.
    base_version_cleanup_interval_seconds: float = 60.0
    #: WAL entries (fence sentinels included) are collected at or below the flushed position of
    #: the newest shard manifest at least this old. Must exceed the writers' ``max_idle_seconds``
    #: (``ShardWriterPool``, 120 s) plus the longest a WAL append may stall; see the module doc.
    wal_retention_seconds: float = 600.0
    #: A registered change-feed consumer (:mod:`memwal.readers.feed`) holds the SSTables and the base
    #: version it has yet to read for at most this long after its last commit; then GC
    #: releases its hold, and its next read raises ``ChangesCollectedError``.
    feed_retention_seconds: float = 7 * 24 * 3600.0


@dataclass
class ShardGcResult:
    shard_id: str
    sstables_removed: list[int] = field(default_factory=list)
    wal_entries_removed: int = 0
    manifests_removed: int = 0
    orphans_removed: list[str] = field(default_factory=list)
    bytes_reclaimed: int = 0


def _collectable_through(
    base: lance.LanceDataset | None, index: MemWalIndex | None, indexes: list[str], shard_id: str
) -> int:
    """Highest generation of ``shard_id`` that is compacted and covered by every base index
    (``base`` is the base table at the version ``index`` was read from)."""
    if base is None or index is None:
        return 0
    limit = index.compacted_generation(shard_id)
    for name in indexes:
        # Lance reads "shard absent from index_catchup" as caught up; GC does not: until an
        # index has recorded its catch-up, the SSTables are what keeps reads indexed.
        limit = min(limit, covered_generation(base, index, name, shard_id))
    return limit


@dataclass(frozen=True)
class _WalMeta:
    """What GC needs to know of one WAL entry (immutable, so read once per collector)."""

    sentinel: bool
    #: the MemTable generation a data entry went into; None if unknown (unreadable entry)
    generation: int | None

    @classmethod
    def parse(cls, data: bytes) -> "_WalMeta":
        try:
            with pa.ipc.open_stream(data) as reader:
                meta = reader.schema.metadata or {}
        except pa.ArrowInvalid:
            return cls(False, None)  # unreadable: never collected here (memwal check reports it)
        gen = meta.get(b"generation")
        return cls(meta.get(b"fence_sentinel") == b"true", int(gen) if gen is not None else None)


class GarbageCollector:
    """Collects one table's garbage; safe to run while writers, readers and compactors run."""

    def __init__(self, state: TableState, config: GcConfig | None = None) -> None:
        self.state = state
        self.config = config or GcConfig()
        self.bytes_reclaimed = 0
        self._last_drain: dict[str, float] = {}  # shard id -> monotonic time of its last drain
        self._wal_meta: dict[tuple[str, int], _WalMeta] = {}  # (shard, position) -> its metadata
        #: shard id -> (collectable position, listed generations) when its WAL was last collected
        self._wal_collected: dict[str, tuple[int, int, int, frozenset[int]]] = {}
        #: base version -> its commit time (seconds since the epoch)
        self._committed_at: dict[int, float] = {}
        #: the last safe base version found, checked to exist then
        self._verified: int | None = None
        #: the base at the last safe version, and the MemWAL index of that version
        self._safe_base: tuple[int, lance.LanceDataset] | None = None
        #: shard id -> (manifest version, monotonic time) of its last orphan sweep
        self._swept: dict[str, tuple[int, float]] = {}
        #: shard id -> (manifest version, generations collectable, time.time() when something
        #: else may become collectable) of its last listing of manifest versions and WAL
        self._listed: dict[str, tuple[int, int, float]] = {}

    @property
    def sstable_retention_seconds(self) -> float:
        """How long ago an SSTable must have been compacted to be collected: the reader grace,
        or the time-travel retention while the states it serves are kept (see ``GcConfig``)."""
        c = self.config
        travel = min(c.time_travel_seconds, c.base_version_retention_seconds, c.manifest_retention_seconds)
        return max(c.reader_grace_seconds, travel)

    def safe_base_version(self, ds: lance.LanceDataset | None = None, older_than: float | None = None) -> int | None:
        """The newest base version committed at least ``older_than`` seconds ago
        (``reader_grace_seconds`` by default), if any.

        Found by bisection over the version numbers, whose commit times ascend with them: a
        manifest read per probe. Listing the versions reads every retained manifest, and the
        base keeps ``base_version_retention_seconds`` of them (an hour by default, a few
        thousand): 1.3 s a cycle at 2,000 versions. The version returned had its own commit
        time checked, so a clock that steps back can only make it an older one (GC then
        collects less, never more). Versions already cleaned up count as old: cleanup removes
        the oldest ones.

        Commit times never change, so they are remembered: a pass over a base that did not
        move reads nothing. A version remembered but cleaned up since would still look like
        one; so an answer that differs from the last one is checked to exist, and if it does
        not, the bisection runs again from what is on disk.
        """
        ds = ds or self.state.dataset()
        age = self.config.reader_grace_seconds if older_than is None else older_than
        version = self._bisect(ds, age)
        if version is not None and version != self._verified:
            if self._commit_time(ds, version, remembered=False) is None:  # cleaned up meanwhile
                self._committed_at.clear()
                version = self._bisect(ds, age)
            self._verified = version
        return version

    def _commit_time(self, ds: lance.LanceDataset, version: int, remembered: bool = True) -> float | None:
        """When ``version`` was committed (seconds since the epoch); None if it is not on disk."""
        if remembered and version in self._committed_at:
            return self._committed_at[version]
        try:
            ts = ds.checkout_version(version).get_version()["timestamp"]
        except OSError as e:
            if is_not_found(e):
                return None  # not remembered: a version being committed is not found yet either
            raise
        if len(self._committed_at) >= 100_000:  # a day of one commit a second: start over
            self._committed_at.clear()
        t = self._committed_at[version] = ts.timestamp() if hasattr(ts, "timestamp") else float(ts)
        return t

    def _bisect(self, ds: lance.LanceDataset, older_than: float) -> int | None:
        cutoff = time.time() - older_than
        lo, hi = 1, ds.version + 1  # versions below lo are old or gone, from hi on young
        while lo < hi:
            mid = (lo + hi) // 2
            ts = self._commit_time(ds, mid)
            if ts is None or ts <= cutoff:
                lo = mid + 1
            else:
                hi = mid
        if lo == 1:
            return None
        ts = self._commit_time(ds, lo - 1)
        return lo - 1 if ts is not None and ts <= cutoff else None

    def run_once(
        self,
        shard_ids: Iterable[str] | None = None,
        on_shard_error: Callable[[str, Exception], None] | None = None,
        *,
        base: lance.LanceDataset | None = None,
        manifests: Mapping[str, ShardManifest] | None = None,
    ) -> list[ShardGcResult]:
        """Collect every shard (or those given).

        With ``on_shard_error``, a shard that fails (a damaged manifest, say) is handed to it
        and the other shards are still collected; without, the error propagates. ``base``: the
        latest base (a maintenance cycle's, as it left it); ``manifests``: shard manifests to
        start from (a cycle's, read at its start; a stale one only costs a reload).
        """
        latest = base or self.state.dataset()
        version = self.safe_base_version(latest, self.sstable_retention_seconds)
        safe = self._safe_dataset(version) if version is not None else None
        index = self.state.manifests.mem_wal_index(version) if version is not None else None
        indexes = base_indexes(latest)
        holds = view_holds(self.state.io, self.state.uri)  # read after the index: holds only move up
        feeds, expired = feed_holds(self.state.io, self.state.uri, time.time(), self.config.feed_retention_seconds)
        holds += feeds
        for name in expired:
            self._release_feed(latest, name)
        results = []
        for shard_id in self.state.manifests.list_shards() if shard_ids is None else shard_ids:
            try:
                through = held_through(holds, shard_id, _collectable_through(safe, index, indexes, shard_id))
                r = self.collect_shard(shard_id, through, manifests.get(shard_id) if manifests is not None else None)
            except (MemwalError, OSError, ValueError) as e:
                if on_shard_error is None or isinstance(e, ConcurrencyError):
                    raise
                on_shard_error(shard_id, e)
                continue
            if r.sstables_removed or r.wal_entries_removed or r.manifests_removed or r.orphans_removed:
                results.append(r)
        return results

    def _release_feed(self, latest: lance.LanceDataset, name: str) -> None:
        """Drop an expired change-feed consumer: its anchor tag, then its hold."""
        tag = FEED_TAG_PREFIX + name
        if tag in latest.tags.list():
            latest.tags.delete(tag)
        self.state.io.remove(paths.feed_hold(self.state.uri, name))
        log.warning("change-feed consumer %r did not commit for %.0fs: its hold is released", name, self.config.feed_retention_seconds)

    def _safe_dataset(self, version: int) -> lance.LanceDataset:
        """The base at ``version`` (opened once per version: it is read for its fragments only)."""
        if self._safe_base is None or self._safe_base[0] != version:
            self._safe_base = (version, self.state.dataset(version))
        return self._safe_base[1]

    # -- one shard -------------------------------------------------------------------------------

    def collect_shard(self, shard_id: str, through: int, manifest: ShardManifest | None = None) -> ShardGcResult:
        """Collect one shard: SSTables up to generation ``through``, their WAL, old manifests,
        orphans. ``manifest``: the shard's manifest to start from (the latest is read if None)."""
        r = ShardGcResult(shard_id)
        manifest = self._drain(shard_id, through, r, manifest)
        if manifest is None:
            return r
        now = time.monotonic()
        swept = self._swept.get(shard_id)
        if swept is None or swept[0] != manifest.version or now - swept[1] >= self.config.orphan_grace_seconds / 2:
            # Drained SSTables are now listed nowhere: the orphan sweep removes their directories.
            # An orphan appears with a manifest change (a drain, a flush that superseded a failed
            # one), or is of the current generation and waits out the orphan grace anyway.
            self._sweep_orphans(manifest, r)
            self._swept[shard_id] = (manifest.version, now)
        listed = self._listed.get(shard_id)
        if listed is None or listed[:2] != (manifest.version, through) or time.time() >= listed[2]:
            # Before old manifests go: the newest one old enough bounds which sentinels may go.
            # One listing of the shard's manifest versions serves both (thousands of names an hour).
            versions = self.state.manifests.retained_versions(shard_id)
            next_wal = self._remove_wal(manifest, through, r, versions)
            next_manifest = self._remove_old_manifests(manifest, r, versions)
            self._listed[shard_id] = (manifest.version, through, min(next_wal, next_manifest))
        self.bytes_reclaimed += r.bytes_reclaimed
        if r.sstables_removed or r.orphans_removed or r.wal_entries_removed:
            log.info(
                "gc shard %s: %d sstables, %d orphans, %d wal entries, %d manifests, %d bytes",
                shard_id, len(r.sstables_removed), len(r.orphans_removed), r.wal_entries_removed,
                r.manifests_removed, r.bytes_reclaimed,
            )
        return r

    def _drain(self, shard_id: str, through: int, r: ShardGcResult, manifest: ShardManifest | None = None) -> ShardManifest | None:
        """Commit a manifest without SSTables <= ``through`` (claiming the epoch); returns the
        latest manifest afterwards (the drained one, or the unchanged latest). Starts from
        ``manifest`` when given: if it is not the latest, the commit of its next version fails
        (put-if-absent) and the latest is read."""
        store = self.state.manifests
        for _ in range(100):
            m, manifest = (manifest, None) if manifest is not None else (store.read_shard(shard_id), None)
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

    def wal_collectable_through(self, shard_id: str, versions: list[int] | None = None) -> int:
        """The flushed position of the shard's newest manifest version at least
        ``wal_retention_seconds`` old (0 if none): WAL entries at or below it may go.

        ``versions`` are the shard's retained manifest versions, ascending (listed if not
        given). A version is written only once the one before it exists, so their modification
        times ascend with them and the newest old-enough version is found by bisection: a
        handful of stats instead of one per retained version (thousands an hour per shard).
        Whatever version the bisection settles on had its own time checked, so a clock that
        steps back can only make it an older version, which collects less, never more.
        """
        return self._wal_through(shard_id, versions)[0]

    def _wal_through(self, shard_id: str, versions: list[int] | None = None) -> tuple[int, float]:
        """:meth:`wal_collectable_through`, and when (``time.time()``) it may next move: when
        the oldest version that is not old enough yet becomes so (never, if none)."""
        io, store = self.state.io, self.state.manifests
        versions = store.retained_versions(shard_id) if versions is None else versions
        cutoff = time.time() - self.config.wal_retention_seconds
        young_at = float("inf")  # the time of versions[hi], once probed
        lo, hi = 0, len(versions)  # versions[:lo] are old enough, versions[hi:] are not
        while lo < hi:
            mid = (lo + hi) // 2
            try:
                _size, mtime = io.stat(paths.shard_manifest_path(self.state.uri, shard_id, versions[mid]))
            except FileNotFoundError:
                mtime = float("-inf")  # removed meanwhile by another GC: only old versions go
            if mtime <= cutoff:
                lo = mid + 1
            else:
                hi, young_at = mid, mtime
        next_at = young_at + self.config.wal_retention_seconds
        if lo == 0:
            return 0, next_at
        m = store.read_shard(shard_id, versions[lo - 1])
        return (m.replay_after_wal_entry_position if m is not None else 0), next_at

    def _remove_wal(self, manifest: ShardManifest, generations_through: int, r: ShardGcResult, versions: list[int]) -> float:
        """Remove the shard's WAL entries that nothing reads and no stale writer can collide with
        (see the module docstring): at or below the flushed position, data entries of
        generations up to ``generations_through`` no longer listed in ``manifest``, and fence
        sentinels at or below :meth:`wal_collectable_through`. Returns when (``time.time()``)
        more sentinels may become collectable with the manifest unchanged."""
        io, uri, shard_id = self.state.io, self.state.uri, manifest.shard_id
        through, next_at = self._wal_through(shard_id, versions)
        flushed = manifest.replay_after_wal_entry_position
        listed = frozenset(s.generation for s in manifest.sstables)
        state = (through, flushed, generations_through, listed)
        if flushed == 0 or self._wal_collected.get(shard_id) == state:
            return next_at  # nothing new can be collectable: spare the listing and the reads
        wal = paths.wal_dir(uri, shard_id)
        for info in io.list_prefix(wal):
            try:
                pos = paths.parse_bitrev64(info.path)
            except ValueError:
                continue
            if pos > flushed:
                continue  # needed by replay and strong reads
            key = (shard_id, pos)
            meta = self._wal_meta.get(key)
            path = paths.join(wal, info.path)
            if meta is None:
                try:
                    meta = self._wal_meta[key] = _WalMeta.parse(io.read(path))
                except FileNotFoundError:
                    continue
            if meta.sentinel:
                if pos > through:
                    continue  # a stale writer may still collide with it
            elif meta.generation is None or meta.generation in listed or meta.generation > generations_through:
                continue  # rows of an SSTable not collected yet (or unknown): kept until it is
            io.remove(path)
            self._wal_meta.pop(key, None)
            r.wal_entries_removed += 1
            r.bytes_reclaimed += info.size
        self._wal_collected[shard_id] = state
        return next_at

    def _remove_old_manifests(self, manifest: ShardManifest, r: ShardGcResult, versions: list[int]) -> float:
        """Remove versions older than both the newest ``manifest_versions_kept`` and
        ``manifest_retention_seconds``, oldest first, stopping at the first one too young: the
        versions after it are younger still (see :meth:`wal_collectable_through`). Returns when
        (``time.time()``) that one becomes old enough (never, if it stopped at the kept ones)."""
        io = self.state.io
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
                return mtime + self.config.manifest_retention_seconds
            io.remove(path)
            r.manifests_removed += 1
            r.bytes_reclaimed += size
        return float("inf")

