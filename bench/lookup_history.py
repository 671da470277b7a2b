"""Lookups and update history: base tables with stable row ids against without, in one run.

Two memwal tables, identical but for the base table's stable row ids (on: the layout of
tables made before views were fed by compaction; off: tables made now). Each gets a
``--base-rows`` base (BTREE on ``id``), then ``--commits`` rounds of ``--commit-rows`` rows
(half updates of random existing ids, half new ids) written, flushed and compacted: one
``merge_insert`` commit each, as in production, each followed by the rest of a maintenance
cycle (index catch-up, and the base-file compaction that merges small fragments and
materializes deletions once 32 small fragments pile up); ``--cycle compactor`` runs the
compactor alone, as this benchmark first did. Measured on both:

1. point lookups on the base table (``id = k`` through the BTREE) p50/p99, before, every
   ``--probe-every`` commits and after the commits (with stable row ids a lookup scans the
   row-id sequence of every fragment ``merge_insert`` rewrote, so it slows down with update
   history; without, a lookup costs ~10 ns per deleted row of the fragment it reads, which
   the base-file compaction bounds);
2. the base manifest's size and the mean compaction commit time;
3. reading the change of the last ``--change-commits`` commits, what a view refresh reads:
   Lance's ``delta()`` on the stable-row-id table (the previous views' feed) against the
   compacted SSTables (:func:`memwal.views.changes.read_changes`, today's feed) on the other.

Run: ``python bench/lookup_history.py`` (defaults: 1M rows, 100 commits of 10k rows).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from memwal.core.runtime import configure_process  # noqa: E402

configure_process()  # Lance's log filter, before Lance is imported

import lance  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import git_rev, machine, pct, report, today, work_dir  # noqa: E402

from memwal import Table  # noqa: E402
from memwal.maintain.compactor import Compactor  # noqa: E402
from memwal.core.indexes import IndexMaintainer  # noqa: E402
from memwal.maintain.maintenance import Maintenance, MaintenanceConfig  # noqa: E402
from memwal.readers.points import base_point_read  # noqa: E402
from memwal.views import changes  # noqa: E402
from memwal.views.refresh import Delta  # noqa: E402

SCHEMA = pa.schema([("id", pa.int64()), ("val", pa.float64()), ("name", pa.string())])


def rows(ids: np.ndarray, tag: str, rng: np.random.Generator) -> pa.Table:
    return pa.table(
        {"id": pa.array(ids, pa.int64()), "val": pa.array(rng.random(len(ids))), "name": pa.array([f"{tag}-{i}" for i in ids])},
        schema=SCHEMA,
    )


def make(uri: str, base: int, stable_row_ids: bool) -> Table:
    """A memwal table; with ``stable_row_ids`` as the previous version made them."""
    write = lance.write_dataset
    if stable_row_ids:
        lance.write_dataset = lambda *a, **k: write(*a, **{**k, "enable_stable_row_ids": True})  # type: ignore[assignment]
    try:
        return Table.create(uri, SCHEMA, ["id"], "bucket(id, 1)", initial_data=rows(np.arange(base), "base", np.random.default_rng(0)))
    finally:
        lance.write_dataset = write  # type: ignore[assignment]


def lookups(uri: str, keys: np.ndarray, memwal_path: bool = False) -> list[float]:
    """Point lookups through the BTREE: Lance's own live read, or (``memwal_path``) the read
    memwal's readers make of the base, which drops deleted versions itself."""
    ds = lance.dataset(uri)
    out = []
    for k in keys:
        t0 = time.perf_counter()
        got = base_point_read(ds, SCHEMA.names, f"id = {int(k)}") if memwal_path else ds.to_table(filter=f"id = {int(k)}")
        out.append(time.perf_counter() - t0)
        assert got.num_rows == 1
    return out


def deletions(uri: str) -> tuple[int, int]:
    """Base fragments, and the most deleted rows any one of them carries."""
    frags = lance.dataset(uri).get_fragments()
    return len(frags), max((f.metadata.deletion_file.num_deleted_rows for f in frags if f.metadata.deletion_file), default=0)


def manifest_bytes(uri: str) -> int:
    d = os.path.join(uri, "_versions")
    newest = max((os.path.join(d, n) for n in os.listdir(d) if n.endswith(".manifest")), key=os.path.getmtime)
    return os.path.getsize(newest)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-rows", type=int, default=1_000_000)
    ap.add_argument("--commits", type=int, default=100)
    ap.add_argument("--commit-rows", type=int, default=10_000)
    ap.add_argument("--change-commits", type=int, default=10, help="commits in the change a view refresh reads")
    ap.add_argument("--lookups", type=int, default=300)
    ap.add_argument("--probe-every", type=int, default=25, help="commits between lookup probes (100 keys)")
    ap.add_argument("--cycle", choices=["maintenance", "compactor"], default="maintenance",
                    help="after each write: a maintenance cycle (no GC or views) or the compactor alone")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rng = np.random.default_rng(1)
    results: dict = {"date": today(), "machine": machine(), "commit": git_rev(), "args": vars(args)}
    with work_dir(args.dir, "memwal-lookup-history-") as work:
        tables = {name: make(os.path.join(work, name), args.base_rows, on) for name, on in (("stable", True), ("plain", False))}
        probe = rng.choice(args.base_rows, args.lookups, replace=False)
        for name, t in tables.items():
            lookups(t.uri, probe[:20])  # warm up
            results[f"{name}_lookup_0"] = lookups(t.uri, probe)
        cfg = MaintenanceConfig(gc=False, views=False, flush_stranded_after_seconds=None)
        cycles = {name: Maintenance(t.state, cfg) for name, t in tables.items()}
        results["probes"] = {name: [] for name in tables}
        versions: dict[str, list[int]] = {name: [] for name in tables}
        commit_seconds: dict[str, list[float]] = {name: [] for name in tables}
        next_id = args.base_rows
        for c in range(args.commits):
            half = args.commit_rows // 2
            ids = np.concatenate([rng.choice(next_id, half, replace=False), next_id + np.arange(half)])
            next_id += half
            batch = rows(ids, f"c{c}", rng)
            for name, t in tables.items():
                versions[name].append(t.state.dataset().version)
                t.write(batch)
                t.flush()
                if args.cycle == "compactor":
                    t0 = time.perf_counter()
                    Compactor(t.state).run_once()
                    commit_seconds[name].append(time.perf_counter() - t0)
                else:
                    r = cycles[name].run_cycle()
                    commit_seconds[name].append(r.rows_compacted / r.rows_per_second if r.rows_per_second else 0.0)  # compaction's own time
                if (c + 1) % args.probe_every == 0:
                    took = lookups(t.uri, probe[:100])
                    results["probes"][name].append((c + 1, pct(took, 50) * 1000, *deletions(t.uri)))
            if (c + 1) % 10 == 0:
                print(f"  {c + 1}/{args.commits} commits: " + ", ".join(
                    f"{n} {np.mean(commit_seconds[n][-10:]):.2f}s/commit" for n in tables), flush=True)
        for name, t in tables.items():
            IndexMaintainer(t.state).catch_up()  # as maintenance does: the BTREE covers every fragment
            lookups(t.uri, probe[:20])
            results[f"{name}_lookup_n"] = lookups(t.uri, probe)
            results[f"{name}_manifest_bytes"] = manifest_bytes(t.uri)
            results[f"{name}_fragments"], results[f"{name}_max_deleted"] = deletions(t.uri)
            results[f"{name}_commit_s"] = commit_seconds[name]
        # the yardstick: the same live rows written fresh into a plain Lance table with a BTREE;
        # and memwal's own base read on the table made now (it drops deleted versions itself)
        fresh = lance.write_dataset(lance.dataset(tables["plain"].uri).to_table(), os.path.join(work, "fresh"))
        fresh.create_scalar_index("id", "BTREE")
        lookups(fresh.uri, probe[:20])
        lookups(tables["plain"].uri, probe[:20], memwal_path=True)
        results["fresh_lookup"], results["plain_memwal_lookup"] = [], []
        for i in range(0, len(probe), 50):  # alternating, so load changes hit both alike
            results["fresh_lookup"] += lookups(fresh.uri, probe[i:i + 50])
            results["plain_memwal_lookup"] += lookups(tables["plain"].uri, probe[i:i + 50], memwal_path=True)
        # the change of the last --change-commits commits, as a refresh reads it
        stable, plain = tables["stable"], tables["plain"]
        since = versions["stable"][-args.change_commits]
        t0 = time.perf_counter()
        d = Delta.read(stable.state.dataset(), since)
        results["delta_s"] = time.perf_counter() - t0
        results["delta_rows"] = d.changed.num_rows + d.deleted
        since = versions["plain"][-args.change_commits]
        t0 = time.perf_counter()
        k = changes.read_changes(plain.state, changes.folded_through(plain.state, since), plain.state.dataset(), SCHEMA.names)
        results["sstables_s"] = time.perf_counter() - t0
        results["sstables_rows"] = k.rows.num_rows
        for t in tables.values():
            t.close()

    def ms(v: list[float], p: float) -> float:
        return pct(v, p) * 1000

    print(f"\nbase {args.base_rows:,} rows, {args.commits} compaction commits of {args.commit_rows:,} rows (half updates), "
          f"each followed by {'a maintenance cycle' if args.cycle == 'maintenance' else 'nothing (compactor alone)'}")
    print("| base table | lookup p50 / p99, 0 commits | after | manifest | compaction commit (mean, last 10) | fragments (most deleted rows in one) |")
    print("|---|---|---|---|---|---|")
    for name, label in (("stable", "stable row ids (previous layout)"), ("plain", "no stable row ids (now)")):
        a, b = results[f"{name}_lookup_0"], results[f"{name}_lookup_n"]
        print(
            f"| {label} | {ms(a, 50):.2f} / {ms(a, 99):.2f} ms | {ms(b, 50):.2f} / {ms(b, 99):.2f} ms | "
            f"{results[f'{name}_manifest_bytes'] / 1024:.0f} KB | {np.mean(results[f'{name}_commit_s'][-10:]):.2f} s | "
            f"{results[f'{name}_fragments']} ({results[f'{name}_max_deleted']:,}) |"
        )
    print(f"lookup p50 (ms) every {args.probe_every} commits [base fragments, most deleted rows in one]:")
    for name in ("stable", "plain"):
        print(f"  {name}: " + ", ".join(f"{c}: {p50:.2f} [{nf}, {nd:,}]" for c, p50, nf, nd in results["probes"][name]))
    a, b = results["plain_memwal_lookup"], results["fresh_lookup"]
    print(f"| no stable row ids, memwal's base read (deleted versions dropped by memwal) | | {ms(a, 50):.2f} / {ms(a, 99):.2f} ms | | | |")
    print(f"| the same live rows written fresh, BTREE | | {ms(b, 50):.2f} / {ms(b, 99):.2f} ms | | | |")
    print(f"lookup p50 after the commits: memwal's base read / fresh table = {ms(a, 50) / ms(b, 50):.2f}x (target <= 2x); "
          f"Lance's live read / fresh = {ms(results['plain_lookup_n'], 50) / ms(b, 50):.2f}x")
    ratio = ms(results["stable_lookup_n"], 50) / ms(results["plain_lookup_n"], 50)
    print(f"lookup p50 after the commits: stable row ids / none = {ratio:.1f}x")
    print(
        f"change of the last {args.change_commits} commits: delta() {results['delta_s']:.3f} s "
        f"({results['delta_rows']:,} rows) vs SSTables {results['sstables_s']:.3f} s ({results['sstables_rows']:,} rows): "
        f"{results['delta_s'] / results['sstables_s']:.1f}x"
    )
    report(results, args.json)


if __name__ == "__main__":
    main()
