"""Compaction benchmark: one commit per generation against several generations per commit.

Two identical tables (a ``--base-rows`` base, ``--generations`` flushed SSTables per shard of
``--rows`` upserts each, half updates of earlier keys so runs overlap) are compacted, one
with ``max_generations_per_commit=1`` and one with the default (8). Prints the time, the
commits and the rows written into the base, and checks both tables read the same.

Run: ``python bench/compaction.py``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

from memwal.core.runtime import configure_process  # noqa: E402

configure_process()  # Lance's log filter, before Lance is imported

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import git_rev, machine, report, today, work_dir  # noqa: E402

from memwal import Table, readers  # noqa: E402
from memwal.maintain.compactor import Compactor  # noqa: E402

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("val", pa.float64()), pa.field("name", pa.string())])


def rows(ids: np.ndarray, rng: np.random.Generator, tag: str) -> pa.Table:
    return pa.table({"id": ids, "val": rng.random(len(ids)), "name": [f"{tag}-{i}" for i in ids]}, schema=SCHEMA)


def build(uri: str, base: int, generations: int, per_gen: int) -> None:
    rng = np.random.default_rng(0)
    with Table.create(uri, SCHEMA, ["id"], "bucket(id, 4)", initial_data=rows(np.arange(base), rng, "base")) as t:
        fresh = base
        for g in range(generations):
            half = per_gen // 2
            updates = rng.choice(fresh, half, replace=False)
            new = np.arange(fresh, fresh + per_gen - half)
            fresh += len(new)
            t.write(rows(np.concatenate([updates, new]), rng, f"g{g}"))
            t.flush()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-rows", type=int, default=1_000_000)
    p.add_argument("--generations", type=int, default=16, help="flushes (each makes one SSTable per shard)")
    p.add_argument("--rows", type=int, default=20_000, help="rows per flush (all shards)")
    p.add_argument("--workdir")
    p.add_argument("--json")
    args = p.parse_args()
    results: dict = {"date": today(), "machine": machine(), "commit": git_rev(), "args": vars(args), "runs": []}
    with work_dir(args.workdir, "memwal-bench-compaction-") as work:
        build(os.path.join(work, "one"), args.base_rows, args.generations, args.rows)
        shutil.copytree(os.path.join(work, "one"), os.path.join(work, "many"))
        print(f"{args.base_rows:,}-row base, {args.generations} generations x 4 shards, {args.rows:,} rows per flush")
        for name, per_commit in (("one", 1), ("many", 8)):
            table = Table.open(os.path.join(work, name))
            t0 = time.perf_counter()
            done = Compactor(table.state, max_generations_per_commit=per_commit).run_once()
            seconds = time.perf_counter() - t0
            upserted = sum(r.rows_upserted for r in done)
            run = {"generations_per_commit": per_commit, "seconds": seconds, "commits": len(done), "rows_upserted": upserted}
            results["runs"].append(run)
            print(f"{per_commit} generation(s) per commit: {seconds:6.2f}s, {len(done):3} commits, {upserted:,} rows written into the base")
        one, many = (readers.open(os.path.join(work, n)).scan().sort_by("id") for n in ("one", "many"))
        assert one.equals(many), "the two compactions disagree"
        a, b = results["runs"]
        print(f"several per commit: {a['seconds'] / b['seconds']:.2f}x faster, {a['rows_upserted'] / max(1, b['rows_upserted']):.2f}x fewer rows written")
    report(results, args.json)


if __name__ == "__main__":
    main()
