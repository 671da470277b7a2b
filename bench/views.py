"""View benchmark: incremental refresh against full recompute, in one run.

A ``--base-rows`` memwal table; a row view (filter, computed column, a Python UDF; once with a
vectorized UDF and once with a row-at-a-time one) and an
aggregate view (GROUP BY with count/sum/min/max/avg). The first refresh computes
everything; then ``--changes`` rows change (updates and deletes, compacted into the base)
and each view is refreshed incrementally, ``--rounds`` times (the figure is the median: one
refresh is tens of milliseconds, which a loaded machine's scheduling alone can double); then
each is recomputed in full for comparison. The UDF
counts the rows it is called with: an incremental refresh must call it for exactly the
changed rows that pass the filter.

Run: ``python bench/views.py``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time

from memwal.core.runtime import configure_process  # noqa: E402

configure_process()  # Lance's log filter, before Lance is imported

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import SCHEMA, base_rows, git_rev, machine, report, today, work_dir  # noqa: E402

from memwal import Table  # noqa: E402
from memwal.maintain.compactor import Compactor  # noqa: E402
from memwal.views import UdfColumn, View  # noqa: E402

UDF_ROWS = [0]


def name_length(batch: pa.RecordBatch) -> pa.Array:
    """A vectorized UDF (one Arrow kernel): the cheapest a UDF gets, so a full recompute
    is mostly I/O. Counts the rows it is given."""
    UDF_ROWS[0] += batch.num_rows
    return pc.utf8_length(batch.column(0))


def name_digest(batch: pa.RecordBatch) -> pa.Array:
    """A row-at-a-time Python UDF (a hash feature), the kind users write: about a
    microsecond per row. Counts the rows it is given."""
    UDF_ROWS[0] += batch.num_rows
    return pa.array(
        [int.from_bytes(hashlib.blake2b(s.encode(), digest_size=4).digest(), "little") >> 1 for s in batch.column(0).to_pylist()],
        pa.int32(),
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-rows", type=int, default=1_000_000)
    p.add_argument("--changes", type=int, default=1_000)
    p.add_argument("--rounds", type=int, default=5, help="change-and-refresh rounds; the incremental figure is their median")
    p.add_argument("--workdir")
    p.add_argument("--json")
    args = p.parse_args()
    results: dict = {"date": today(), "machine": machine(), "commit": git_rev(), "args": vars(args)}
    sys.modules.setdefault("bench_views_udf", sys.modules[__name__])
    with work_dir(args.workdir, "memwal-bench-views-") as work:
        uri = os.path.join(work, "t")
        base = base_rows(args.base_rows).drop_columns(["vec"])
        schema = pa.schema([f for f in SCHEMA if f.name != "vec"])
        table = Table.create(uri, schema, ["id"], "bucket(id, 4)", initial_data=base)
        row_views = []
        for name, fn in (("rows", "name_length"), ("rows_py", "name_digest")):
            udf = UdfColumn("feature", f"bench_views_udf:{fn}", ("name",), "int32")
            UDF_ROWS[0] = 0
            t0 = time.perf_counter()
            row_views.append(View.create(uri, name, select=["name", "val * 2 AS v2"], where="val > 0.1", udfs=[udf]))
            print(f"{args.base_rows:,}-row base: first (full) refresh of view {name} ({fn}) {time.perf_counter() - t0:.2f}s, "
                  f"{UDF_ROWS[0]:,} UDF rows")
        t0 = time.perf_counter()
        groups = View.create(
            uri, "groups",
            select=["substr(name, 18, 1) AS bucket", "count(*) AS n", "sum(id) AS ids", "min(val) AS lo", "max(val) AS hi", "avg(val) AS mean"],
            group_by=["bucket"],
        )
        print(f"{args.base_rows:,}-row base: first (full) refresh of view groups {time.perf_counter() - t0:.2f}s")

        rng = np.random.default_rng(1)
        alive = np.arange(args.base_rows)
        timings: dict[str, list[float]] = {v.definition.name: [] for v in (*row_views, groups)}
        udf_counts: dict[str, list[int]] = {v.definition.name: [] for v in row_views}
        modes: dict[str, set[str]] = {v.definition.name: set() for v in (*row_views, groups)}
        expected_udf = 0
        for _ in range(args.rounds):
            # each round: updates and deletes of rows still present, compacted, then each view refreshed
            changed = rng.choice(alive, args.changes, replace=False)
            dead, upd = changed[: args.changes // 10], changed[args.changes // 10 :]
            alive = np.setdiff1d(alive, dead)
            updates = base.take(pa.array(upd)).set_column(1, "val", pa.array(rng.random(len(upd))))
            table.write(updates)
            table.delete({"id": pa.array(dead)})
            table.flush()
            Compactor(table.state).run_once()
            expected_udf = int(pc.sum(pc.greater(updates.column("val"), 0.1)).as_py())
            for view in (*row_views, groups):
                UDF_ROWS[0] = 0
                t0 = time.perf_counter()
                rec = view.refresh()
                timings[view.definition.name].append(time.perf_counter() - t0)
                modes[view.definition.name].add(rec.mode)
                if view.definition.udfs:
                    udf_counts[view.definition.name].append(UDF_ROWS[0])

        results["views"] = []
        for view in (*row_views, groups):
            name = view.definition.name
            incremental = float(np.median(timings[name]))
            incremental_state = view.to_table().sort_by(view.to_table().schema.names[0])
            # full recompute of the same state: a fresh view over the same base version
            t0 = time.perf_counter()
            fresh = View.create(uri, f"{name}_full", select=list(view.definition.select), where=view.definition.where,
                                group_by=list(view.definition.group_by), udfs=list(view.definition.udfs))
            full = time.perf_counter() - t0
            same = _same(fresh.to_table().sort_by(fresh.to_table().schema.names[0]), incremental_state)
            fresh.drop()
            ratio = full / incremental
            mode = "/".join(sorted(modes[name]))
            spread = ", ".join(f"{t * 1000:.0f}" for t in timings[name])
            line = (f"{name:7}: {args.changes:,} changed rows, incremental {incremental * 1000:8.1f} ms median of "
                    f"{args.rounds} ({mode}; {spread}), full recompute {full * 1000:8.1f} ms, ratio {ratio:6.1f}x")
            udf_rows = udf_counts[name][-1] if view.definition.udfs else 0
            if view.definition.udfs:
                line += f", UDF rows {udf_rows:,} (changed rows passing the filter: {expected_udf:,})"
            print(line + ("" if same else "  MISMATCH"))
            results["views"].append({"view": name, "incremental_ms": incremental * 1000,
                                     "incremental_ms_each": [t * 1000 for t in timings[name]], "full_ms": full * 1000,
                                     "ratio": ratio, "udf_rows": udf_rows, "expected_udf_rows": expected_udf if view.definition.udfs else 0,
                                     "same_as_full": same})
    report(results, args.json)


def _same(a: pa.Table, b: pa.Table) -> bool:
    """Equal rows; floating-point aggregates to 1e-9 relative (summation order differs)."""
    if a.num_rows != b.num_rows or a.schema.names != b.schema.names:
        return False
    for name in a.schema.names:
        x, y = a.column(name), b.column(name)
        if pa.types.is_floating(x.type):
            if not np.allclose(x.to_numpy(zero_copy_only=False), y.to_numpy(zero_copy_only=False), rtol=1e-9, equal_nan=True):
                return False
        elif x.to_pylist() != y.to_pylist():
            return False
    return True


if __name__ == "__main__":
    main()
