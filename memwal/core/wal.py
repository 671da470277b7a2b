"""Reading shard WAL entries: the unflushed tail, for strong reads and for recovery.

Lance's readers see unflushed data only inside the writer's own process. Every
acknowledged durable write is also a WAL entry, though, so a reader elsewhere can replay
the entries after the shard's last flushed position exactly as a recovering writer does:
in position order, skipping fence sentinels, accepting entries whose writer epoch is at
most the shard's current epoch, tombstones included. WAL entries are immutable, so parsed
ones are cached until a flush covers them.

The same reading tells maintenance which shards hold acknowledged writes that no writer
is going to flush (their writer crashed or went idle), see ``Table.flush_stranded``.

A missing entry with later entries after it is corruption: positions are taken in order
with put-if-not-exists, and GC removes only entries at or below the flushed position. (On S3
Lance can skip a position when a conditional PUT is answered 409; the writer fills it before it
acknowledges the write, :func:`fill_skipped`.) Everything that replays (these readers, and Lance's writer
when it claims a shard) stops at the first missing position, so the acknowledged writes
beyond a gap would be dropped without a word by the next flush. :func:`check_contiguous`
finds such a gap with one listing of the shard's ``wal/`` directory and raises
:class:`~memwal.core.errors.WalGapError` naming the missing file.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pyarrow as pa

from memwal.core import paths
from memwal.core.cache import ByteLRU
from memwal.core.errors import TableDamagedError, WalGapError
from memwal.core.io import FileIO
from memwal.core.lsm import newest_per_key
from memwal.core.manifest import ManifestStore, ShardManifest
from memwal.core.schema import as_evolved

#: Default bound of a WAL reader's cache of parsed entries (by their file sizes).
WAL_CACHE_BYTES = 128 << 20

#: Before a gap is called corruption, the listing is repeated after these pauses: an entry
#: still being written when a later one landed (parallel WAL flushes) fills its hole quickly.
GAP_RECHECK_SECONDS = (0.05, 0.2, 0.5)


def wal_positions(io: FileIO, table_uri: str, shard_id: str, after: int = 0) -> list[int]:
    """The positions of the shard's WAL entries on disk above ``after``, ascending (one listing).

    Only complete entries count (``{bitrev64}.arrow``): a writer killed while writing an entry
    leaves a staging file behind (``{bitrev64}.arrow.tmp.{uuid}#1``), which is no entry, and
    taking its position twice would look like a gap."""
    out = []
    for name in io.list_dir(paths.wal_dir(table_uri, shard_id)):
        if not name.endswith(paths.WAL_SUFFIX) or name.count(".") != 1:
            continue
        try:
            pos = paths.parse_bitrev64(name)
        except ValueError:
            continue
        if pos > after:
            out.append(pos)
    return sorted(out)


def first_missing(after: int, positions: list[int]) -> int | None:
    """The first position above ``after`` that is missing while a later one exists, or None."""
    for i, pos in enumerate(positions):
        if pos != after + 1 + i:
            return after + 1 + i
    return None


def check_contiguous(io: FileIO, table_uri: str, shard_id: str, after: int) -> list[int]:
    """The shard's WAL positions above ``after`` (its last flushed position), which must be
    ``after + 1, after + 2, ...`` with no hole; raises :class:`WalGapError` if one is missing
    while later entries exist. A hole at the end is no gap: that is the next write's place."""
    positions = wal_positions(io, table_uri, shard_id, after)
    for pause in GAP_RECHECK_SECONDS:
        if first_missing(after, positions) is None:
            return positions
        time.sleep(pause)
        positions = wal_positions(io, table_uri, shard_id, after)
    missing = first_missing(after, positions)
    if missing is None:
        return positions
    later = [p for p in positions if p > missing]
    shown = ", ".join(map(str, later[:5])) + (", ..." if len(later) > 5 else "")
    raise WalGapError(
        f"shard {shard_id}: WAL entry {missing} is missing ({paths.wal_entry_path(table_uri, shard_id, missing)}) "
        f"while {len(later)} later entr{'y' if len(later) == 1 else 'ies'} exist (positions {shown}); the acknowledged "
        "writes after the gap cannot be replayed, so memwal will not read, flush or write this shard. "
        "Restore the missing file from a backup, or run `memwal repair` to quarantine the entries after the gap"
    )


#: What pyarrow raises for a WAL entry that is not an Arrow IPC stream (ArrowInvalid is a
#: ValueError; a bad continuation token or metadata length is an OSError).
UNREADABLE_ENTRY = (pa.ArrowInvalid, ValueError, OSError)


def unreadable_entry_error(shard_id: str, position: int, path: str, size: int, exc: BaseException) -> TableDamagedError:
    """The one error for a WAL entry that cannot be parsed: it names the file and the way out."""
    return TableDamagedError(
        f"shard {shard_id}: WAL entry {position} ({path}, {size} bytes) cannot be read ({exc}); "
        "restore the file from a backup, or run `memwal repair` to quarantine it and what follows it"
    )


def first_unreadable_entry(io: FileIO, table_uri: str, shard_id: str, after: int) -> TableDamagedError | None:
    """The error for the first WAL entry above ``after`` that does not parse, or None if all do.

    Lance's replay fails on such an entry without naming it; this reads the tail to say which."""
    for pos in wal_positions(io, table_uri, shard_id, after):
        path = paths.wal_entry_path(table_uri, shard_id, pos)
        try:
            data = io.read(path)
        except FileNotFoundError:
            continue
        try:
            WalEntry.parse(pos, data)
        except UNREADABLE_ENTRY as exc:
            return unreadable_entry_error(shard_id, pos, path, len(data), exc)
    return None


def fill_skipped(io: FileIO, table_uri: str, shard_id: str, after: int) -> tuple[int, list[int]]:
    """Fill the positions a writer skipped above ``after`` with empty entries; return the highest
    position on disk and the positions filled.

    S3 answers a conditional PUT with 409 ConditionalRequestConflict while another conditional
    write of the key is in flight; object_store reports that as "already exists", and Lance's
    WAL append, meeting "already exists" at a position it has not tried before, takes the
    position for occupied and appends at the next one. The skipped position stays empty, and
    every replay stops there, before the acknowledged entries after it. Called by the writer
    right after its own write returned (so a hole below its entry is a position it skipped,
    not an entry that went missing), once the hole outlasts :data:`GAP_RECHECK_SECONDS`. The
    filler is what a fence sentinel is (no rows; the writer epoch of the entry after it), put
    if absent: should a write of that position still land first, it stays.
    """
    positions = wal_positions(io, table_uri, shard_id, after)
    for pause in GAP_RECHECK_SECONDS:
        if first_missing(after, positions) is None:
            return (positions[-1] if positions else after), []
        time.sleep(pause)
        positions = wal_positions(io, table_uri, shard_id, after)
    present = set(positions)
    filled = []
    for pos in range(after + 1, positions[-1] + 1 if positions else after + 1):
        if pos in present:
            continue
        following = next(p for p in positions if p > pos)
        epoch = WalEntry.parse(following, io.read(paths.wal_entry_path(table_uri, shard_id, following))).writer_epoch
        if io.write_if_absent(paths.wal_entry_path(table_uri, shard_id, pos), _filler(epoch)):
            filled.append(pos)
    return (positions[-1] if positions else after), filled


def _filler(writer_epoch: int) -> bytes:
    """An empty WAL entry in the form of Lance's fence sentinel (no columns, no batches)."""
    sink = pa.BufferOutputStream()
    schema = pa.schema([], metadata={"fence_sentinel": "true", "writer_epoch": str(writer_epoch)})
    with pa.ipc.new_stream(sink, schema):
        pass
    return sink.getvalue().to_pybytes()


@dataclass(frozen=True)
class WalEntry:
    position: int
    writer_epoch: int
    fence_sentinel: bool
    rows: pa.Table | None  # None for a sentinel

    @classmethod
    def parse(cls, position: int, data: bytes) -> "WalEntry":
        with pa.ipc.open_stream(data) as reader:
            meta = reader.schema.metadata or {}
            sentinel = meta.get(b"fence_sentinel") == b"true"
            rows = None if sentinel else reader.read_all()
        return cls(position, int(meta.get(b"writer_epoch", b"0")), sentinel, rows)


class WalTailReader:
    """Reads the unflushed WAL tail of shards of one table."""

    def __init__(
        self, table_uri: str, io: FileIO, store: ManifestStore, primary_key: tuple[str, ...],
        cache_bytes: int = WAL_CACHE_BYTES, schema: pa.Schema | None = None,
    ) -> None:
        self.uri = table_uri
        #: the columns tails are returned as (``_tombstone`` included): entries written before a
        #: column was added or dropped are read as if written under them (:func:`as_evolved`)
        self.schema = schema
        self.io = io
        self.store = store
        self.primary_key = primary_key
        self._cache: ByteLRU[tuple[str, int], WalEntry] = ByteLRU(cache_bytes)
        #: per shard, the last tail merged: (entry positions and epochs, its newest rows per key)
        self._last_tails: dict[str, tuple[tuple, pa.Table]] = {}

    def clear_cache(self) -> None:
        self._cache.clear()

    def _entry(self, shard_id: str, position: int) -> WalEntry | None:
        key = (shard_id, position)
        e = self._cache.get(key)
        if e is None:
            path = paths.wal_entry_path(self.uri, shard_id, position)
            try:
                data = self.io.read(path)
            except FileNotFoundError:
                return None
            try:
                parsed = WalEntry.parse(position, data)
            except UNREADABLE_ENTRY as exc:
                raise unreadable_entry_error(shard_id, position, path, len(data), exc) from None
            e = self._cache.put(key, parsed, len(data))
        return e

    def entries(self, manifest: ShardManifest) -> list[WalEntry]:
        """Valid entries after the manifest's last flushed position, in position order.

        Raises :class:`WalGapError` if an entry is missing before later ones: returning the
        entries before the gap would hide acknowledged writes (one listing per call).
        """
        shard_id = manifest.shard_id
        start = manifest.replay_after_wal_entry_position
        # covered by a flush: never needed again
        self._cache.discard_where(lambda k: k[0] == shard_id and k[1] <= start)
        listed = check_contiguous(self.io, self.uri, shard_id, start)
        out = []
        pos = start + 1
        # Entries written after the listing are read too, until the first missing position.
        while (e := self._entry(shard_id, pos)) is not None:
            out.append(e)
            pos += 1
        if listed and pos <= listed[-1]:
            check_contiguous(self.io, self.uri, shard_id, start)  # a listed entry vanished: say which
        # An entry can only carry an epoch above the manifest's if a writer claimed the shard
        # after we read the manifest: it is valid if the shard's latest manifest has that epoch.
        max_epoch = manifest.writer_epoch
        if any(e.writer_epoch > max_epoch for e in out):
            latest = self.store.read_shard(shard_id)
            max_epoch = latest.writer_epoch if latest is not None else max_epoch
        return [e for e in out if not e.fence_sentinel and e.writer_epoch <= max_epoch]

    def newest_entry_mtime(self, manifest: ShardManifest) -> float | None:
        """Modification time of the newest unflushed data entry, or None if there is none."""
        entries = [e for e in self.entries(manifest) if e.rows is not None and e.rows.num_rows]
        if not entries:
            return None
        try:
            return self.io.stat(paths.wal_entry_path(self.uri, manifest.shard_id, entries[-1].position))[1]
        except FileNotFoundError:
            return None

    def tail(self, manifest: ShardManifest) -> pa.Table | None:
        """The newest unflushed row of each key written to the shard (with ``_tombstone``), or None."""
        entries = [e for e in self.entries(manifest) if e.rows is not None and e.rows.num_rows]
        if not entries:
            return None
        # The same entries give the same rows: a strong reader asking again (every read
        # takes a fresh view) merges them once, per shard (one slot for all shards was
        # refilled by every shard of every read: 6 ms of a 4-shard search, reads.md).
        key = (tuple(e.position for e in entries), tuple(e.writer_epoch for e in entries))
        last = self._last_tails.get(manifest.shard_id)
        if last is not None and last[0] == key:
            return last[1]
        rows = newest_per_key(pa.concat_tables([e.rows for e in entries], promote_options="permissive"), self.primary_key)
        if self.schema is not None:
            rows = as_evolved(rows, self.schema)
        self._last_tails[manifest.shard_id] = (key, rows)
        return rows
