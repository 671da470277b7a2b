"""Spark reading a memwal table (``format("memwal")``) against its baselines, in one run.

A table of ``--rows`` rows (the workload of docs/benchmarks.md: id, val, name, 64 x float32;
``bucket(id, 4)``), compacted, read whole with 0 and then ``--sstables`` uncompacted SSTables
per shard (each flush upserts ``--rows-per-flush`` rows: half updates, half new keys):

- **memwal, Spark**: ``spark.read.format("memwal").load(uri)`` written to Spark's ``noop``
  sink (every row reaches the JVM; no Python row objects);
- **plain Lance, Spark**: the same base version's fragments read through Arrow by a minimal
  Python data source with the same splits and no LSM merge (Maven serves lance-spark only for
  Spark 3.5 / Scala 2.12, which pyspark 4.2 cannot load);
- **memwal, one process**: ``readers.open(uri).to_batches()`` drained (the streaming scan) in
  the bench's own process.

Ratios are memwal's Spark read over each baseline, same data, same run. The table is made once
and kept under ``--cache-dir``.

Run: ``python bench/spark_read.py [--rows 10000000] [--sstables 10] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time

from memwal.core.runtime import configure_process

configure_process()

import pyarrow as pa  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import SCHEMA, base_rows, batch_rows, git_rev, machine, report, today  # noqa: E402

from memwal import Table, readers  # noqa: E402
from memwal.core.state import TableState  # noqa: E402


def plain_lance_source():
    """A Python data source reading a Lance dataset's fragments through Arrow: the baseline."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class Reader(DataSourceReader):
        def __init__(self, uri: str, version: int, rows_per_split: int) -> None:
            self.uri, self.version, self.rows_per_split = uri, version, rows_per_split

        def partitions(self):
            import lance

            ds = lance.dataset(self.uri, version=self.version)
            splits, group, n = [], [], 0
            for f in ds.get_fragments():
                c = f.count_rows()
                if group and n + c > self.rows_per_split:
                    splits.append(InputPartition(tuple(group)))
                    group, n = [], 0
                group.append(f.fragment_id)
                n += c
            return splits + ([InputPartition(tuple(group))] if group else [])

        def read(self, partition):
            import lance
            from pyspark.sql.pandas.types import to_arrow_schema
            from pyspark.sql.types import ArrayType, DoubleType, FloatType, LongType, StringType, StructField, StructType

            target = to_arrow_schema(StructType([StructField("id", LongType()), StructField("val", DoubleType()), StructField("name", StringType()),
                                                  StructField("vec", ArrayType(FloatType()))]), timezone="UTC")
            ds = lance.dataset(self.uri, version=self.version)
            frags = [ds.get_fragment(i) for i in partition.value]
            for batch in ds.scanner(fragments=frags).to_batches():
                yield pa.Table.from_batches([batch]).cast(target).to_batches()[0]

    class PlainLance(DataSource):
        @classmethod
        def name(cls):
            return "plainlance"

        def schema(self):
            return "id long, val double, name string, vec array<float>"

        def reader(self, schema):
            return Reader(self.options["path"], int(self.options["version"]), int(self.options.get("rowsperpartition", "1000000")))

    return PlainLance


def build(cache: str, n: int) -> str:
    uri = os.path.join(cache, f"spark-read-{n}")
    if not os.path.exists(os.path.join(uri, ".done")):
        shutil.rmtree(uri, ignore_errors=True)
        t0 = time.perf_counter()
        Table.create(uri, SCHEMA, ["id"], "bucket(id, 4)", initial_data=base_rows(n)).close()
        open(os.path.join(uri, ".done"), "w").close()
        print(f"base of {n:,} rows made in {time.perf_counter() - t0:.0f}s")
    return uri


def add_sstables(uri: str, n: int, per_shard: int, rows_per_flush: int) -> None:
    with Table.open(uri) as t:
        for g in range(per_shard):
            t.write(pa.Table.from_pylist(batch_rows(g, rows_per_flush, n), schema=SCHEMA))
            t.flush()


def timed(fn, rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--sstables", type=int, default=10, help="uncompacted SSTables per shard in the second case")
    p.add_argument("--rows-per-flush", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cache-dir", default=os.path.expanduser("~/.cache/memwal-bench"))
    p.add_argument("--json")
    args = p.parse_args()
    from memwal.streaming import local_session

    results = {"date": today(), "machine": machine(), "commit": git_rev(), "args": vars(args), "cases": []}
    os.makedirs(args.cache_dir, exist_ok=True)
    source = build(args.cache_dir, args.rows)
    work = os.path.join(args.cache_dir, "spark-read-work")
    shutil.rmtree(work, ignore_errors=True)
    uri = shutil.copytree(source, work, ignore=shutil.ignore_patterns(".done"))
    spark = local_session(app="memwal-bench-spark-read")
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(plain_lance_source())
    try:
        for sstables in (0, args.sstables):
            if sstables:
                add_sstables(uri, args.rows, sstables, args.rows_per_flush)
            version = TableState.load(uri).dataset().version
            live = readers.open(uri).count()
            memwal = timed(lambda: spark.read.format("memwal").load(uri).write.format("noop").mode("overwrite").save(), args.rounds)
            plain = timed(lambda v=version: spark.read.format("plainlance").option("version", str(v)).load(uri)
                          .write.format("noop").mode("overwrite").save(), args.rounds)

            def drain():
                for _ in readers.open(uri).to_batches():
                    pass

            local = timed(drain, args.rounds)
            m, b, r = statistics.median(memwal), statistics.median(plain), statistics.median(local)
            print(f"{sstables:>3} SSTables/shard, {live:,} live rows: memwal via Spark {m:6.2f} s ({live / m:,.0f} rows/s), "
                  f"plain Lance via Spark {b:6.2f} s ({m / b:.2f}x), reader in one process {r:6.2f} s ({m / r:.2f}x)")
            results["cases"].append({"sstables_per_shard": sstables, "live_rows": live, "memwal_spark_s": memwal,
                                     "plain_lance_spark_s": plain, "reader_s": local, "x_plain": m / b, "x_reader": m / r})
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    report(results, args.json)


if __name__ == "__main__":
    main()
