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
  topic fed at ``--rate`` rows/s (Apache Kafka 4), then the JVM job or the same Python
  task: the source's planning and its (Python) read task, without and with a second Python step.

The baseline is the first query; the report prints each query's trigger cadence (p50, p90),
its micro-batch (``triggerExecution``) and Spark's phases, and the ratio of its cadence to the
baseline's. Run: ``python bench/spark_floor.py [--rate 5000] [--seconds 30] [--kafka-source spark]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import git_rev, machine, report, today, trigger_cadence, work_dir  # noqa: E402
from ingest import open_broker, produce_at_rate  # noqa: E402

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
    rows = sum(p["numInputRows"] for p in progress) / max(1, len(progress))
    cadence = trigger_cadence([p["timestamp"] for p in progress], [p["durationMs"] for p in progress])
    return {"query": name, "batches": len(progress), "rows_per_batch": rows, **cadence}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=int, default=5000, help="rows/s produced to the Kafka topic")
    p.add_argument("--rows-per-batch", type=int, default=2000, help="rows per micro-batch of the rate-micro-batch source")
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--kafka-source", choices=("spark", "python"), default="spark")
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
            with open_broker(os.path.join(work, "broker")) as broker:
                topic = f"floor-{time.monotonic_ns()}"
                broker.create_topic(topic, 3)
                stop = threading.Event()
                feed = (broker, topic, args.rate, 1_000_000, lambda: not stop.is_set())
                feeder = threading.Thread(target=produce_at_rate, args=feed, daemon=True)
                feeder.start()
                try:
                    df = kafka_stream(spark, broker.bootstrap, topic, starting_offsets="latest", kafka_source=args.kafka_source)
                    for i, (name, action) in enumerate((("memwal-kafka, count", cases[1][2]), ("memwal-kafka, Python task", cases[2][2]))):
                        results.append(measure(name, df, action, args.seconds, os.path.join(work, f"ckpt-k{i}")))
                        print_row(results[-1], results[0])
                finally:
                    stop.set()
                    feeder.join()
        finally:
            spark.stop()
    report({"date": today(), "machine": machine(), "commit": git_rev(), "args": vars(args), "results": results}, args.json)


def print_row(r: dict, base: dict) -> None:
    if "cadence_ms_p50" not in r:
        print(f"{r['query']:28} fewer than two micro-batches", flush=True)
        return
    phases = "  ".join(f"{k} {r['spark_duration_ms_mean'].get(k, 0):.0f}" for k in PHASES)
    print(
        f"{r['query']:28} every {r['cadence_ms_p50']:4.0f} ms (p90 {r['cadence_ms_p90']:4.0f}; x{r['cadence_ms_p50'] / base['cadence_ms_p50']:.2f}), "
        f"{r['rows_per_batch']:,.0f} rows/batch, {r['batches']} batches; mean ms: {phases}",
        flush=True,
    )


if __name__ == "__main__":
    main()
