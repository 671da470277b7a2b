"""What a schema change costs on a large base (issue 44): adding a column against widening one.

Adding a nullable column is one metadata commit. Widening a column (memwal.maintain.evolve) reads the
column and the row ids from the base and writes one new column file per fragment, with
maintenance's base commits paused meanwhile, so its time is the pause compaction waits. The bench
loads a table of ``--rows`` rows (an int32 column, a 50-byte string column) and times each change
``--repeats`` times on fresh copies; the ratio is widening over adding.

Run: ``python bench/schema_change.py [--rows 2000000] [--repeats 3] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import git_rev, machine, report, today, work_dir  # noqa: E402

from memwal import Table  # noqa: E402


def table_rows(n: int) -> pa.Table:
    ids = np.arange(n, dtype=np.int64)
    return pa.table({"id": ids, "qty": pa.array(ids % 100_000, pa.int32()),
                     "name": pa.array([f"customer {i % 5000:05d} " + "x" * 35 for i in range(n)])})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", help="work directory (default: a temporary one)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    data = table_rows(args.rows)
    seconds: dict[str, list[float]] = {"add": [], "widen": []}
    with work_dir(args.dir, "memwal-schema-change-") as work:
        for r in range(args.repeats):
            uri = f"{work}/t{r}"
            t = Table.create(uri, data.schema, ["id"], "bucket(id, 4)", initial_data=data)
            t0 = time.perf_counter()
            t.update_schema().add_column("note", pa.string()).commit()
            seconds["add"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            t.update_schema().widen_column("qty", pa.int64()).commit()
            seconds["widen"].append(time.perf_counter() - t0)
            t.close()
    add, widen = statistics.median(seconds["add"]), statistics.median(seconds["widen"])
    print(f"{args.rows:,} rows, median of {args.repeats}: add a column {add * 1000:.1f} ms, "
          f"widen int32 -> int64 {widen:.2f} s ({widen / add:.0f}x adding)")
    report({"date": today(), "machine": machine(), "commit": git_rev(), "rows": args.rows, "seconds": seconds,
            "add_median_s": add, "widen_median_s": widen}, args.json)


if __name__ == "__main__":
    main()
