"""Ingest benchmark: memwal's Spark sink against the naive sink, in one run, same data.

The naive sink is what a user writes today: ``foreachBatch`` decoding the Kafka JSON with
Spark's ``from_json``, collecting the micro-batch and running Lance ``merge_insert`` on
the driver. The memwal sink is :func:`memwal.streaming.job`. Both read the same
records from the same local broker through the same Kafka source.

Workload (as in ../shared/notes/baselines.md): a base table of ``--base-rows`` rows
(id int64 key, val float64, name ~20 chars, vec 64 x float32), micro-batches of 10k rows,
half updates of existing ids and half new ids.

Phases:
1. throughput: the topic is filled first, then each sink drains it (``availableNow``,
   ``maxOffsetsPerTrigger`` = batch size): rows/s and micro-batch latency p50/p99;
2. freshness: a producer sends at a fixed rate (``--freshness-rate``) while the query runs;
   a probe record every 100 ms carries its send time, and a reader in another (spawned)
   process (bench/probe_reader.py) polls the table and records when each probe becomes
   visible: producer send -> visible, p50/p99, plus the sink's fenced retries and writer
   opens per minute over the phase; for memwal's strong reader, the verdict against issue
   12's steady-state targets (p50 <= 300 ms, p99 <= 600 ms, <= 1 fenced retry per minute);
3. durability: memwal's Python write path (``Table.write``, 4 shards) with ``durability="os"``
   against ``"fsync"`` (each write acknowledged only once its WAL entries are fsynced), same
   process, same data, alternating: rows/s and the fsync/os ratio per batch size.

Run: ``python bench/ingest.py`` (add ``--base-rows 3000000`` to see the trend with size);
``--durability-only`` runs phase 3 alone (no Spark, no broker); ``--freshness-only`` runs
phase 2 alone for memwal's strong reader, on a table of ``--base-rows`` rows.

``--axes`` runs the grid instead (:func:`run_axes`): base table size (``--bases``, made once
and kept under ``--cache-dir``) x micro-batch size (``--sizes``), memwal against the naive
sink on the same records in one run, each memwal cell with its per-batch time breakdown
(:class:`memwal.streaming.timing.BatchTiming`), then the backlog catch-up rate with adaptive
micro-batches against memwal's Python write path on the same records; ``--plot FILE``
draws rows/s against both axes (matplotlib, the ``bench`` extra). ``--value-format avro``
sends the catch-up's records as Avro (bare datums of bench/common.py's AVSC) instead of JSON.

``--kafka-sources spark,python`` (the default: both) runs each phase through Spark's own Kafka
connector and memwal's Python source, each against the naive sink on the same source. The
broker is a local Apache Kafka 4 (memwal_dev.local_broker, full JIT); its start time and
memory are printed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import threading
import time

from memwal.core.runtime import configure_process  # noqa: E402

configure_process()  # Lance's log filter, before Lance is imported

import lance  # noqa: E402
import pyarrow as pa  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import AVSC, DIM, SCHEMA, base_rows, batch_json, batch_rows, git_rev, machine, pct, report, today, trigger_cadence, value_encoder, work_dir  # noqa: E402
from probe_reader import ProbeReader  # noqa: E402

from memwal import Table, WriterConfig, readers  # noqa: E402
from memwal.streaming import SinkOptions, ingest, kafka_stream, local_session  # noqa: E402
from memwal.streaming.adaptive import AdaptiveSizing  # noqa: E402
from memwal.streaming.job import MIN_ROWS_PER_TASK  # noqa: E402
from memwal_dev.local_broker import start_local_broker  # noqa: E402

PROBE = -1
log = logging.getLogger("bench.ingest")


@contextlib.contextmanager
def open_broker(workdir: str):
    """An Apache Kafka 4 broker (memwal_dev.local_broker) with the full JIT, stopped on exit."""
    with start_local_broker(workdir, fast_start=False) as b:
        print(f"Apache Kafka broker on {b.bootstrap}: up in {b.start_seconds:.1f}s, {b.rss_bytes() / 2**20:.0f} MiB resident")
        yield b


def produce_batches(broker, topic: str, batches: int, size: int, base: int, first: int = 0, value_format: str = "json") -> int:
    encode = value_encoder(value_format)
    sent = 0
    for b in range(first, first + batches):
        rows = batch_rows(b, size, base)
        sent += len(broker.produce(topic, [(str(r["id"]).encode(), encode(r), r["id"] % 3) for r in rows], timeout=600, **{"linger.ms": 20}))
    return sent


# -- the naive sink ------------------------------------------------------------------------------


class NaiveSink:
    """foreachBatch: from_json in Spark, collect, keep the last record per key (merge_insert
    refuses two source rows for one key), Lance merge_insert on the driver."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.durations: list[float] = []
        #: Per micro-batch with rows: seconds in Spark's job (Kafka read and from_json in the
        #: JVM, rows to Arrow) and in the dedup + merge_insert (the write).
        self.job_seconds: list[float] = []
        self.write_seconds: list[float] = []
        #: The query's progress (Spark's durations per micro-batch), set when it ends.
        self.progress: list[dict] = []
        self.rows = 0

    def profile(self, skip: int = 1) -> dict[str, float]:
        """Mean ms per micro-batch with rows (the first ``skip`` left out): Spark's planning,
        the job reading and decoding, the write, Spark's offset and commit logs."""
        ps = [p for p in self.progress if p.get("numInputRows")][skip:]
        jobs, writes = self.job_seconds[skip:], self.write_seconds[skip:]
        if not ps or not jobs:
            return {}

        def mean(xs):
            return sum(xs) / len(xs)

        d = [p["durationMs"] for p in ps]
        return {"total_ms": mean([x.get("triggerExecution", 0) for x in d]),
                "planning_ms": mean([x.get("latestOffset", 0) + x.get("getBatch", 0) + x.get("queryPlanning", 0) for x in d]),
                "read_decode_ms": 1000 * mean(jobs), "write_ms": 1000 * mean(writes),
                "commit_ms": mean([x.get("walCommit", 0) + x.get("commitOffsets", 0) for x in d])}

    def __call__(self, df, batch_id: int) -> None:
        from pyspark.sql import functions as F
        from pyspark.sql.types import ArrayType, DoubleType, FloatType, LongType, StringType, StructField, StructType

        t0 = time.perf_counter()
        spark_schema = StructType(
            [
                StructField("id", LongType()),
                StructField("val", DoubleType()),
                StructField("name", StringType()),
                StructField("vec", ArrayType(FloatType())),
            ]
        )
        data = (
            df.select(F.from_json(F.col("value").cast("string"), spark_schema).alias("r"), "partition", "offset")
            .select("r.*", "partition", "offset")
            .toArrow()
        )
        t1 = time.perf_counter()
        if data.num_rows:
            from memwal.core.lsm import newest_per_key  # a user would write this dedup by hand

            data = newest_per_key(data.sort_by([("partition", "ascending"), ("offset", "ascending")]), ["id"])
            vec = pa.FixedSizeListArray.from_arrays(data.column("vec").combine_chunks().flatten(), DIM)
            data = pa.table({"id": data["id"], "val": data["val"], "name": data["name"], "vec": vec}, schema=SCHEMA)
            lance.dataset(self.uri).merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(data)
            self.rows += data.num_rows
            t2 = time.perf_counter()
            self.durations.append(t2 - t0)
            self.job_seconds.append(t1 - t0)
            self.write_seconds.append(t2 - t1)


def run_naive(spark, broker, topic: str, uri: str, ckpt: str, batch: int, available_now: bool = True, stop: threading.Event | None = None,
              started: list | None = None, kafka_source: str = "spark"):
    sink = NaiveSink(uri)
    if started is not None:
        started.append(sink)
    source = kafka_stream(spark, broker.bootstrap, topic, max_offsets_per_trigger=batch, kafka_source=kafka_source)
    writer = source.writeStream.foreachBatch(sink).option("checkpointLocation", ckpt)
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime="0 seconds")
    t0 = time.perf_counter()
    q = writer.start()
    if available_now:
        q.awaitTermination()
    else:
        stop.wait()
        q.stop()
    elapsed = time.perf_counter() - t0
    sink.progress = [json.loads(p.json) if hasattr(p, "json") else dict(p) for p in q.recentProgress]
    return sink, elapsed


#: memwal's layouts ``--axes --variants`` can run side by side in each cell (each against the
#: same cell's naive sink): ingest's default on one executor, the tasks that read write
#: (``format("memwal")``, one stage); the exchange by shard first (the ``foreachBatch`` sink,
#: two stages, what ``ingest`` runs on a cluster whose topic is not partitioned by shard, and
#: the default before).
VARIANTS = {
    "default": {},
    "exchange": {"exchange": "shard"},
}


def run_memwal(spark, broker, topic: str, uri: str, ckpt: str, batch: int, tasks: int | None, available_now: bool = True, stop: threading.Event | None = None,
               started: list | None = None, kafka_source: str = "spark", min_records_per_read_task: int | None = MIN_ROWS_PER_TASK,
               exchange: str = "auto", **sink_options):
    job = ingest(
        spark,
        bootstrap=broker.bootstrap,
        topic=topic,
        table_uri=uri,
        checkpoint=ckpt,
        kafka_source=kafka_source,
        min_records_per_read_task=min_records_per_read_task,
        available_now=available_now,
        max_offsets_per_trigger=batch,
        options=SinkOptions(source="kafka-json", op_field=None, max_write_tasks=tasks, **sink_options),
        exchange=exchange,
    )
    if started is not None:
        started.append(job)
    t0 = time.perf_counter()
    if available_now:
        job.await_termination()
    else:
        stop.wait()
        job.stop()
    return job, time.perf_counter() - t0


def shard_manifests(uri: str) -> dict:
    """Each shard's current manifest (shard id -> ShardManifest)."""
    from memwal.core.state import TableState

    store = TableState.load(uri).manifests
    return {sid: m for sid in store.list_shards() if (m := store.read_shard(sid)) is not None}


def writer_epochs(uri: str) -> int:
    """The sum of the table's shard epochs (each writer open claims its shard: +1)."""
    return sum(m.writer_epoch for m in shard_manifests(uri).values())


def pending_sstables(uri: str) -> dict[str, int]:
    """Each shard's SSTables not yet compacted into the base (what readers merge, what the
    table's bounds limit)."""
    from memwal.core.state import TableState

    return {s.shard_id: len(s.live_sstables) for s in TableState.load(uri).snapshot().shards}


def run_real_time(spark, broker, topic: str, uri: str, work: str, stop: threading.Event, started: list, flush_interval: float = 2.0):
    """memwal's Real-Time Mode ingest (memwal.streaming.realtime) until ``stop`` is set, with
    maintenance running beside it (as ``memwal ingest --real-time --maintain``): seals every
    ``flush_interval`` seconds make SSTables that only compaction keeps under the table's bounds.
    Every 10 s the uncompacted SSTables per shard are sampled; their maximum and last value are
    printed at the end (the bound a long run must hold)."""
    from memwal.maintain.maintenance import Maintenance, MaintenanceConfig
    from memwal.core.state import TableState
    from memwal.streaming.realtime import ingest_real_time

    maintenance = Maintenance(TableState.load(uri), MaintenanceConfig(interval_seconds=1.0))
    maintenance.start()
    job = ingest_real_time(spark, bootstrap=broker.bootstrap, topic=topic, table_uri=uri, checkpoint=os.path.join(work, f"ckpt-rt-{topic}"),
                           options=SinkOptions(source="kafka-json", op_field=None, flush_interval_seconds=flush_interval))
    started.append(job)
    samples: list[int] = []
    while not stop.wait(10):
        samples.append(max(pending_sstables(uri).values(), default=0))
    job.stop()
    maintenance.stop()
    last = pending_sstables(uri)
    print(f"  uncompacted SSTables per shard: at most {max(samples, default=0)} over {len(samples)} samples 10 s apart "
          f"(a shard's most); at the end { {sid[:8]: n for sid, n in last.items()} }")
    return job, 0.0


# -- freshness -----------------------------------------------------------------------------------


def freshness(broker, name: str, run, reader_kind: str, uri: str, rate: int, seconds: float, base: int) -> dict:
    """Producer at ``rate`` rows/s with a probe every 100 ms, and a reader in another process
    (:class:`probe_reader.ProbeReader`, ``reader_kind``) watching ``uri`` for it.

    When the reader sees a probe sent at ``v``, every probe sent up to ``v`` is visible too
    (one partition, read in order, committed a micro-batch at a time), so each of them counts
    its own send -> visible delay: taking only the newest of a micro-batch's probes would
    report its shortest delay. ``run(topic, stop, started)`` runs the query until ``stop`` is
    set and appends the ingest job (or the naive sink) to ``started``; for an ingest job the
    sink's fenced retries and writer opens are counted over the measured window (producer
    start -> last probe visible), not the query's start-up."""
    topic = f"fresh-{name}-{time.monotonic_ns()}"
    broker.create_topic(topic, 3)
    stop_query = threading.Event()
    done = threading.Event()
    sent: list[float] = []  # probe send times, in order
    produced = [0]

    def produce():
        t_end = time.time() + seconds

        def probe(producer) -> None:  # one per burst, i.e. every 100 ms
            sent.append(send_probe(producer, topic))

        # Batch numbers far from the throughput phase's.
        produced[0] = produce_at_rate(broker, topic, rate, base + 50_000_000, lambda: time.time() < t_end, first_batch=10_000, after_burst=probe)
        done.set()

    reader = ProbeReader(reader_kind, uri, PROBE)
    reader.start()
    started: list = []
    runner = threading.Thread(target=run, args=(topic, stop_query, started))
    producer = threading.Thread(target=produce)
    runner.start()
    # The query's start-up is not part of freshness: wait until it runs (a loaded machine may
    # take long to start it), then give it a few seconds more.
    until = time.monotonic() + 300
    while not started and runner.is_alive() and time.monotonic() < until:
        time.sleep(0.1)
    if not started:
        stop_query.set()
        reader.stop()
        raise RuntimeError(f"the {name} query did not start")
    time.sleep(6)
    job = started[0] if hasattr(started[0], "sink") else None
    warm_up(broker, topic, reader)
    before = job.reports.totals() if job else {}
    first_batch = max(job.listener.progress, default=-1) + 1 if job else 0
    t_start, w_start = time.monotonic(), time.time()
    producer.start()
    delays: list[float] = []
    measured = 0  # probes of sent[] already given a delay
    deadline = time.monotonic() + seconds + 120
    try:
        while time.monotonic() < deadline:
            seen = reader.next(timeout=0.5)
            if seen is not None:
                v, at = seen
                if v >= w_start:  # not a probe left in the table by an earlier run
                    while measured < len(sent) and sent[measured] <= v:
                        delays.append(at - sent[measured])
                        measured += 1
            if done.is_set() and sent and measured >= len(sent):
                break
        window = time.monotonic() - t_start
        after = job.reports.totals() if job else {}
    finally:
        stop_query.set()
        reader.stop()
    producer.join()
    runner.join(timeout=120)
    out = {"samples": delays,
           "probes_sent": len(sent), "probes_seen": measured, "window_s": window, "produced_rows_per_s": produced[0] / window}
    if job:
        minutes = window / 60
        for k in ("fenced_retries", "writer_opens", "batches"):
            out[k] = int(after.get(k, 0) - before.get(k, 0))
        out["fenced_retries_per_min"] = out["fenced_retries"] / minutes
        out["writer_opens_per_min"] = out["writer_opens"] / minutes
        out.update(cadence(job.listener, first_batch))
        # What a shard flush (close -> SSTable) adds to the micro-batch that runs it.
        reports = [r for r in job.reports.reports if r.batch_id >= before.get("batches", 0)]
        for label, rs in (("with_flush", [r for r in reports if r.flushes]), ("without_flush", [r for r in reports if not r.flushes])):
            if rs:
                out[f"batches_{label}"] = len(rs)
                out[f"batch_ms_{label}"] = 1000 * sum(r.seconds for r in rs) / len(rs)
                out[f"write_ms_max_{label}"] = 1000 * sum(r.write_seconds_max for r in rs) / len(rs)
    return out


def produce_at_rate(broker, topic: str, rate: int, base: int, keep_going, first_batch: int = 0, after_burst=None) -> int:
    """Produce the workload's records (:func:`batch_json` over ``base`` ids) to ``topic`` at
    ``rate`` rows/s, a burst every 100 ms, while ``keep_going()``; ``after_burst(producer)``
    runs after each burst. Returns how many records it produced (flushed)."""
    import confluent_kafka

    producer = confluent_kafka.Producer(broker.client_config(**{"linger.ms": 5}))
    produced, b = 0, first_batch
    while keep_going():
        t0 = time.time()
        for i, value in batch_json(b, rate // 10, base):
            producer.produce(topic, key=str(i).encode(), value=value, partition=i % 3)
        produced += rate // 10
        if after_burst is not None:
            after_burst(producer)
        producer.poll(0)
        b += 1
        time.sleep(max(0.0, 0.1 - (time.time() - t0)))
    producer.flush(30)
    return produced


def send_probe(producer, topic: str) -> float:
    """Produce the freshness probe (key ``PROBE``, partition 0) carrying its send time; returns it."""
    at = time.time()
    probe = {"id": PROBE, "val": at, "name": "probe", "vec": [0.0] * DIM}
    producer.produce(topic, key=b"probe", value=json.dumps(probe).encode(), partition=0)
    return at


def warm_up(broker, topic: str, reader: ProbeReader, timeout: float = 120.0) -> None:
    """Send one probe before the measured window and wait until the reader sees it, so the
    window measures the steady state: the first micro-batch with data starts the Python
    workers, the writer process and the shard writers (seconds, once per query)."""
    import confluent_kafka

    producer = confluent_kafka.Producer(broker.client_config())
    at = send_probe(producer, topic)
    producer.flush(30)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = reader.next(timeout=0.5)
        if seen is not None and seen[0] >= at:
            print(f"  warm-up: the first probe took {seen[1] - at:.2f} s")
            return
    raise RuntimeError("the warm-up probe never became visible")


def cadence(listener, first_batch: int) -> dict:
    """How often micro-batches with data started from ``first_batch`` on, and where a
    micro-batch's time went: Spark's driver-side durations and the joined profile, means."""
    from memwal.streaming.timing import PHASES, mean_timing

    ids = sorted(b for b, p in listener.progress.items() if b >= first_batch and p["input_rows"])
    out = trigger_cadence([listener.progress[b]["timestamp"] for b in ids], [listener.progress[b]["duration_ms"] for b in ids])
    m = mean_timing([listener.timings[b] for b in ids if b in listener.timings])
    if out and m is not None:
        out["phases_ms_mean"] = {p: getattr(m, p) for p in ("total_ms", *PHASES)}
    return out


#: Issue 12's steady-state targets (bench, not tests): at 5k rows/s, producer send -> visible
#: to a strong reader in another process.
FRESHNESS_TARGETS = {"p50_ms": 300.0, "p99_ms": 600.0, "fenced_retries_per_min": 1.0}


def print_freshness(name: str, f: dict, rate: int, verdict: bool) -> dict:
    """One reader's freshness line (and the targets' verdict lines); the result record."""
    samples = f["samples"]
    row = {"reader": name, "p50_ms": pct(samples, 50) * 1000 if samples else None,
           "p99_ms": pct(samples, 99) * 1000 if samples else None, "probes": len(samples),
           **{k: v for k, v in f.items() if k != "samples"},
           "delays_ms": [round(x * 1000) for x in samples]}  # in send order: where the slow probes sit
    if not samples:
        print(f"{name:32} no probe became visible ({f['probes_sent']} sent)")
        return row
    line = f"{name:32} p50 {row['p50_ms']:6.0f} ms   p99 {row['p99_ms']:6.0f} ms   ({len(samples)} probes"
    if "fenced_retries" in f:
        line += (f"; {f['fenced_retries_per_min']:.1f} fenced retries/min, {f['writer_opens_per_min']:.1f} writer opens/min"
                 f" over {f['window_s']:.0f}s, {f['batches']} batches")
    print(line + f"; producer {f['produced_rows_per_s']:,.0f} rows/s)")
    if "cadence_ms_p50" in f:
        spark = "  ".join(f"{k} {v:.0f}" for k, v in f["spark_duration_ms_mean"].items())
        print(f"  a micro-batch with data every {f['cadence_ms_p50']:.0f} ms (p50; p90 {f['cadence_ms_p90']:.0f}); Spark's durations, mean ms: {spark}")
        if "phases_ms_mean" in f:
            print("  phases, mean ms: " + "  ".join(f"{k[:-3]} {v:.0f}" for k, v in f["phases_ms_mean"].items()))
    if "batch_ms_with_flush" in f and "batch_ms_without_flush" in f:
        print(f"  micro-batches with a shard flush: {f['batches_with_flush']}, {f['batch_ms_with_flush']:.0f} ms mean "
              f"(longest shard write {f['write_ms_max_with_flush']:.0f} ms); without: {f['batches_without_flush']}, "
              f"{f['batch_ms_without_flush']:.0f} ms (longest shard write {f['write_ms_max_without_flush']:.0f} ms)")
    if verdict:
        checks = [("freshness p50", row["p50_ms"], "p50_ms", "ms"), ("freshness p99", row["p99_ms"], "p99_ms", "ms"),
                  ("fenced retries", f.get("fenced_retries_per_min"), "fenced_retries_per_min", "/min")]
        if rate != 5_000:
            print(f"  (the targets are stated at 5,000 rows/s; this ran at {rate:,})")
        for label, value, key, unit in checks:
            target = FRESHNESS_TARGETS[key]
            if value is None:
                print(f"  target {label} <= {target:g} {unit}: not measured")
            else:
                print(f"  target {label} <= {target:g} {unit}: {'met' if value <= target else 'MISSED'} ({value:.1f} {unit})")
        row["targets_met"] = all(v is not None and v <= FRESHNESS_TARGETS[k] for _, v, k, _ in checks)
    return row


def run_freshness_only(args) -> dict:
    """Phase 2 alone: a memwal table of ``--base-rows`` rows, the ingest query at
    ``--freshness-rate``, a strong reader in another process."""
    with work_dir(args.workdir, "memwal-bench-freshness-") as work:
        spark = local_session(app="memwal-bench", fast_start=not args.full_jit, cores=args.cores)
        spark.sparkContext.setLogLevel("ERROR")
        try:
            with open_broker(os.path.join(work, "broker")) as broker:
                uri = os.path.join(work, "memwal")
                t0 = time.perf_counter()
                Table.create(uri, SCHEMA, ["id"], "bucket(id, 4)", initial_data=base_rows(args.base_rows)).close()
                print(f"base table of {args.base_rows:,} rows ready in {time.perf_counter() - t0:.1f}s")
                print(f"\nfreshness at {args.freshness_rate:,} rows/s for {args.freshness_seconds:.0f}s "
                      "(producer send -> visible to a strong reader in another process)")

                rows = []
                for source in args.kafka_sources:
                    if source.startswith("real-time"):  # real-time: a strong reader; real-time-eventual: an eventual one
                        kind = "eventual" if source.endswith("eventual") else "strong"
                        # Writer opens, counted from outside: each is a claim, which raises its shard's epoch.
                        epochs = writer_epochs(uri)
                        t_open = time.monotonic()
                        def rt(topic, stop, started):
                            return run_real_time(spark, broker, topic, uri, work, stop, started, args.real_time_flush_interval)

                        f = freshness(broker, f"memwal-{source}", rt, kind, uri, args.freshness_rate, args.freshness_seconds, args.base_rows)
                        opens = writer_epochs(uri) - epochs
                        print(f"  writer opens (shard epochs raised) over the whole query, start-up included: {opens} in {time.monotonic() - t_open:.0f}s")
                        f["writer_opens_whole_query"] = opens
                        rows.append(print_freshness(f"memwal, Real-Time Mode, {kind} reader", f, args.freshness_rate, verdict=kind == "strong"))
                        continue

                    def run(topic, stop, started, source=source):
                        return run_memwal(spark, broker, topic, uri, os.path.join(work, f"ckpt-{topic}"), args.batch_rows, None, False, stop, started,
                                          kafka_source=source, single_stage_max_rows=args.single_stage_max_rows,
                                          **({} if args.writer_process is None else {"writer_process": args.writer_process}))

                    f = freshness(broker, f"memwal-{source}", run, "strong", uri, args.freshness_rate, args.freshness_seconds, args.base_rows)
                    rows.append(print_freshness(f"memwal, {source} source, strong reader", f, args.freshness_rate, verdict=True))
                return {"freshness": rows}
        finally:
            spark.stop()


def merge_modes(work: str, base: int, batches: int, size: int, flush_every: int = 5) -> dict:
    """Partial updates against full upserts, Python write path (no Spark), same process.

    Two tables from the same base; each gets ``batches`` writes of ``size`` updates of
    existing ids (the same ids in both): full rows into one, only ``val`` into the other
    (``merge="partial"``: a strong read of the stored rows, a fold, then a full put), and
    both flush every ``flush_every`` writes, so partial reads hit the WAL tail, SSTables
    and the base as a sink's would.
    """
    import numpy as np

    data = base_rows(base)
    rng = np.random.default_rng(7)
    out = {}
    for mode in ("full", "partial"):
        uri = os.path.join(work, f"merge-{mode}")
        t = Table.create(uri, SCHEMA, ["id"], "bucket(id, 4)", initial_data=data)
        rng = np.random.default_rng(7)
        busy = 0.0
        for b in range(batches):
            ids = np.sort(rng.choice(base, size, replace=False))
            rows = data.take(pa.array(ids)).set_column(1, "val", pa.array(rng.random(size)))
            if mode == "partial":
                rows = rows.select(["id", "val"])
            t0 = time.perf_counter()
            t.write(rows, merge=mode)
            if (b + 1) % flush_every == 0:
                t.flush()
            busy += time.perf_counter() - t0
        t.close()
        out[mode] = batches * size / busy
    out["ratio"] = out["partial"] / out["full"]
    print(f"\nmerge modes, Python write path ({batches} writes of {size:,} updates of existing ids, base {base:,}):")
    print(f"  full upserts {out['full']:12,.0f} rows/s\n  partial      {out['partial']:12,.0f} rows/s   ({out['ratio']:.2f}x full)")
    return out


def durability_cost(work: str, batch_sizes: tuple[int, ...] = (100, 10_000), rows: int = 100_000, rounds: int = 3) -> list[dict]:
    """rows/s of ``Table.write`` with durability os and fsync; the two alternate within each round so
    that the machine's load drifts over both alike. Prints and returns one record per batch size."""
    print(f"\ndurability: Table.write of {rows:,} rows per run, 4 shards, {rounds} rounds (os and fsync alternating)")
    print(f"{'batch rows':>10} {'os rows/s':>12} {'fsync rows/s':>13} {'fsync / os':>11}")
    out = []
    for size in batch_sizes:
        batches = [pa.Table.from_pylist(batch_rows(b, size, rows), schema=SCHEMA) for b in range(max(1, rows // size))]
        seconds: dict[str, float] = {"os": 0.0, "fsync": 0.0}
        for r in range(rounds):
            for durability in ("os", "fsync"):
                uri = os.path.join(work, f"durability-{size}-{r}-{durability}")
                with Table.create(uri, SCHEMA, ["id"], "bucket(id, 4)", writer=WriterConfig(durability=durability)) as t:
                    t0 = time.perf_counter()
                    for b in batches:
                        t.write(b)
                    seconds[durability] += time.perf_counter() - t0
        n = rounds * sum(b.num_rows for b in batches)
        os_rate, fsync_rate = n / seconds["os"], n / seconds["fsync"]
        print(f"{size:>10,} {os_rate:12,.0f} {fsync_rate:13,.0f} {fsync_rate / os_rate:11.2f}")
        out.append({"batch_rows": size, "os_rows_per_s": os_rate, "fsync_rows_per_s": fsync_rate, "fsync_over_os": fsync_rate / os_rate})
    return out


# -- axes: base size x micro-batch size, per-batch breakdown, backlog catch-up ------------------


def cached_base(cache: str, n: int) -> tuple[str, str]:
    """A naive (plain Lance) and a memwal table of the ``n``-row base under ``cache``, made
    once: cells copy them (a file copy is much cheaper than writing 1M-10M rows again)."""
    import shutil

    naive, mem = os.path.join(cache, f"naive-{n}"), os.path.join(cache, f"memwal-{n}")
    if not (os.path.exists(os.path.join(naive, ".done")) and os.path.exists(os.path.join(mem, ".done"))):
        for d in (naive, mem):
            shutil.rmtree(d, ignore_errors=True)
        t0 = time.perf_counter()
        base = base_rows(n)
        lance.write_dataset(base, naive)
        Table.create(mem, SCHEMA, ["id"], "bucket(id, 4)", initial_data=base).close()
        del base
        for d in (naive, mem):
            open(os.path.join(d, ".done"), "w").close()
        print(f"base of {n:,} rows made in {time.perf_counter() - t0:.0f}s (cached in {cache})")
    return naive, mem


def _copy(src: str, dst: str) -> str:
    import shutil

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".done"))
    return dst


def print_breakdown(label: str, timings: list) -> dict:
    """Mean per-batch phases of ``timings`` (warm-up batch dropped), ms and fraction."""
    from memwal.streaming.timing import PHASES, mean_timing

    m = mean_timing(timings[1:] if len(timings) > 1 else timings)
    if m is None:
        return {}
    f = m.fractions()
    cells = "  ".join(f"{p[:-3]} {getattr(m, p):.0f} ({f[p]:.0%})" for p in PHASES)
    print(f"  {label}: {m.rows:,} rows/batch, {m.total_ms:.0f} ms/batch: {cells}")
    return {"rows": m.rows, "total_ms": m.total_ms, **{p: getattr(m, p) for p in PHASES}}


def run_axes(args, spark, broker, work: str) -> dict:
    out: dict = {"cells": [], "catch_up": []}
    cache = args.cache_dir
    os.makedirs(cache, exist_ok=True)
    for n in args.bases:
        naive_base, mem_base = cached_base(cache, n)
        for size in [] if args.catch_up_only else args.sizes:
            batches = max(2, args.records_per_cell // size)  # the first is the warm-up
            topic = f"axes-{n}-{size}"
            broker.create_topic(topic, 3)
            sent = produce_batches(broker, topic, batches, size, n)
            for source in args.kafka_sources:
                cell = os.path.join(work, f"{topic}-{source}")
                naive_uri = _copy(naive_base, cell + "-naive")
                naive, _ = run_naive(spark, broker, topic, naive_uri, cell + "-ckpt-naive", size, kafka_source=source)
                # steady-state rate: the first batch of each (JVM/worker warm-up) left out
                nd = naive.durations[1:]
                naive_rate = size * len(nd) / sum(nd)
                naive_profile = naive.profile(1)
                print(f"base {n:>10,}  batch {size:>7,}  {source:6} source: naive {naive_rate:9,.0f} rows/s  ({sent:,} records)")
                print("  naive per batch: " + "  ".join(f"{k} {v:.0f}" for k, v in naive_profile.items()))
                import shutil

                shutil.rmtree(naive_uri, ignore_errors=True)
                for variant in args.variants:
                    mem_uri = _copy(mem_base, cell + f"-memwal-{variant}")
                    job, _ = run_memwal(spark, broker, topic, mem_uri, cell + f"-ckpt-memwal-{variant}", size, None, kafka_source=source,
                                        **VARIANTS[variant])
                    md = [r.seconds for r in job.reports.reports][1:]
                    mem_rate = sum(r.rows for r in job.reports.reports[1:]) / sum(md)
                    print(f"  memwal ({variant}): {mem_rate:9,.0f} rows/s  x{mem_rate / naive_rate:.2f} naive")
                    timings = [job.listener.timings[b] for b in sorted(job.listener.timings)]
                    breakdown = print_breakdown(f"memwal ({variant}) per batch", timings)
                    totals = job.reports.totals()
                    print(f"  writers: {int(totals['writer_opens'])} open(s), {int(totals['fenced_retries'])} fenced retr(ies) "
                          f"in {int(totals['batches'])} batches")
                    out["cells"].append({"base_rows": n, "batch_rows": size, "kafka_source": source, "variant": variant, "naive_rows_per_s": naive_rate,
                                         "memwal_rows_per_s": mem_rate, "x_naive": mem_rate / naive_rate, "breakdown": breakdown,
                                         "naive_profile": naive_profile,
                                         "writer_opens": totals["writer_opens"], "fenced_retries": totals["fenced_retries"]})
                    shutil.rmtree(mem_uri, ignore_errors=True)
    if args.backlog_records:
        for source in args.kafka_sources:
            out["catch_up"].append(catch_up(args, spark, broker, work, source))
    return out


def catch_up(args, spark, broker, work: str, source: str) -> dict:
    """``--backlog-records`` waiting, drained with adaptive micro-batches through ``source``;
    memwal's Python write path (Table.write of the same rows, decoded) on the same records as
    the yardstick."""

    n = args.bases[0]
    naive_base, mem_base = cached_base(args.cache_dir, n)
    topic = f"backlog-{args.value_format}"
    size = 10_000
    if topic not in broker_topics(broker):
        broker.create_topic(topic, 3)
        produce_batches(broker, topic, args.backlog_records // size, size, n, value_format=args.value_format)
    sent = args.backlog_records // size * size
    uri = _copy(mem_base, os.path.join(work, f"backlog-memwal-{source}"))
    policy = AdaptiveSizing(steady_rows=size, max_rows=args.adaptive_max_rows, growth=args.adaptive_growth)
    job = ingest(spark, bootstrap=broker.bootstrap, topic=topic, table_uri=uri, checkpoint=os.path.join(work, f"ckpt-backlog-{source}"),
                 kafka_source=source, available_now=True, adaptive=policy,
                 options=SinkOptions(source="kafka-json", op_field=None, value_format=args.value_format,
                                     avro_schema=json.dumps(AVSC) if args.value_format == "avro" else None))
    t0 = time.perf_counter()
    job.await_termination()
    elapsed = time.perf_counter() - t0
    sizes = [job.listener.sizes[b] for b in sorted(job.listener.sizes)]
    spark_rate = sent / elapsed
    sink_rate = sum(r.rows for r in job.reports.reports) / sum(r.seconds for r in job.reports.reports)
    print(f"\nbacklog catch-up, {source} source, {sent:,} {args.value_format} records waiting, adaptive micro-batches: {spark_rate:,.0f} rows/s through Spark "
          f"({len(sizes)} batches: " + ", ".join(f"{d.rows:,} {d.kind}" for d in sizes[:6]) + (" ..." if len(sizes) > 6 else "") + ")")
    timings = [job.listener.timings[b] for b in sorted(job.listener.timings)]
    breakdown = print_breakdown("catch-up per batch", timings)
    in_batches = sum(t.total_ms for t in timings) / 1000
    print(f"  micro-batches: {in_batches:.1f} s of the query's {elapsed:.1f} s; each: "
          + ", ".join(f"{t.rows // 1000}k {t.total_ms / 1000:.1f} s (read {t.read_ms / 1000:.1f}, decode {t.decode_ms / 1000:.1f})" for t in timings))
    # The yardstick: memwal's Python write path on the same records, decoded once up front.
    py_uri = _copy(mem_base, os.path.join(work, f"backlog-python-{source}"))
    rows = [batch_rows(b, size, n) for b in range(args.backlog_records // size)]
    tables = [pa.Table.from_pylist(r, schema=SCHEMA) for r in rows]
    del rows
    table = Table.open(py_uri)
    t0 = time.perf_counter()
    for t in tables:
        table.write(t)
    table.close()
    py_rate = sent / (time.perf_counter() - t0)
    print(f"memwal's Python write path on the same records: {py_rate:,.0f} rows/s; Spark catch-up = {spark_rate / py_rate:.2f}x of it "
          f"(query wall time, start-up included; in the sink: {sink_rate:,.0f} rows/s = {sink_rate / py_rate:.2f}x)")
    return {"records": sent, "value_format": args.value_format, "kafka_source": source,
            "spark_rows_per_s": spark_rate, "sink_rows_per_s": sink_rate, "python_rows_per_s": py_rate, "ratio": spark_rate / py_rate,
            "sizes": [(d.rows, d.kind) for d in sizes], "breakdown": breakdown}


def broker_topics(broker) -> set[str]:
    from confluent_kafka.admin import AdminClient

    return set(AdminClient(broker.client_config()).list_topics(timeout=10).topics)


#: The per-micro-batch profile's phases as the plot stacks them (BatchTiming's, grouped).
PROFILE_GROUPS = {
    "planning": ("planning_ms",),
    "read": ("read_ms",),
    "decode": ("decode_ms",),
    "exchange": ("exchange_ms",),
    "write": ("write_ms",),
    "Spark job, driver": ("job_other_ms", "sink_driver_ms", "other_ms"),
    "commit": ("commit_ms",),
}


def plot(result: dict, path: str) -> None:
    """Left: rows/s against micro-batch size and against base size, one line per base (or
    batch size), sink, Kafka source and layout; right: the per-micro-batch profile (read,
    decode, write, commit...) of every memwal cell and catch-up, stacked, the Kafka sources
    side by side; the catch-ups' rates in the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = result["cells"]
    series = sorted({(c.get("kafka_source", "python"), c.get("variant", "default")) for c in cells})
    fig, (a, b, prof) = plt.subplots(1, 3, figsize=(18, 5.2), gridspec_kw={"width_ratios": [1, 1, 1.3]})
    for source, variant in series:
        mark = "-" if source == "spark" else ":"
        tag = source if variant == "default" else f"{source}, {variant}"
        mine_all = [c for c in cells if c.get("kafka_source", "python") == source and c.get("variant", "default") == variant]
        for n in sorted({c["base_rows"] for c in mine_all}):
            mine = sorted((c for c in mine_all if c["base_rows"] == n), key=lambda c: c["batch_rows"])
            xs = [c["batch_rows"] for c in mine]
            a.plot(xs, [c["memwal_rows_per_s"] for c in mine], "o" + mark, label=f"memwal, {tag}, base {n:,}")
            if variant == "default":
                a.plot(xs, [c["naive_rows_per_s"] for c in mine], "s" + mark, alpha=0.6, label=f"naive, {source}, base {n:,}")
        for size in sorted({c["batch_rows"] for c in mine_all}):
            mine = sorted((c for c in mine_all if c["batch_rows"] == size), key=lambda c: c["base_rows"])
            xs = [c["base_rows"] for c in mine]
            b.plot(xs, [c["memwal_rows_per_s"] for c in mine], "o" + mark, label=f"memwal, {tag}, batch {size:,}")
            if variant == "default":
                b.plot(xs, [c["naive_rows_per_s"] for c in mine], "s" + mark, alpha=0.6, label=f"naive, {source}, batch {size:,}")
    for ax, label in ((a, "micro-batch (records)"), (b, "base table (rows)")):
        ax.set_xlabel(label)
        if cells:  # a catch-up-only run draws the profile alone
            ax.set_xscale("log")
            ax.legend(fontsize=6)
    a.set_ylabel("rows/s (in the sink)")
    # The profile: one stacked bar per memwal cell and catch-up, ms per micro-batch.
    bars = [(f"{c.get('kafka_source', 'python')}\n{c.get('variant', 'default')}\n{c['batch_rows'] // 1000}k, base {c['base_rows'] / 1e6:g}M",
             c["breakdown"]) for c in cells if c.get("breakdown")]
    bars += [(f"{cu['kafka_source']}\ncatch-up\n{cu['breakdown']['rows'] // 1000}k/batch", cu["breakdown"])
             for cu in result.get("catch_up") or [] if cu.get("breakdown")]
    # Shares, so 10k micro-batches and catch-ups compare on one axis; each bar's ms below it.
    totals = [sum(bd.get(p, 0.0) for ps in PROFILE_GROUPS.values() for p in ps) or 1.0 for _, bd in bars]
    bottoms = [0.0] * len(bars)
    for group, phases in PROFILE_GROUPS.items():
        heights = [100 * sum(bd.get(p, 0.0) for p in phases) / t for (_, bd), t in zip(bars, totals)]
        prof.bar(range(len(bars)), heights, bottom=bottoms, label=group)
        bottoms = [x + h for x, h in zip(bottoms, heights)]
    prof.set_xticks(range(len(bars)), [f"{label}\n{t:,.0f} ms" for (label, _), t in zip(bars, totals)], fontsize=6)
    prof.set_ylabel("% of a micro-batch (mean, first left out)")
    prof.legend(fontsize=6)
    title = "bench/ingest.py --axes (2 cores)"
    for cu in result.get("catch_up") or []:
        title += f"; catch-up ({cu['kafka_source']}) {cu['spark_rows_per_s']:,.0f} rows/s"
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-rows", type=int, default=1_000_000)
    p.add_argument("--batches", type=int, default=30)
    p.add_argument("--batch-rows", type=int, default=10_000)
    p.add_argument("--freshness-rate", type=int, default=5_000, help="rows/s the freshness producer sends")
    p.add_argument("--freshness-seconds", type=float, default=30)
    p.add_argument("--workdir")
    p.add_argument("--json", help="write the results here too")
    p.add_argument("--merge-modes-only", action="store_true", help="only measure partial updates against full upserts (no Spark)")
    p.add_argument("--durability-only", action="store_true", help="only phase 3: the cost of durability fsync (no Spark)")
    p.add_argument("--axes", action="store_true", help="run the base size x micro-batch size grid and the catch-up (see the docstring)")
    p.add_argument("--bases", type=lambda v: [int(x) for x in v.split(",")], default=[1_000_000], help="--axes: base sizes, e.g. 1000000,10000000")
    p.add_argument("--sizes", type=lambda v: [int(x) for x in v.split(",")], default=[10_000, 50_000, 200_000], help="--axes: micro-batch sizes")
    p.add_argument("--records-per-cell", type=int, default=300_000, help="--axes: records per cell (at least 2 micro-batches; the first is warm-up)")
    p.add_argument("--backlog-records", type=int, default=1_000_000, help="--axes: records waiting for the catch-up (0: skip)")
    p.add_argument("--adaptive-max-rows", type=int, default=400_000, help="--axes: the catch-up's largest micro-batch")
    p.add_argument("--adaptive-growth", type=float, default=AdaptiveSizing.growth, help="--axes: the catch-up's micro-batch growth factor")
    p.add_argument("--cache-dir", default=os.path.expanduser("~/.cache/memwal-bench"), help="--axes: where the bases are kept")
    p.add_argument("--plot", help="--axes: draw rows/s against both axes into this PNG")
    p.add_argument("--catch-up-only", action="store_true", help="--axes: only the backlog catch-up")
    p.add_argument("--value-format", choices=("json", "avro"), default="json", help="--axes: the catch-up records' value format")
    p.add_argument("--writer-process", action=argparse.BooleanOptionalAction, default=None,
                   help="--freshness-only: the sink's writer process (SinkOptions.writer_process; default: on)")
    p.add_argument("--single-stage-max-rows", type=int, default=SinkOptions.single_stage_max_rows,
                   help="--freshness-only: SinkOptions.single_stage_max_rows (0: always two stages)")
    p.add_argument("--freshness-only", action="store_true",
                   help="only phase 2 for memwal's strong reader, on a table of --base-rows rows, with the targets' verdict")
    p.add_argument("--variants", type=lambda v: v.split(","), default=["default"],
                   help=f"--axes: the memwal sink's layouts to run in each cell, each against the naive sink ({', '.join(VARIANTS)})")
    p.add_argument("--fast-start-jvm", dest="full_jit", action="store_false",
                   help="launch the driver JVM as tests do (C1 JIT only) instead of as memwal ingest does (the full JIT)")
    p.add_argument("--real-time-flush-interval", type=float, default=2.0, help="Real-Time Mode: seconds between MemTable seals (eventual readers)")
    p.add_argument("--cores", type=int, default=2, help="the session's task slots (Real-Time Mode needs one per Kafka partition: 3 here)")
    p.add_argument("--kafka-sources", type=lambda v: v.split(","), default=["spark", "python"],
                   help="the Kafka sources to run, each against the naive sink on the same source: spark (Spark's connector), python (memwal's)")
    args = p.parse_args()
    if args.freshness_only:
        logging.basicConfig(level=logging.WARNING)
        results = {"date": today(), "machine": machine(), "commit": git_rev(), "args": vars(args)}
        results.update(run_freshness_only(args))
        report(results, args.json)
        return
    if args.axes:
        logging.basicConfig(level=logging.WARNING)
        results = {"date": today(), "machine": machine(), "commit": git_rev(), "args": vars(args)}
        with work_dir(args.workdir, "memwal-bench-ingest-") as work:
            spark = local_session(app="memwal-bench", fast_start=not args.full_jit)
            spark.sparkContext.setLogLevel("ERROR")
            with open_broker(os.path.join(work, "broker")) as broker:
                results["axes"] = run_axes(args, spark, broker, work)
            spark.stop()
        # the figures first: a plot that fails (matplotlib is in the `bench` extra) loses nothing
        report(results, args.json)
        if args.plot and (results["axes"]["cells"] or results["axes"]["catch_up"]):
            plot(results["axes"], args.plot)
        return
    logging.basicConfig(level=logging.WARNING)
    results: dict = {"date": today(), "machine": machine(), "commit": git_rev(), "args": vars(args)}
    if args.merge_modes_only or args.durability_only:
        if args.merge_modes_only:
            with work_dir(args.workdir, "memwal-bench-merge-") as work:
                results["merge_modes"] = merge_modes(work, args.base_rows, args.batches, args.batch_rows)
        if args.durability_only:
            with work_dir(args.workdir, "memwal-bench-durability-") as work:
                results["durability"] = durability_cost(work)
        report(results, args.json)
        return
    with work_dir(args.workdir, "memwal-bench-ingest-") as work:
        spark = local_session(app="memwal-bench", fast_start=not args.full_jit)
        spark.sparkContext.setLogLevel("ERROR")
        with open_broker(os.path.join(work, "broker")) as broker:
            t0 = time.perf_counter()
            base = base_rows(args.base_rows)
            naive_uri = os.path.join(work, "naive")
            lance.write_dataset(base, naive_uri)
            # ingest's default (one stage: the tasks that read write), and the exchange by shard
            # with its write tasks: ingest's default there (one per 50k rows of a micro-batch, up to
            # Spark's slots: one here), and one per shard
            variants = {"memwal": ("none", None), "memwal (exchange by shard)": ("shard", None),
                        "memwal (exchange, 1 task per shard)": ("shard", 4)}
            uris = {}
            for name in variants:
                uris[name] = os.path.join(work, name.replace(" ", "_").replace("(", "").replace(")", ""))
                Table.create(uris[name], SCHEMA, ["id"], "bucket(id, 4)", initial_data=base).close()
            print(f"base tables of {args.base_rows:,} rows ready in {time.perf_counter() - t0:.1f}s")

            topic = "throughput"
            broker.create_topic(topic, 3)
            sent = produce_batches(broker, topic, args.batches, args.batch_rows, args.base_rows)
            print(f"produced {sent:,} records ({args.batches} micro-batches of {args.batch_rows:,})")

            rows = []
            naive, elapsed = run_naive(spark, broker, topic, naive_uri, os.path.join(work, "ckpt-naive"), args.batch_rows)
            assert lance.dataset(naive_uri).count_rows() == args.base_rows + args.batches * (args.batch_rows // 2)
            rows.append(("naive (merge_insert per batch)", naive.rows, sum(naive.durations), elapsed, naive.durations))
            for name, (exchange, tasks) in variants.items():
                job, elapsed = run_memwal(spark, broker, topic, uris[name], os.path.join(work, f"ckpt-{exchange}-{tasks}"), args.batch_rows, tasks,
                                          exchange=exchange)
                durations = [r.seconds for r in job.reports.reports]
                total_rows = int(job.reports.totals()["rows"])
                count = readers.open(uris[name]).count()
                assert count == args.base_rows + args.batches * (args.batch_rows // 2), count
                rows.append((name, total_rows, sum(durations), elapsed, durations))

            naive_rate = rows[0][1] / rows[0][2]
            print(f"\n{'sink':32} {'rows/s (sink)':>14} {'x naive':>8} {'rows/s (query)':>15} {'batch p50 / p99 ms':>20}")
            results["throughput"] = []
            for name, n, busy, elapsed, durations in rows:
                rate = n / busy
                p50, p99 = pct(durations, 50) * 1000, pct(durations, 99) * 1000
                print(f"{name:32} {rate:14,.0f} {rate / naive_rate:8.2f} {n / elapsed:15,.0f} {p50:9.0f} / {p99:.0f}")
                results["throughput"].append(
                    {"sink": name, "rows": n, "rows_per_s": rate, "x_naive": rate / naive_rate, "query_rows_per_s": n / elapsed,
                     "batch_p50_ms": pct(durations, 50) * 1000, "batch_p99_ms": pct(durations, 99) * 1000}
                )

            if args.freshness_seconds > 0:
                results["freshness"] = []

                def ckpt(tag, topic):
                    return os.path.join(work, f"ckpt-{tag}-{topic}")

                def memwal_run(tag):
                    return lambda topic, stop, started: run_memwal(spark, broker, topic, uris["memwal"], ckpt(tag, topic), args.batch_rows, None,
                                                                  False, stop, started)

                # (name, query, reader kind in the probe's process, table it reads)
                cases = [
                    ("naive", lambda topic, stop, started: run_naive(spark, broker, topic, naive_uri, ckpt("fn", topic), args.batch_rows, False, stop, started),
                     "lance", naive_uri),
                    ("memwal, strong reader", memwal_run("fm"), "strong", uris["memwal"]),
                    ("memwal, eventual reader", memwal_run("fe"), "eventual", uris["memwal"]),
                ]
                print(f"\nfreshness at {args.freshness_rate:,} rows/s for {args.freshness_seconds:.0f}s "
                      "(producer send -> visible to a reader in another process)")
                for name, run, kind, uri in cases:
                    f = freshness(broker, name.split(",")[0], run, kind, uri, args.freshness_rate, args.freshness_seconds, args.base_rows)
                    results["freshness"].append(print_freshness(name, f, args.freshness_rate, verdict=kind == "strong"))
            results["merge_modes"] = merge_modes(work, args.base_rows, args.batches, args.batch_rows)
        spark.stop()
        results["durability"] = durability_cost(work)
    report(results, args.json)


if __name__ == "__main__":
    main()
