"""``memwal repair``: move aside what cannot be read, and bring the table back to a readable,
writable state built from what survives, saying exactly which rows may be lost.

Run it with the table's writers stopped (maintenance may keep running: repair claims each
shard it changes, which fences a writer that is still alive). Per shard, from what
:mod:`memwal.maintain.check` finds:

* **damaged manifest versions** are quarantined. If the latest was one, the shard falls
  back to the newest version that decodes. Nothing acknowledged is lost by that: a
  manifest only ever advances the flushed WAL position over entries that GC keeps until
  their SSTable is compacted, so what the lost version covered replays from the WAL
  (an SSTable it listed becomes an orphan, which GC collects).
* **a missing or unreadable SSTable** is dropped from the manifest (an unreadable one is
  quarantined). Its rows are lost unless it was compacted already (then the base table
  holds them); the report gives its row count and, where they read, its keys.
* **a WAL gap or an unreadable WAL entry**: the entries before it form the longest prefix
  that replays consistently; the bad entry and every later one are quarantined, and
  their rows reported (count and keys, where the entry reads). Later entries are not
  replayed over the hole: that would make a state no writer ever acknowledged (say, a
  delete lost and a later update kept). They stay in quarantine, in order, for a person
  to re-apply.

A shard that changed gets one new manifest version (put-if-not-exists) with its writer
epoch claimed (+1), as GC's drain does: a writer computing its next manifest from memory
would list a dropped SSTable again, so it must be fenced. ``wal_entry_position_last_seen``
is lowered to the surviving tail, so the next writer's first entry lands right after it
(not after a quarantined hole). The next writer claims the shard as usual and replays the
surviving entries.

Quarantined files keep their path relative to the table under
``_memwal/quarantine/{stamp}/`` (:func:`memwal.core.paths.quarantined`), outside ``_mem_wal/``,
so nothing that lists shards, WAL entries or SSTables sees them.

Where the MemWAL index (in the base table's manifest) disagrees with a shard:

* it records a compacted generation the shard's manifest has not reached (e.g. after a
  fallback): the repaired manifest's ``current_generation`` is raised above it, otherwise
  the shard's next SSTables would be numbered at or below it and readers would skip them;
* it records compaction of a shard whose directory is gone: the shard gets a new first
  manifest numbered from the compacted generation + 1 (its shard values recovered when
  the spec has a fixed set of shards); what it held above that generation is reported lost.

An index that does not decode is reported, not repaired (restore the base manifest).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import pyarrow as pa

from memwal.core import paths
from memwal.maintain.check import (
    INDEX_GENERATION_AHEAD,
    INDEX_SHARD_MISSING,
    MANIFEST,
    SSTABLE_MISSING,
    SSTABLE_UNREADABLE,
    WAL_GAP,
    WAL_UNREADABLE,
    CheckReport,
    Damage,
    check_table,
)
from memwal.core.errors import CommitConflictError
from memwal.core.jsonvalues import jsonable
from memwal.core.manifest import ShardManifest
from memwal.core.progress import ProgressCallback, notify
from memwal.core.sharding import field_entries
from memwal.core.state import TableState
from memwal.core.wal import UNREADABLE_ENTRY, WalEntry, wal_positions

log = logging.getLogger(__name__)

#: Keys listed per possibly lost file, at most (the row count is always exact when known).
MAX_KEYS_LISTED = 1000


@dataclass(frozen=True)
class RepairAction:
    """One thing repair did (or, in a dry run, would do)."""

    #: "quarantine" (move a file or directory aside) or "manifest" (commit a shard manifest version)
    kind: str
    path: str
    detail: str
    #: where a quarantined file went
    to: str | None = None


@dataclass(frozen=True)
class PossiblyLost:
    """Acknowledged rows that may be gone: those of one file repair dropped or quarantined."""

    shard_id: str
    path: str
    why: str
    position: int | None = None
    generation: int | None = None
    #: rows in the file (None: unknown, the file cannot be read or is missing)
    rows: int | None = None
    #: primary keys of those rows, where the file reads (deleted keys included); at most MAX_KEYS_LISTED
    keys: tuple[dict[str, Any], ...] | None = None


@dataclass(frozen=True)
class RepairReport:
    uri: str
    dry_run: bool
    quarantine: str
    before: CheckReport
    actions: tuple[RepairAction, ...]
    possibly_lost: tuple[PossiblyLost, ...]
    #: damage repair cannot fix (restore from a backup)
    unrepaired: tuple[Damage, ...]
    #: the check after repairing (None in a dry run)
    after: CheckReport | None

    @property
    def ok(self) -> bool:
        """True if the table is (or, in a dry run, would be) clean."""
        return not self.unrepaired and (self.after is None or self.after.clean)

    def to_json(self) -> str:
        doc = asdict(self)
        doc["before"] = self.before.to_dict()
        doc["after"] = self.after.to_dict() if self.after is not None else None
        doc["ok"] = self.ok
        return json.dumps(jsonable(doc), sort_keys=True, default=str)


class _Repair:
    def __init__(self, state: TableState, dry_run: bool, stamp: str) -> None:
        self.state = state
        self.dry_run = dry_run
        self.stamp = stamp
        self.actions: list[RepairAction] = []
        self.lost: list[PossiblyLost] = []
        self.unrepaired: list[Damage] = []

    # -- moving files aside ----------------------------------------------------------------------

    def quarantine(self, path: str, detail: str) -> None:
        to = paths.quarantined(self.state.uri, self.stamp, path)
        self.actions.append(RepairAction("quarantine", path, detail, to))
        if self.dry_run:
            return
        io = self.state.io
        files = io.list_prefix(path) if not io.is_file(path) else []
        if files:  # a directory (an SSTable): copy every file, then remove the tree
            for f in files:
                io.write(paths.join(to, f.path), io.read(paths.join(path, f.path)))
            io.remove_tree(path)
        elif io.exists(path):
            io.write(to, io.read(path))  # copied before removed: a crash leaves both, never neither
            io.remove(path)

    # -- what may be lost ------------------------------------------------------------------------

    def _keys(self, rows) -> tuple[dict[str, Any], ...]:
        cols = [c for c in self.state.primary_key if c in rows.column_names]
        return tuple(rows.select(cols).slice(0, MAX_KEYS_LISTED).to_pylist()) if cols else ()

    def wal_lost(self, shard_id: str, position: int, why: str) -> None:
        path = paths.wal_entry_path(self.state.uri, shard_id, position)
        try:
            data = self.state.io.read(path)
            entry = WalEntry.parse(position, data)
        except FileNotFoundError:
            self.lost.append(PossiblyLost(shard_id, path, why + "; the file is missing", position=position))
            return
        except UNREADABLE_ENTRY:
            self.lost.append(PossiblyLost(shard_id, path, why + "; the file does not parse", position=position))
            return
        if entry.rows is None or entry.rows.num_rows == 0:
            return  # a fence sentinel: no rows
        self.lost.append(PossiblyLost(shard_id, path, why, position=position, rows=entry.rows.num_rows,
                                      keys=self._keys(entry.rows)))

    def _keys_from_wal(self, shard_id: str, generation: int, flushed: int) -> tuple[dict[str, Any], ...] | None:
        """Keys written to an SSTable's generation, from its WAL entries if GC has not
        collected them yet (it collects them only with the SSTable); None if none remain."""
        keys: list[dict[str, Any]] = []
        found = False
        for pos in wal_positions(self.state.io, self.state.uri, shard_id, 0):
            if pos > flushed or len(keys) >= MAX_KEYS_LISTED:
                break
            try:
                data = self.state.io.read(paths.wal_entry_path(self.state.uri, shard_id, pos))
                with pa.ipc.open_stream(data) as reader:
                    meta = reader.schema.metadata or {}
                    if meta.get(b"generation") != str(generation).encode() or meta.get(b"fence_sentinel") == b"true":
                        continue
                    rows = reader.read_all()
            except (FileNotFoundError, *UNREADABLE_ENTRY):
                continue
            found = True
            keys += self._keys(rows)
        return tuple(keys[:MAX_KEYS_LISTED]) if found else None

    def sstable_lost(self, shard_id: str, damage: Damage, compacted: int, physical_rows: int, flushed: int) -> None:
        gen = damage.generation or 0
        if gen <= compacted:
            return  # its rows are in the base table
        keys = None
        try:
            keys = self._keys(self.state.lance_dataset(damage.path).to_table(columns=list(self.state.primary_key)))
        except Exception:  # noqa: BLE001 - an unreadable SSTable's keys are unknown; the count still says how many
            keys = self._keys_from_wal(shard_id, gen, flushed)
        self.lost.append(PossiblyLost(shard_id, damage.path, f"SSTable generation {gen} dropped ({damage.problem})",
                                      generation=gen, rows=physical_rows, keys=keys))

    # -- one shard -------------------------------------------------------------------------------

    def shard(self, shard_id: str, damage: list[Damage], compacted: int) -> None:
        store = self.state.manifests
        for d in damage:
            if d.kind == MANIFEST:
                self.quarantine(d.path, f"manifest version {d.version}: {d.problem}")
        intact = [v for v in store.retained_versions(shard_id) if all(d.version != v for d in damage if d.kind == MANIFEST)]
        if not intact:
            self.unrepaired += [d for d in damage if d.kind == MANIFEST]
            return
        store.clear_cache()
        m = store.read_shard(shard_id, intact[-1])
        if m is None:  # vanished meanwhile
            self.unrepaired += damage
            return
        bad_ssts = {d.generation: d for d in damage if d.kind in (SSTABLE_MISSING, SSTABLE_UNREADABLE)}
        for gen, d in sorted(bad_ssts.items()):
            sst = next(s for s in m.sstables if s.generation == gen)
            self.sstable_lost(shard_id, d, compacted, sst.physical_rows, m.replay_after_wal_entry_position)
            if d.kind == SSTABLE_UNREADABLE:
                self.quarantine(d.path, f"SSTable generation {gen}: {d.problem}")
        bad_wal = [d.position for d in damage if d.kind in (WAL_GAP, WAL_UNREADABLE) and d.position is not None]
        tail = None
        if bad_wal:
            first = min(bad_wal)
            tail = first - 1
            positions = wal_positions(self.state.io, self.state.uri, shard_id, tail)
            if first not in positions:
                self.wal_lost(shard_id, first, "missing WAL entry (a gap before later entries)")
            for pos in positions:
                why = ("the first WAL entry that cannot be replayed" if pos == first
                       else f"follows WAL entry {first}, which cannot be replayed")
                self.wal_lost(shard_id, pos, why)
                self.quarantine(paths.wal_entry_path(self.state.uri, shard_id, pos), f"WAL entry {pos}: {why}")
        fell_back = any(d.kind == MANIFEST and (d.version or 0) > m.version for d in damage)
        behind = m.current_generation <= compacted
        if bad_ssts or tail is not None or fell_back or behind:
            self.commit(m, set(bad_ssts), tail, compacted)

    def recreate(self, shard_id: str, damage: Damage, compacted: int) -> None:
        """A first manifest for a shard whose directory is gone but whose compaction the
        MemWAL index records: numbered above the compacted generation, so what the shard's
        next writer flushes is read, not skipped as compacted. Its shard values are found
        again when the spec has a fixed set of shards (unsharded, bucket)."""
        state = self.state
        values = None
        count = state.spec.fixed_shard_count
        for i in range(count or 0):
            if state.resolver.shard_id((i,)) == shard_id:
                values = (i,)
        m = ShardManifest(
            shard_id=shard_id,
            version=1,
            current_generation=compacted + 1,
            shard_spec_id=state.lance_spec_id(),
            field_entries=field_entries(state.spec, values) if values is not None else {},
        )
        self.lost.append(PossiblyLost(
            shard_id, paths.shard_dir(state.uri, shard_id),
            f"the shard's directory is gone; what it held above compacted generation {compacted} "
            "(flushed or not) is lost, the base table holds the rest", generation=compacted + 1,
        ))
        self.actions.append(RepairAction(
            "manifest", paths.shard_manifest_path(state.uri, shard_id, 1),
            f"shard {shard_id}: a new first manifest, generations from {compacted + 1}"
            + ("" if values is not None else " (its shard values cannot be recovered; routing does not need them)"),
        ))
        if not self.dry_run and not state.manifests.write_shard_if_absent(m):
            raise CommitConflictError(f"shard {shard_id}: a manifest appeared while repairing; run `memwal repair` again")

    def _max_epoch(self, m: ShardManifest) -> int:
        """The highest writer epoch in the manifest or in a surviving WAL entry after its flushed
        position: a lost (quarantined) manifest version may have recorded a claim that only
        its writer's entries still show, and the repair must claim above it."""
        epoch = m.writer_epoch
        for pos in wal_positions(self.state.io, self.state.uri, m.shard_id, m.replay_after_wal_entry_position):
            try:
                epoch = max(epoch, WalEntry.parse(pos, self.state.io.read(
                    paths.wal_entry_path(self.state.uri, m.shard_id, pos))).writer_epoch)
            except (FileNotFoundError, *UNREADABLE_ENTRY):
                continue
        return epoch

    def commit(self, m: ShardManifest, dropped: set[int], tail: int | None, compacted: int) -> None:
        """The shard's next manifest version after its newest intact one (every version above it
        was quarantined, so the number is free): dropped SSTables left out, the writer epoch
        claimed, the WAL position last seen lowered to the surviving tail."""
        store = self.state.manifests
        last_seen = m.wal_entry_position_last_seen if tail is None else min(m.wal_entry_position_last_seen, tail)
        fixed = replace(
            m,
            version=m.version + 1,
            writer_epoch=self._max_epoch(m) + 1,
            sstables=tuple(s for s in m.sstables if s.generation not in dropped),
            wal_entry_position_last_seen=max(last_seen, m.replay_after_wal_entry_position),
            # above the compacted generation: a flush numbered at or below it would never be read
            current_generation=max(m.current_generation, compacted + 1),
        )
        self.actions.append(RepairAction(
            "manifest", paths.shard_manifest_path(self.state.uri, m.shard_id, fixed.version),
            f"shard {m.shard_id}: version {fixed.version} from intact version {m.version}, writer epoch "
            f"{fixed.writer_epoch}" + (f", without SSTable generation(s) {sorted(dropped)}" if dropped else "")
            + (f", WAL ending at position {tail}" if tail is not None else "")
            + (f", next generation {fixed.current_generation}" if fixed.current_generation != m.current_generation else ""),
        ))
        if self.dry_run:
            return
        if not store.write_shard_if_absent(fixed):
            raise CommitConflictError(
                f"shard {m.shard_id}: manifest version {fixed.version} appeared while repairing; a writer is "
                "running: stop the table's writers and run `memwal repair` again"
            )
        store.clear_cache()


def repair_table(state: TableState, *, dry_run: bool = False, stamp: str | None = None,
                 progress: ProgressCallback | None = None) -> RepairReport:
    """Check the table, quarantine what cannot be read, restore each damaged shard from what
    survives, and check again; with ``dry_run`` only report what would be done. ``progress``
    hears of each shard checked and repaired."""
    stamp = stamp or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    before = check_table(state, progress)
    work = _Repair(state, dry_run, stamp)
    index = None
    try:
        index = state.manifests.mem_wal_index(before.base_version)
    except Exception:  # noqa: BLE001 - reported by the check as MemWAL index damage
        pass
    compacted = (lambda sid: index.compacted_generation(sid)) if index is not None else (lambda sid: 0)  # noqa: E731
    by_shard = {s.shard_id: list(s.damage) for s in before.shards}
    for d in before.table_damage:
        if d.kind == INDEX_SHARD_MISSING and d.shard_id is not None:
            work.recreate(d.shard_id, d, compacted(d.shard_id))
        elif d.kind == INDEX_GENERATION_AHEAD and d.shard_id in by_shard:
            by_shard[d.shard_id].append(d)
        else:
            work.unrepaired.append(d)
    damaged = [(shard_id, damage) for shard_id, damage in by_shard.items() if damage]
    for i, (shard_id, damage) in enumerate(damaged, 1):
        work.shard(shard_id, damage, compacted(shard_id))
        notify(progress, "repairing shards", i, len(damaged), "shards")
    after = None
    if not dry_run:
        after = check_table(state, progress)
    report = RepairReport(
        uri=state.uri,
        dry_run=dry_run,
        quarantine=paths.quarantine_dir(state.uri, stamp),
        before=before,
        actions=tuple(work.actions),
        possibly_lost=tuple(work.lost),
        unrepaired=tuple(work.unrepaired),
        after=after,
    )
    for lost in report.possibly_lost:
        log.info("possibly lost: %s (%s rows): %s", lost.path, "?" if lost.rows is None else lost.rows, lost.why)
    return report
