"""Change-log holds: what consumers of compacted SSTables still have to read, so GC keeps it.

The SSTables a compaction folded into the base table are the table's change log (upserts
and tombstones per shard and generation, in order). A consumer reading it, such as a
materialized view fed by compaction, records per shard the highest generation it has
consumed; GC removes only SSTables at or below every consumer's hold, as it waits for
index catch-up.

Invariant: a hold is never ahead of what its consumer has committed. Consumers write a
hold only after the commit that consumed the generations (a crash in between leaves the
older, lower hold: GC keeps more than needed, never less). A shard absent from a hold is
held at generation 0 (nothing of it consumed). Holds are small JSON files, one per
consumer, found by listing; a consumer that goes away takes its file with it.

Two kinds of consumer hold: materialized views (their file inside the view's directory) and
registered readers of the change feed (:mod:`memwal.readers.feed`; ``_memwal/feeds/{name}.json``),
whose hold also records their position and when they last committed it. A feed hold older
than ``GcConfig.feed_retention_seconds`` no longer holds anything: a consumer gone for good
cannot keep the change log forever (it then gets a clear error naming the oldest position).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

from memwal.core import paths
from memwal.core.io import FileIO

#: the Lance tag that keeps a feed consumer's anchor base version through version cleanup
FEED_TAG_PREFIX = "memwal-feed-"


def write_hold(io: FileIO, path: str, consumed: Mapping[str, int]) -> None:
    """Record that the consumer at ``path`` has consumed every generation up to ``consumed[shard]``."""
    io.write(path, json.dumps({"consumed": dict(consumed)}, sort_keys=True).encode())


def read_hold(io: FileIO, path: str) -> dict[str, int] | None:
    try:
        return {str(k): int(v) for k, v in json.loads(io.read(path))["consumed"].items()}
    except FileNotFoundError:
        return None


def view_holds(io: FileIO, table: str) -> list[dict[str, int]]:
    """The holds of the table's views (views without one, fed by Lance's change feed, hold nothing)."""
    out = []
    for name in io.list_dir(paths.views_dir(table)):
        hold = read_hold(io, paths.view_hold(table, name))
        if hold is not None:
            out.append(hold)
    return out


def held_through(holds: list[dict[str, int]], shard_id: str, limit: int) -> int:
    """``limit`` lowered to the highest generation of ``shard_id`` every hold has consumed."""
    for hold in holds:
        limit = min(limit, hold.get(shard_id, 0))
    return limit


@dataclass(frozen=True)
class FeedHold:
    """A registered change-feed consumer's hold."""

    #: per shard, the generation its anchor version had folded: GC keeps what is above
    consumed: Mapping[str, int]
    #: its committed position (:class:`memwal.readers.feed.Position` as JSON)
    position: Mapping[str, Any]
    #: when it was committed (seconds since the epoch)
    committed_at: float


def write_feed_hold(io: FileIO, path: str, hold: FeedHold) -> None:
    body = {"consumed": dict(hold.consumed), "position": dict(hold.position), "committed_at": hold.committed_at}
    io.write(path, json.dumps(body, sort_keys=True).encode())


def read_feed_hold(io: FileIO, path: str) -> FeedHold | None:
    try:
        d = json.loads(io.read(path))
    except FileNotFoundError:
        return None
    return FeedHold({str(k): int(v) for k, v in d["consumed"].items()}, d["position"], float(d["committed_at"]))


def feed_holds(io: FileIO, table: str, now: float, retention_seconds: float) -> tuple[list[dict[str, int]], list[str]]:
    """The holds of the table's feed consumers that committed within ``retention_seconds``,
    and the names of those that did not (expired: they hold nothing)."""
    live, expired = [], []
    for name in io.list_dir(paths.feeds_dir(table)):
        if not name.endswith(".json"):
            continue
        hold = read_feed_hold(io, paths.join(paths.feeds_dir(table), name))
        if hold is None:
            continue
        if now - hold.committed_at > retention_seconds:
            expired.append(name.removesuffix(".json"))
        else:
            live.append(dict(hold.consumed))
    return live, expired
