"""Text renderings for terminals: rows, read plans, table status.

The one place that turns memwal's data records into human-readable text; only the entry
points (``memwal.cli.app``, ``memwal_dev.demo``) use it. Domain modules hold data, and JSON output
is each record's own ``to_json``, so changing a rendering here never changes what a
script parsing ``--json`` reads.
"""

from __future__ import annotations

import json
import time
from typing import Any, Iterable, Iterator

import pyarrow as pa

from memwal.maintain.check import CheckReport, Damage
from memwal.readers.feed import Position
from memwal.maintain.health import HealthReport
from memwal.core.jsonvalues import jsonable
from memwal.maintain.metrics import CycleReport, MaintenanceMetrics
from memwal.readers.plan import ReadPlan
from memwal.maintain.repair import RepairReport
from memwal.maintain.status import MaintenanceStatus, ShardStatus, TableStatus
from memwal.maintain.upgrade import UpgradeReport


def _cell(v: Any, max_width: int) -> str:
    s = "null" if v is None else (json.dumps(jsonable(v)) if isinstance(v, (list, dict, bytes)) else str(v))
    return s if len(s) <= max_width else s[: max_width - 1] + "…"


def _row_count(n: int) -> str:
    return f"({n} row{'s' if n != 1 else ''})"


def render_rows(table: pa.Table, max_width: int = 40) -> str:
    """A plain-text table of ``table``'s rows."""
    return "\n".join(render_row_stream(table.to_batches(), table.schema, max_width))


def render_row_stream(batches: Iterable[pa.RecordBatch], schema: pa.Schema | None = None, max_width: int = 40) -> Iterator[str]:
    """A plain-text table of the rows of ``batches``, a block of lines per batch as it comes
    (the header with the first; a record batch reader gives its schema), then the row count.
    Column widths are those of the first batch, so a later cell wider than its column shifts
    the rest of its line (every cell stays whole up to ``max_width``)."""
    schema = schema if schema is not None else getattr(batches, "schema", None)
    widths: list[int] | None = None
    fmt = ""
    count = 0
    for batch in batches:
        names = batch.schema.names
        cells = [[_cell(r[n], max_width) for n in names] for r in batch.to_pylist()]
        if widths is None:
            widths = [max([len(n)] + [len(c[i]) for c in cells]) for i, n in enumerate(names)]
            fmt = "  ".join(f"{{:<{w}}}" for w in widths)
            yield "\n".join([fmt.format(*names), fmt.format(*("-" * w for w in widths))])
        if cells:
            yield "\n".join(fmt.format(*c).rstrip() for c in cells)
        count += len(cells)
    if widths is None:  # no batch: the header alone
        names = schema.names if schema is not None else []
        fmt = "  ".join(f"{{:<{len(n)}}}" for n in names)
        yield "\n".join([fmt.format(*names), fmt.format(*("-" * len(n) for n in names))])
    yield _row_count(count)


def render_position(position: Position) -> str:
    """Where a change-feed read ended, as the line to pass back to ``memwal changes --since``."""
    return f"next position: {json.dumps(position.to_json(), sort_keys=True)}"


def render_plan(plan: ReadPlan) -> str:
    """A read plan: base version, shards read and pruned (and why), SSTables merged."""
    lines = [f"base table version {plan.base_version}"]
    lines.append(f"shards read: {len(plan.shards)}, pruned: {len(plan.pruned_shards)} ({plan.pruning})")
    lines += [f"  read   {s}" for s in plan.shards]
    lines += [f"  pruned {s}" for s in plan.pruned_shards]
    lines.append(f"sstables: {len(plan.sstables)}")
    lines += [f"  {p}" for p in plan.sstables]
    return "\n".join(lines)



def shard_cells(s: ShardStatus, stop: int | None) -> tuple[str, ...]:
    """One shard's row of the status table, as text (the terminal view styles the last two)."""
    return (
        s.shard_id,
        ",".join(f"{k}={v}" for k, v in s.shard_values.items()) or "-",
        str(s.writer_epoch),
        f"v{s.manifest_version}",
        f"{s.wal_flushed_position}/{s.wal_last_seen_position}/{s.wal_tail_position}",
        str(s.current_generation),
        generation_ranges(s.sstables),
        str(s.compacted_generation),
        str(s.pending_sstables) + (f"/{stop}" if stop is not None else ""),
        "STALLED" if s.stalled else "slowed" if s.slowed else "ok",
    )

def render_status(status: TableStatus) -> str:
    """The table, its shards, its base indexes' lag and the maintenance service's last cycle."""
    lines = [
        f"table        {status.uri}",
        f"primary key  {', '.join(status.primary_key)}",
        f"sharding     {status.sharding}",
        f"base table   version {status.base_version}, {status.base_rows} rows",
        f"shards       {status.num_shards}",
    ]
    if status.shards:
        header = ("shard", "values", "epoch", "manifest", "wal flushed/seen/tail", "gen", "sstables", "compacted", "pending", "writes")
        rows = [shard_cells(s, status.bounds.stop_sstables if status.bounds is not None else None) for s in status.shards]
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        fmt = "  ".join(f"{{:<{w}}}" for w in widths)
        lines += ["", fmt.format(*header), fmt.format(*("-" * w for w in widths))]
        lines += [fmt.format(*r) for r in rows]
    lines += bounds_lines(status)
    if status.index_lag_generations:
        lines += ["", "base indexes (generations behind compaction):"]
        lines += [
            f"  {name:<20} {sum(per_shard.values())}" for name, per_shard in sorted(status.index_lag_generations.items())
        ]
    if status.maintenance is not None:
        lines += ["", *maintenance_lines(status.maintenance)]
    return "\n".join(lines)


def bounds_lines(status: TableStatus) -> list[str]:
    """The bounds against what the table holds: "pending" above is uncompacted SSTables out
    of the stop bound; writes are "slowed" from the slowdown bound, "STALLED" from the stop."""
    b, f = status.bounds, status.base
    if b is None or f is None:
        return []
    return [
        "",
        f"bounds       SSTables per shard: compacted above {b.max_sstables}, writes slowed from "
        f"{b.slowdown_sstables}, stalled from {b.stop_sstables}",
        f"             base: {f.fragments} fragments (bound {b.max_base_fragments}), manifest "
        f"{f.manifest_bytes:,} bytes (bound {b.max_manifest_bytes:,}), {f.versions} versions (bound {b.max_base_versions + 1}), "
        f"live data {f.live_bytes:,} bytes",
    ]


def maintenance_lines(m: MaintenanceStatus) -> list[str]:
    if m.metrics is None:
        return [f"maintenance: {m.problem}"]
    metrics: MaintenanceMetrics = m.metrics
    last, totals = metrics.last_cycle, metrics.totals
    lines = [f"maintenance (last cycle {time.time() - metrics.updated_at:.0f}s ago):"]
    if last.error:
        lines.append(f"  last cycle FAILED: {last.error}")
    else:
        lines.append(
            f"  last cycle: {last.compaction_commits} compaction commits, "
            f"{last.rows_compacted} rows at {last.rows_per_second:,.0f} rows/s, "
            f"{last.bytes_reclaimed:,} bytes reclaimed"
        )
        if last.fold_reason:
            lines.append(f"  folded because {last.fold_reason}")
        elif last.fold_deferred_rows:
            lines.append(f"  fold not due: {last.fold_deferred_rows:,} pending rows wait for more (memwal maintain --fold-fraction)")
        if last.index_segments:
            lines.append("  index segments: " + ", ".join(f"{n} {c}" for n, c in sorted(last.index_segments.items())))
        if last.disk_bytes is not None:
            lines.append(f"  disk: {last.disk_bytes:,} bytes for {last.live_bytes:,} bytes of live base data")
        if last.bounds_exceeded:
            lines.append(f"  over its bounds after the cycle: {', '.join(last.bounds_exceeded)}")
    lines += [f"  skipped damaged shard {d.shard_id} ({d.stage}): {d.error}" for d in last.damaged_shards]
    lines.append(
        f"  totals: {totals.cycles} cycles ({totals.failures} failed), "
        f"{totals.rows_compacted} rows compacted, {totals.bytes_reclaimed:,} bytes reclaimed"
    )
    return lines


def render_cycle(report: CycleReport) -> str:
    """One line: what a maintenance cycle did (``memwal maintain --once``)."""
    return (
        f"compacted {report.generations_compacted} generation(s) in {report.compaction_commits} commit(s) "
        f"({report.rows_compacted} rows); reclaimed {report.sstables_removed} SSTable(s), "
        f"{report.wal_entries_removed} WAL entr{'y' if report.wal_entries_removed == 1 else 'ies'}, "
        f"{report.bytes_reclaimed} bytes; {sum(report.pending_sstables.values())} SSTable(s) pending"
        + (f"; skipped {len(report.damaged_shards)} damaged shard(s)" if report.damaged_shards else "")
    )


def render_damaged_shards(report: CycleReport) -> list[str]:
    """One error line per shard a cycle skipped, naming the shard, the stage and the file."""
    return [
        f"memwal: error: shard {d.shard_id} skipped ({d.stage}), the other shards were maintained: {d.error}"
        for d in report.damaged_shards
    ]


def generation_ranges(gens: list[int]) -> str:
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


def _damage_line(d: Damage) -> str:
    return f"  DAMAGED {d.kind:<18} {d.path}\n          {d.problem}"


def render_check(report: CheckReport) -> str:
    """``memwal check``: per shard what was checked, then every damaged file and what is wrong with it."""
    lines = [f"table {report.uri} (base version {report.base_version}): {len(report.shards)} shard(s)"]
    for s in report.shards:
        v = "none decodes" if s.manifest_version is None else f"v{s.manifest_version}"
        lines.append(f"  shard {s.shard_id}: manifest {v}, {s.sstables_checked} SSTable(s), "
                     f"{s.wal_entries_checked} unflushed WAL entr{'y' if s.wal_entries_checked == 1 else 'ies'}")
    damage = report.damage
    lines += [_damage_line(d) for d in damage]
    lines.append("clean" if not damage else f"{len(damage)} damaged file(s); `memwal repair` quarantines them "
                 "(see `memwal repair --dry-run` first)")
    return "\n".join(lines)


def render_repair(report: RepairReport) -> str:
    """``memwal repair``: what was (or would be) done, which rows may be lost, what is left."""
    verb = "would" if report.dry_run else "did"
    lines = [f"repair of {report.uri}{' (dry run: nothing changed)' if report.dry_run else ''}"]
    if report.before.clean:
        lines.append("nothing to repair: the check is clean")
        return "\n".join(lines)
    lines += [_damage_line(d) for d in report.before.damage]
    lines.append(f"actions ({verb}):")
    for a in report.actions:
        lines.append(f"  {a.kind:<10} {a.path}" + (f"\n             -> {a.to}" if a.to else "") + f"\n             {a.detail}")
    if report.possibly_lost:
        lines.append("rows that may be lost:")
        for lost in report.possibly_lost:
            rows = "unknown number of rows" if lost.rows is None else f"{lost.rows} row(s)"
            lines.append(f"  {lost.path}: {rows}; {lost.why}")
            if lost.keys:
                shown = ", ".join(json.dumps(jsonable(k), sort_keys=True) for k in lost.keys[:20])
                more = f" (+{len(lost.keys) - 20} more)" if len(lost.keys) > 20 else ""
                lines.append(f"    keys: {shown}{more}")
    else:
        lines.append("no acknowledged rows lost")
    for d in report.unrepaired:
        lines.append(f"  NOT REPAIRED {d.path}: {d.problem} (restore it from a backup)")
    if report.after is not None:
        lines.append("check after repair: " + ("clean" if report.after.clean else f"{len(report.after.damage)} damaged file(s) left"))
        lines += [_damage_line(d) for d in report.after.damage]
    return "\n".join(lines)


def render_upgrade(report: UpgradeReport) -> str:
    """What ``memwal upgrade`` did (or would do)."""
    if report.outcome == "noop":
        return f"{report.uri} is current: nothing to upgrade"
    if report.outcome == "purged" or (report.outcome == "dry-run" and report.plan is None):
        verb = "removed" if report.outcome == "purged" else "would remove"
        names = ", ".join(report.purged) or "nothing (none finished longer ago than the grace period)"
        return f"{verb} old bases of upgrade(s): {names}"
    if report.outcome == "dry-run" and report.plan is not None:
        return "\n".join([f"would upgrade {report.uri}:"] + [f"  {i}. {s}" for i, s in enumerate(report.plan.steps(), 1)])
    return "\n".join([
        f"upgraded {report.uri} in {report.seconds:.1f}s: base v{report.base_version_before} -> "
        f"v{report.base_version_after} without stable row ids, {report.rows} rows",
        f"views recreated: {', '.join(report.views_recreated) or 'none'}",
        f"old base kept in {report.moved_aside} (remove with `memwal upgrade --purge`)",
    ])


def render_health(report: HealthReport) -> str:
    """``memwal health``: one line per check, then the verdict."""
    lines = [f"table {report.uri}"]
    for c in report.checks:
        verdict = "ok" if c.ok else "not checked" if c.ok is None else "FAILED"
        lines.append(f"  {c.name:<12} {verdict:<12} {c.detail}")
    lines.append("healthy" if report.ok else "UNHEALTHY: " + ", ".join(c.name for c in report.checks if c.ok is False))
    return "\n".join(lines)
