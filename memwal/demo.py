"""End-to-end demo on a local, embedded setup: ``python -m memwal.demo`` (``make demo``).

Creates a sharded table, streams upserts and deletes into it, reads it back through
memwal's reader and checks the result against what was sent, then prints the table status.
Exits non-zero if what a reader sees differs from what was written.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import shutil
import sys
import tempfile
import time

os.environ.setdefault("LANCE_LOG", "error,lance::index=off")

import pyarrow as pa  # noqa: E402

log = logging.getLogger("memwal.demo")

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64()),
        pa.field("name", pa.string()),
        pa.field("score", pa.float64()),
        pa.field("embedding", pa.list_(pa.float32(), 8)),
    ]
)


def synthetic_batches(n_batches: int, batch_rows: int, key_space: int, seed: int):
    """Yield (kind, table) pairs: mostly upserts of random keys, some deletes."""
    rng = random.Random(seed)
    for b in range(n_batches):
        if b % 4 == 3:
            ids = sorted(rng.sample(range(key_space), batch_rows // 10))
            yield "delete", pa.table({"id": pa.array(ids, pa.int64())})
            continue
        ids = [rng.randrange(key_space) for _ in range(batch_rows)]
        yield "upsert", pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "name": [f"user-{i}-v{b}" for i in ids],
                "score": [round(rng.uniform(0, 100), 2) for _ in ids],
                "embedding": pa.array([[rng.random() for _ in range(8)] for _ in ids], pa.list_(pa.float32(), 8)),
            },
            schema=SCHEMA,
        )


def run_python_flow(workdir: str, shards: int, batches: int, batch_rows: int) -> bool:
    from memwal import Table, readers

    uri = os.path.join(workdir, "users")
    print(f"== creating {uri}: primary key id, sharding bucket(id, {shards})")
    table = Table.create(uri, SCHEMA, ["id"], f"bucket(id, {shards})")
    model: dict[int, dict] = {}
    t0 = time.perf_counter()
    rows = 0
    for kind, data in synthetic_batches(batches, batch_rows, key_space=batch_rows * 3, seed=7):
        if kind == "upsert":
            table.write(data)
            for r in data.to_pylist():
                model[r["id"]] = r
        else:
            table.delete(data)
            for i in data.column("id").to_pylist():
                model.pop(i, None)
        rows += data.num_rows
    table.flush()
    elapsed = time.perf_counter() - t0
    print(f"== wrote {rows} rows ({batches} batches) in {elapsed:.2f}s: {rows / elapsed:,.0f} rows/s")

    reader = readers.open(uri)
    seen = {r["id"]: r for r in reader.scan().to_pylist()}
    ok = seen == model
    print(f"== reader sees {len(seen)} live rows; model has {len(model)}: {'MATCH' if ok else 'MISMATCH'}")
    some = next(iter(model))
    print(f"== get({some}) -> {reader.get(some, columns=['id', 'name', 'score'])}")
    print()
    print(table.status().render())
    table.close()
    return ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m memwal.demo", description=__doc__.splitlines()[0])
    p.add_argument("--workdir", help="where to create tables (default: a temporary directory, removed afterwards)")
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--batch-rows", type=int, default=5_000)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    workdir = args.workdir or tempfile.mkdtemp(prefix="memwal-demo-")
    try:
        ok = run_python_flow(workdir, args.shards, args.batches, args.batch_rows)
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    print("\ndemo", "passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
