"""``memwal check``: which of a table's files cannot be read, and what is wrong with each.

A table is readable and writable when, for every shard,

* its latest manifest version decodes (and so do the older versions GC keeps);
* every SSTable that manifest lists opens and its rows read: Lance's readers fail on a
  listed SSTable they cannot open, and the compactor would stop at it;
* its WAL after the last flushed position (``replay_after_wal_entry_position``) is
  ``after + 1, after + 2, ...`` with no hole before a later entry (a hole is where every
  replay stops, see :mod:`memwal.core.wal`), and every such entry parses;

and the MemWAL index in the latest base version decodes and agrees with the shard
manifests: each shard it records compaction for exists, a compacted generation is below
the shard's current generation (the next one to flush), and a shard's spec id is one the
index knows.

Everything is read, nothing is written, so checking is safe while writers run; a file
written while the check runs may show up as damage that is not (re-run to confirm). The
report is data (:class:`CheckReport`); ``memwal.cli.render`` turns it into text.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from google.protobuf.message import DecodeError

from memwal.core import paths
from memwal.core.errors import ManifestError, TableDamagedError
from memwal.core.lance_errors import lance_message
from memwal.core.manifest import MemWalIndex, ShardManifest, SsTable
from memwal.core.progress import ProgressCallback, notify
from memwal.core.state import TableState
from memwal.core.wal import UNREADABLE_ENTRY, WalEntry, first_missing, wal_positions

#: Kinds of damage, as reported (and as :mod:`memwal.maintain.repair` handles them).
MANIFEST = "manifest"
SSTABLE_MISSING = "sstable-missing"
SSTABLE_UNREADABLE = "sstable-unreadable"
WAL_GAP = "wal-gap"
WAL_UNREADABLE = "wal-unreadable"
MEM_WAL_INDEX = "mem-wal-index"
#: the index records compaction of a shard that has no manifest (its directory is gone)
INDEX_SHARD_MISSING = "index-shard-missing"
#: the index records a compacted generation the shard's manifest has not reached: the
#: shard's next SSTables would be numbered at or below it, and readers would skip them
INDEX_GENERATION_AHEAD = "index-generation-ahead"


@dataclass(frozen=True)
class Damage:
    """One damaged file (or a missing one) and what is wrong with it."""

    kind: str
    path: str
    problem: str
    shard_id: str | None = None
    #: manifest version, WAL position or SSTable generation, by kind
    version: int | None = None
    position: int | None = None
    generation: int | None = None


@dataclass(frozen=True)
class ShardCheck:
    """What was checked of one shard, and its damage."""

    shard_id: str
    #: the newest manifest version that decodes (None: none does)
    manifest_version: int | None
    #: the newest manifest version on disk
    latest_version: int | None
    sstables_checked: int
    wal_entries_checked: int
    damage: tuple[Damage, ...] = ()


@dataclass(frozen=True)
class CheckReport:
    uri: str
    base_version: int
    shards: tuple[ShardCheck, ...]
    #: damage outside any one shard (the MemWAL index)
    table_damage: tuple[Damage, ...] = field(default=())

    @property
    def damage(self) -> tuple[Damage, ...]:
        return self.table_damage + tuple(d for s in self.shards for d in s.damage)

    @property
    def clean(self) -> bool:
        return not self.damage

    def to_dict(self) -> dict:
        doc = asdict(self)
        doc["clean"] = self.clean
        return doc

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


def _reason(exc: BaseException) -> str:
    return " ".join(lance_message(exc).split()) or type(exc).__name__


def read_manifest_version(state: TableState, shard_id: str, version: int) -> ShardManifest | Damage:
    """One manifest version decoded, or the damage that stops it (read past the cache)."""
    path = paths.shard_manifest_path(state.uri, shard_id, version)
    try:
        data = state.io.read(path)
    except FileNotFoundError:
        return Damage(MANIFEST, path, "vanished while checking", shard_id, version=version)
    try:
        m = ShardManifest.from_bytes(data)
    except (DecodeError, ValueError) as e:
        return Damage(MANIFEST, path, f"{len(data)} bytes that do not decode as a shard manifest ({e})", shard_id,
                      version=version)
    if m.version != version or m.shard_id != shard_id:
        return Damage(MANIFEST, path, f"holds shard {m.shard_id} version {m.version}, not version {version}", shard_id,
                      version=version)
    return m


def check_sstable(state: TableState, shard_id: str, sst: SsTable) -> Damage | None:
    """None if the SSTable opens and its primary-key column(s) read, else its damage."""
    path = paths.sstable_path(state.uri, shard_id, sst.path)
    if not state.io.list_prefix(path):
        return Damage(SSTABLE_MISSING, path, f"generation {sst.generation} is listed in the manifest but absent",
                      shard_id, generation=sst.generation)
    try:
        ds = state.lance_dataset(path)
        ds.to_table(columns=list(state.primary_key))
    except Exception as e:  # noqa: BLE001 - any failure to read it is the finding (Lance raises untyped errors)
        return Damage(SSTABLE_UNREADABLE, path, f"generation {sst.generation} cannot be read ({_reason(e)})",
                      shard_id, generation=sst.generation)
    return None


def check_wal(state: TableState, manifest: ShardManifest) -> tuple[int, list[Damage]]:
    """(entries checked, damage) of the shard's WAL after its last flushed position."""
    shard_id, after = manifest.shard_id, manifest.replay_after_wal_entry_position
    positions = wal_positions(state.io, state.uri, shard_id, after)
    damage = []
    missing = first_missing(after, positions)
    if missing is not None:
        later = [p for p in positions if p > missing]
        damage.append(Damage(
            WAL_GAP, paths.wal_entry_path(state.uri, shard_id, missing),
            f"WAL entry {missing} is missing while {len(later)} later entr{'y' if len(later) == 1 else 'ies'} "
            f"exist (from position {later[0]}); replay stops at the gap",
            shard_id, position=missing,
        ))
    for pos in positions:
        path = paths.wal_entry_path(state.uri, shard_id, pos)
        try:
            data = state.io.read(path)
        except FileNotFoundError:
            continue  # collected or moved meanwhile
        try:
            WalEntry.parse(pos, data)
        except UNREADABLE_ENTRY as e:
            damage.append(Damage(WAL_UNREADABLE, path, f"WAL entry {pos} ({len(data)} bytes) does not parse ({e})",
                                 shard_id, position=pos))
    return len(positions), damage


def check_shard(state: TableState, shard_id: str) -> tuple[ShardCheck, ShardManifest | None]:
    """One shard's check, and the newest manifest version that decodes (None if none does)."""
    versions = state.manifests.retained_versions(shard_id)
    damage: list[Damage] = []
    newest: ShardManifest | None = None
    for v in versions:
        got = read_manifest_version(state, shard_id, v)
        if isinstance(got, Damage):
            damage.append(got)
        else:
            newest = got
    if newest is None:
        return ShardCheck(shard_id, None, versions[-1] if versions else None, 0, 0, tuple(damage)), None
    # The rest is checked against the newest intact version: what a repair falls back to.
    for sst in newest.sstables:
        found = check_sstable(state, shard_id, sst)
        if found is not None:
            damage.append(found)
    entries, wal_damage = check_wal(state, newest)
    damage += wal_damage
    return ShardCheck(shard_id, newest.version, versions[-1], len(newest.sstables), entries, tuple(damage)), newest


def check_index(state: TableState, base_version: int, manifests: dict[str, ShardManifest]) -> list[Damage]:
    """Damage of the MemWAL index in ``base_version``: undecodable, or at odds with the shards."""
    where = paths.base_manifest_path(state.uri, base_version)
    try:
        index: MemWalIndex | None = state.manifests.mem_wal_index(base_version)
    except (ManifestError, TableDamagedError, DecodeError, ValueError) as e:
        return [Damage(MEM_WAL_INDEX, where, f"the MemWAL index does not decode ({_reason(e)})")]
    if index is None:
        return [Damage(MEM_WAL_INDEX, where, "base version has no MemWAL index")]
    damage = []
    spec_ids = {s["spec_id"] for s in index.sharding_specs} | {0}
    for shard_id, generation in sorted(index.compacted.items()):
        m = manifests.get(shard_id)
        if m is None and not state.manifests.retained_versions(shard_id):
            damage.append(Damage(INDEX_SHARD_MISSING, where,
                                 f"records compacted generation {generation} of shard {shard_id}, which has no manifest",
                                 shard_id, generation=generation))
        elif m is not None and generation >= m.current_generation:
            damage.append(Damage(INDEX_GENERATION_AHEAD, where,
                                 f"records compacted generation {generation} of shard {shard_id}, whose manifest "
                                 f"v{m.version} has not flushed past generation {m.current_generation - 1}",
                                 shard_id, generation=generation))
    for shard_id, m in sorted(manifests.items()):
        if m.shard_spec_id not in spec_ids:
            damage.append(Damage(MEM_WAL_INDEX, where,
                                 f"knows no sharding spec {m.shard_spec_id}, which shard {shard_id} uses", shard_id))
    return damage


def check_table(state: TableState, progress: ProgressCallback | None = None) -> CheckReport:
    """Check every shard of the table and its MemWAL index; nothing is written. ``progress``
    hears of each shard checked."""
    state.manifests.clear_cache()
    base_version = state.dataset().version
    shards, intact = [], {}
    shard_ids = sorted(state.manifests.list_shards())
    notify(progress, "checking shards", 0, len(shard_ids), "shards")
    for i, shard_id in enumerate(shard_ids, 1):
        result, newest = check_shard(state, shard_id)
        shards.append(result)
        if newest is not None:
            intact[shard_id] = newest
        notify(progress, "checking shards", i, len(shard_ids), "shards")
    return CheckReport(state.uri, base_version, tuple(shards), tuple(check_index(state, base_version, intact)))
