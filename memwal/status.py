"""Table status: per shard its fencing, WAL and SSTable state; for the base table its version.

This is what ``memwal status`` prints. Everything is read from disk (manifests, WAL file
names), so it reflects every writer, not only the ones in this process.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class ShardStatus:
    shard_id: str
    shard_values: dict[str, Any]
    writer_epoch: int
    manifest_version: int
    #: last WAL position covered by an SSTable (Lance: replay_after_wal_entry_position)
    wal_flushed_position: int
    #: last WAL position recorded in the manifest (a hint, may lag)
    wal_last_seen_position: int
    #: last WAL position found on disk by probing
    wal_tail_position: int
    current_generation: int
    sstables: list[int]
    compacted_generation: int
    #: SSTables above the compacted generation: what readers merge and the compactor owes
    pending_sstables: int
    sealed: bool


@dataclass(frozen=True)
class TableStatus:
    uri: str
    primary_key: list[str]
    sharding: str
    base_version: int
    base_rows: int
    num_shards: int
    shards: list[ShardStatus]
    #: extra sections added by maintenance (metrics) and views
    extra: dict[str, Any]

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, default=str)

    def render(self) -> str:
        """A human-readable table."""
        lines = [
            f"table        {self.uri}",
            f"primary key  {', '.join(self.primary_key)}",
            f"sharding     {self.sharding}",
            f"base table   version {self.base_version}, {self.base_rows} rows",
            f"shards       {self.num_shards}",
        ]
        if self.shards:
            header = ("shard", "values", "epoch", "manifest", "wal flushed/seen/tail", "gen", "sstables", "compacted", "pending")
            rows = [
                (
                    s.shard_id,
                    ",".join(f"{k}={v}" for k, v in s.shard_values.items()) or "-",
                    str(s.writer_epoch),
                    f"v{s.manifest_version}",
                    f"{s.wal_flushed_position}/{s.wal_last_seen_position}/{s.wal_tail_position}",
                    str(s.current_generation),
                    _ranges(s.sstables),
                    str(s.compacted_generation),
                    str(s.pending_sstables),
                )
                for s in self.shards
            ]
            widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
            fmt = "  ".join(f"{{:<{w}}}" for w in widths)
            lines += ["", fmt.format(*header), fmt.format(*("-" * w for w in widths))]
            lines += [fmt.format(*r) for r in rows]
        for section, value in self.extra.items():
            lines += ["", f"{section}:", json.dumps(value, indent=2, sort_keys=True, default=str)]
        return "\n".join(lines)


def _ranges(gens: list[int]) -> str:
    """[1,2,3,5] -> '1-3,5'."""
    if not gens:
        return "-"
    out, start, prev = [], gens[0], gens[0]
    for g in gens[1:] + [None]:
        if g is not None and g == prev + 1:
            prev = g
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if g is not None:
            start = prev = g
    return ",".join(out)
