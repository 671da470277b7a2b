"""What folding the same rows into a large base costs in fewer, larger commits (issue 15).

A compaction commit is one Lance ``merge_insert`` into the base. Its cost follows the base rows
its updates span (the rows of the fragments they touch; ``bench/fold_cost.py``), not the rows it
carries, so the same rows folded in fewer commits should cost less. On copies of a given base table (a soaked one:
many fragments, updates everywhere), the same ``--rows`` rows (half updates of keys drawn from
the whole table, half new keys) are upserted in 8, 4, 2 and 1 commits, each on a fresh copy;
the report is each split's seconds as a ratio to the 8-commit baseline.

Run: ``python bench/commit_size.py BASE_URI [--rows 200000]`` (BASE_URI: a Lance dataset with
an ``id`` key, e.g. a soaked memwal table's directory; it is copied, never written).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import lance
import numpy as np
import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import git_rev, machine, report, today  # noqa: E402


def upserts(schema: pa.Schema, update_ids: np.ndarray, n: int, first_new: int, seed: int = 11) -> pa.Table:
    """``n`` rows of ``schema``: half updates of keys drawn from ``update_ids``, half new keys
    from ``first_new`` on, shuffled (a compaction run's mix in the soak)."""
    rng = np.random.default_rng(seed)
    ids = np.concatenate([rng.choice(update_ids, n // 2, replace=False), np.arange(n - n // 2) + first_new]).astype("int64")
    rng.shuffle(ids)
    cols = {"id": ids}
    for f in schema:
        if f.name == "id":
            continue
        if pa.types.is_floating(f.type):
            cols[f.name] = pa.array(rng.random(n)).cast(f.type)
        elif pa.types.is_string(f.type):
            cols[f.name] = pa.array([f"n{i}" for i in ids])
        else:
            cols[f.name] = pa.nulls(n, f.type)
    return pa.table(cols).cast(schema)


def rows_to_fold(ds: lance.LanceDataset, n: int, seed: int = 11) -> pa.Table:
    """``n`` rows in the base's schema: half updates of keys drawn from the whole table, half
    new keys, shuffled."""
    existing = ds.to_table(columns=["id"]).column(0).to_numpy()
    return upserts(ds.schema, existing, n, int(existing.max()) + 1, seed)


def fold(uri: str, rows: pa.Table, commits: int, size: int, session: "lance.Session | None" = None) -> list[float]:
    """Upsert ``rows`` into the dataset at ``uri`` in ``commits`` ``merge_insert`` calls of
    ``size`` rows, each on a freshly opened dataset (as a compaction cycle opens the base; with
    ``session``, sharing its caches); the seconds of each."""
    took = []
    for i in range(commits):
        t0 = time.perf_counter()
        lance.dataset(uri, session=session).merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(
            rows.slice(i * size, size)
        )
        took.append(time.perf_counter() - t0)
    return took


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("base", help="a Lance dataset with an id key (copied, never written)")
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    ds = lance.dataset(args.base)
    rows = rows_to_fold(ds, args.rows)
    base_rows = ds.count_rows()
    print(f"base: {base_rows:,} rows in {len(ds.get_fragments())} fragments; folding {args.rows:,} rows")
    results = []
    with tempfile.TemporaryDirectory(prefix="memwal-bench-commits-", dir=os.path.dirname(os.path.abspath(args.base))) as tmp:
        for commits in (8, 4, 2, 1):
            work = os.path.join(tmp, f"copy-{commits}")
            shutil.copytree(args.base, work)
            size = -(-args.rows // commits)
            seconds = sum(fold(work, rows, commits, size))
            shutil.rmtree(work)
            results.append({"commits": commits, "rows_per_commit": size, "seconds": seconds})
            print(f"{commits} commit(s) of {size:>7,} rows: {seconds:6.2f} s  x{seconds / results[0]['seconds']:.2f}", flush=True)
    report({"date": today(), "machine": machine(), "commit": git_rev(), "base_rows": base_rows, "results": results}, args.json)


if __name__ == "__main__":
    main()
