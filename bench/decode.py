"""Read and decode without Spark: the two phases that dominate a backlog catch-up micro-batch.

docs/bench-log/ingest.md (issue 12) measured a 93k-row catch-up micro-batch on Kafka 0.9 at read 37%
(the Kafka source turning librdkafka messages into Arrow batches) and decode 42% (the prepare
stage: JSON values -> the table's write schema, validation, routing). This times both phases
alone, in one process, against the code of a baseline git revision (``--baseline``, loaded
from git into modules of their own), and prints new/old ratios:

(a) **read**: the source's message -> Arrow conversion (``read_range``'s loop over consumed
    messages and the batches it yields) on ``confluent_kafka.Message`` objects carrying the
    catch-up's records (no broker); with ``--broker``, also the whole read from a real Apache
    Kafka 0.9 broker (one partition, librdkafka's fetches included);
(b) **decode**: ``Prepare.prepare`` on the batches the source yields, as the read task calls it
    (a table of the workload's schema, 4 shards; ``op_field=None`` as in the catch-up, and
    again with the default operation field ``op``).

Records are bench/ingest.py's: ``json.dumps`` of bench/common.py's ``batch_rows`` (id, val,
name, 64 x float). Run: ``python bench/decode.py [--records 93000] [--rounds 5] [--broker]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import types
from typing import Any

from memwal.core.runtime import configure_process  # noqa: E402

configure_process()  # Lance's log filter, before Lance is imported

import confluent_kafka  # noqa: E402
import pyarrow as pa  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import SCHEMA, batch_rows, git_rev, machine, today  # noqa: E402

from memwal import Table  # noqa: E402
from memwal.core.state import TableState  # noqa: E402
from memwal.streaming import kafka_source as new_source  # noqa: E402
from memwal.streaming import sink as new_sink  # noqa: E402
from memwal.streaming.sink import SinkOptions  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _module_at(rev: str, path: str, name: str, replace: dict[str, str] | None = None) -> types.ModuleType:
    """The module ``path`` as it was at ``rev``, imported under ``name``."""
    src = subprocess.run(["git", "-C", ROOT, "show", f"{rev}:{path}"], capture_output=True, text=True, check=True).stdout
    for a, b in (replace or {}).items():
        src = src.replace(a, b)
    mod = types.ModuleType(name)
    mod.__file__ = f"<{rev}:{path}>"
    sys.modules[name] = mod
    exec(compile(src, mod.__file__, "exec"), mod.__dict__)
    return mod


def messages(records: int, base: int) -> list:
    """The catch-up's records as consumed messages of one partition (Kafka 0.9: no timestamps)."""
    out, off = [], 0
    for b in range(0, records // 10_000 + 1):
        for r in batch_rows(b, 10_000, base):
            if off == records:
                return out
            out.append(confluent_kafka.Message(topic="backlog", partition=0, offset=off, key=str(r["id"]).encode(),
                                               value=json.dumps(r).encode(), timestamp=(confluent_kafka.TIMESTAMP_NOT_AVAILABLE, -1)))
            off += 1
    return out


class FakeConsumer:
    """Hands out the prepared messages ``consume`` call by ``consume`` call, as librdkafka does."""

    def __init__(self, msgs: list) -> None:
        self.msgs, self.at = msgs, 0

    def assign(self, parts) -> None:
        self.at = 0

    def consume(self, num_messages: int, timeout: float) -> list:
        out = self.msgs[self.at:self.at + num_messages]
        self.at += len(out)
        return out

    def unassign(self) -> None:
        pass

    def close(self) -> None:
        pass


def source_parts(src: types.ModuleType) -> tuple[Any, Any, types.ModuleType]:
    """(settings class, read function, the module holding the consumer pool) of a version of
    the Kafka source: one module before issue 34, a package since (``read_range`` in its
    ``records`` module)."""
    if hasattr(src, "read_range"):
        return src.Settings, src.read_range, src.records
    return src._Settings, src._read_range, src


def read_all(src: types.ModuleType, msgs: list) -> list[pa.RecordBatch]:
    consumer = FakeConsumer(msgs)

    class Pool:
        def take(self, conf):
            return consumer, []

        def give_back(self, conf, c, errors):
            pass

    settings, read_range, pool_module = source_parts(src)
    pool_module._POOL = Pool()
    s = settings({"kafka.bootstrap.servers": "unused:9092", "subscribe": "backlog"})
    return list(read_range(s, "backlog", 0, 0, len(msgs)))


def broker_reads(args, msgs: list, old_source: types.ModuleType) -> tuple[float, float]:
    """(old, new) seconds to read ``msgs`` back through the source's read function from a real Apache
    Kafka 4 broker (tests/brokers.py), best of ``--rounds``, alternating old and new: the
    source's whole read phase (librdkafka's fetches and messages included) on one partition."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from brokers import produce, start_broker

    with tempfile.TemporaryDirectory() as work, start_broker(work) as broker:
        broker.create_topic("backlog", 1)
        produce(broker, "backlog", ((m.key(), m.value(), 0) for m in msgs), timeout=600, **{"linger.ms": 20})
        opts = {"kafka.bootstrap.servers": broker.bootstrap, "subscribe": "backlog"}
        best = {}
        for _ in range(args.rounds):
            for name, src in (("old", old_source), ("new", new_source)):
                settings, read_range, pool_module = source_parts(src)
                pool_module._POOL = None
                s = settings(opts)
                t0 = time.perf_counter()
                n = sum(b.num_rows for b in read_range(s, "backlog", 0, 0, len(msgs)))
                best[name] = min(best.get(name, float("inf")), time.perf_counter() - t0)
                assert n == len(msgs)
    return best["old"], best["new"]


def timed(fn, rounds: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(rounds):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=93_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--broker", action="store_true", help="also read the records back from a real Kafka 0.9 broker")
    ap.add_argument("--baseline", default="0c75d42", help="git revision whose source and decode are the baseline")
    args = ap.parse_args()

    old_source = _module_at(args.baseline, "memwal/streaming/kafka_source.py", "bench_old_kafka_source")
    _module_at(args.baseline, "memwal/streaming/decode.py", "bench_old_decode")  # old_sink imports it
    old_sink = _module_at(args.baseline, "memwal/streaming/sink.py", "bench_old_sink",
                          {"from memwal.streaming.decode import": "from bench_old_decode import"})

    msgs = messages(args.records, 1_000_000)
    print(f"{today()}, {machine()}, commit {git_rev()} against {args.baseline}; {len(msgs):,} records, "
          f"{sum(len(m.value()) for m in msgs) / 2**20:.1f} MiB of JSON values; best of {args.rounds}")

    t_old_read, old_batches = timed(lambda: read_all(old_source, msgs), args.rounds)
    t_new_read, new_batches = timed(lambda: read_all(new_source, msgs), args.rounds)
    assert pa.Table.from_batches(old_batches).equals(pa.Table.from_batches(new_batches).cast(old_source.KAFKA_ARROW_SCHEMA))

    with tempfile.TemporaryDirectory() as work:
        uri = os.path.join(work, "t")
        Table.create(uri, SCHEMA, ["id"], "bucket(id, 4)").close()
        state = TableState.load(uri)
        opts = SinkOptions(source="kafka-json", op_field=None)

        def prepare(sink, batches, opts=opts):
            out, row = [], 0
            p = sink.Prepare(uri, opts)
            for b in batches:
                out.append(p.prepare(state, pa.Table.from_batches([b]), 0, row, 1))
                row += b.num_rows
            return out

        t_old_dec, old_prep = timed(lambda: prepare(old_sink, old_batches), args.rounds)
        t_new_dec, new_prep = timed(lambda: prepare(new_sink, new_batches), args.rounds)
        # ``memwal ingest``'s default reads an operation field ("op"; absent here: all upserts)
        with_op = SinkOptions(source="kafka-json")
        t_old_op, old_op = timed(lambda: prepare(old_sink, old_batches, with_op), args.rounds)
        t_new_op, new_op = timed(lambda: prepare(new_sink, new_batches, with_op), args.rounds)
        for a, b in zip(old_prep + old_op, new_prep + new_op):
            assert a.rows.equals(b.rows) and a.dead.equals(b.dead) and a.shards == b.shards, "prepare differs from the baseline"

    per = 93_000 / len(msgs) * 1000
    phases = [("read", t_old_read, t_new_read), ("decode", t_old_dec, t_new_dec), ("decode, op field", t_old_op, t_new_op),
              ("both", t_old_read + t_old_dec, t_new_read + t_new_dec)]
    if args.broker:
        o, n = broker_reads(args, msgs, old_source)
        phases += [("read from Kafka 0.9 (fetches included)", o, n), ("that + decode", o + t_old_dec, n + t_new_dec)]
    print(f"{'phase':<40}{'old ms/93k':>12}{'new ms/93k':>12}{'new/old':>9}")
    for name, o, n in phases:
        print(f"{name:<40}{o * per:>12.0f}{n * per:>12.0f}{n / o:>9.2f}")


if __name__ == "__main__":
    main()
