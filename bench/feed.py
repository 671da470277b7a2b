"""Change-feed benchmark: changes read per second, and what the feed costs ingest and GC, in one run.

A ``--base-rows`` memwal table (the workload's schema, 64-dim vectors); then ``--generations``
flushed generations of ``--changes`` rows each (80% updates of base keys, 10% new keys, 10%
deletes), every other one compacted into the base. Measured:

- **read**: the feed from before the first generation to the last flush (before-images
  included), against the baseline of reading the same SSTables raw, newest row per key
  (:func:`memwal.readers.feed.net_changes`, what a consumer without before-images reads);
- **ingest**: writing, flushing and compacting the generations with a registered consumer
  that reads each new generation and commits (the pattern of a Spark stream on the feed),
  against the same without a consumer;
- **GC**: a GC pass with one registered consumer against one with ``--consumers`` more (all
  holding every generation), and the SSTable bytes they hold.

Run: ``python bench/feed.py``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from memwal.core.runtime import configure_process  # noqa: E402

configure_process()  # Lance's log filter, before Lance is imported

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import SCHEMA, base_rows, git_rev, machine, report, today, work_dir  # noqa: E402

from memwal import Table  # noqa: E402
from memwal.core import paths  # noqa: E402
from memwal.readers import feed  # noqa: E402
from memwal.maintain.compactor import Compactor  # noqa: E402
from memwal.maintain.gc import GarbageCollector, GcConfig  # noqa: E402
from memwal.core.indexes import IndexMaintainer  # noqa: E402

NOW = GcConfig(reader_grace_seconds=0, manifest_retention_seconds=0, base_version_retention_seconds=0, drain_interval_seconds=0,
               time_travel_seconds=0, min_sstables_to_drain=1)


def generation(base: pa.Table, n_base: int, n: int, g: int, rng: np.random.Generator) -> tuple[pa.Table, pa.Table]:
    """One generation's upserts and deleted keys."""
    ups = rng.choice(n_base, int(n * 0.8), replace=False)
    rows = base.take(pa.array(ups)).set_column(1, "val", pa.array(rng.random(len(ups))))
    fresh = base.slice(0, n // 10).set_column(0, "id", pa.array(np.arange(n // 10) + n_base + g * n, pa.int64()))
    dead = pa.table({"id": pa.array(rng.choice(n_base, n // 10, replace=False), pa.int64())})
    return pa.concat_tables([rows, fresh]), dead


def ingest(uri: str, base: pa.Table, args: argparse.Namespace, consumer: bool) -> tuple[float, float, int, int]:
    """Seconds to write the generations (and, with a consumer, to read and commit each);
    seconds of that spent in the feed; change rows read; the base version before them."""
    t = Table.create(uri, SCHEMA, ["id"], "bucket(id, 4)", initial_data=base)
    before = t.dataset().version
    rng = np.random.default_rng(7)
    c = feed.Consumer(t.state, "bench") if consumer else None
    pos = c.commit(feed.start_at(t.state, t.dataset().version)) if c else None
    in_feed = 0.0
    rows = 0
    t0 = time.perf_counter()
    for g in range(args.generations):
        up, dead = generation(base, args.base_rows, args.changes, g, rng)
        t.write(up)
        t.delete(dead)
        t.flush()
        if g % 2:
            Compactor(t.state).run_once()
        if c is not None:
            f0 = time.perf_counter()
            r = feed.FeedReader(t.state, pos)
            end = feed.head(t.state)
            rows += r.read(end).num_rows
            pos = c.commit(r.end_position(end))
            in_feed += time.perf_counter() - f0
    seconds = time.perf_counter() - t0
    t.close()
    return seconds, in_feed, rows, before


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-rows", type=int, default=200_000)
    ap.add_argument("--generations", type=int, default=8)
    ap.add_argument("--changes", type=int, default=10_000)
    ap.add_argument("--consumers", type=int, default=5)
    ap.add_argument("--work", help="directory for the tables (default: a temporary one)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    base = base_rows(args.base_rows)
    results: dict = {"date": today(), "machine": machine(), "commit": git_rev(), "args": vars(args)}
    with work_dir(args.work, "memwal-bench-feed-") as work:
        plain, _, _, before = ingest(f"{work}/plain", base, args, consumer=False)
        fed, in_feed, streamed, _ = ingest(f"{work}/fed", base, args, consumer=True)
        results["ingest"] = {"seconds_without_consumer": plain, "seconds_with_consumer": fed, "seconds_in_feed": in_feed,
                             "change_rows_streamed": streamed}
        print(f"ingest of {args.generations} generations x {args.changes} rows: {plain:.2f} s alone, {fed:.2f} s with a consumer "
              f"reading each generation ({in_feed:.2f} s of it in the feed: read and commit), {fed / plain:.2f}x")

        t = Table.open(f"{work}/plain")
        state = t.state
        start = feed.start_at(state, before)
        end = feed.head(state)
        f0 = time.perf_counter()
        rows = feed.FeedReader(state, start).read(end)
        read_s = time.perf_counter() - f0
        r0 = time.perf_counter()
        raw, _ = feed.net_changes(state, {}, end, state.schema.names)
        raw_s = time.perf_counter() - r0
        raw_rows = sum(x.num_rows for x in raw.values())
        kinds = dict(zip(*np.unique(rows.column(feed.CHANGE_TYPE).to_numpy(zero_copy_only=False), return_counts=True)))
        results["read"] = {"change_rows": rows.num_rows, "seconds": read_s, "rows_per_second": rows.num_rows / read_s,
                           "raw_rows": raw_rows, "raw_seconds": raw_s, "kinds": {k: int(v) for k, v in kinds.items()}}
        print(f"feed read: {rows.num_rows} change rows ({', '.join(f'{k} {v}' for k, v in kinds.items())}) in {read_s:.2f} s, "
              f"{rows.num_rows / read_s:,.0f} rows/s; the same SSTables raw (newest per key, {raw_rows} rows): {raw_s:.2f} s; "
              f"{read_s / raw_s:.1f}x")

        # GC: a pass (a fresh collector each time) with one consumer holding every generation,
        # against one with --consumers more: neither can collect, the difference is the holds
        IndexMaintainer(state).catch_up()
        feed.Consumer(state, "c0").commit(start)
        g0 = time.perf_counter()
        GarbageCollector(state, NOW).run_once()
        gc_one = time.perf_counter() - g0
        for i in range(1, args.consumers + 1):
            feed.Consumer(state, f"c{i}").commit(start)
        g0 = time.perf_counter()
        GarbageCollector(state, NOW).run_once()
        gc_more = time.perf_counter() - g0
        held = sum(state.io.tree_size(paths.sstable_path(state.uri, s, x.path))
                   for s in state.manifests.list_shards() for x in state.manifests.read_shard(s).sstables)
        total = state.io.tree_size(state.uri)
        results["gc"] = {"seconds_one_consumer": gc_one, "seconds_more_consumers": gc_more, "consumers": args.consumers + 1,
                         "sstable_bytes_held": held, "table_bytes": total}
        print(f"GC pass: {gc_one * 1000:.0f} ms with one consumer, {gc_more * 1000:.0f} ms with {args.consumers + 1} "
              f"(holding every generation: {held / 2**20:.1f} MiB of SSTables kept, of {total / 2**20:.1f} MiB on disk)")
        t.close()
    report(results, args.json)


if __name__ == "__main__":
    main()
