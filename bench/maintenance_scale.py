"""Compacting a large table: one process, against shards compacted side by side.

Before building distributed maintenance (issue 35), measure what one process takes: a
``--base-rows`` base (id, val, name: the compaction bench's narrow rows, so 50M rows fit
this machine's disk and memory), ``--shards`` shards, ``--sstables`` uncompacted SSTables a
shard (each flush upserts ``--rows-per-flush`` rows, half updates of base keys, half new), then

1. **one process**: ``Compactor.run_once()`` (each round commits every shard's next run in
   one ``merge_insert``), timed, with its commits and rows;
2. **side by side**: ``--workers`` processes, each compacting its share of the shards with
   its own commits (what executors compacting shards in parallel would do), timed from start
   to the last one's end, with the commits each lost to the others (Lance's commit conflicts,
   retried by the compactor).

Each case runs on its own copy of the same table; both end reading the same rows (checked).
The table is made once and kept under ``--cache-dir``.

Run: ``python bench/maintenance_scale.py [--base-rows 50000000] [--shards 16] [--sstables 64]``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import sys
import time

from memwal.core.runtime import configure_process

configure_process()

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import git_rev, machine, report, today  # noqa: E402

from memwal import Table, readers  # noqa: E402
from memwal.maintain.compactor import Compactor  # noqa: E402
from memwal.core.metadata import Bounds  # noqa: E402
from memwal.core.state import TableState  # noqa: E402

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("val", pa.float64()), pa.field("name", pa.string())])

#: base rows written per Lance append while building (bounds the builder's memory)
CHUNK = 5_000_000


def rows(ids: np.ndarray, rng: np.random.Generator, tag: str) -> pa.Table:
    ids_arr = pa.array(ids, pa.int64())
    name = pc.binary_join_element_wise(f"{tag}-", pc.cast(ids_arr, pa.string()), "")
    return pa.table({"id": ids_arr, "val": rng.random(len(ids)), "name": name}, schema=SCHEMA)


def build(cache: str, base: int, shards: int, sstables: int, per_flush: int) -> str:
    import lance

    uri = os.path.join(cache, f"maint-{base}-{shards}-{sstables}-{per_flush}")
    if os.path.exists(os.path.join(uri, ".done")):
        return uri
    shutil.rmtree(uri, ignore_errors=True)
    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    first = min(base, CHUNK)
    # Unbounded: the table is built with every SSTable pending, beyond the write stall.
    Table.create(uri, SCHEMA, ["id"], f"bucket(id, {shards})", initial_data=rows(np.arange(first), rng, "base"),
                 bounds=Bounds.unbounded()).close()
    for start in range(first, base, CHUNK):
        lance.write_dataset(rows(np.arange(start, min(base, start + CHUNK)), rng, "base"), uri, mode="append")
    print(f"base of {base:,} rows in {time.perf_counter() - t0:.0f}s")
    with Table.open(uri) as t:
        fresh = base
        for g in range(sstables):
            half = per_flush // 2
            updates = rng.choice(base, half, replace=False)
            new = np.arange(fresh, fresh + per_flush - half)
            fresh += len(new)
            t.write(rows(np.concatenate([updates, new]), rng, f"g{g}"))
            t.flush()
    open(os.path.join(uri, ".done"), "w").close()
    print(f"{sstables} SSTables x {shards} shards written; table ready in {time.perf_counter() - t0:.0f}s")
    return uri


def _compact(uri: str, shard_ids: list[str], out: "multiprocessing.Queue") -> None:
    configure_process()
    c = Compactor(TableState.load(uri))
    t0 = time.perf_counter()
    done = c.compact_shards(shard_ids)
    out.put({"seconds": time.perf_counter() - t0, "commits": len({r.base_version for r in done}), "results": len(done),
             "lost_races": c.stats.lost_races})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-rows", type=int, default=50_000_000)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--sstables", type=int, default=64, help="uncompacted SSTables per shard")
    p.add_argument("--rows-per-flush", type=int, default=32_000, help="rows per flush, over all shards")
    p.add_argument("--workers", type=int, default=2, help="processes compacting shards side by side")
    p.add_argument("--cache-dir", default=os.path.expanduser("~/.cache/memwal-bench"))
    p.add_argument("--json")
    args = p.parse_args()
    os.makedirs(args.cache_dir, exist_ok=True)
    results: dict = {"date": today(), "machine": machine(), "commit": git_rev(), "args": vars(args)}
    source = build(args.cache_dir, args.base_rows, args.shards, args.sstables, args.rows_per_flush)
    work = os.path.join(args.cache_dir, "maint-work")
    scans = {}
    for case in ("one process", "side by side"):
        shutil.rmtree(work, ignore_errors=True)
        uri = shutil.copytree(source, work, ignore=shutil.ignore_patterns(".done"))
        shard_ids = sorted(TableState.load(uri).manifests.list_shards())
        if case == "one process":
            c = Compactor(TableState.load(uri))
            t0 = time.perf_counter()
            done = c.run_once()
            seconds = time.perf_counter() - t0
            commits = len({r.base_version for r in done})
            upserted = sum(r.rows_upserted for r in done)
            results["one_process"] = {"seconds": seconds, "commits": commits, "rows_upserted": upserted}
            print(f"one process: {seconds:7.1f} s, {commits} commits, {upserted:,} rows into the base "
                  f"({upserted / seconds:,.0f} rows/s)")
        else:
            ctx = multiprocessing.get_context("spawn")
            out = ctx.Queue()
            shares = [shard_ids[i::args.workers] for i in range(args.workers)]
            procs = [ctx.Process(target=_compact, args=(uri, share, out)) for share in shares]
            t0 = time.perf_counter()
            for proc in procs:
                proc.start()
            got = [out.get() for _ in procs]
            for proc in procs:
                proc.join()
            seconds = time.perf_counter() - t0
            results["side_by_side"] = {"seconds": seconds, "workers": got}
            print(f"{args.workers} processes side by side: {seconds:7.1f} s "
                  f"({results['one_process']['seconds'] / seconds:.2f}x one process); each: "
                  + "; ".join(f"{g['seconds']:.1f} s, {g['commits']} commits" for g in got))
        scans[case] = readers.open(uri).scan(columns=["id", "val"]).sort_by("id")
    assert scans["one process"].equals(scans["side by side"]), "the two compactions disagree"
    shutil.rmtree(work, ignore_errors=True)
    report(results, args.json)


if __name__ == "__main__":
    main()
