"""Table status: per shard its fencing, WAL and SSTable state; for the base table its version.

This is what ``memwal status`` prints; ``memwal.cli.render`` turns it into text, this module
holds data only. Everything is read from disk (manifests, WAL file names), so it reflects
every writer, not only the ones in this process.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from memwal.core import paths
from memwal.maintain.bounds import BaseFootprint, measure_base
from memwal.core.errors import MetricsFormatError
from memwal.core.indexes import index_lag
from memwal.core.io import FileIO
from memwal.core.metadata import Bounds
from memwal.maintain.metrics import MaintenanceMetrics
from memwal.core.state import TableState


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
    #: writes into the shard are delayed (pending at or above the slowdown bound) ...
    slowed: bool = False
    #: ... or wait for compaction (pending at or above the stop bound)
    stalled: bool = False


@dataclass(frozen=True)
class MaintenanceStatus:
    """What ``memwal status`` knows of the maintenance service: its last published record,
    or why that record cannot be read (never a misreading of it)."""

    metrics: MaintenanceMetrics | None
    #: set when a record exists but is unreadable, e.g. written by a newer memwal
    problem: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return self.metrics.to_dict() if self.metrics is not None else {"unreadable": self.problem}


@dataclass(frozen=True)
class TableStatus:
    uri: str
    primary_key: list[str]
    sharding: str
    base_version: int
    base_rows: int
    num_shards: int
    shards: list[ShardStatus]
    #: base index -> shard id -> generations the index is behind compaction
    index_lag_generations: dict[str, dict[str, int]]
    #: None if the maintenance service never ran on this table
    maintenance: MaintenanceStatus | None
    #: the table's bounds, and the base as they count it
    bounds: Bounds | None = None
    base: BaseFootprint | None = None

    def to_json(self) -> str:
        """One JSON object; the index lag and maintenance record sit under ``extra``, where
        earlier versions put them, so scripts reading this keep working."""
        doc = asdict(self)
        del doc["index_lag_generations"], doc["maintenance"]
        extra: dict[str, Any] = {"index_lag_generations": self.index_lag_generations}
        if self.maintenance is not None:
            extra["maintenance"] = self.maintenance.to_dict()
        doc["extra"] = extra
        return json.dumps(doc, sort_keys=True, default=str)


def read_maintenance_metrics(io: FileIO, table_uri: str) -> MaintenanceStatus | None:
    """The maintenance service's last published metrics for a table; None if it never ran."""
    try:
        data = io.read(paths.maintenance_metrics(table_uri))
    except FileNotFoundError:
        return None
    try:
        return MaintenanceStatus(MaintenanceMetrics.from_json(data))
    except MetricsFormatError as e:
        return MaintenanceStatus(None, str(e))
    except ValueError as e:  # a torn or foreign file: say so rather than show made-up numbers
        return MaintenanceStatus(None, f"unreadable maintenance metrics: {e}")


def table_status(state: TableState) -> TableStatus:
    """Per-shard state from the manifests on disk, and the base table's version and rows."""
    snap = state.snapshot()
    bounds = state.metadata.bounds
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
                slowed=bounds.slowdown_sstables <= len(s.live_sstables) < bounds.stop_sstables,
                stalled=len(s.live_sstables) >= bounds.stop_sstables,
            )
        )
    return TableStatus(
        uri=state.uri,
        primary_key=list(state.primary_key),
        sharding=state.spec.render(),
        base_version=snap.base_version,
        base_rows=snap.dataset.count_rows(),
        num_shards=len(shards),
        shards=shards,
        index_lag_generations={lg.index: lg.lag for lg in index_lag(snap.dataset, snap.index)},
        maintenance=read_maintenance_metrics(state.io, state.uri),
        bounds=bounds,
        base=measure_base(state, snap.dataset),
    )
