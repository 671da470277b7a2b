"""End-to-end demo on a local, embedded setup: ``python -m memwal_dev.demo`` (``make demo``).

1. starts an Apache Kafka 4 broker on 127.0.0.1 (KRaft, one node; its jars fetched by
   ``make demo`` with Maven) and a local Spark with Spark's own Kafka connector;
2. creates a table sharded ``bucket(id, 4)`` and produces synthetic upserts and deletes
   (integers, strings, a float vector) to a 4-partition topic whose partitions line up with the
   shards (:func:`memwal.streaming.partitioning.partitions`, what a producer computes);
3. ingests the topic through Spark's Kafka source into ``format("memwal")``: one stage per
   micro-batch, the tasks that read the records write them; prints the ingest rate;
4. reads the table back and checks it equals what the producer sent (last write per key);
   runs a vector search and checks it against brute force;
5. defines two materialized views (a filter, and an aggregate per score band);
6. runs maintenance (compaction into the base table, index catch-up, garbage collection,
   view refresh) and checks the table and the views again; then shows the table's status.

Exits non-zero if a reader ever sees something other than what was sent.
``--python-only`` skips Kafka and Spark and writes through the Python API instead.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import sys
import tempfile
import time

from memwal.core.runtime import configure_process

configure_process()  # before anything imports Lance

import pyarrow as pa  # noqa: E402

log = logging.getLogger("memwal_dev.demo")

DIM = 8
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64()),
        pa.field("name", pa.string()),
        pa.field("score", pa.float64()),
        pa.field("embedding", pa.list_(pa.float32(), DIM)),
    ]
)


def synthetic_records(n: int, keys: int, seed: int) -> tuple[list[dict], dict[int, dict]]:
    """Records with an ``op`` field, about one in eight a delete, and the model they produce."""
    rng = random.Random(seed)
    records: list[dict] = []
    model: dict[int, dict] = {}
    for i in range(n):
        k = rng.randrange(keys)
        if rng.random() < 0.125:
            records.append({"id": k, "op": "delete"})
            model.pop(k, None)
            continue
        row = {
            "id": k,
            "name": f"user-{k}-v{i}",
            "score": round(rng.uniform(0, 100), 2),
            # values exact in float32, so what is read back compares equal
            "embedding": [rng.randrange(-512, 512) / 256 for _ in range(DIM)],
        }
        records.append({**row, "op": "upsert"})
        model[k] = row
    return records, model


def check(label: str, uri: str, model: dict[int, dict], consistency: str = "eventual") -> bool:
    from memwal import readers

    seen = {r["id"]: r for r in readers.open(uri, consistency=consistency).scan().to_pylist()}
    ok = seen == model
    print(f"== {label}: reader ({consistency}) sees {len(seen)} live rows, producer model has {len(model)}: "
          f"{'MATCH' if ok else 'MISMATCH'}")
    if not ok:
        missing = sorted(set(model) - set(seen))[:5]
        extra = sorted(set(seen) - set(model))[:5]
        wrong = [k for k in model if k in seen and seen[k] != model[k]][:5]
        print(f"   missing {missing} extra {extra} different {wrong}")
    return ok


def check_search(uri: str, model: dict[int, dict]) -> bool:
    """Vector search over the live rows against brute force over the producer's model."""
    import numpy as np

    from memwal import readers

    query = [0.5] * DIM
    hits = readers.open(uri).search(query, k=5, columns=["id"]).column("id").to_pylist()
    ids = np.array(list(model))
    vecs = np.array([model[i]["embedding"] for i in ids], dtype=np.float32)
    dist = ((vecs - np.array(query, dtype=np.float32)) ** 2).sum(axis=1)
    expected = ids[np.argsort(dist, kind="stable")[:5]].tolist()
    ok = sorted(hits) == sorted(expected)
    print(f"== vector search: 5 nearest ids {hits}: {'MATCH' if ok else 'MISMATCH (brute force: %s)' % expected}")
    return ok


def check_views(uri: str, model: dict[int, dict]) -> bool:
    """The views, refreshed by maintenance, against the same queries over the model."""
    import math
    from collections import defaultdict

    from memwal.views import View

    high = {r["id"]: (r["name"], r["score"]) for r in View.open(uri, "high_scores").to_table().to_pylist()}
    want_high = {k: (r["name"], r["score"]) for k, r in model.items() if r["score"] > 50}
    bands = {r["band"]: (r["users"], r["top"]) for r in View.open(uri, "score_bands").to_table().to_pylist()}
    want: dict[int, list[float]] = defaultdict(list)
    for r in model.values():
        want[math.floor(r["score"] / 25)].append(r["score"])
    want_bands = {b: (len(v), max(v)) for b, v in want.items()}
    ok = high == want_high and bands == want_bands
    print(f"== views: high_scores has {len(high)} rows, score_bands {dict(sorted((b, n) for b, (n, _) in bands.items()))}: "
          f"{'MATCH' if ok else 'MISMATCH'}")
    return ok


def run_kafka_flow(workdir: str, records: int, keys: int) -> bool:
    from memwal import Table
    from memwal.maintain.gc import GcConfig
    from memwal.maintain.maintenance import Maintenance, MaintenanceConfig
    from memwal.cli.render import render_status
    from memwal.streaming import ingest, local_session
    from memwal_dev.local_broker import start_local_broker
    from memwal.streaming.partitioning import partitions

    uri = os.path.join(workdir, "users")
    print("== starting a local Apache Kafka broker and Spark (local[2])")
    with start_local_broker(os.path.join(workdir, "broker")) as broker:
        print(f"== Kafka broker up on {broker.bootstrap} in {broker.start_seconds:.1f}s")
        t0 = time.perf_counter()
        spark = local_session(app="memwal-demo", fast_start=False)  # the full JIT: the JVM reads and converts every record
        print(f"== Spark (local[2]) up in {time.perf_counter() - t0:.1f}s")
        broker.create_topic("users", 4)
        Table.create(uri, SCHEMA, ["id"], "bucket(id, 4)").close()
        print(f"== created {uri}: primary key id, sharding bucket(id, 4)")

        rows, model = synthetic_records(records, keys, seed=7)
        t0 = time.perf_counter()
        # Each record goes to its shard's partition: a shard is then written from one task
        parts = partitions(uri, [{"id": r["id"]} for r in rows], 4)
        broker.produce("users", ((str(r["id"]).encode(), json.dumps(r).encode(), int(p)) for r, p in zip(rows, parts)))
        print(f"== produced {len(rows)} records ({sum(r['op'] == 'delete' for r in rows)} deletes) "
              f"over {keys} keys to topic users in {time.perf_counter() - t0:.1f}s")

        t0 = time.perf_counter()
        job = ingest(
            spark,
            bootstrap=broker.bootstrap,
            topic="users",
            table_uri=uri,
            checkpoint=os.path.join(workdir, "checkpoint"),
            available_now=True,
            max_offsets_per_trigger=25_000,
        )
        job.await_termination()
        elapsed = time.perf_counter() - t0
        totals = job.reports.totals()
        print(f"== Spark ({job.kafka_source} Kafka source) ingested {int(totals['rows'])} records in {int(totals['batches'])} micro-batches "
              f"(one stage each: the tasks that read write) in {elapsed:.1f}s after Spark was up, query start included: "
              f"{totals['rows'] / elapsed:,.0f} records/s; {int(totals['dead_letters'])} dead letters")
        ok = check("after ingest", uri, model)
        ok = check_search(uri, model) and ok

        from memwal.views import View

        View.create(uri, "high_scores", select=["id", "name", "score"], where="score > 50")
        View.create(uri, "score_bands", select=["CAST(floor(score / 25) AS BIGINT) AS band", "count(*) AS users", "max(score) AS top"],
                    group_by=["band"])
        print("== created views high_scores (score > 50) and score_bands (users per band of 25 points)")

        # No reader grace and no time-travel retention: the demo shows GC collecting at once.
        collect_now = GcConfig(reader_grace_seconds=0, drain_interval_seconds=0, time_travel_seconds=0)
        report = Maintenance(uri, MaintenanceConfig(gc_config=collect_now)).run_cycle()
        print(f"== maintenance: compacted {report.generations_compacted} SSTables in {report.compaction_commits} "
              f"commits ({report.rows_compacted} rows), reclaimed {report.sstables_removed} SSTables "
              f"({report.bytes_reclaimed:,} bytes), refreshed {report.views_refreshed} views")
        ok = check("after maintenance", uri, model) and ok
        ok = check_views(uri, model) and ok
        print()
        print(render_status(Table.open(uri).status()))
        spark.stop()
    return ok


def run_python_flow(workdir: str, records: int, keys: int) -> bool:
    from memwal import Table
    from memwal.cli.render import render_status

    uri = os.path.join(workdir, "users")
    table = Table.create(uri, SCHEMA, ["id"], "bucket(id, 4)")
    rows, model = synthetic_records(records, keys, seed=7)
    t0 = time.perf_counter()
    for i in range(0, len(rows), 5_000):
        chunk = rows[i : i + 5_000]
        # one write per run of same-kind records keeps their order
        start = 0
        for j in range(1, len(chunk) + 1):
            if j == len(chunk) or chunk[j]["op"] != chunk[start]["op"]:
                part = chunk[start:j]
                if part[0]["op"] == "delete":
                    table.delete({"id": [r["id"] for r in part]})
                else:
                    table.write(pa.Table.from_pylist([{k: v for k, v in r.items() if k != "op"} for r in part], schema=SCHEMA))
                start = j
    table.close()
    print(f"== wrote {len(rows)} records through the Python API in {time.perf_counter() - t0:.2f}s")
    ok = check("after writes", uri, model)
    print()
    print(render_status(Table.open(uri).status()))
    return ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m memwal_dev.demo", description=__doc__.splitlines()[0])
    p.add_argument("--workdir", help="where to put tables and the broker (default: a temporary directory, removed afterwards)")
    p.add_argument("--records", type=int, default=50_000)
    p.add_argument("--keys", type=int, default=8_000)
    p.add_argument("--python-only", action="store_true", help="no Kafka or Spark: write through the Python API")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("memwal.streaming").setLevel(logging.INFO)  # one line per micro-batch
    workdir = args.workdir or tempfile.mkdtemp(prefix="memwal-demo-")
    try:
        flow = run_python_flow if args.python_only else run_kafka_flow
        ok = flow(workdir, args.records, args.keys)
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    print("\ndemo", "passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
