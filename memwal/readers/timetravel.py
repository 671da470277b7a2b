"""Time travel across the LSM: the table as it was at a base version or a moment.

The state of a memwal table at time ``T`` is the base version that was the latest at ``T``
plus, per shard, the SSTables its manifest listed at ``T`` above the generation that base
version had compacted: exactly what a reader that refreshed at ``T`` read. A base version
carries its commit time; a shard manifest version is written once (put-if-absent) and its
file's modification time is when it was committed, and versions are written in order, so the
manifest live at ``T`` is the newest version written at or before ``T``. The pair is
consistent for the reason a reader's snapshot is (:mod:`memwal.core.snapshot`): every generation
the base version had compacted was flushed, so listed, before that version was committed,
at or before ``T``. Rows still in a WAL at ``T`` (not flushed) are not part of it, as for an
eventual reader.

``as_of`` is a base version (the table when that version was committed) or a time (a
``datetime``, naive meaning UTC, or Unix seconds). The state is readable while GC keeps its
base version, the shards' manifests of that time and the SSTables they list
(``GcConfig.time_travel_seconds``, :mod:`memwal.maintain.gc`); otherwise :class:`StateNotRetainedError`
names the oldest state that can still be read.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Union

from memwal.core import paths
from memwal.core.errors import StateNotRetainedError
from memwal.core.snapshot import ShardState, Snapshot
from memwal.core.state import TableState

AsOf = Union[int, float, dt.datetime]


@dataclass(frozen=True)
class PastState:
    """A resolved ``as_of``: the base version live then, and the moment (Unix seconds)."""

    base_version: int
    at: float


def _seconds(when: dt.datetime | float) -> float:
    if isinstance(when, dt.datetime):
        return (when if when.tzinfo is not None else when.replace(tzinfo=dt.timezone.utc)).timestamp()
    return float(when)


def _iso(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).isoformat(timespec="milliseconds")


def _committed(version: dict) -> float:
    ts = version["timestamp"]
    return ts.timestamp() if hasattr(ts, "timestamp") else float(ts)


def _base_versions(state: TableState) -> list[tuple[int, float]]:
    """The retained base versions and their commit times, ascending."""
    return [(v["version"], _committed(v)) for v in state.dataset().versions()]


def oldest_readable(state: TableState) -> tuple[int, float] | None:
    """The oldest state time travel can read, as (base version, its commit time in Unix
    seconds): the first retained base version whose state at its commit is still whole (its
    shards' manifests of that time and the SSTables they list kept). States are lost oldest
    first (GC removes base versions, manifest versions and compacted SSTables in the order
    they were made), so a bisection finds it; None if none is (a table GC is collecting right
    now, say)."""
    versions = _base_versions(state)
    lo, hi = 0, len(versions)  # versions[:lo] are not readable, versions[hi:] are
    while lo < hi:
        mid = (lo + hi) // 2
        if _gone(state, PastState(*versions[mid])) is None:
            hi = mid
        else:
            lo = mid + 1
    for version, at in versions[lo:]:  # the first found readable, checked (and past it, if not)
        if _gone(state, PastState(version, at)) is None:
            return version, at
    return None


def _not_retained(state: TableState, asked: str, why: str) -> StateNotRetainedError:
    oldest = oldest_readable(state)
    keeps = f"base version {oldest[0]} at {_iso(oldest[1])}" if oldest is not None else "none right now"
    return StateNotRetainedError(
        f"cannot read the table as of {asked}: {why}; the oldest state it keeps is {keeps} "
        f"(GcConfig.time_travel_seconds sets how long states are kept)"
    )


def resolve(state: TableState, as_of: AsOf) -> PastState:
    """The base version and moment ``as_of`` names; :class:`StateNotRetainedError` if its base
    version is not retained (or never existed)."""
    versions = _base_versions(state)
    if isinstance(as_of, bool) or not isinstance(as_of, (int, float, dt.datetime)):
        raise StateNotRetainedError(f"as_of is a base version (int) or a time (datetime or Unix seconds), got {as_of!r}")
    if isinstance(as_of, int):
        for v, ts in versions:
            if v == as_of:
                return PastState(v, ts)
        latest = state.dataset().version
        why = "no such version yet" if as_of > latest else "that base version was cleaned up"
        raise _not_retained(state, f"base version {as_of}", why)
    at = _seconds(as_of)
    live = [v for v, ts in versions if ts <= at]
    if not live:
        return_why = "the table did not exist yet" if versions[0][0] == 1 else "its base version was cleaned up"
        raise _not_retained(state, _iso(at), return_why)
    # Cleanup removes the oldest versions first, so the newest one committed by then is kept.
    return PastState(live[-1], at)


def past_snapshot(state: TableState, past: PastState) -> Snapshot:
    """The snapshot a reader that refreshed at ``past.at`` read (see the module doc);
    :class:`StateNotRetainedError` if GC no longer keeps all of it."""
    shards = _shards_at(state, past)
    if isinstance(shards, str):
        raise _not_retained(state, _iso(past.at), shards)
    return Snapshot(state.dataset(past.base_version), state.manifests.mem_wal_index(past.base_version), shards)


def _gone(state: TableState, past: PastState) -> str | None:
    """What of ``past`` GC no longer keeps, or None if it is all there."""
    shards = _shards_at(state, past)
    return shards if isinstance(shards, str) else None


def _shards_at(state: TableState, past: PastState) -> tuple[ShardState, ...] | str:
    """Every shard as it was at ``past.at`` over ``past``'s base version, or what is missing."""
    index = state.manifests.mem_wal_index(past.base_version)
    shards = []
    for shard_id in state.manifests.list_shards():
        kept = state.manifests.retained_versions(shard_id)
        version = _manifest_at(state, shard_id, kept, past.at)
        if version is None:
            if kept and kept[0] > 1:
                return f"shard {shard_id}'s manifest of that time was collected"
            continue  # the shard did not exist yet
        manifest = state.manifests.read_shard(shard_id, version)
        if manifest is None:
            return f"shard {shard_id}'s manifest version {version} was collected meanwhile"
        shard = ShardState(manifest, index.compacted_generation(shard_id) if index is not None else 0)
        for sst in shard.live_sstables:
            if not state.io.list_dir(paths.sstable_path(state.uri, shard_id, sst.path)):
                return f"shard {shard_id}'s SSTable {sst.path} of that time was collected"
        shards.append(shard)
    return tuple(shards)


def _manifest_at(state: TableState, shard_id: str, kept: list[int], at: float) -> int | None:
    """The newest of the shard's retained manifest versions written at or before ``at``, if
    any. Versions are written in order, so their times ascend: bisection."""
    lo, hi = 0, len(kept)  # kept[:lo] were written by then, kept[hi:] after
    while lo < hi:
        mid = (lo + hi) // 2
        try:
            _size, mtime = state.io.stat(paths.shard_manifest_path(state.uri, shard_id, kept[mid]))
        except FileNotFoundError:
            mtime = float("-inf")  # collected meanwhile: it was old
        if mtime <= at:
            lo = mid + 1
        else:
            hi = mid
    return kept[lo - 1] if lo else None
