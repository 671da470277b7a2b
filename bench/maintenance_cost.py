"""What one maintenance cycle costs on a large table: one index segment against tiered segments.

The hour-long soak (docs/bench-log/soak.md, "Soak") saw the maintenance cycle grow from 2.2 to 13.3 s
as the table grew from 1M to 18.4M rows, mostly because every index catch-up rewrote the whole
BTREE (157 MB at 18.7M rows) and base-file compaction kept rewriting big fragments. This script
takes a large table (``--table``: e.g. the soak's workdir table, copied, never modified; or
``--base-rows`` to make one), and for each configuration, on its own copy, runs ``--cycles``
cycles of: write ``--rows-per-cycle`` upserts (half updates of existing ids, half new) through
memwal's shard writers, flush, and one maintenance cycle. It prints per configuration the
median cycle, index catch-up and base-file compaction seconds, bytes written under ``_indices``,
the index segments and fragments left, and the ratios of the tiered configuration to the
baseline (the policy before issue 15's change: one segment, rewritten every catch-up; deleted
fragments rewritten from 10%; no bound on rows rewritten per cycle).

Run: ``python bench/maintenance_cost.py --table /path/to/soaked/table --cycles 12``
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass

from memwal.core.runtime import configure_process  # noqa: E402

configure_process()  # Lance's log filter, before Lance is imported

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import git_rev, machine, today  # noqa: E402
from keepup import SCHEMA, base_table, disk_bytes  # noqa: E402

from memwal import Table  # noqa: E402
from memwal.maintain.gc import GcConfig  # noqa: E402
from memwal.core.indexes import SegmentPolicy, segment_rows  # noqa: E402
from memwal.maintain.maintenance import Maintenance, MaintenanceConfig  # noqa: E402


@dataclass(frozen=True)
class Setup:
    name: str
    policy: SegmentPolicy
    config: MaintenanceConfig


def setups() -> list[Setup]:
    common = dict(flush_stranded_after_seconds=None, views=False, gc_config=GcConfig(reader_grace_seconds=60.0))
    return [
        Setup(
            "one segment (before)",
            SegmentPolicy(max_segments=1),
            MaintenanceConfig(max_deleted_fraction=0.1, max_rows_rewritten_per_cycle=1 << 62, **common),
        ),
        Setup("tiered segments", SegmentPolicy(), MaintenanceConfig(**common)),
    ]


def upserts(rng: np.random.Generator, n: int, next_id: int, max_id: int) -> pa.Table:
    """Half updates of random existing ids, half new ids from ``next_id``."""
    upd = rng.choice(max_id, n // 2, replace=False)
    ids = np.concatenate([upd, np.arange(next_id, next_id + n - n // 2)]).astype(np.int64)
    return pa.table(
        {"id": ids, "val": rng.random(n), "name": [f"name-{i:012d}-upd" for i in ids]},
        schema=SCHEMA,
    )


def index_bytes(uri: str) -> int:
    return disk_bytes(os.path.join(uri, "_indices"))


def run(setup: Setup, source: str, work: str, args: argparse.Namespace) -> dict:
    uri = os.path.join(work, "t")
    shutil.rmtree(uri, ignore_errors=True)
    shutil.copytree(source, uri)
    table = Table.open(uri)
    m = Maintenance(table.state, setup.config)
    m.indexes.policy = setup.policy
    m.run_cycle()  # settle whatever the source left pending
    rng = np.random.default_rng(1)
    next_id = table.state.dataset().count_rows() * 4  # above any id the source holds
    rows = []
    for c in range(args.cycles):
        table.write(upserts(rng, args.rows_per_cycle, next_id, args.update_ids))
        next_id += args.rows_per_cycle
        table.flush()
        idx_before, idx_s = index_bytes(uri), m.indexes.seconds
        t0 = time.perf_counter()
        report = m.run_cycle()
        seconds = time.perf_counter() - t0
        ds = table.state.dataset()
        rows.append(
            dict(
                cycle=seconds,
                index_s=m.indexes.seconds - idx_s,
                index_growth=max(0, index_bytes(uri) - idx_before),
                fragments_compacted=report.base_fragments_compacted,
                segments=len(segment_rows(ds, "id_idx")),
                fragments=len(ds.get_fragments()),
            )
        )
        print(f"  {setup.name} cycle {c}: {seconds:.2f}s (index {rows[-1]['index_s']:.2f}s), "
              f"{rows[-1]['segments']} segments, {rows[-1]['fragments']} fragments, "
              f"{report.base_fragments_compacted} fragments compacted", flush=True)
    table.close()
    out = dict(
        cycle_p50=statistics.median(r["cycle"] for r in rows),
        cycle_max=max(r["cycle"] for r in rows),
        index_p50=statistics.median(r["index_s"] for r in rows),
        index_written_mb=sum(r["index_growth"] for r in rows) / 1e6,
        segments_max=max(r["segments"] for r in rows),
        fragments_end=rows[-1]["fragments"],
        disk_mb=disk_bytes(uri) / 1e6,
    )
    shutil.rmtree(uri, ignore_errors=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--table", help="a large memwal table to copy (left untouched)")
    p.add_argument("--base-rows", type=int, default=5_000_000, help="without --table: make a base of this many rows")
    p.add_argument("--cycles", type=int, default=12)
    p.add_argument("--rows-per-cycle", type=int, default=50_000, help="a 5-s cycle at 10k rows/s")
    p.add_argument("--update-ids", type=int, default=1_000_000, help="updates pick ids below this")
    p.add_argument("--workdir")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    work = args.workdir or tempfile.mkdtemp(prefix="memwal-bench-mcost-")
    source = args.table
    if source is None:
        source = os.path.join(work, "source")
        if not os.path.exists(source):
            Table.create(source, SCHEMA, ["id"], "bucket(id, 4)", initial_data=base_table(args.base_rows)).close()
            Maintenance(source, MaintenanceConfig(flush_stranded_after_seconds=None, views=False)).run_cycle()
    rows = Table.open(source).state.dataset().count_rows()
    print(f"maintenance cost, {today()}, {machine()}, commit {git_rev()}; table of {rows:,} rows, "
          f"{args.cycles} cycles of {args.rows_per_cycle:,} upserts")
    results = {}
    for s in setups():
        results[s.name] = run(s, source, work, args)
    print()
    names = list(results)
    print(f"| | {' | '.join(names)} | ratio |")
    print("|---|" + "---|" * (len(names) + 1))
    for key in ("cycle_p50", "cycle_max", "index_p50", "index_written_mb", "segments_max", "fragments_end", "disk_mb"):
        a, b = results[names[0]][key], results[names[1]][key]
        ratio = f"{b / a:.2f}x" if a else "-"
        print(f"| {key} | {a:,.2f} | {b:,.2f} | {ratio} |")
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
