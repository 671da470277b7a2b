"""Where a compaction commit's time goes on a large base (issue 15).

A compaction commit is one Lance ``merge_insert`` of an SSTable run into the base, and in the
soak its cost per row folded doubles over the hour as the base grows. This bench takes a base
(a soaked memwal table's directory; read, never written) and times commits of ``--rows`` rows
(half updates, half new keys), each on a freshly opened dataset sharing one warm Lance session
(what memwal's table handle does), to say what the cost follows:

* **size or history**: the soaked base against the same rows written fresh (no update history,
  no deletion files) and against a fresh 1M-row base; each as a whole commit, as
  ``execute_uncommitted`` (the commit's own share is the difference) and with the index join
  turned off (``use_index(False)``: a hash join over the key column);
* **where the updates land**: on the fresh copy, updates drawn from the first 1, 4 or all
  fragments (the same number of rows each time);
* **fragment count**: the same rows in 1M- against 4M-row fragments, updates everywhere.

Each line gives the steady commits (all but the first, which warms the session) and a ratio to
its section's first line.

Run: ``python bench/fold_cost.py TABLE_URI [--rows 50000] [--commits 4]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Callable

import lance
import numpy as np
import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from commit_size import upserts  # noqa: E402
from common import git_rev, machine, report, today  # noqa: E402


def timed_commits(uri: str, batches: Callable[[int], pa.Table], commits: int, how: str = "commit") -> float:
    """Median seconds of the steady commits (all but the first) into ``uri``, one warm session."""
    session = lance.Session(index_cache_size_bytes=2 << 30, metadata_cache_size_bytes=64 << 20)
    took = []
    for i in range(commits):
        data = batches(i)
        t0 = time.perf_counter()
        builder = lance.dataset(uri, session=session).merge_insert("id").when_matched_update_all().when_not_matched_insert_all()
        if how == "uncommitted":
            builder.execute_uncommitted(data)
        elif how == "hash join":
            builder.use_index(False).execute(data)
        else:
            builder.execute(data)
        took.append(time.perf_counter() - t0)
    return statistics.median(took[1:])


def fresh_copy(rows: pa.Table, uri: str, rows_per_file: int) -> str:
    ds = lance.write_dataset(rows, uri, max_rows_per_file=rows_per_file)
    ds.create_scalar_index("id", "BTREE")
    return uri


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("table", help="a base with an int64 id key (a memwal table's directory; read, never written)")
    p.add_argument("--rows", type=int, default=50_000, help="rows per commit")
    p.add_argument("--commits", type=int, default=4)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    soaked = lance.dataset(args.table)
    rows = soaked.to_table(columns=[f.name for f in soaked.schema])
    schema = soaked.schema
    all_ids = rows.column("id").to_numpy()
    first_new = int(all_ids.max()) + 1
    n, k = args.rows, args.commits
    print(f"base: {rows.num_rows:,} rows in {len(soaked.get_fragments())} fragments; commits of {n:,} rows; "
          f"median of {k - 1} steady commits, one warm session", flush=True)
    results: dict[str, dict[str, float]] = {}

    def line(section: str, name: str, seconds: float) -> None:
        base = next(iter(results.setdefault(section, {}).values()), seconds)
        results[section][name] = seconds
        print(f"  {name:<58} {seconds:6.2f} s  x{seconds / base:.2f}", flush=True)

    seed = iter(range(1, 1 << 30))
    with tempfile.TemporaryDirectory(prefix="memwal-bench-fold-", dir=os.path.dirname(os.path.abspath(args.table))) as tmp:
        print("size or history:")
        work = os.path.join(tmp, "soaked")
        shutil.copytree(args.table, work)
        fresh = fresh_copy(rows, os.path.join(tmp, "fresh"), 1 << 20)
        small = fresh_copy(rows.slice(0, 1_000_000), os.path.join(tmp, "fresh-1M"), 1 << 20)
        for name, uri, ids in (("soaked base", work, all_ids), ("same rows, written fresh", fresh, all_ids),
                               ("fresh 1M-row base", small, all_ids[:1_000_000])):
            for how in ("commit", "uncommitted", "hash join"):
                line("size", f"{name}, {how}", timed_commits(uri, lambda i, ids=ids: upserts(schema, ids, n, first_new + next(seed) * n, i), k, how))
        print("where the updates land (the fresh copy):")
        frags = lance.dataset(fresh).get_fragments()
        by_frag = [f.to_table(columns=["id"]).column(0).to_numpy() for f in frags]
        for m in (1, 4, len(frags)):
            ids = np.concatenate(by_frag[:m])
            line("spread", f"updates in {m} of {len(frags)} fragments ({len(ids):,} rows)",
                 timed_commits(fresh, lambda i, ids=ids: upserts(schema, ids, n, first_new + next(seed) * n, i), k))
        print("fragment count (same rows, updates everywhere):")
        for per in (1 << 20, 4 << 20):
            uri = fresh_copy(rows, os.path.join(tmp, f"frag-{per >> 20}M"), per)
            line("fragments", f"{per >> 20}M-row fragments ({len(lance.dataset(uri).get_fragments())})",
                 timed_commits(uri, lambda i: upserts(schema, all_ids, n, first_new + next(seed) * n, i), k))
    report({"date": today(), "machine": machine(), "commit": git_rev(), "rows_per_commit": n, "seconds": results}, args.json)


if __name__ == "__main__":
    main()
