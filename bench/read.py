"""Read benchmark: memwal's reader against a plain Lance table, in one run.

1. point lookups p50/p99 on a ``--base-rows`` table with 0, 10 and 100 uncompacted SSTables
   (one shard, so a lookup sees all of them), against a plain Lance table with a BTREE on
   the key and no MemWAL;
2. full deduplicated scan rows/s, same tables (median of 5 scans by fresh readers; the
   ratio to memwal's own compacted table, 0 SSTables, is the "scans stay fast" target);
3. vector search latency and recall@10 against exact brute force, on a ``--vector-rows``
   table with an IVF_PQ index, with SSTables on top;
4. the indexed read plan: vector search while the base index lags behind compaction,
   memwal's plan (the compacted SSTables' own indexes for the gap) against Lance's own
   search of the base (flat scan of the unindexed fragments).

Run: ``python bench/read.py``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from memwal.runtime import configure_process  # noqa: E402

configure_process()  # Lance's log filter, before Lance is imported

import lance  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import DIM, SCHEMA, base_rows, git_rev, machine, pct, report, today, work_dir  # noqa: E402

from memwal import Bounds, Table, WriterConfig, readers  # noqa: E402
from memwal.compactor import Compactor  # noqa: E402


def update_rows(rng: np.random.Generator, ids: np.ndarray) -> pa.Table:
    n = len(ids)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "val": pa.array(rng.random(n)),
            "name": pa.array([f"name-{i:012d}-upd" for i in ids]),
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(rng.random(n * DIM, dtype=np.float32)), DIM),
        },
        schema=SCHEMA,
    )


def add_sstables(table: Table, count: int, rows_each: int, base: int, rng: np.random.Generator) -> None:
    """``count`` flushes of ``rows_each`` rows (half updates, half new ids): one SSTable each."""
    for i in range(count):
        ids = np.concatenate([rng.choice(base, rows_each // 2, replace=False), base + i * rows_each + np.arange(rows_each // 2)])
        table.write(update_rows(rng, ids))
        table.flush()


def time_calls(fn, args: list) -> list[float]:
    out = []
    for a in args:
        t0 = time.perf_counter()
        fn(a)
        out.append(time.perf_counter() - t0)
    return out


def scan_rate(uri: str, plain: bool = False, runs: int = 5) -> dict[str, float]:
    """Live rows/s of a full scan of three columns, medians of ``runs`` scans: by fresh
    readers (SSTables opened and read as a new reader would; the OS page cache is warm for
    every table alike), in wall-clock time and in the process's CPU time (every thread's:
    on a machine shared with other work CPU time is the steadier measure of the work), and
    by one long-lived reader (its SSTable cache warm, as a serving process's is)."""
    wall, cpu, warm = [], [], []

    def one(reader) -> int:
        if plain:
            return lance.dataset(uri).to_table(columns=["id", "val", "name"]).num_rows
        return reader.scan(columns=["id", "val", "name"]).num_rows

    kept = None if plain else readers.open(uri, refresh_interval_ms=None)
    for _ in range(runs):
        t0, c0 = time.perf_counter(), time.process_time()
        rows = one(None if plain else readers.open(uri, refresh_interval_ms=None))
        wall.append(rows / (time.perf_counter() - t0))
        cpu.append(rows / (time.process_time() - c0))
        t0 = time.perf_counter()
        one(kept)
        warm.append(rows / (time.perf_counter() - t0))
    return {"fresh": pct(wall, 50), "fresh_cpu": pct(cpu, 50), "warm": pct(warm, 50)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-rows", type=int, default=1_000_000)
    p.add_argument("--lookups", type=int, default=500)
    p.add_argument("--sstable-rows", type=int, default=2_000)
    p.add_argument("--vector-rows", type=int, default=200_000)
    p.add_argument("--queries", type=int, default=50)
    p.add_argument("--gap-sstables", type=int, default=10, help="flushes (x4 shards) compacted but not indexed, for part 4")
    p.add_argument("--gap-sstable-rows", type=int, default=2_000, help="rows per flush in part 4")
    p.add_argument("--scans-only", action="store_true", help="parts 1 and 2 only (lookups and scans)")
    p.add_argument("--vectors-only", action="store_true", help="parts 3 and 4 only (vector search)")
    p.add_argument("--workdir")
    p.add_argument("--json")
    args = p.parse_args()
    results: dict = {"date": today(), "machine": machine(), "commit": git_rev(), "args": vars(args)}
    rng = np.random.default_rng(0)
    with work_dir(args.workdir, "memwal-bench-read-") as work:
        base = base_rows(args.vector_rows if args.vectors_only else args.base_rows)
        # No maintenance runs here: lift the write stall so 100 SSTables can pile up.
        no_stall = Bounds(slowdown_sstables=10**6, stop_sstables=10**6)
        if not args.vectors_only:
            plain_uri = os.path.join(work, "plain")
            plain = lance.write_dataset(base, plain_uri)
            plain.create_scalar_index("id", "BTREE")
            plain = lance.dataset(plain_uri)
            uri = os.path.join(work, "memwal")
            table = Table.create(uri, SCHEMA, ["id"], "unsharded", initial_data=base, bounds=no_stall,
                                 writer=WriterConfig(max_memtable_rows=100_000))
            keys = [int(k) for k in rng.integers(0, args.base_rows, args.lookups)]

            # 1 + 2: lookups and scans
            plain_lookup = lambda k: plain.to_table(filter=f"id = {k}", columns=["id", "val", "name"])  # noqa: E731
            plain_lat = time_calls(plain_lookup, keys)
            plain_scan = scan_rate(plain_uri, plain=True)
            results["plain"] = {"lookup_p50_ms": pct(plain_lat, 50) * 1000, "lookup_p99_ms": pct(plain_lat, 99) * 1000,
                                "scan_rows_per_s": plain_scan["fresh"]}
            print(f"{'table':36} {'lookup p50 / p99 ms':>20} {'x plain p50':>12} {'scan rows/s':>14}"
                  f"   compacted / this: fresh, CPU, warm")
            print(f"{'plain Lance + BTREE (no MemWAL)':36} {pct(plain_lat, 50) * 1000:9.2f} / {pct(plain_lat, 99) * 1000:6.2f} "
                  f"{1.0:12.2f} {plain_scan['fresh']:14,.0f}")
            results["memwal"] = []
            made = 0
            compacted_scan: dict[str, float] = {}
            for sstables in (0, 10, 100):
                add_sstables(table, sstables - made, args.sstable_rows, args.base_rows, rng)
                made = sstables
                reader = readers.open(uri, refresh_interval_ms=None)
                assert reader.snapshot.num_live_sstables == sstables
                reader.get(keys[0])  # warm the planner
                lat = time_calls(lambda k, r=reader: r.get(k, columns=["id", "val", "name"]), keys)
                scan = scan_rate(uri)
                ratio = pct(lat, 50) / pct(plain_lat, 50)
                compacted_scan = scan if sstables == 0 else compacted_scan
                # The scan target: within 1.5x of the compacted table's rows/s at 10 SSTables.
                slower = {k: compacted_scan[k] / scan[k] for k in scan}
                print(f"{f'memwal, {sstables} SSTables':36} {pct(lat, 50) * 1000:9.2f} / {pct(lat, 99) * 1000:6.2f} {ratio:12.2f} "
                      f"{scan['fresh']:14,.0f}   {slower['fresh']:.2f}, {slower['fresh_cpu']:.2f}, {slower['warm']:.2f}")
                results["memwal"].append({"sstables": sstables, "lookup_p50_ms": pct(lat, 50) * 1000, "lookup_p99_ms": pct(lat, 99) * 1000,
                                          "x_plain_p50": ratio, "scan_rows_per_s": scan["fresh"], "scan": scan, "scan_x_compacted": slower})

        if args.scans_only:
            report(results, args.json)
            return

        # 3: vector search
        vbase = base.slice(0, args.vector_rows)
        vuri = os.path.join(work, "vectors")
        vt = Table.create(vuri, SCHEMA, ["id"], "bucket(id, 4)", initial_data=vbase, bounds=no_stall)
        t0 = time.perf_counter()
        lance.dataset(vuri).create_index("vec", "IVF_PQ", num_partitions=64, num_sub_vectors=16)
        build = time.perf_counter() - t0
        add_sstables(vt, 3, args.sstable_rows, args.vector_rows, rng)  # 3 flushes x 4 shards
        live = readers.open(vuri).scan(columns=["id", "vec"])
        ids = live.column("id").to_numpy()
        mat = np.stack(live.column("vec").to_numpy(zero_copy_only=False)).astype(np.float32)
        queries = rng.random((args.queries, DIM), dtype=np.float32)
        r = readers.open(vuri, refresh_interval_ms=None)
        print(f"\nvector search, {args.vector_rows:,} rows + {r.snapshot.num_live_sstables} SSTables, IVF_PQ 64 partitions (built in {build:.0f}s)")
        results["vector"] = []

        def exact_ids(q: np.ndarray) -> set[int]:
            return set(ids[np.argsort(((mat - q) ** 2).sum(1))[:10]].tolist())

        truth = [exact_ids(q) for q in queries]
        for nprobes, overfetch in ((8, 1.0), (20, 1.0), (20, 4.0), (64, 4.0), (64, 16.0)):
            lat, recall = [], []
            for q, want in zip(queries, truth):
                t0 = time.perf_counter()
                got = r.search(q, k=10, nprobes=nprobes, columns=["id"], overfetch=overfetch)
                lat.append(time.perf_counter() - t0)
                recall.append(len(set(got.column("id").to_pylist()) & want) / 10)
            p50, p99 = pct(lat, 50) * 1000, pct(lat, 99) * 1000
            print(f"  nprobes {nprobes:3}, overfetch {overfetch:4.0f}: p50 {p50:6.1f} ms  p99 {p99:6.1f} ms  recall@10 {np.mean(recall):.3f}")
            results["vector"].append({"nprobes": nprobes, "overfetch": overfetch, "p50_ms": pct(lat, 50) * 1000,
                                      "p99_ms": pct(lat, 99) * 1000, "recall_at_10": float(np.mean(recall))})

        # 3b: what scoring small SSTables exactly costs: the default plan against the SSTables'
        # own indexes only, alternating query by query, nprobes 20 and overfetch 4.
        import memwal.readers.reader as reader_module

        exact_default = reader_module.EXACT_SSTABLE_MAX_ROWS
        took: dict[str, list[float]] = {"exact": [], "indexes": []}
        hits: dict[str, list[float]] = {"exact": [], "indexes": []}
        for i, (q, want) in enumerate(zip(queries, truth)):
            for name in (("exact", "indexes") if i % 2 == 0 else ("indexes", "exact")):
                reader_module.EXACT_SSTABLE_MAX_ROWS = exact_default if name == "exact" else 0
                t0 = time.perf_counter()
                got = r.search(q, k=10, nprobes=20, columns=["id"], overfetch=4.0)
                took[name].append(time.perf_counter() - t0)
                hits[name].append(len(set(got.column("id").to_pylist()) & want) / 10)
        reader_module.EXACT_SSTABLE_MAX_ROWS = exact_default
        print(f"  small SSTables (< {exact_default:,} rows) scored exactly (the default) against by their indexes only, nprobes 20, overfetch 4:")
        for name in ("exact", "indexes"):
            print(f"    {name:8} p50 {pct(took[name], 50) * 1000:6.1f} ms  p99 {pct(took[name], 99) * 1000:6.1f} ms  recall@10 {np.mean(hits[name]):.3f}")
        results["exact_small_sstables"] = {n: {"p50_ms": pct(took[n], 50) * 1000, "p99_ms": pct(took[n], 99) * 1000,
                                               "recall_at_10": float(np.mean(hits[n]))} for n in took}

        # 4: the indexed read plan while the base index lags behind compaction
        add_sstables(vt, args.gap_sstables, args.gap_sstable_rows, args.vector_rows, rng)
        Compactor(vt.state).run_once()  # everything compacted; the IVF index does not cover it yet
        ds = lance.dataset(vuri)
        unindexed = ds.stats.index_stats("vec_idx")["num_unindexed_rows"]
        live = readers.open(vuri).scan(columns=["id", "vec"])
        ids = live.column("id").to_numpy()
        mat = np.stack(live.column("vec").to_numpy(zero_copy_only=False)).astype(np.float32)
        truth = [exact_ids(q) for q in queries]
        r = readers.open(vuri, refresh_interval_ms=None)
        gap = r.snapshot.with_index_gap("vec_idx").num_live_sstables
        print(f"\nindex lagging by {gap} compacted SSTables ({unindexed:,} unindexed base rows), nprobes 20, overfetch 4:")
        results["index_gap"] = {"gap_sstables": gap, "unindexed_rows": unindexed}
        default = reader_module.GAP_PLAN_MIN_ROWS_PER_SSTABLE
        for name, threshold in (("gap SSTables' indexes", 0), ("exact scan of unindexed base", 10**12), ("automatic choice", default)):
            reader_module.GAP_PLAN_MIN_ROWS_PER_SSTABLE = threshold
            lat, recall = [], []
            for q, want in zip(queries, truth):
                t0 = time.perf_counter()
                got = r.search(q, k=10, nprobes=20, columns=["id"])
                lat.append(time.perf_counter() - t0)
                recall.append(len(set(got.column("id").to_pylist()) & want) / 10)
            label = f"{name} ({r.last_vector_plan})" if threshold == default else name
            print(f"  {label:44} p50 {pct(lat, 50) * 1000:6.1f} ms  p99 {pct(lat, 99) * 1000:6.1f} ms  recall@10 {np.mean(recall):.3f}")
            results["index_gap"][name] = {"p50_ms": pct(lat, 50) * 1000, "p99_ms": pct(lat, 99) * 1000, "recall_at_10": float(np.mean(recall))}
        reader_module.GAP_PLAN_MIN_ROWS_PER_SSTABLE = default
    report(results, args.json)


if __name__ == "__main__":
    main()
