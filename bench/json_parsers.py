"""Could a schema-bound JSON parser beat Arrow's for the catch-up? (issue 12)

The catch-up spends most of its decode in ``pyarrow.json.read_json`` (docs/bench-log/ingest.md,
"Read and decode without Spark"), 58% of it on the workload's 64-number vector. This script
times, on the same records in one process, Arrow's reader as memwal calls it
(:func:`memwal.streaming.decode.read_json_objects`, the baseline) against msgspec decoding each
record into a typed struct and building the same Arrow columns (numpy for the vector), and
checks that both give the same table. Best of ``--rounds``, alternating.

msgspec is not a memwal dependency: ``pip install msgspec`` to run this.
Run: ``python bench/json_parsers.py [--rows 10000] [--rounds 15]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import DIM, batch_rows, git_rev, machine, report, today  # noqa: E402

from memwal.streaming.decode import read_json_objects  # noqa: E402

SCHEMA = pa.schema([("id", pa.int64()), ("val", pa.float64()), ("name", pa.string()), ("vec", pa.list_(pa.float32()))])


def msgspec_decoder():
    import msgspec

    class Row(msgspec.Struct):
        id: int
        val: float | None = None
        name: str | None = None
        vec: list[float] | None = None

    decoder = msgspec.json.Decoder(Row)

    def decode(records: list[bytes]) -> pa.Table:
        rows = [decoder.decode(r) for r in records]
        n = len(rows)
        vectors = np.array([r.vec for r in rows], dtype=np.float32)  # every record has DIM numbers here
        offsets = pa.array(np.arange(0, (n + 1) * DIM, DIM, dtype=np.int32))
        return pa.table(
            [
                pa.array([r.id for r in rows], pa.int64()),
                pa.array([r.val for r in rows], pa.float64()),
                pa.array([r.name for r in rows], pa.string()),
                pa.ListArray.from_arrays(offsets, pa.array(vectors.ravel())),
            ],
            schema=SCHEMA,
        )

    return decode


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    records = [json.dumps(r).encode() for r in batch_rows(0, args.rows, 1_000_000)]
    values = pa.array(records, pa.binary())
    decode = msgspec_decoder()
    assert decode(records).equals(read_json_objects(values, SCHEMA)), "the two parsers disagree"
    best = {"arrow": float("inf"), "msgspec": float("inf")}
    for _ in range(args.rounds):
        for name, run in (("arrow", lambda: read_json_objects(values, SCHEMA)), ("msgspec", lambda: decode(records))):
            t0 = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - t0)
    for name, s in best.items():
        print(f"{name:8} {1000 * s:7.1f} ms per {args.rows:,} records ({args.rows / s:10,.0f} records/s), x{s / best['arrow']:.2f} of Arrow's")
    mib = sum(map(len, records)) / 2**20
    report({"date": today(), "machine": machine(), "commit": git_rev(), "rows": args.rows, "best_seconds": best, "mib": mib}, args.json)


if __name__ == "__main__":
    main()
