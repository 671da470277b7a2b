"""Table status: per shard its fencing, WAL and SSTable state; for the base table its version.

This is what ``memwal status`` prints. Everything is read from disk (manifests, WAL file
names), so it reflects every writer, not only the ones in this process.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any

from memwal import paths
from memwal.indexes import index_lag
from memwal.io import FileIO
from memwal.state import TableState


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
        lag = self.extra.get("index_lag_generations")
        if lag:
            lines += ["", "base indexes (generations behind compaction):"]
            lines += [f"  {name:<20} {sum(per_shard.values())}" for name, per_shard in sorted(lag.items())]
        m = self.extra.get("maintenance")
        if m:
            last, totals = m.get("last_cycle", {}), m.get("totals", {})
            age = time.time() - m.get("updated_at", time.time())
            lines += ["", f"maintenance (last cycle {age:.0f}s ago):"]
            if last.get("error"):
                lines.append(f"  last cycle FAILED: {last['error']}")
            else:
                lines.append(
                    f"  last cycle: {last.get('compaction_commits', 0)} compaction commits, "
                    f"{last.get('rows_compacted', 0)} rows at {last.get('rows_per_second', 0):,.0f} rows/s, "
                    f"{last.get('bytes_reclaimed', 0):,} bytes reclaimed"
                )
            lines.append(
                f"  totals: {totals.get('cycles', 0)} cycles ({totals.get('failures', 0)} failed), "
                f"{totals.get('rows_compacted', 0)} rows compacted, {totals.get('bytes_reclaimed', 0):,} bytes reclaimed"
            )
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


def read_maintenance_metrics(io: FileIO, table_uri: str) -> dict[str, Any] | None:
    """The maintenance service's last published metrics for a table, if it ever ran."""
    try:
        return json.loads(io.read(paths.maintenance_metrics(table_uri)))
    except (FileNotFoundError, ValueError):
        return None


def table_status(state: TableState) -> TableStatus:
    """Per-shard state from the manifests on disk, and the base table's version and rows."""
    snap = state.snapshot()
    shards = []
    for s in sorted(snap.shards, key=lambda s: s.shard_id):
        m = s.manifest
        shards.append(
            ShardStatus(
                shard_id=m.shard_id,
                shard_values=state.shard_values(m),
                writer_epoch=m.writer_epoch,
                manifest_version=m.version,
                wal_flushed_position=m.replay_after_wal_entry_position,
                wal_last_seen_position=m.wal_entry_position_last_seen,
                wal_tail_position=state.wal_tail(
                    m.shard_id, max(m.wal_entry_position_last_seen, m.replay_after_wal_entry_position)
                ),
                current_generation=m.current_generation,
                sstables=sorted(t.generation for t in m.sstables),
                compacted_generation=s.compacted_generation,
                pending_sstables=len(s.live_sstables),
                sealed=m.sealed,
            )
        )
    extra: dict[str, Any] = {
        "index_lag_generations": {lg.index: lg.lag for lg in index_lag(snap.dataset, snap.index)},
    }
    metrics = read_maintenance_metrics(state.io, state.uri)
    if metrics is not None:
        extra["maintenance"] = metrics
    return TableStatus(
        uri=state.uri,
        primary_key=list(state.primary_key),
        sharding=state.spec.render(),
        base_version=snap.base_version,
        base_rows=snap.dataset.count_rows(),
        num_shards=len(shards),
        shards=shards,
        extra=extra,
    )
