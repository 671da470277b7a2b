"""Backlog catch-up through Spark's Kafka connector: memwal's layouts against their floors and the naive sink, one run.

A topic of ``--records`` JSON records (the workload of bench/common.py: id, val, name, a
64 x float32 vector; half updates of a ``--base-rows`` base, half new ids) waits in a local
Apache Kafka 4 broker; each variant drains it from the start with ``availableNow`` and
``maxOffsetsPerTrigger`` = ``--batch``, in the same SparkSession, into its own copy of the base:

- ``read-floor``: Spark's connector into a Python Arrow writer that only counts rows (what a
  Python sink in the scan stage can reach at all);
- ``decode-floor``: the same writer decoding each batch with memwal's JSON decoder, writing
  nothing (the floor of a one-stage Python sink);
- ``jvm-decode-floor``: the records decoded in the JVM by Spark's ``from_json`` and handed to
  the counting writer as Arrow columns (the floor of decoding in Spark instead of in Python);
- ``one-stage``: ``memwal ingest`` as it runs by default on one executor: ``format("memwal")``,
  the tasks that read decode, route and write (through the executor's writer process);
- ``jvm-decode``: ``from_json`` in Spark, then ``writeStream.format("memwal")`` of the decoded
  columns: one stage, the decode in the JVM (upserts only: what the comparison needs);
- ``exchange``: ``memwal ingest --exchange shard``: the ``foreachBatch`` sink, prepare, an
  exchange by shard, write tasks (the layout before one-stage, and the cluster fallback);
- ``naive``: ``foreachBatch`` with Spark's ``from_json``, ``collect`` and Lance ``merge_insert``
  on the driver, what a Spark user writes without memwal;
- ``python``: memwal's own write path (``Table.write`` of the same rows, decoded up front),
  no Spark: the engine's speed on these records.

Ratios are within the run. The broker, the topic and the base are made once per run (the
base is cached under ``--cache-dir``).

Run: ``python bench/catchup.py`` (2M records, 1M base, 4 partitions);
``--base-rows 10000000 --batch 10000 --variants one-stage,naive`` for the 10M-base catch-up.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from memwal.core.runtime import configure_process  # noqa: E402

configure_process()

import pyarrow as pa  # noqa: E402
import pyarrow.compute  # noqa: E402, F401 - pa.compute below

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import SCHEMA, CpuByProcess, batch_rows, git_rev, machine, report, today, work_dir  # noqa: E402
from ingest import _copy, cached_base, open_broker, run_naive  # noqa: E402

from memwal import Table  # noqa: E402
from memwal.streaming import SinkOptions, ingest, local_session  # noqa: E402

VARIANTS = ("read-floor", "decode-floor", "jvm-decode-floor", "one-stage", "jvm-decode", "exchange", "naive", "python")

#: The records' value as Spark's ``from_json`` reads it (what the ``jvm-*`` variants and the naive sink decode with).
JSON_DDL = "id BIGINT, val DOUBLE, name STRING, vec ARRAY<FLOAT>"


def backlog(cache: str, records: int, base: int, size: int = 10_000) -> pa.Table:
    """The workload's ``records`` as (id, key, JSON value), made once and kept under ``cache``
    (drawing 64 random floats a row in Python costs minutes for 2M rows)."""
    path = os.path.join(cache, f"backlog-{records}-{base}.arrow")
    if os.path.exists(path):
        with pa.memory_map(path) as f:
            return pa.ipc.open_file(f).read_all()
    parts = []
    for b in range(records // size):
        rows = batch_rows(b, size, base)
        parts.append(pa.table({"id": [r["id"] for r in rows], "value": [json.dumps(r).encode() for r in rows]}))
    table = pa.concat_tables(parts)
    with pa.OSFile(path + ".tmp", "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table)
    os.replace(path + ".tmp", path)
    return table


def produce_backlog(broker, topic: str, records: pa.Table, partitions: int) -> int:
    """The records, keyed by id, partition = id % partitions (a key's records in one partition, in order)."""
    broker.create_topic(topic, partitions)
    ids, values = records.column("id").to_pylist(), records.column("value").to_pylist()
    sent = 0
    for start in range(0, len(ids), 100_000):
        chunk = range(start, min(start + 100_000, len(ids)))
        sent += len(broker.produce(topic, [(str(ids[i]).encode(), values[i], ids[i] % partitions) for i in chunk], timeout=600,
                                   **{"linger.ms": 20}))
    return sent


def floor_source(decode: bool):
    """A Python data source whose stream writer counts (and with ``decode``, decodes with
    memwal's JSON decoder) each Arrow batch of Kafka records, and writes nothing."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

    class Counted(WriterCommitMessage):
        def __init__(self, rows: int) -> None:
            self.rows = rows

    class Writer(DataSourceStreamArrowWriter):
        def write(self, iterator):
            rows = 0
            decoder = None
            if decode:
                from memwal.streaming.decode import JsonDecoder

                decoder = JsonDecoder(SCHEMA, op_field=None)
            for batch in iterator:
                if decoder is not None:
                    decoder.decode(batch.column("value"))
                rows += batch.num_rows
            return Counted(rows)

        def commit(self, messages, batchId):  # noqa: N803 - Spark's name
            """Nothing to commit."""

        def abort(self, messages, batchId):  # noqa: N803
            """Nothing to undo."""

    class Source(DataSource):
        @classmethod
        def name(cls):
            return "memwal-bench-decode-floor" if decode else "memwal-bench-read-floor"

        def schema(self):
            return "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, timestampType int"

        def streamWriter(self, schema, overwrite):  # noqa: N802 - Spark's name
            return Writer()

    return Source


def kafka_read(spark, broker, topic: str, batch: int):
    """Spark's connector read as memwal's ingest reads (its fetch wait, whole partitions
    grouped into its read tasks)."""
    from memwal.streaming.job import FETCH_MAX_WAIT_MS, MIN_ROWS_PER_TASK, read_tasks
    from memwal.streaming.session import default_parallelism

    df = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap).option("subscribe", topic)
          .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", str(batch))
          .option("kafka.fetch.max.wait.ms", str(FETCH_MAX_WAIT_MS)).load())
    return df.coalesce(read_tasks(batch, MIN_ROWS_PER_TASK, default_parallelism(spark)))


def jvm_decoded(df):
    """The records' values decoded by Spark's ``from_json``, as the table's columns."""
    from pyspark.sql import functions as F

    return df.select(F.from_json(F.col("value").cast("string"), JSON_DDL).alias("r")).select("r.*")


def run_floor(spark, broker, topic: str, work: str, batch: int, decode: str | None) -> float:
    """``decode``: None (count the Kafka records), ``"python"`` (memwal's decoder in the
    writer) or ``"jvm"`` (``from_json`` before the writer, which counts)."""
    source = floor_source(decode == "python")
    spark.dataSource.register(source)
    df = kafka_read(spark, broker, topic, batch)
    if decode == "jvm":
        df = jvm_decoded(df)
    t0 = time.perf_counter()
    q = (df.writeStream.format(source.name()).option("checkpointLocation", os.path.join(work, f"ckpt-{source.name()}-{decode}"))
         .trigger(availableNow=True).start())
    q.awaitTermination()
    return time.perf_counter() - t0


def run_jvm_decode(spark, broker, topic: str, uri: str, ckpt: str, batch: int) -> float:
    df = jvm_decoded(kafka_read(spark, broker, topic, batch))
    t0 = time.perf_counter()
    q = df.writeStream.format("memwal").option("checkpointLocation", ckpt).trigger(availableNow=True).start(uri)
    q.awaitTermination()
    return time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=2_000_000)
    p.add_argument("--base-rows", type=int, default=1_000_000)
    p.add_argument("--partitions", type=int, default=4, help="the topic's partitions")
    p.add_argument("--batch", type=int, default=200_000, help="maxOffsetsPerTrigger, the same for every variant")
    p.add_argument("--variants", type=lambda v: v.split(","), default=list(VARIANTS))
    p.add_argument("--cache-dir", default=os.path.expanduser("~/.cache/memwal-bench"))
    p.add_argument("--workdir")
    p.add_argument("--json", help="write the results here too")
    p.add_argument("--arrow-batch", type=int, help="spark.sql.execution.arrow.maxRecordsPerBatch (default: Spark's, 10,000)")
    args = p.parse_args()
    unknown = set(args.variants) - set(VARIANTS)
    if unknown:
        p.error(f"unknown variants {sorted(unknown)}; choose from {VARIANTS}")
    os.makedirs(args.cache_dir, exist_ok=True)
    naive_base, mem_base = cached_base(args.cache_dir, args.base_rows)
    results: dict = {"date": today(), "commit": git_rev(), "machine": machine(), "records": args.records, "base_rows": args.base_rows,
                     "partitions": args.partitions, "batch": args.batch, "rows_per_s": {}, "reports": {}}
    with work_dir(args.workdir, "memwal-bench-catchup-") as work, open_broker(os.path.join(work, "kafka")) as broker:
        topic = "backlog"
        t0 = time.perf_counter()
        records = backlog(args.cache_dir, args.records, args.base_rows)
        sent = produce_backlog(broker, topic, records, args.partitions)
        size = pa.compute.mean(pa.compute.binary_length(records.column("value"))).as_py()
        print(f"{sent:,} records of ~{size:.0f} bytes in {args.partitions} partitions produced in {time.perf_counter() - t0:.0f}s")
        results["record_bytes"] = size
        spark = local_session(app="memwal-bench-catchup", fast_start=False)
        spark.sparkContext.setLogLevel("ERROR")
        if args.arrow_batch:
            spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(args.arrow_batch))
        # Warm-up, not measured: the first query of a session starts the Python workers, loads
        # the connector's classes and JIT-compiles the read path.
        run_floor(spark, broker, topic, os.path.join(work, "warm-up"), args.batch, decode=None)
        rates = results["rows_per_s"]
        results["cpu_seconds"] = {}
        for variant in args.variants:
            cpu = CpuByProcess().__enter__()
            t0 = time.perf_counter()
            if variant in ("read-floor", "decode-floor", "jvm-decode-floor"):
                decode = {"read-floor": None, "decode-floor": "python", "jvm-decode-floor": "jvm"}[variant]
                elapsed = run_floor(spark, broker, topic, work, args.batch, decode=decode)
            elif variant == "jvm-decode":
                uri = _copy(mem_base, os.path.join(work, "t-jvm-decode"))
                elapsed = run_jvm_decode(spark, broker, topic, uri, os.path.join(work, "ckpt-jvm-decode"), args.batch)
                from memwal import readers

                results.setdefault("live_rows", {})["jvm-decode"] = readers.open(uri).scan(columns=["id"]).num_rows
            elif variant in ("one-stage", "exchange"):
                uri = _copy(mem_base, os.path.join(work, f"t-{variant}"))
                job = ingest(spark, bootstrap=broker.bootstrap, topic=topic, table_uri=uri, checkpoint=os.path.join(work, f"ckpt-{variant}"),
                             available_now=True, max_offsets_per_trigger=args.batch, exchange="none" if variant == "one-stage" else "shard",
                             options=SinkOptions(source="kafka-json", op_field=None))
                job.await_termination()
                elapsed = time.perf_counter() - t0
                totals = job.reports.totals()
                assert totals["rows"] == sent, (variant, totals)
                results["reports"][variant] = {k: totals[k] for k in ("batches", "fenced_retries", "writer_opens", "flushes", "read_seconds",
                                                                     "prepare_seconds", "write_seconds", "exchange_seconds")}
                results.setdefault("spark_durations_ms", {})[variant] = [p["duration_ms"] for _, p in sorted(job.listener.progress.items())]
                for b, p in sorted(job.listener.progress.items()):
                    print(f"    batch {b}: {p['input_rows']:,} records, Spark ms {p['duration_ms']}")
            elif variant == "naive":
                uri = _copy(naive_base, os.path.join(work, "t-naive"))
                sink, elapsed = run_naive(spark, broker, topic, uri, os.path.join(work, "ckpt-naive"), args.batch)
                results["reports"]["naive"] = sink.profile(skip=0)
            else:  # python: the engine's own write path, the rows decoded up front
                uri = _copy(mem_base, os.path.join(work, "t-python"))
                from memwal.streaming.decode import JsonDecoder
                from memwal.core.schema import conform

                decoder = JsonDecoder(SCHEMA, op_field=None)
                tables = [conform(decoder.decode(records.column("value").slice(i, 10_000))[0].select(SCHEMA.names), SCHEMA)
                          for i in range(0, sent, 10_000)]
                table = Table.open(uri)
                t0 = time.perf_counter()
                for t in tables:
                    table.write(t)
                table.close()
                elapsed = time.perf_counter() - t0
            rates[variant] = sent / elapsed
            cpu.__exit__(None, None, None)
            results["cpu_seconds"][variant] = cpu.seconds
            extra = f"  {results['reports'][variant]}" if variant in results["reports"] else ""
            print(f"\n{variant:>13}: {rates[variant]:>9,.0f} rows/s ({elapsed:.1f} s){extra}\n{'':>15}CPU seconds: {cpu.line()}", flush=True)
        spark.stop()
    print()
    for a, b in (("one-stage", "python"), ("one-stage", "decode-floor"), ("one-stage", "naive"), ("one-stage", "exchange"),
                 ("decode-floor", "read-floor"), ("jvm-decode-floor", "decode-floor"), ("jvm-decode", "one-stage"), ("jvm-decode", "naive")):
        if a in rates and b in rates:
            print(f"{a} / {b}: {rates[a] / rates[b]:.2f}x")
    report(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
