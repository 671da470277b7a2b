"""Broker fetch sizes: does reading a range cost the range, or everything behind it? (no Spark)

A read task of memwal's Kafka source assigns a consumer at its range's first offset and
stops at the range's end. A broker that honours librdkafka's fetch sizes
(``fetch.max.bytes``, ``max.partition.fetch.bytes``) answers each Fetch with at most that
much, so reading 10k records costs about the same wherever they sit in the log. A broker
that answers a Fetch with everything from the requested offset to the end of the log makes
the read cost grow with the backlog behind the range, and once that exceeds librdkafka's
``receive.message.max.bytes`` (100 MB by default) the consumer can not receive at all
("Invalid response size").

For each broker (``--brokers``: noida-db 0.2.3, the demo broker; Apache Kafka 0.9.0.1 from
tests/brokers.py) and each backlog B (``--backlogs``), one partition is filled with B records
of the ingest bench's JSON workload (~800 bytes each); then a fresh consumer reads the LAST
``--read`` records (assigned at end - read) and the FIRST ``--read`` records (assigned at 0,
B - read records behind the range), median of ``--repeats``: milliseconds, MB received
(librdkafka's ``rxbytes``) and the first/last ratio. ``--variants`` adds consumer settings
that try to make noida answer less (smaller fetch sizes).

Run: ``nice -n 19 python bench/broker.py --backlogs 10000,100000,300000``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from typing import Any, Dict, List

import confluent_kafka
from confluent_kafka import TopicPartition

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
from brokers import start_broker  # noqa: E402
from common import batch_rows, git_rev, machine, report, today, work_dir  # noqa: E402

# Consumer settings tried against each broker: librdkafka's defaults, then smaller fetch
# sizes (fetch.message.max.bytes is librdkafka's alias of max.partition.fetch.bytes).
VARIANTS: Dict[str, Dict[str, Any]] = {
    "default": {},
    "fetch.max.bytes=1MB, max.partition.fetch.bytes=256KB": {
        "fetch.max.bytes": 1 << 20, "max.partition.fetch.bytes": 256 << 10},
    "fetch.message.max.bytes=64KB": {"fetch.message.max.bytes": 64 << 10},
}


def payloads(n: int = 10_000) -> List[bytes]:
    """``n`` JSON records of the ingest workload (cycled to fill larger backlogs)."""
    return [json.dumps(r).encode() for r in batch_rows(0, n, 1_000_000)]


def fill(broker, topic: str, records: int, values: List[bytes]) -> int:
    """Produce ``records`` records to partition 0 of ``topic``; returns the bytes sent."""
    producer = confluent_kafka.Producer(broker.librdkafka_config(**{
        "linger.ms": 20, "acks": "1", "batch.num.messages": 10_000,
        "max.in.flight.requests.per.connection": 1}))
    errors: List[str] = []

    def on_delivery(err, _msg) -> None:
        if err is not None:
            errors.append(str(err))

    sent = 0
    for i in range(records):
        v = values[i % len(values)]
        while True:
            try:
                producer.produce(topic, value=v, key=str(i).encode(), partition=0, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.1)
        sent += len(v)
        if i % 1000 == 0:
            producer.poll(0)
    left = producer.flush(300)
    if left or errors:
        raise RuntimeError(f"producing failed: {left} undelivered, errors {errors[:3]}")
    return sent


def read_range(broker, topic: str, start: int, count: int, extra: Dict[str, Any], timeout: float) -> Dict[str, Any]:
    """A fresh consumer assigned at ``start`` reads ``count`` records: ms, MB received, error."""
    stats: List[int] = []
    errors: List[str] = []
    conf = broker.librdkafka_config(**{
        "group.id": f"bench-broker-{uuid.uuid4()}", "enable.auto.commit": False,
        "enable.partition.eof": False, "statistics.interval.ms": 100,
        "stats_cb": lambda s: stats.append(sum(b.get("rxbytes", 0) for b in json.loads(s)["brokers"].values())),
        "error_cb": lambda e: errors.append(e.str()),
        **extra})
    c = confluent_kafka.Consumer(conf)
    try:
        t0 = time.perf_counter()
        c.assign([TopicPartition(topic, 0, start)])
        got, nbytes = 0, 0
        deadline = time.monotonic() + timeout
        while got < count and time.monotonic() < deadline:
            if any("Invalid response size" in e for e in errors):
                break
            for m in c.consume(num_messages=min(5_000, count - got), timeout=0.5):
                if m.error() is None:
                    got += 1
                    nbytes += len(m.value() or b"")
        ms = (time.perf_counter() - t0) * 1000
        # Stop fetching, then let one more statistics callback report what arrived.
        c.unassign()
        n = len(stats)
        wait = time.monotonic() + 2
        while len(stats) <= n and time.monotonic() < wait:
            c.consume(num_messages=1, timeout=0.1)
        return {"ms": ms, "records": got, "value_mb": nbytes / 1e6, "rx_mb": (stats[-1] if stats else 0) / 1e6,
                "error": next((e for e in errors if "Invalid response size" in e), None) if got < count else None}
    finally:
        c.close()


def median_of(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    ok = [r for r in runs if r["error"] is None and r["records"] > 0]
    if len(ok) < len(runs):
        bad = next(r for r in runs if r not in ok)
        return {**bad, "ms": float("nan"), "failed": len(runs) - len(ok)}
    return {"ms": statistics.median(r["ms"] for r in ok), "rx_mb": statistics.median(r["rx_mb"] for r in ok),
            "records": ok[0]["records"], "error": None, "failed": 0}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--brokers", type=lambda v: v.split(","), default=["noida", "kafka09"])
    p.add_argument("--backlogs", type=lambda v: [int(x) for x in v.split(",")], default=[10_000, 100_000, 300_000])
    p.add_argument("--read", type=int, default=10_000, help="records read at each end")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds one read may take before it counts as failed")
    p.add_argument("--variants", action="store_true", help="also try smaller fetch sizes (see VARIANTS)")
    p.add_argument("--workdir")
    p.add_argument("--json")
    args = p.parse_args()

    results: Dict[str, Any] = {"date": today(), "machine": machine(), "commit": git_rev(), "args": vars(args), "cells": []}
    values = payloads()
    variants = VARIANTS if args.variants else {"default": {}}
    print(f"record size {statistics.mean(len(v) for v in values):.0f} bytes; read {args.read:,} records; median of {args.repeats}")
    print(f"{'broker':8} {'backlog':>8} {'variant':52} {'last ms':>8} {'last MB':>8} {'first ms':>9} {'first MB':>9} {'first/last':>10}")
    with work_dir(args.workdir, "memwal-bench-broker-") as work:
        for kind in args.brokers:
            with start_broker(kind, os.path.join(work, kind)) as broker:
                for backlog in args.backlogs:
                    topic = f"backlog-{backlog}"
                    broker.create_topic(topic, 1)
                    fill(broker, topic, backlog, values)
                    for name, extra in variants.items():
                        last = median_of([read_range(broker, topic, backlog - args.read, args.read, extra, args.timeout)
                                          for _ in range(args.repeats)])
                        first = median_of([read_range(broker, topic, 0, args.read, extra, args.timeout)
                                           for _ in range(args.repeats)])
                        ratio = first["ms"] / last["ms"]

                        def cell(r: Dict[str, Any]) -> str:
                            if r["error"] is not None or r.get("failed"):
                                return f"{'FAILED':>8} {'':>8}"
                            return f"{r['ms']:8.0f} {r['rx_mb']:8.1f}"

                        print(f"{kind:8} {backlog:8,} {name:52} {cell(last)} {cell(first)} {ratio:10.2f}", flush=True)
                        for r in (last, first):
                            if r["error"]:
                                print(f"{'':18}error: {r['error'][:160]}")
                        results["cells"].append({"broker": kind, "backlog": backlog, "variant": name, "last": last, "first": first,
                                                 "first_over_last": ratio})
    report(results, args.json)


if __name__ == "__main__":
    main()
