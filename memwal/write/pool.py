"""Shard writers: one Lance ``ShardWriter`` per shard, opened once and reused.

Opening a writer claims its shard (epoch + 1, which fences any older writer) and replays
the shard's unflushed WAL, so it is far too expensive per write. A writer that finds
itself fenced has lost the shard to a newer one; its acknowledged writes are safe (they
are in the WAL, and the new writer replays them), so the pool reopens the shard once and
retries the write. A second fence means another process keeps claiming the shard, which
memwal reports as :class:`FencedError` rather than fighting over it.

Each open writer holds a lease on its shard (:mod:`memwal.write.lease`). Before it claims a
shard the pool checks that the shard's unflushed WAL has no gap: Lance's replay stops at the
first missing entry and the writer would then flush (and so drop) only what came before it. A shard with a gap raises :class:`WalGapError` and is never opened.

A cached writer unused for ``max_idle_seconds`` is closed and reopened rather than written
through. While it sat idle another pool may have claimed the shard; a stale writer finds out
only when its next WAL append collides with the fence sentinel of that claim, and GC collects
sentinels once they are ``GcConfig.wal_retention_seconds`` old (see ``memwal.maintain.gc``). Bounding
the idle time is what keeps every stale append ahead of that collection.

Writes get back-pressure when compaction falls behind (the table's
:class:`~memwal.core.metadata.Bounds`): before each put or delete the pool estimates the shard's
uncompacted SSTables as ``generation - 1 - compacted`` from the open writer's MemTable
generation (in memory) and the shard's compacted generation as last read from the base
table. The compacted generation only grows, so a stale one overestimates: while the estimate
is below the slowdown bound no storage is read at all, and only near the bounds is it
re-read (at most every ``recheck_seconds``). Between the bounds a write is delayed; at the
stop bound it waits for compaction, then raises :class:`WriteStalledError`.

A put, delete or flush that fails on storage (the object store past its client's retries, a
reset conditional PUT, a full disk) discards the shard's writer: one whose WAL append failed is
never written through again, and reopening it replays whatever landed. A transient failure
(:class:`~memwal.core.errors.StorageUnavailableError`) is then repeated, at most the table's
``RetryPolicy.operation_retries`` times (upserts and deletes are idempotent, so a repeat of a
write that did land changes nothing); anything else is raised as memwal's error for it.

With ``durability="fsync"`` (:class:`~memwal.core.metadata.WriterConfig`) a put or delete returns
only after the WAL entries it wrote, and the WAL directory, are fsynced (:meth:`FileIO.sync`):
Lance 14.0.2 writes them without fsync. Positions only grow, so the entries above the last
position this pool synced are exactly the unsynced ones (the first put after a claim also syncs
the replayed entries of the previous writer, which may have been written with ``"os"``). A flush
likewise syncs the SSTable and shard manifest it wrote before returning.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

import lance
import lance.mem_wal
import pyarrow as pa

from memwal.core import paths
from memwal.core.errors import (
    FencedError,
    MemwalError,
    StorageError,
    StorageUnavailableError,
    TableDamagedError,
    WriteStalledError,
)
from memwal.core.failpoints import failpoint
from memwal.core.lance_errors import classify, is_claim_race, is_fenced, is_wal_unreadable
from memwal.core.manifest import ShardManifest
from memwal.core.metadata import Bounds, WriterConfig
from memwal.core.routing import RoutedBatch
from memwal.core.schema import as_evolved, takes
from memwal.core.sharding import ShardValues, field_entries
from memwal.core.state import TableState
from memwal.core.io import uri_scheme
from memwal.write.lease import WriterLease, owner_id
from memwal.core.wal import WalTailReader, check_contiguous, fill_skipped, first_unreadable_entry, wal_positions

log = logging.getLogger(__name__)

_CLAIM_ATTEMPTS = 10


def _keeps_claiming(shard_id: str, what: str, claimer: str | None = None) -> FencedError:
    """The one error for a writer fenced again right after it reopened: another process keeps
    claiming the shard. Its acknowledged writes are in the WAL, which the shard's current owner replays."""
    who = f" (last claimed by {claimer})" if claimer else ""
    return FencedError(
        f"shard {shard_id}: {what} was fenced twice; another writer keeps claiming this shard{who} "
        "(acknowledged writes are safe in its WAL). Make sure one pipeline writes each shard"
    )


def in_batches(data: pa.Table, k: int) -> pa.Table:
    """``data`` as exactly ``k >= 1`` non-empty record batches: Lance counts a put's record
    batches against a MemTable's ``max_memtable_batches``. With ``k <= data.num_rows`` they are
    slices of one contiguous copy. With fewer rows than ``k``, each row is a batch and the last
    row is repeated as the batches still missing: Lance drops empty batches without counting
    them, and a repeat of a put's last row changes nothing readers see (newest row per key, and
    the last row stays the newest; a flushed MemTable keeps one row per key)."""
    one = data.combine_chunks()
    if k > one.num_rows:
        rows = one.to_batches(max_chunksize=1)
        return pa.Table.from_batches(rows + [one.slice(one.num_rows - 1, 1).to_batches()[0]] * (k - len(rows)),
                                     schema=data.schema)
    size, extra = divmod(one.num_rows, k)
    starts = [i * size + min(i, extra) for i in range(k + 1)]
    return pa.Table.from_batches([b for i in range(k) for b in one.slice(starts[i], starts[i + 1] - starts[i]).to_batches()],
                                 schema=data.schema)


def split_rows(data: pa.Table, max_rows: int) -> list[pa.Table]:
    """``data`` in consecutive slices of at most ``max_rows`` rows: Lance refuses a single put
    larger than a MemTable, and never splits one itself."""
    if data.num_rows <= max_rows:
        return [data]
    return [data.slice(i, max_rows) for i in range(0, data.num_rows, max_rows)]


@dataclass
class WriterStats:
    """Counters of one pool, for progress logs and metrics."""

    opens: int = 0
    fenced_retries: int = 0
    puts: int = 0
    rows_put: int = 0
    deletes: int = 0
    rows_deleted: int = 0
    open_seconds: float = 0.0
    #: writes delayed by the slowdown bound, writes that waited at the stop bound, and the
    #: seconds both cost (back-pressure, see :class:`~memwal.core.metadata.Bounds`)
    slowdowns: int = 0
    stalls: int = 0
    stall_seconds: float = 0.0
    #: writes and flushes repeated after a transient storage failure (the writer reopened)
    storage_retries: int = 0
    #: WAL positions a write skipped on S3 (a 409), filled (:meth:`ShardWriterPool._fill_skipped`)
    wal_holes_filled: int = 0
    #: MemTables sealed by a timed seal with the writer open (Lance flushes them in the background)
    seals: int = 0
    #: writers closed to flush their MemTable (:meth:`ShardWriterPool.flush`)
    flushes: int = 0

    def snapshot(self) -> dict[str, float]:
        return dict(self.__dict__)

    def add(self, **deltas: float) -> None:
        for name, delta in deltas.items():
            setattr(self, name, getattr(self, name) + delta)


@dataclass
class ShardWriterPool:
    """Writers of one table, keyed by shard id. Thread-safe across shards.

    A shard gets its first manifest (:meth:`ensure_shard`) before its first write.
    :attr:`stats` counts for the whole pool; :meth:`shard_stats` for one shard, changed only
    by operations on that shard, so a caller that alone uses a shard (the Spark sink: one
    thread per shard) gets exact before/after differences while other threads write other
    shards, which the pool-wide counters cannot give.
    """

    state: TableState
    stats: WriterStats = field(default_factory=WriterStats)
    #: A writer's lease lasts this long after its last renewal ...
    lease_seconds: float = 60.0
    #: ... and its writes renew it at most this often.
    renew_seconds: float = 5.0
    #: This pool's name in leases (host:pid:random).
    owner: str = field(default_factory=owner_id)
    #: A cached writer unused this long is reopened before its next use (must stay well below
    #: ``GcConfig.wal_retention_seconds``; see the module docstring).
    max_idle_seconds: float = 120.0
    _last_used: dict[str, float] = field(default_factory=dict, repr=False)
    _renewed: dict[str, float] = field(default_factory=dict, repr=False)
    _shard_stats: dict[str, WriterStats] = field(default_factory=dict, repr=False)
    _writers: dict[str, lance.mem_wal.ShardWriter] = field(default_factory=dict, repr=False)
    _locks: dict[str, threading.Lock] = field(default_factory=dict, repr=False)
    _guard: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _known_shards: set[str] = field(default_factory=set, repr=False)
    #: Back-pressure bounds; None: the table's (``state.metadata.bounds``).
    bounds: Bounds | None = None
    _compacted: dict[str, tuple[int, float]] = field(default_factory=dict, repr=False)
    #: Shards whose writes are waiting at the stop bound right now.
    stalled_shards: set[str] = field(default_factory=set, repr=False)
    #: Overrides the table's ``WriterConfig.durability`` for this pool's writes (None: the table's).
    durability: str | None = None
    #: Per shard, the highest WAL position this pool has fsynced (durability "fsync").
    _synced: dict[str, int] = field(default_factory=dict, repr=False)
    #: Per shard, the WAL position up to which this pool found no hole (on S3: :meth:`_fill_skipped`).
    _contiguous: dict[str, int] = field(default_factory=dict, repr=False)
    _dirs_synced: set[str] = field(default_factory=set, repr=False)
    #: Timed seals: a write into a shard whose MemTable was last sealed (or its writer opened)
    #: at least this long ago seals the MemTable with the writer open, so eventual readers see
    #: the rows within about this time (None: MemTables seal only when full). See :meth:`put`.
    seal_interval_seconds: float | None = None
    _last_seal: dict[str, float] = field(default_factory=dict, repr=False)
    #: Per shard, when a write last went into its MemTable (a seal after it leaves nothing to flush).
    _last_write: dict[str, float] = field(default_factory=dict, repr=False)
    #: per shard, the base schema its open writer was claimed under: what its puts must carry
    #: (a writer opened after a column was added or dropped takes rows of the new columns only)
    _writer_schema: dict[str, pa.Schema] = field(default_factory=dict, repr=False)

    @property
    def config(self) -> WriterConfig:
        return self.state.metadata.writer

    @property
    def write_bounds(self) -> Bounds:
        return self.bounds if self.bounds is not None else self.state.metadata.bounds

    def ensure_shard(self, shard_id: str, values: ShardValues) -> None:
        """Create the shard's first manifest, recording its spec id and shard values, if absent.

        Lance's writer would create a bare manifest; writing it first records the shard
        value -> shard UUID mapping in Lance's own format, and Lance keeps it in every
        later version.
        """
        if shard_id in self._known_shards:
            return
        manifests = self.state.manifests
        if manifests.latest_version(shard_id) is None:
            manifests.write_shard_if_absent(
                ShardManifest(
                    shard_id=shard_id,
                    version=1,
                    shard_spec_id=self.state.lance_spec_id(),
                    field_entries=field_entries(self.state.spec, values),
                )
            )
        self._known_shards.add(shard_id)

    def _lock(self, shard_id: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(shard_id, threading.Lock())

    def shard_stats(self, shard_id: str) -> WriterStats:
        """The counters of one shard (live; copy with :meth:`WriterStats.snapshot`)."""
        with self._guard:
            return self._shard_stats.setdefault(shard_id, WriterStats())

    def _count(self, shard_id: str, **deltas: float) -> None:
        self.shard_stats(shard_id).add(**deltas)
        with self._guard:
            self.stats.add(**deltas)

    # -- leases ---------------------------------------------------------------------------------

    def lease(self, shard_id: str) -> WriterLease | None:
        """The shard's writer lease as last written (live or not), or None."""
        try:
            return WriterLease.from_json(self.state.io.read(paths.writer_lease(self.state.uri, shard_id)))
        except (FileNotFoundError, OSError):
            return None

    def _write_lease(self, shard_id: str, expires_at: float, owner: str | None = None) -> None:
        try:
            lease = WriterLease(owner or self.owner, expires_at)
            self.state.io.write(paths.writer_lease(self.state.uri, shard_id), lease.to_json())
        except OSError as e:  # advisory: never fail a write over it
            log.warning("could not write the writer lease of shard %s: %s", shard_id, e)

    def _renew(self, shard_id: str, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._renewed.get(shard_id, float("-inf")) >= self.renew_seconds:
            self._renewed[shard_id] = now
            self._write_lease(shard_id, time.time() + self.lease_seconds)

    def _release(self, shard_id: str) -> None:
        """End this pool's lease on the shard (expired now; the record keeps naming the owner)."""
        self._renewed.pop(shard_id, None)
        held = self.lease(shard_id)
        if held is not None and held.owner == self.owner and held.live():
            self._write_lease(shard_id, time.time())

    def break_lease(self, shard_id: str) -> WriterLease | None:
        """End another writer's live lease on the shard now; returns the lease it ended (None:
        none was live). For an operator who knows the writer is dead: its writes become flushable
        at once instead of when the lease runs out. A writer that is alive after all renews the
        lease at its next write, or is fenced by the flush and reopens: nothing is lost."""
        held = self.lease(shard_id)
        if held is None or not held.live() or held.owner == self.owner:
            return None
        self._write_lease(shard_id, time.time(), owner=held.owner)
        return held

    def _claimer(self, shard_id: str) -> str | None:
        """Who claimed the shard last, if another pool's lease says so."""
        held = self.lease(shard_id)
        return held.owner if held is not None and held.owner != self.owner else None

    def _check_wal(self, shard_id: str) -> int:
        """Raise :class:`WalGapError` if the shard's WAL after its last flushed position has a gap;
        return that position (0 for a shard never flushed)."""
        manifests = self.state.manifests
        version = manifests.latest_version(shard_id)
        m = manifests.read_shard(shard_id, version) if version is not None else None
        if m is None:
            return 0
        positions = check_contiguous(self.state.io, self.state.uri, shard_id, m.replay_after_wal_entry_position)
        self._contiguous[shard_id] = positions[-1] if positions else m.replay_after_wal_entry_position
        return m.replay_after_wal_entry_position

    def _fill_skipped(self, shard_id: str) -> None:
        """On S3, after a write returned: fill the WAL positions it skipped (a 409 taken for an
        occupied position, see :func:`memwal.core.wal.fill_skipped`) before it is acknowledged.
        One listing of the shard's WAL per write."""
        if uri_scheme(self.state.uri) not in ("s3", "s3a"):
            return
        top, filled = fill_skipped(self.state.io, self.state.uri, shard_id, self._contiguous.get(shard_id, 0))
        self._contiguous[shard_id] = top
        if filled:
            self._count(shard_id, wal_holes_filled=len(filled))
            log.warning("shard %s: the writer skipped WAL position(s) %s (S3 answered 409 to a conditional PUT); "
                        "filled them with empty entries so replay goes on to the acknowledged writes after them",
                        shard_id, ", ".join(map(str, filled)))

    # -- durability -------------------------------------------------------------------------------

    @property
    def fsync(self) -> bool:
        """Whether this pool's writes are acknowledged only once fsynced."""
        return (self.durability or self.config.durability) == "fsync" and not self.state.io.durable_on_write

    def _sync_wal(self, shard_id: str) -> None:
        """fsync the shard's WAL entries above the last synced position, then the WAL directory."""
        io, uri = self.state.io, self.state.uri
        positions = wal_positions(io, uri, shard_id, self._synced.get(shard_id, 0))
        if positions:
            if shard_id not in self._dirs_synced:
                # The first sync of this shard here: the directories holding the WAL directory may
                # be new too (a new shard's first write), and a lost directory entry loses its files.
                io.sync([], paths.shard_dir(uri, shard_id))
                io.sync([], paths.mem_wal_root(uri))
                self._dirs_synced.add(shard_id)
            io.sync([paths.wal_entry_path(uri, shard_id, p) for p in positions], paths.wal_dir(uri, shard_id))
            # Threads writing the same shard may finish their syncs out of order; never go back.
            self._synced[shard_id] = max(positions[-1], self._synced.get(shard_id, 0))

    def _sync_flushed(self, shard_id: str) -> None:
        """fsync what a flush wrote: the shard's newest manifest and its newest SSTable."""
        io, uri = self.state.io, self.state.uri
        manifests = self.state.manifests
        version = manifests.latest_version(shard_id)
        if version is None:
            return
        m = manifests.read_shard(shard_id, version)
        if m is not None and m.sstables:
            newest = max(m.sstables, key=lambda t: t.generation)
            root = paths.sstable_path(uri, shard_id, newest.path)
            by_dir: dict[str, list[str]] = {}
            for info in io.list_prefix(root):
                full = paths.join(root, info.path)
                by_dir.setdefault(full.rsplit("/", 1)[0], []).append(full)
            for directory, files in by_dir.items():
                io.sync(files, directory)
            io.sync([], paths.shard_dir(uri, shard_id))
        io.sync([paths.shard_manifest_path(uri, shard_id, version)], paths.shard_manifest_dir(uri, shard_id))

    def _unreadable_wal(self, shard_id: str) -> TableDamagedError:
        """The error for a claim whose WAL replay failed on an entry Lance could not parse,
        naming that entry (Lance's message does not)."""
        m = self.state.manifests.read_shard(shard_id)
        after = m.replay_after_wal_entry_position if m is not None else 0
        found = first_unreadable_entry(self.state.io, self.state.uri, shard_id, after)
        return found or TableDamagedError(
            f"shard {shard_id}: a WAL entry under {paths.wal_dir(self.state.uri, shard_id)} cannot be replayed; "
            "run `memwal check` to find it and `memwal repair` to quarantine it"
        )

    def _open(self, shard_id: str) -> lance.mem_wal.ShardWriter:
        t0 = time.perf_counter()
        # One manifest read and one listing: opens are rare (first write, after a fence).
        flushed_position = self._check_wal(shard_id)
        for attempt in range(_CLAIM_ATTEMPTS):
            try:
                base = self.state.dataset()
                w = base.mem_wal_writer(shard_id, **self.config.lance_kwargs())
                self._writer_schema[shard_id] = base.schema
                break
            except OSError as e:
                if is_wal_unreadable(e):
                    raise self._unreadable_wal(shard_id) from e
                # Lance gives up when another claim (a writer, a GC drain, maintenance flushing a
                # dead writer's shard) commits the same manifest version first, or claims the
                # shard while this open replays its WAL ("fenced during open"); the spec says to
                # reload and claim again.
                if not (is_claim_race(e) or is_fenced(e)):
                    raise
                if attempt == _CLAIM_ATTEMPTS - 1:
                    claimer = self._claimer(shard_id)
                    who = f" (last claimed by {claimer})" if claimer else ""
                    raise FencedError(
                        f"shard {shard_id}: lost the claim to other writers {_CLAIM_ATTEMPTS} times in a row; "
                        f"another writer keeps claiming this shard{who}. Make sure one pipeline writes each shard"
                    ) from e
                time.sleep(min(0.01 * 2**attempt, 0.5))
        self._synced[shard_id] = max(flushed_position, self._synced.get(shard_id, 0))
        self._last_seal[shard_id] = time.monotonic()
        self._renew(shard_id, force=True)
        self._count(shard_id, opens=1, open_seconds=time.perf_counter() - t0)
        log.debug("opened writer for shard %s in %.3fs", shard_id, time.perf_counter() - t0)
        return w

    def _writer(self, shard_id: str) -> lance.mem_wal.ShardWriter:
        now = time.monotonic()
        if shard_id in self._writers and now - self._last_used.get(shard_id, now) > self.max_idle_seconds:
            log.debug("writer of shard %s idle for %.0fs; reopening it", shard_id, now - self._last_used[shard_id])
            self._discard(shard_id)
        w = self._writers.get(shard_id)
        if w is None:
            w = self._writers[shard_id] = self._open(shard_id)
        self._last_used[shard_id] = time.monotonic()
        return w

    def _discard(self, shard_id: str) -> None:
        w = self._writers.pop(shard_id, None)
        if w is not None:
            try:
                w.close()
            except Exception:  # noqa: BLE001 - a fenced writer cannot flush; its WAL is replayed by the new owner
                pass
            self._release(shard_id)

    def _run(self, shard_id: str, op: Callable[[lance.mem_wal.ShardWriter], None], what: str, retry_fenced: bool = True) -> None:
        with self._lock(shard_id):
            try:
                op(self._writer(shard_id))
                return
            except OSError as e:
                if not is_fenced(e):
                    raise
                claimer = self._claimer(shard_id) if not retry_fenced else None
                self._discard(shard_id)
                self._count(shard_id, fenced_retries=1)
                if not retry_fenced:
                    who = f" by {claimer}" if claimer else ""
                    raise FencedError(f"shard {shard_id}: the writer was fenced{who} during {what}; nothing of it was written") from e
                log.info("writer of shard %s was fenced during %s; reopening and retrying once", shard_id, what)
            try:
                op(self._writer(shard_id))
            except OSError as e:
                if not is_fenced(e):
                    raise
                claimer = self._claimer(shard_id)
                self._discard(shard_id)
                raise _keeps_claiming(shard_id, what, claimer) from e

    # -- back-pressure ----------------------------------------------------------------------------

    def _compacted_generation(self, shard_id: str, max_age: float) -> int:
        """The shard's compacted generation, as read from the base table at most ``max_age``
        seconds ago (one base manifest read refreshes every shard's)."""
        now = time.monotonic()
        cached = self._compacted.get(shard_id)
        if cached is not None and now - cached[1] <= max_age:
            return cached[0]
        ds = self.state.dataset()
        index = self.state.manifests.mem_wal_index(ds.version)
        compacted = dict(index.compacted) if index is not None else {}
        for sid in {shard_id, *self._compacted}:
            self._compacted[sid] = (compacted.get(sid, 0), now)
        return self._compacted[shard_id][0]

    def backlog(self, shard_id: str, max_age: float = float("inf")) -> int:
        """Uncompacted SSTables of the shard (flushed or being flushed) as this pool sees it:
        an upper bound, exact when the compacted generation was read within ``max_age``."""
        with self._lock(shard_id):
            generation = int(self._writer(shard_id).memtable_stats()["generation"])
        return max(0, generation - 1 - self._compacted_generation(shard_id, max_age))

    def _admit(self, shard_id: str) -> None:
        """Apply the bounds before a write into ``shard_id``: nothing below the slowdown bound,
        a delay up to the stop bound, a wait for compaction from it (WriteStalledError after
        ``stall_timeout_seconds``). Holds no lock while it waits."""
        b = self.write_bounds
        if self.backlog(shard_id) < b.slowdown_sstables:
            return
        pending = self.backlog(shard_id, b.recheck_seconds)
        if pending < b.slowdown_sstables:
            return
        if pending < b.stop_sstables:
            delay = b.slowdown_delay(pending)
            time.sleep(delay)
            self._count(shard_id, slowdowns=1, stall_seconds=delay)
            return
        t0 = time.monotonic()
        log.warning("shard %s has %d uncompacted SSTables (stop bound %d): writes wait for compaction",
                    shard_id, pending, b.stop_sstables)
        with self._guard:
            self.stalled_shards.add(shard_id)
        try:
            while pending >= b.stop_sstables:
                waited = time.monotonic() - t0
                if waited >= b.stall_timeout_seconds:
                    raise WriteStalledError(
                        f"shard {shard_id}: {pending} uncompacted SSTables (stop bound {b.stop_sstables}); writes "
                        f"waited {waited:.1f}s for compaction. Is maintenance (memwal maintain) running and keeping up?"
                    )
                time.sleep(min(b.recheck_seconds, b.stall_timeout_seconds - waited))
                pending = self.backlog(shard_id, 0.0)
        finally:
            with self._guard:
                self.stalled_shards.discard(shard_id)
            self._count(shard_id, stalls=1, stall_seconds=time.monotonic() - t0)

    def claim(self, shard_id: str, values: ShardValues) -> None:
        """Open (claim) the shard's writer now unless it is open: what is read from the table
        after this was written by this writer or before its claim (any later claim fences it,
        and its next write raises or retries). A caller that decides what to write from the
        stored rows claims first, then reads, then writes with ``retry_fenced=False``."""
        self.ensure_shard(shard_id, values)
        with self._lock(shard_id):
            self._writer(shard_id)

    def write(self, batch: RoutedBatch, *, retry_fenced: bool = True) -> None:
        """Apply a routed batch: upserts, or deletes by key. Durable (in the WAL) on return.

        ``retry_fenced=False``: a writer fenced by another claim is discarded (reopened on next
        use) and :class:`FencedError` raised, nothing of the failed part written, instead of
        writing it again through a new claim. For writes decided from what was stored (drop
        stale, partial merges): the other writer may have stored something newer since, so the
        caller must decide again (see :meth:`claim`)."""
        self.ensure_shard(batch.shard_id, batch.values)
        (self.delete if batch.deletes else self.put)(batch.shard_id, batch.rows, retry_fenced=retry_fenced)

    def put(self, shard_id: str, rows: pa.Table, *, retry_fenced: bool = True) -> None:
        """Upsert ``rows`` (already conformed to the table schema) into ``shard_id``.

        With :attr:`seal_interval_seconds`, a put into a shard whose seal is due seals its
        MemTable with the writer open. Lance 14.0.2's Python writer has no seal call; it seals
        a MemTable once it holds ``max_memtable_batches`` record batches, counting each record
        batch of a put, and never splits a put across MemTables. So the put is handed over as
        exactly the batches still missing (:func:`in_batches`: slices of its rows, or, for a put
        of fewer rows, its rows with the last one repeated): Lance seals after it, and the
        MemTable, this put included, is flushed to an SSTable in the background. A shard with no
        writes cannot seal this way (:meth:`seal_overdue` says when a caller should flush it by
        closing instead)."""
        claimed_under = self._writer_schema.get(shard_id)
        if shard_id in self._writers and claimed_under is not None and not takes(claimed_under, rows.schema):
            self.flush([shard_id])  # claimed before a column was added or widened: reopened under the new schema
        for part in split_rows(rows, self.config.max_memtable_rows):
            self._on_storage(shard_id, lambda p=part: self._apply(shard_id, self._batches_op(shard_id, p, "put"), "put", retry_fenced),
                             retry_fenced)
            self._count(shard_id, puts=1, rows_put=part.num_rows)
        self._renew(shard_id)

    def delete(self, shard_id: str, keys: pa.Table, *, retry_fenced: bool = True) -> None:
        """Delete ``keys`` (primary-key columns only) from ``shard_id`` (sealing as :meth:`put` does)."""
        for part in split_rows(keys, self.config.max_memtable_rows):
            self._on_storage(shard_id, lambda p=part: self._apply(shard_id, self._batches_op(shard_id, p, "delete"), "delete",
                                                                  retry_fenced), retry_fenced)
            self._count(shard_id, deletes=1, rows_deleted=part.num_rows)
        self._renew(shard_id)

    def _seal_due(self, shard_id: str, now: float | None = None) -> bool:
        interval = self.seal_interval_seconds
        if interval is None or self.fsync:
            # (fsync: an SSTable Lance flushes in the background is not synced by memwal; such
            # a pool flushes by closing, which syncs what it wrote.)
            return False
        now = time.monotonic() if now is None else now
        return now - self._last_seal.get(shard_id, now) >= interval

    def seal_overdue(self, shard_id: str, factor: float = 3.0) -> bool:
        """Whether the shard's MemTable holds writes and its timed seal is ``factor`` intervals
        late (no write came to seal it): then the caller flushes it by closing the writer. A
        MemTable sealed since its last write holds nothing to flush."""
        interval = self.seal_interval_seconds
        if interval is None or shard_id not in self._writers:
            return False
        now = time.monotonic()
        last_seal = self._last_seal.get(shard_id, now)
        if self._last_write.get(shard_id, last_seal) <= last_seal:
            return False
        return now - last_seal >= factor * interval

    def _batches_op(self, shard_id: str, data: pa.Table, kind: str) -> Callable[[lance.mem_wal.ShardWriter], None]:
        """The put or delete of ``data`` as a writer operation, its record batches arranged so
        that it seals the MemTable when a timed seal is due, and never by surprise otherwise
        (Lance refuses a put of more batches than a MemTable holds and seals before one that
        does not fit)."""
        limit = self.config.max_memtable_batches

        def op(w: lance.mem_wal.ShardWriter) -> None:
            nonlocal data
            self._last_write[shard_id] = time.monotonic()
            if kind == "put":  # rows conformed before a schema change reach a writer claimed after it
                data = as_evolved(data, self._writer_schema.get(shard_id, data.schema))
            chunks = data.column(0).num_chunks if data.num_columns else 1
            held = int(w.memtable_stats()["batch_count"])
            missing = limit - held
            seal = self._seal_due(shard_id) and missing >= 1 and data.num_rows >= 1
            if seal:
                data = in_batches(data, missing)
            elif chunks > 1 and held + chunks >= limit:
                data = data.combine_chunks()
            getattr(w, kind)(data)
            if held + (data.column(0).num_chunks if data.num_columns else 1) >= limit:  # Lance sealed the MemTable
                self._last_seal[shard_id] = time.monotonic()
            if seal:
                self._count(shard_id, seals=1)

        return op

    def _apply(self, shard_id: str, op: Callable[[lance.mem_wal.ShardWriter], None], what: str, retry_fenced: bool) -> None:
        """One slice of a put or delete: back-pressure, the write, its fsync."""
        self._admit(shard_id)
        self._run(shard_id, op, what, retry_fenced)
        self._fill_skipped(shard_id)
        if self.fsync:
            self._sync_wal(shard_id)

    def _on_storage(self, shard_id: str, fn: Callable[[], None], repeat: bool) -> None:
        """Run ``fn``, one write into the shard. When storage fails it, discard the shard's writer
        (see the module docstring), and repeat a transient failure up to ``operation_retries``
        times when ``repeat`` (not for a write decided from what was stored: a new claim may let
        another writer's newer write in between, so its caller decides again). Raises memwal's
        error for the failure (:func:`memwal.core.lance_errors.classify`), or the original one."""
        policy = self.state.storage.retry
        attempt = 0
        while True:
            try:
                fn()
                return
            except MemwalError as e:
                if not isinstance(e, StorageError):
                    raise
                known: MemwalError | None = e
                cause: Exception = e
            except OSError as e:
                known, cause = classify(e), e
            with self._lock(shard_id):
                self._discard(shard_id)
            if known is None:
                raise cause
            if not (repeat and isinstance(known, StorageUnavailableError)) or attempt >= policy.operation_retries:
                if known is cause:
                    raise known
                raise known from cause
            attempt += 1
            self._count(shard_id, storage_retries=1)
            log.warning("shard %s: a write failed on storage (%s); repeating it (%d of %d)", shard_id, known, attempt,
                        policy.operation_retries)
            time.sleep(policy.backoff(attempt))

    def flush(self, shard_ids: list[str] | None = None, *, reopen_fenced: bool = True) -> None:
        """Close writers, which flushes their MemTables to SSTables; they reopen on next use.

        A writer fenced before it could flush (by a GC drain or another writer's claim) has
        its acknowledged writes in the WAL: reopening replays them, closing flushes them.
        ``reopen_fenced=False`` (a flush for freshness alone, by a writer process's sweeper or
        its idle exit) leaves them to whoever holds the shard now, or to maintenance, which
        flushes a shard whose writer's lease ended (:meth:`flush_stranded`): claiming a shard
        back only to flush it fences its new owner.
        """
        for shard_id in list(self._writers) if shard_ids is None else shard_ids:
            with self._lock(shard_id):
                w = self._writers.pop(shard_id, None)
                if w is None:
                    continue
                self._count(shard_id, flushes=1)
                try:
                    try:
                        w.close()
                        if self.fsync:
                            self._sync_flushed(shard_id)
                        continue
                    except OSError as e:
                        if not is_fenced(e):
                            self._reflush(shard_id, e)
                            continue
                    self._count(shard_id, fenced_retries=1)
                    if not reopen_fenced:
                        log.info("writer of shard %s was fenced before its flush; its writes are its new owner's", shard_id)
                        continue
                    log.info("writer of shard %s was fenced before its flush; reopening to flush", shard_id)
                    try:
                        self._open(shard_id).close()
                        if self.fsync:
                            self._sync_flushed(shard_id)
                    except OSError as e:
                        if not is_fenced(e):
                            self._reflush(shard_id, e)  # the storage failed the new writer's flush
                            continue
                        raise _keeps_claiming(shard_id, "flush", self._claimer(shard_id)) from e
                finally:
                    self._release(shard_id)

    def _reflush(self, shard_id: str, failure: OSError) -> None:
        """A flush failed on storage: its MemTable's rows are in the WAL, so a writer opened
        anew replays them, and closing it flushes them. Repeated while the failure is transient,
        at most ``operation_retries`` times; otherwise memwal's error for it is raised."""
        policy = self.state.storage.retry
        for attempt in range(1, policy.operation_retries + 2):
            known = failure if isinstance(failure, MemwalError) else classify(failure)
            if not isinstance(known, StorageUnavailableError) or attempt > policy.operation_retries:
                if known is None:
                    raise failure
                if known is failure:
                    raise known
                raise known from failure
            self._count(shard_id, storage_retries=1)
            log.warning("shard %s: a flush failed on storage (%s); flushing again (%d of %d)", shard_id, known, attempt,
                        policy.operation_retries)
            time.sleep(policy.backoff(attempt))
            try:
                self._open(shard_id).close()
                if self.fsync:
                    self._sync_flushed(shard_id)
                return
            except OSError as e:
                if is_fenced(e):
                    raise _keeps_claiming(shard_id, "flush", self._claimer(shard_id)) from e
                failure = e

    def claim_and_flush(self, shard_id: str) -> None:
        """Open a writer on the shard (replaying its unflushed WAL) and close it (flushing)."""
        with self._lock(shard_id):
            try:
                writer = self._open(shard_id)
                failpoint("writer.claimed_for_flush")
                writer.close()
                if self.fsync:
                    self._sync_flushed(shard_id)
            finally:
                self._release(shard_id)

    @property
    def open_shards(self) -> list[str]:
        return list(self._writers)

    def flush_stranded(
        self,
        idle_seconds: float = 0.0,
        *,
        skip_live_writers: bool = False,
        on_damage: Callable[[str, TableDamagedError], None] | None = None,
        manifests: Mapping[str, ShardManifest] | None = None,
    ) -> list[str]:
        """Flush shards holding acknowledged but unflushed writes that no writer here owns,
        and whose newest such write is at least ``idle_seconds`` old; returns their ids.

        Such writes (from a writer that crashed, or went idle) are durable in the WAL and
        visible to strong readers, but eventual readers see them only once flushed.
        Claiming the shard replays them and closing flushes them; a live but idle writer
        elsewhere is fenced and reopens on its next write. A writer that claims the shard
        between this claim and its flush replayed the same entries: the shard is left to it
        (not returned), since it will flush them.

        With ``skip_live_writers`` (what maintenance does) a shard whose writer holds a live
        lease is skipped: its writer is alive, merely idle, and will flush itself (see the
        module docstring); unless the lease names a process of this host that is gone. Without it every such shard is flushed now, as a stopped ingest
        query wants for the writers its tasks left behind.

        A shard whose WAL has a gap is never flushed (that would drop the entries after the
        gap): the other shards are flushed, then the first such :class:`WalGapError` is raised.
        A shard with another damaged file (its manifest, a WAL entry) is skipped the same way.
        With ``on_damage`` each damaged shard is handed to it instead, and nothing is raised.

        ``manifests``: the shards to look at and their latest manifests, as the caller (a
        maintenance cycle) read them; default: every shard, read now.
        """
        state = self.state
        tails = WalTailReader(state.uri, state.io, state.manifests, state.primary_key)
        now = time.time()
        flushed = []
        damaged: list[TableDamagedError] = []
        for shard_id in state.manifests.list_shards() if manifests is None else list(manifests):
            if shard_id in self.open_shards:
                continue
            try:
                m = state.manifests.read_shard(shard_id) if manifests is None else manifests[shard_id]
                newest = tails.newest_entry_mtime(m) if m is not None else None
                if newest is None or now - newest < idle_seconds:
                    continue
                held = self.lease(shard_id) if skip_live_writers else None
                if held is not None and held.owner != self.owner and held.live(now):
                    if not held.holder_gone():
                        log.info("shard %s has unflushed writes of a live writer (%s); leaving them to it", shard_id, held.owner)
                        continue
                    log.warning("shard %s: its writer %s is gone (no such process on this host); flushing its writes "
                                "without waiting for its lease", shard_id, held.owner)
                log.info("flushing stranded WAL entries of shard %s", shard_id)
                try:
                    self.claim_and_flush(shard_id)
                except OSError as e:
                    if not (is_fenced(e) or is_claim_race(e)):
                        raise
                    # A writer claimed the shard after this one: its claim replayed the same WAL
                    # entries, so they are its to flush now (a stopped query's last task may still
                    # be writing). Not flushed here, and nothing lost.
                    log.info("shard %s was claimed by another writer during its flush; its writes are that writer's", shard_id)
                    continue
            except TableDamagedError as e:
                log.error("%s", e)
                if on_damage is not None:
                    on_damage(shard_id, e)
                else:
                    damaged.append(e)
                continue
            flushed.append(shard_id)
        if damaged:
            raise damaged[0]
        return flushed

    def close(self) -> None:
        self.flush()
