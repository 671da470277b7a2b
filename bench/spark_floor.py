"""Spark's own floor under steady-state freshness: how often a micro-batch can start on this
machine when the sink does (almost) nothing, in the same session settings as ``memwal ingest``.

Freshness is at least half the time between micro-batches (a record waits for the next one)
plus one micro-batch. Five queries, each for ``--seconds``, one after the
other in one Spark session (``local[2]``), each sampled from Spark's own progress reports:

- ``rate, no-op``: Spark's ``rate-micro-batch`` source (``--rows-per-batch`` rows ready at every
  trigger, so micro-batches run back to back), ``foreachBatch`` doing nothing: the trigger's fixed
  work alone (offsets, the offset and commit logs, the Python ``foreachBatch`` call);
- ``rate, count``: the same with one Spark job per micro-batch (``df.count()``, JVM only);
- ``rate, Python task``: the job runs a Python function over the rows (``mapInArrow``), as
  memwal's write stage does: a Python worker hand-off per task;
- ``memwal-kafka, count`` and ``memwal-kafka, Python task``: memwal's Kafka source reading a
  topic fed at ``--rate`` rows/s (Kafka 0.9 or noida-db), then the JVM job or the same Python
  task: the source's planning and its (Python) read task, without and with a second Python step.

The baseline is the first query; the report prints each query's trigger cadence (p50, p90),
its micro-batch (``triggerExecution``) and Spark's phases, and the ratio of its cadence to the
baseline's. Run: ``python bench/spark_floor.py [--rate 5000] [--seconds 30] [--broker kafka09]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from datetime import datetime

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import batch_rows, git_rev, machine, pct, report, today, work_dir  # noqa: E402
from ingest import open_broker  # noqa: E402

from memwal.streaming import kafka_stream, local_session  # noqa: E402

PHASES = ("latestOffset", "walCommit", "getBatch", "queryPlanning", "addBatch", "commitOffsets", "triggerExecution")


def _identity(batches):
    yield from batches


def measure(name: str, df, action, seconds: float, ckpt: str, with_rows: bool = True) -> dict:
    """Run ``df`` into ``foreachBatch(action)`` for ``seconds`` after a warm-up; the cadence of
    micro-batches (those that read rows, if ``with_rows``: a sink that reads nothing counts
    none) and Spark's mean durations."""
    query = df.writeStream.foreachBatch(action).option("checkpointLocation", ckpt).trigger(processingTime="0 seconds").start()
    try:
        time.sleep(5)  # warm-up: Python workers, code generation, the first offsets
        first = query.lastProgress["batchId"] + 1 if query.lastProgress else 0
        time.sleep(seconds)
        progress = [p for p in query.recentProgress if p["batchId"] >= first and (p["numInputRows"] or not with_rows)]
    finally:
        query.stop()
    starts = [datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp() for p in progress]
    gaps = [1000 * (b - a) for a, b in zip(starts, starts[1:])]
    spark_ms = {k: sum(float(p["durationMs"].get(k, 0)) for p in progress) / max(1, len(progress)) for k in PHASES}
    rows = sum(p["numInputRows"] for p in progress) / max(1, len(progress))
    return {"query": name, "batches": len(progress), "rows_per_batch": rows, "cadence_ms_p50": pct(gaps, 50), "cadence_ms_p90": pct(gaps, 90), **spark_ms}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=int, default=5000, help="rows/s produced to the Kafka topic")
    p.add_argument("--rows-per-batch", type=int, default=2000, help="rows per micro-batch of the rate-micro-batch source")
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--broker", choices=("noida", "kafka09"), default="kafka09")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    with work_dir(None, "memwal-bench-floor-") as work:
        spark = local_session(app="memwal-bench-floor")
        spark.sparkContext.setLogLevel("ERROR")
        spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "10000")
        results = []
        try:
            # Every trigger has rows ready: the micro-batches run back to back, at Spark's pace.
            rate = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", args.rows_per_batch).load()
            cases = [
                ("rate, no-op", rate, lambda df, _id: None),
                ("rate, count", rate, lambda df, _id: df.count()),
                ("rate, Python task", rate, lambda df, _id: df.mapInArrow(_identity, df.schema).count()),
            ]
            for i, (name, df, action) in enumerate(cases):
                results.append(measure(name, df, action, args.seconds, os.path.join(work, f"ckpt-{i}"), with_rows=False))
                print_row(results[-1], results[0])
            with open_broker(args.broker, os.path.join(work, "broker")) as broker:
                topic = f"floor-{time.monotonic_ns()}"
                broker.create_topic(topic, 3)
                stop = threading.Event()
                feeder = threading.Thread(target=feed, args=(broker, topic, args.rate, stop), daemon=True)
                feeder.start()
                try:
                    df = kafka_stream(spark, broker.bootstrap, topic, starting_offsets="latest", kafka_options=broker.kafka_options)
                    for i, (name, action) in enumerate((("memwal-kafka, count", cases[1][2]), ("memwal-kafka, Python task", cases[2][2]))):
                        results.append(measure(name, df, action, args.seconds, os.path.join(work, f"ckpt-k{i}")))
                        print_row(results[-1], results[0])
                finally:
                    stop.set()
                    feeder.join()
        finally:
            spark.stop()
    report({"date": today(), "machine": machine(), "commit": git_rev(), "args": vars(args), "results": results}, args.json)


def feed(broker, topic: str, rate: int, stop: threading.Event) -> None:
    """Produce the workload's records at ``rate`` rows/s, in bursts every 100 ms."""
    import confluent_kafka

    producer = confluent_kafka.Producer(broker.producer_config(**{"linger.ms": 5}))
    b = 0
    while not stop.is_set():
        t0 = time.time()
        for r in batch_rows(b, rate // 10, 1_000_000):
            producer.produce(topic, key=str(r["id"]).encode(), value=json.dumps(r).encode(), partition=r["id"] % 3)
        producer.poll(0)
        b += 1
        time.sleep(max(0.0, 0.1 - (time.time() - t0)))
    producer.flush(30)


def print_row(r: dict, base: dict) -> None:
    phases = "  ".join(f"{k} {r[k]:.0f}" for k in PHASES)
    print(
        f"{r['query']:28} every {r['cadence_ms_p50']:4.0f} ms (p90 {r['cadence_ms_p90']:4.0f}; x{r['cadence_ms_p50'] / base['cadence_ms_p50']:.2f}), "
        f"{r['rows_per_batch']:,.0f} rows/batch, {r['batches']} batches; mean ms: {phases}",
        flush=True,
    )


if __name__ == "__main__":
    main()
