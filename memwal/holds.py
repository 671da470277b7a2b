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
"""

from __future__ import annotations

import json
from typing import Mapping

from memwal import paths
from memwal.io import FileIO


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
