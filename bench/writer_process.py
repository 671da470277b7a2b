"""Writer process benchmark: the sink with ``writer_process`` off against on, same records,
same Spark session, alternating runs.

Without the writer process each Python worker keeps its own shard writers, so a write task
that Spark hands to another worker claims its shards again (writer open, WAL replay) and
fences the other worker's writers (a fenced retry at that worker's next write). With it one
process per executor keeps the writers (:mod:`memwal.write.process`).

The topic is filled once with ``--batches`` micro-batches of ``--batch-rows`` records (the
ingest workload: half updates of a ``--base-rows`` base, half new ids); each run drains it
into a fresh 4-shard table (``availableNow``, ``maxOffsetsPerTrigger`` = batch size) with
``--tasks`` write tasks per micro-batch. Per mode: writer opens and fenced retries per
minute of the run, flushes (a flush closes the writer, which reopens: an open that is no
re-claim by another worker), and ms per micro-batch (the first, warm-up, left out).

Run: ``python bench/writer_process.py`` (``--rounds``, ``--tasks 1``, ``--flush-interval none``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time

from memwal.core.runtime import configure_process  # noqa: E402

configure_process()  # Lance's log filter, before Lance is imported

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import SCHEMA, base_rows, batch_rows, git_rev, machine, pct, report, today, work_dir  # noqa: E402

from memwal import Table  # noqa: E402
from memwal.streaming import SinkOptions, ingest, local_session  # noqa: E402
from memwal_dev.local_broker import start_local_broker  # noqa: E402


def run(spark, broker, topic: str, work: str, name: str, base, args, writer_process: bool) -> dict:
    uri = os.path.join(work, f"{name}.lance")
    Table.create(uri, SCHEMA, ["id"], "bucket(id, 4)", initial_data=base).close()
    t0 = time.perf_counter()
    job = ingest(
        spark, bootstrap=broker.bootstrap, topic=topic, table_uri=uri, checkpoint=os.path.join(work, f"{name}.ckpt"),
        available_now=True, max_offsets_per_trigger=args.batch_rows,
        options=SinkOptions(source="kafka-json", op_field=None, max_write_tasks=args.tasks, writer_process=writer_process,
                            writer_process_idle_seconds=120, flush_interval_seconds=args.flush_interval),
    )
    job.await_termination()
    seconds = time.perf_counter() - t0
    reports = sorted(job.reports.reports, key=lambda r: r.batch_id)
    per_batch = [r.seconds for r in reports[1:]]
    minutes = sum(r.seconds for r in reports) / 60  # the micro-batches' own time (no session/query start)
    out = {
        "writer_process": writer_process,
        "batches": len(reports),
        "rows": sum(r.rows for r in reports),
        "run_seconds": round(seconds, 1),
        "writer_opens": sum(r.writer_opens for r in reports),
        "fenced_retries": sum(r.fenced_retries for r in reports),
        "flushes": sum(r.flushes for r in reports),
        "opens_per_minute": round(sum(r.writer_opens for r in reports) / minutes, 1),
        "fenced_per_minute": round(sum(r.fenced_retries for r in reports) / minutes, 1),
        "batch_ms_p50": round(pct(per_batch, 50) * 1000),
        "batch_ms_mean": round(statistics.fmean(per_batch) * 1000),
        "batch_ms_p99": round(pct(per_batch, 99) * 1000),
        "write_ms_max_mean": round(statistics.fmean(r.write_seconds_max for r in reports[1:]) * 1000, 1),
    }
    print(json.dumps({"run": name, **out}), flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-rows", type=int, default=100_000)
    p.add_argument("--batches", type=int, default=24)
    p.add_argument("--batch-rows", type=int, default=10_000)
    p.add_argument("--tasks", type=int, default=2, help="write tasks per micro-batch")
    p.add_argument("--rounds", type=int, default=2, help="off/on pairs, alternating")
    p.add_argument("--flush-interval", type=lambda v: None if v == "none" else float(v), default=2.0,
                   help="the sink's flush interval in seconds, or 'none' (then every writer open is a claim)")
    p.add_argument("--workdir")
    p.add_argument("--json")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with work_dir(args.workdir, "memwal-bench-wp-") as work:
        broker = start_local_broker(os.path.join(work, "broker"))
        try:
            topic = "wp"
            broker.create_topic(topic, 3)
            for b in range(args.batches):
                broker.produce(topic, ((str(r["id"]).encode(), json.dumps(r).encode(), r["id"] % 3)
                                       for r in batch_rows(b, args.batch_rows, args.base_rows)))
            base = base_rows(args.base_rows)
            spark = local_session(app="memwal-bench-writer-process")
            spark.sparkContext.setLogLevel("ERROR")
            runs = {"off": [], "on": []}
            for i in range(args.rounds):
                for mode in ("off", "on"):
                    runs[mode].append(run(spark, broker, topic, work, f"{mode}{i}", base, args, mode == "on"))
            spark.stop()
        finally:
            broker.stop()
    totals = {}
    for mode, rs in runs.items():
        minutes = sum(r["batches"] * r["batch_ms_mean"] for r in rs) / 60_000
        totals[mode] = {
            "opens_per_minute": round(sum(r["writer_opens"] for r in rs) / minutes, 1),
            "fenced_per_minute": round(sum(r["fenced_retries"] for r in rs) / minutes, 1),
            "flushes_per_minute": round(sum(r["flushes"] for r in rs) / minutes, 1),
            "batch_ms_p50": statistics.median(r["batch_ms_p50"] for r in rs),
        }
    print(f"\n{'mode':<5} {'opens/min':>10} {'fenced/min':>11} {'flushes/min':>12} {'ms/batch p50':>13}")
    for mode, t in totals.items():
        print(f"{mode:<5} {t['opens_per_minute']:>10} {t['fenced_per_minute']:>11} {t['flushes_per_minute']:>12} {t['batch_ms_p50']:>13}")
    ratio = totals["on"]["batch_ms_p50"] / totals["off"]["batch_ms_p50"]
    print(f"ms per micro-batch, on / off: {ratio:.2f}")
    report({"date": today(), "machine": machine(), "commit": git_rev(), "args": vars(args), "runs": runs, "totals": totals,
            "batch_ms_ratio_on_off": round(ratio, 3)}, args.json)


if __name__ == "__main__":
    main()
