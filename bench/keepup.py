"""Keep-up benchmark: ingest at the sink's full rate with maintenance running, for minutes.

A producer keeps a backlog of upserts (half updates of existing ids, half new ids) in a
local broker, so the memwal ingest query (Kafka -> Spark -> foreachBatch shard writers,
10k-row micro-batches) always has a full micro-batch waiting and runs at its full rate.
Beside it, ``memwal maintain`` runs as its own process (compaction, index catch-up, GC),
and a reader in a third process probes point lookups of random keys all along.

Every ``--window`` seconds it prints: rows/s ingested, uncompacted SSTables (what a
reader merges and the compactor owes: the max over the window), point-lookup p50/p99,
and the table's size on disk. Maintenance keeps up when the uncompacted SSTables stay
bounded and lookup latency stays flat from the first window to the last.

Rows carry no vector column here (the producer would need a core of its own to JSON-
encode 64 floats per row at this rate on a 2-core machine).

Run: ``python bench/keepup.py`` (``--seconds 300`` by default).
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from memwal.core.runtime import configure_process  # noqa: E402

configure_process()  # Lance's log filter, before Lance is imported

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import git_rev, machine, pct, read_samples, report, today  # noqa: E402

from memwal import Table, readers  # noqa: E402
from memwal.streaming import SinkOptions, ingest, local_session  # noqa: E402
from memwal_dev.local_broker import start_local_broker  # noqa: E402

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("val", pa.float64()), pa.field("name", pa.string())])


def base_table(n: int) -> pa.Table:
    rng = np.random.default_rng(0)
    return pa.table(
        {"id": np.arange(n, dtype=np.int64), "val": rng.random(n), "name": [f"name-{i:012d}-base" for i in range(n)]},
        schema=SCHEMA,
    )


def disk_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.stat(os.path.join(root, f)).st_size
            except FileNotFoundError:
                pass  # removed by GC while we walked
    return total


class Producer(threading.Thread):
    """Keeps ``ahead`` rows waiting for the sink (half updates of ids below ``base``, half
    new ids), so it always has a full micro-batch to take. A fixed-rate producer above the
    sink's rate would do the same, but its backlog grows without bound, and the local
    broker answers fetches from a deep backlog with responses far above ``fetch.max.bytes``,
    which would make this a benchmark of the broker."""

    def __init__(self, bootstrap: str, topic: str, ahead: int, base: int, consumed, rate: int | None = None) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.ahead, self.base, self.consumed = bootstrap, topic, ahead, base, consumed
        self.rate = rate  # rows/s at most (None: whatever the sink takes)
        self.stop = threading.Event()
        self.sent = 0

    def run(self) -> None:
        import confluent_kafka

        producer = confluent_kafka.Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 20, "queue.buffering.max.messages": 1_000_000})
        rng = random.Random(1)
        next_new = self.base
        while not self.stop.is_set():
            t0 = time.monotonic()
            per_tick = max(0, self.ahead - (self.sent - int(self.consumed())))
            if self.rate is not None:
                per_tick = min(per_tick, self.rate // 10)
            for i in range(per_tick):
                if i % 2:
                    key, next_new = next_new, next_new + 1
                else:
                    key = rng.randrange(self.base)
                value = json.dumps({"id": key, "val": rng.random(), "name": f"name-{key:012d}-{self.sent:010d}"})
                while True:
                    try:
                        producer.produce(self.topic, key=str(key).encode(), value=value.encode(), partition=key % 3)
                        break
                    except BufferError:
                        producer.poll(0.05)
            self.sent += per_tick
            producer.poll(0)
            self.stop.wait(max(0.0, 0.1 - (time.monotonic() - t0)))
        producer.flush(60)


def probe_lookups(uri: str, base: int, out: str) -> None:
    """Point lookups of random base keys through an eventual reader (refreshed every second),
    in a process of its own so the driver's threads do not skew its latencies; appends
    ``wall time, seconds, hit`` lines to ``out`` until killed."""
    reader = readers.open(uri, refresh_interval_ms=1000)
    rng = random.Random(2)
    with open(out, "a", buffering=1) as f:
        while True:
            key = rng.randrange(base)
            t0 = time.perf_counter()
            try:
                hit = reader.get(key, columns=["val"]) is not None  # every base key exists
            except Exception:  # noqa: BLE001 - counted as an error; a reader must not fail
                hit = False
            f.write(f"{time.time()},{time.perf_counter() - t0},{int(hit)}\n")
            time.sleep(0.05)


def read_probes(path: str) -> list[tuple[float, float, bool]]:
    """``wall time, seconds, hit`` lines of a lookup prober."""
    return read_samples(path, float, float, lambda v: v == "1")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-rows", type=int, default=1_000_000)
    p.add_argument("--seconds", type=float, default=300)
    p.add_argument("--ahead", type=int, default=50_000, help="rows the producer keeps waiting for the sink")
    p.add_argument("--rate", type=int, help="cap the producer at this many rows/s (default: the sink's full rate)")
    p.add_argument("--batch-rows", type=int, default=10_000)
    p.add_argument("--window", type=float, default=30)
    p.add_argument("--maintain-interval", type=float, default=5.0)
    p.add_argument("--reader-grace", type=float, default=30.0, help="GC keeps compacted SSTables this long for readers")
    p.add_argument("--workdir")
    p.add_argument("--json")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    work = args.workdir or tempfile.mkdtemp(prefix="memwal-bench-keepup-")
    results: dict = {"date": today(), "machine": machine(), "commit": git_rev(), "args": vars(args), "windows": []}
    maintain = None
    try:
        uri = os.path.join(work, "t")
        Table.create(uri, SCHEMA, ["id"], "bucket(id, 4)", initial_data=base_table(args.base_rows)).close()
        spark = local_session(app="memwal-bench-keepup")
        spark.sparkContext.setLogLevel("ERROR")
        with start_local_broker(os.path.join(work, "broker")) as broker:
            broker.create_topic("keepup", 3)
            maintain = subprocess.Popen(
                [sys.executable, "-m", "memwal", "-v", "maintain", uri, "--interval", str(args.maintain_interval),
                 "--reader-grace", str(args.reader_grace), "--base-retention", "60"],
                stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "maintain.log"), "w"),
            )
            job = ingest(spark, bootstrap=broker.bootstrap, topic="keepup", table_uri=uri, checkpoint=os.path.join(work, "ckpt"),
                         max_offsets_per_trigger=args.batch_rows, options=SinkOptions(source="kafka-json", op_field=None))
            producer = Producer(broker.bootstrap, "keepup", args.ahead, args.base_rows, lambda: job.reports.totals().get("rows", 0), args.rate)
            producer.start()
            time.sleep(10)  # let the query start and the producer build a backlog
            probes = os.path.join(work, "probes.csv")
            prober = multiprocessing.get_context("spawn").Process(target=probe_lookups, args=(uri, args.base_rows, probes), daemon=True)
            prober.start()
            table = Table.open(uri)
            print(f"{'t (s)':>6} {'rows/s':>8} {'backlog':>9} {'uncompacted SSTables (max)':>27} {'lookup p50 / p99 ms':>20} {'disk MB':>8}")
            start = time.time()
            last_rows, last_t = job.reports.totals().get("rows", 0), start
            while time.time() - start < args.seconds:
                window_end = min(start + args.seconds, last_t + args.window)
                pending_max = 0
                while time.time() < window_end:
                    pending_max = max(pending_max, sum(s.pending_sstables for s in table.status().shards))
                    time.sleep(1)
                now = time.time()
                rows = job.reports.totals().get("rows", 0)
                lookups = [took for at, took, _ in read_probes(probes) if last_t <= at < now]
                w = {"t": now - start, "rows_per_s": (rows - last_rows) / (now - last_t), "backlog": producer.sent - rows,
                     "pending_sstables_max": pending_max, "lookup_p50_ms": pct(lookups, 50) * 1000, "lookup_p99_ms": pct(lookups, 99) * 1000,
                     "lookups": len(lookups), "disk_mb": disk_bytes(uri) / 1e6}
                results["windows"].append(w)
                print(f"{w['t']:6.0f} {w['rows_per_s']:8,.0f} {w['backlog']:9,} {pending_max:27} "
                      f"{w['lookup_p50_ms']:9.2f} / {w['lookup_p99_ms']:<8.2f} {w['disk_mb']:8.0f}", flush=True)
                last_rows, last_t = rows, now
            prober.terminate()
            producer.stop.set()
            job.stop()
            producer.join(60)
        spark.stop()
        ws = results["windows"]
        total = job.reports.totals()
        results["summary"] = {
            "rows_ingested": total.get("rows", 0),
            "rows_per_s": sum(w["rows_per_s"] for w in ws) / len(ws),
            "pending_sstables_max_first_half": max(w["pending_sstables_max"] for w in ws[: len(ws) // 2 or 1]),
            "pending_sstables_max_second_half": max(w["pending_sstables_max"] for w in ws[len(ws) // 2 :]),
            "lookup_p50_first_ms": ws[0]["lookup_p50_ms"],
            "lookup_p50_last_ms": ws[-1]["lookup_p50_ms"],
            "lookup_errors": sum(not hit for _, _, hit in read_probes(probes)),
            "fenced_retries": total.get("fenced_retries", 0),
        }
        s = results["summary"]
        print(f"\n{s['rows_ingested']:,.0f} rows in {args.seconds:.0f}s ({s['rows_per_s']:,.0f} rows/s); uncompacted SSTables max "
              f"{s['pending_sstables_max_first_half']} (first half) / {s['pending_sstables_max_second_half']} (second half); "
              f"lookup p50 {s['lookup_p50_first_ms']:.2f} ms (first window) -> {s['lookup_p50_last_ms']:.2f} ms (last); "
              f"lookup errors {s['lookup_errors']}; fenced retries {s['fenced_retries']:.0f}")
    finally:
        if maintain is not None:
            maintain.terminate()
            maintain.wait(60)
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    report(results, args.json)


if __name__ == "__main__":
    main()
