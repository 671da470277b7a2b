"""Maintenance metrics: what one cycle did, running totals, and the versioned record of both.

The maintenance service writes a :class:`MaintenanceMetrics` to
``{table}/_memwal/maintenance.json`` after every cycle; ``memwal status`` reads it back
through :meth:`MaintenanceMetrics.from_json`, so a field renamed here is renamed for both
sides at once instead of silently reading as a default.

Compatibility: adding a field (with a default) keeps :data:`FORMAT_VERSION`; renaming or
removing one, or changing its meaning, bumps it. A reader takes records of its own version
and older ones (a record without ``format_version`` is version 1, written before the field
existed) and refuses newer ones with :class:`~memwal.core.errors.MetricsFormatError` rather than
guess what their fields mean.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from memwal.core.errors import MetricsFormatError

#: Version of the maintenance metrics record written by this memwal.
FORMAT_VERSION = 1


@dataclass(frozen=True)
class ShardDamage:
    """A shard that one maintenance cycle skipped because a file of it cannot be used."""

    shard_id: str
    #: the stage that found it: "flush" (stranded writes), "compaction" or "gc"
    stage: str
    #: one line naming the file and what is wrong with it
    error: str

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> ShardDamage:
        return cls(str(doc["shard_id"]), str(doc["stage"]), str(doc["error"]))


@dataclass(frozen=True)
class CycleReport:
    """What one maintenance cycle did, and the table's state after it."""

    started_at: float
    seconds: float = 0.0
    stranded_shards_flushed: int = 0
    compaction_commits: int = 0
    generations_compacted: int = 0
    rows_compacted: int = 0
    rows_per_second: float = 0.0
    #: why this cycle folded SSTables into the base (memwal.maintain.bounds.FoldSchedule); None: it
    #: waited, or nothing was pending
    fold_reason: str | None = None
    #: rows the fold schedule left pending this cycle (0: it did not wait)
    fold_deferred_rows: int = 0
    base_fragments_compacted: int = 0
    views_refreshed: int = 0
    indexes_caught_up: bool = False
    indexes_created: tuple[str, ...] = ()
    #: base index -> generations it is behind compaction, summed over shards
    index_lag: dict[str, int] = field(default_factory=dict)
    #: base index -> its segments after the cycle (memwal.core.indexes.SegmentPolicy keeps them few)
    index_segments: dict[str, int] = field(default_factory=dict)
    sstables_removed: int = 0
    wal_entries_removed: int = 0
    bytes_reclaimed: int = 0
    #: shard id -> SSTables not yet compacted
    pending_sstables: dict[str, int] = field(default_factory=dict)
    #: the base after the cycle, as the bounds count it (memwal.maintain.bounds)
    base_fragments: int = 0
    base_manifest_bytes: int = 0
    base_versions: int = 0
    base_versions_removed: int = 0
    live_bytes: int = 0
    #: bytes under the table's directory; None when not measured in this cycle
    disk_bytes: int | None = None
    #: bounds still exceeded after the cycle (e.g. "base_fragments", "disk")
    bounds_exceeded: tuple[str, ...] = ()
    #: set when the cycle failed: "ExceptionType: message"
    error: str | None = None
    #: shards skipped (for the stages named) while the others were maintained
    damaged_shards: tuple[ShardDamage, ...] = ()

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> CycleReport:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in doc.items() if k in known}
        values["indexes_created"] = tuple(values.get("indexes_created", ()))
        values["damaged_shards"] = tuple(ShardDamage.from_dict(d) for d in values.get("damaged_shards", ()))
        values["bounds_exceeded"] = tuple(values.get("bounds_exceeded", ()))
        return cls(**values)


@dataclass(frozen=True)
class MaintenanceTotals:
    """Running totals of one maintenance service since it started."""

    cycles: int = 0
    failures: int = 0
    rows_compacted: int = 0
    bytes_reclaimed: int = 0

    def after_cycle(self, report: CycleReport) -> MaintenanceTotals:
        return replace(
            self,
            cycles=self.cycles + 1,
            rows_compacted=self.rows_compacted + report.rows_compacted,
            bytes_reclaimed=self.bytes_reclaimed + report.bytes_reclaimed,
        )

    def after_failure(self) -> MaintenanceTotals:
        return replace(self, failures=self.failures + 1)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> MaintenanceTotals:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in doc.items() if k in known})


@dataclass(frozen=True)
class MaintenanceMetrics:
    """The record the maintenance service publishes after every cycle."""

    last_cycle: CycleReport
    totals: MaintenanceTotals
    #: wall-clock time of publication (seconds since the epoch)
    updated_at: float
    format_version: int = FORMAT_VERSION

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["last_cycle"]["indexes_created"] = list(self.last_cycle.indexes_created)
        doc["last_cycle"]["damaged_shards"] = [asdict(d) for d in self.last_cycle.damaged_shards]
        return doc

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> MaintenanceMetrics:
        """Parse a published record; :class:`MetricsFormatError` if it is newer than this
        memwal understands, :class:`ValueError` if it is not a record at all."""
        doc = json.loads(text)
        if not isinstance(doc, dict):
            raise ValueError("maintenance metrics are not a JSON object")  # noqa: TRY004 - bad file content, not a caller error
        version = doc.get("format_version", 1)
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise MetricsFormatError(
                f"maintenance metrics are in format version {version}; this memwal reads up to "
                f"{FORMAT_VERSION}: upgrade memwal to read them"
            )
        try:
            return cls(
                last_cycle=CycleReport.from_dict(doc["last_cycle"]),
                totals=MaintenanceTotals.from_dict(doc["totals"]),
                updated_at=float(doc["updated_at"]),
                format_version=version,
            )
        except (KeyError, TypeError) as e:
            raise ValueError(f"maintenance metrics lack or mistype a field: {e}") from e
