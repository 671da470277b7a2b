"""Is the table healthy? The checks behind ``memwal health`` (a liveness probe) and the
``memwal_health_*`` gauges.

A table is healthy when

* ``maintenance``: the maintenance service published a record no older than
  ``max_maintenance_age_seconds`` and its last cycle did not fail (a service that stopped,
  hangs, or fails every cycle leaves SSTables to pile up until writers stall);
* ``sstables``: no shard holds ``stop_sstables`` uncompacted SSTables or more (its writes wait
  for compaction);
* ``wal``: every shard's WAL after its flushed position is contiguous and parses (a gap is
  where every replay stops);
* ``files``: every shard manifest decodes, every listed SSTable reads, and the MemWAL index
  agrees with the shards (:mod:`memwal.maintain.check`).

The last two read what ``memwal check`` reads (the key columns of every listed SSTable); with
``HealthConfig(deep=False)`` they are left out and reported as not checked, for probes that
must stay cheap on large tables. Data only: ``memwal.cli.render`` prints it.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

from memwal.maintain import check
from memwal.core.state import TableState
from memwal.maintain.status import TableStatus, table_status

#: The checks, in the order they are reported.
CHECKS = ("maintenance", "sstables", "wal", "files")

_WAL_KINDS = frozenset({check.WAL_GAP, check.WAL_UNREADABLE})


@dataclass(frozen=True)
class HealthConfig:
    #: A maintenance record older than this is stale (the service stopped or hangs). A cycle
    #: publishes when it ends, so this must exceed the longest cycle (large base-file
    #: compactions take minutes) plus the interval between cycles.
    max_maintenance_age_seconds: float = 900.0
    #: Also check the WAL and every file (what ``memwal check`` reads); False: only the
    #: maintenance record and the shard manifests.
    deep: bool = True


@dataclass(frozen=True)
class HealthCheck:
    name: str
    #: None: not checked (``deep=False``)
    ok: bool | None
    detail: str


@dataclass(frozen=True)
class HealthReport:
    uri: str
    checked_at: float
    checks: tuple[HealthCheck, ...]

    @property
    def ok(self) -> bool:
        """Every check that ran passed."""
        return all(c.ok is not False for c in self.checks)

    def check(self, name: str) -> HealthCheck:
        return next(c for c in self.checks if c.name == name)

    def to_json(self) -> str:
        doc = asdict(self)
        doc["ok"] = self.ok
        return json.dumps(doc, sort_keys=True)


def _maintenance(status: TableStatus, config: HealthConfig, now: float) -> HealthCheck:
    m = status.maintenance
    if m is None:
        return HealthCheck("maintenance", False, "maintenance never ran on this table (memwal maintain, or ingest --maintain)")
    if m.metrics is None:
        return HealthCheck("maintenance", False, str(m.problem))
    age = now - m.metrics.updated_at
    if age > config.max_maintenance_age_seconds:
        return HealthCheck("maintenance", False, f"last cycle {age:.0f}s ago (stale after {config.max_maintenance_age_seconds:.0f}s)")
    if m.metrics.last_cycle.error:
        return HealthCheck("maintenance", False, f"last cycle {age:.0f}s ago failed: {m.metrics.last_cycle.error}")
    return HealthCheck("maintenance", True, f"last cycle {age:.0f}s ago")


def _sstables(status: TableStatus) -> HealthCheck:
    stalled = [s for s in status.shards if s.stalled]
    if stalled:
        worst = max(stalled, key=lambda s: s.pending_sstables)
        bound = status.bounds.stop_sstables if status.bounds is not None else "?"
        return HealthCheck("sstables", False, f"{len(stalled)} shard(s) at the stop bound ({bound} uncompacted SSTables), "
                           f"writes wait: shard {worst.shard_id} has {worst.pending_sstables}")
    most = max((s.pending_sstables for s in status.shards), default=0)
    # The base's own bounds (fragments, versions, disk) are the maintenance service's to keep
    # and never stop a writer: said here, not failed on (a small new table is over its disk
    # ratio for a while).
    m = status.maintenance
    exceeded = m.metrics.last_cycle.bounds_exceeded if m is not None and m.metrics is not None else ()
    over = f"; the base is over its bounds after the last cycle: {', '.join(exceeded)}" if exceeded else ""
    return HealthCheck("sstables", True, f"at most {most} uncompacted SSTable(s) in a shard{over}")


def _files(report: check.CheckReport) -> tuple[HealthCheck, HealthCheck]:
    wal = [d for d in report.damage if d.kind in _WAL_KINDS]
    other = [d for d in report.damage if d.kind not in _WAL_KINDS]

    def said(damage: list[check.Damage], what: str) -> HealthCheck:
        if not damage:
            return HealthCheck(what, True, "clean")
        return HealthCheck(what, False, f"{len(damage)} damaged: " + "; ".join(f"{d.path}: {d.problem}" for d in damage[:3])
                           + (" ..." if len(damage) > 3 else "") + " (memwal check, memwal repair)")

    return said(wal, "wal"), said(other, "files")


def table_health(state: TableState, config: HealthConfig | None = None, status: TableStatus | None = None) -> HealthReport:
    """Every check of :data:`CHECKS` on the table as it is on storage now."""
    config = config or HealthConfig()
    status = status or table_status(state)
    now = time.time()
    checks = [_maintenance(status, config, now), _sstables(status)]
    if config.deep:
        checks += _files(check.check_table(state))
    else:
        checks += [HealthCheck("wal", None, "not checked"), HealthCheck("files", None, "not checked")]
    return HealthReport(state.uri, now, tuple(checks))
