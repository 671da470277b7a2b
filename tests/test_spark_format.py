"""``format("memwal")``: reads, writes and streams through Spark's Python Data Source API.

Real SparkSessions (the session fixture; a plain one on local-cluster in a subprocess), real
tables with base rows, SSTables and WAL tails, a real Kafka broker for the stream.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import textwrap
import time
from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memwal import Table, readers
from memwal.maintain.compactor import Compactor
from memwal.core.metadata import WriterConfig
from memwal.core.state import TableState

pytestmark = pytest.mark.spark

SCHEMA = pa.schema([
    ("id", pa.int64()),
    ("region", pa.string()),
    ("amount", pa.decimal128(12, 2)),
    ("day", pa.date32()),
    ("score", pa.float64()),
])


def rows_of(n: int, start: int = 0, tag: str = "v1") -> pa.Table:
    return pa.Table.from_pylist(
        [{"id": i, "region": ["eu", "us", "ap"][i % 3], "amount": Decimal(f"{i}.{i % 100:02d}"),
          "day": dt.date(2026, 1, 1) + dt.timedelta(days=i % 40), "score": i / 7 if tag == "v1" else -i / 7} for i in range(start, start + n)],
        schema=SCHEMA,
    )


def layered_table(uri: str) -> dict[int, dict]:
    """A table with a compacted base, SSTables above it, deletes in both, and a WAL tail."""
    t = Table.create(uri, SCHEMA, ["id"], "bucket(id, 4)", initial_data=rows_of(3000))
    t.write(rows_of(500, start=2800, tag="v2"))  # updates and new keys
    t.delete({"id": list(range(0, 300, 7))})
    t.flush()
    Compactor(TableState.load(uri)).run_once()  # into the base
    t.write(rows_of(200, start=100, tag="v2"))
    t.delete({"id": [101, 2999, 3200]})
    t.flush()  # SSTables above the base
    t.close()
    # The WAL tail (strong readers only): written by a process that dies without flushing.
    tail = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_spark_format import rows_of
        from memwal import Table
        t = Table.open({uri!r})
        t.write(rows_of(50, start=4000))
        t.delete({{"id": [5]}})
        os._exit(0)
    """)
    subprocess.run([sys.executable, "-c", tail], check=True, timeout=300)
    return {r["id"]: r for r in readers.open(uri, consistency="strong").scan().to_pylist()}


def by_id(rows) -> dict[int, dict]:
    return {r["id"]: r for r in (r.asDict() for r in rows)}


def test_a_read_returns_what_the_reader_scans(spark, tmp_path):
    uri = str(tmp_path / "t")
    strong = layered_table(uri)
    eventual = {r["id"]: r for r in readers.open(uri).scan().to_pylist()}
    df = spark.read.format("memwal").load(uri)
    assert df.rdd.getNumPartitions() >= 2  # delta splits and base splits
    assert by_id(df.collect()) == eventual
    assert by_id(spark.read.format("memwal").option("consistency", "strong").load(uri).collect()) == strong
    assert strong != eventual  # the WAL tail is seen by strong reads only


def test_a_read_as_of_a_past_state_equals_the_readers(spark, tmp_path):
    uri = str(tmp_path / "t")
    with Table.create(uri, SCHEMA, ["id"], "bucket(id, 2)", initial_data=rows_of(300)) as t:
        t.write(rows_of(100, start=250, tag="v2"))
        t.flush()
        Compactor(TableState.load(uri)).run_once()
        then = TableState.load(uri).dataset().version
        t.write(rows_of(100, start=0, tag="v2"))
        t.delete({"id": [1, 2, 3]})
        t.flush()
        Compactor(TableState.load(uri)).run_once()
    past = {r["id"]: r for r in readers.open(uri, as_of=then).scan().to_pylist()}
    assert by_id(spark.read.format("memwal").option("asOf", str(then)).load(uri).collect()) == past
    assert past != {r["id"]: r for r in readers.open(uri).scan().to_pylist()}


def test_filters_prune_shards_and_columns_are_chosen_by_schema(spark, tmp_path):
    uri = str(tmp_path / "t")
    layered_table(uri)
    reader = readers.open(uri)
    df = spark.read.format("memwal").load(uri)
    assert by_id(df.where("id = 150").collect()) == {r["id"]: r for r in reader.scan(where="id = 150").to_pylist()}
    got = by_id(df.where("id IN (1, 2, 3, 101, 160)").collect())
    assert got == {r["id"]: r for r in reader.scan(where="id IN (1, 2, 3, 101, 160)").to_pylist()}
    ranged = df.where("amount >= 2500 AND region = 'eu' AND day < DATE '2026-01-20'")
    want = reader.scan(where="amount >= 2500 AND region = 'eu' AND day < DATE '2026-01-20'").to_pylist()
    assert by_id(ranged.collect()) == {r["id"]: r for r in want}
    narrow = spark.read.format("memwal").schema("id long, score double").load(uri)
    assert narrow.columns == ["id", "score"]
    assert {r.id: r.score for r in narrow.collect()} == {r["id"]: r["score"] for r in reader.scan(columns=["id", "score"]).to_pylist()}


def test_batch_writes_upsert_delete_and_merge_partial(spark, tmp_path):
    uri = str(tmp_path / "t")
    Table.create(uri, SCHEMA, ["id"], "bucket(id, 4)").close()
    df = spark.createDataFrame(rows_of(1000).to_pandas())
    df.write.format("memwal").mode("append").save(uri)
    model = {r["id"]: r for r in rows_of(1000).to_pylist()}
    assert {r["id"]: r for r in readers.open(uri).scan().to_pylist()} == model  # visible to eventual readers on return
    spark.createDataFrame([(i,) for i in range(0, 1000, 3)], "id long").write.format("memwal").mode("append").option("operation", "delete").save(uri)
    for i in range(0, 1000, 3):
        model.pop(i)
    spark.createDataFrame([(i, 99.5) for i in range(1, 30)], "id long, score double").write.format("memwal") \
        .mode("append").option("merge", "partial").save(uri)
    for i in range(1, 30):
        if i in model:
            model[i] = {**model[i], "score": 99.5}
        else:
            model[i] = {"id": i, "region": None, "amount": None, "day": None, "score": 99.5}
    assert {r["id"]: r for r in readers.open(uri).scan().to_pylist()} == model
    with pytest.raises(Exception, match="overwrite"):
        df.write.format("memwal").mode("overwrite").save(uri)


@settings(max_examples=8, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["upsert", "delete", "flush", "compact"]), st.lists(st.integers(0, 60), min_size=1, max_size=15)),
                min_size=1, max_size=8))
def test_spark_read_equals_reader_scan_equals_model(spark, tmp_path_factory, steps):
    uri = str(tmp_path_factory.mktemp("prop") / "t")
    table = Table.create(uri, SCHEMA, ["id"], "bucket(id, 3)", writer=WriterConfig(max_memtable_rows=100_000))
    model: dict[int, dict] = {}
    for n, (kind, keys) in enumerate(steps):
        if kind == "upsert":
            rows = rows_of(1, tag="v1").to_pylist()[0]
            batch = [{**rows, "id": k, "score": float(n * 100 + k)} for k in dict.fromkeys(keys)]
            table.write(pa.Table.from_pylist(batch, schema=SCHEMA))
            model.update({r["id"]: r for r in batch})
        elif kind == "delete":
            table.delete({"id": keys})
            for k in keys:
                model.pop(k, None)
        elif kind == "flush":
            table.flush()
        else:
            table.flush()
            Compactor(TableState.load(uri)).run_once()
    scanned = {r["id"]: r for r in readers.open(uri, consistency="strong").scan().to_pylist()}
    via_spark = by_id(spark.read.format("memwal").option("consistency", "strong").load(uri).collect())
    table.close()
    assert scanned == model
    assert via_spark == model


def kafka_into_memwal(spark, bootstrap: str, topic: str, uri: str, ckpt: str, max_per_trigger: str) -> list[int]:
    """Spark's Kafka source -> ``writeStream.format("memwal")`` to the end of ``topic``: the
    records each micro-batch took."""
    kafka = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
             .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", max_per_trigger).load())
    query = (kafka.writeStream.format("memwal").option("checkpointLocation", ckpt).trigger(availableNow=True).start(uri))
    query.awaitTermination()
    return [p["numInputRows"] for p in query.recentProgress]


STREAM_SCRIPT = f"""
import sys
sys.path.insert(0, {os.path.dirname(__file__)!r})
from test_spark_format import kafka_into_memwal
from memwal.streaming import local_session
kafka_into_memwal(local_session(app="format-stream"), *sys.argv[1:6])
"""


@pytest.mark.kafka
@pytest.mark.slow
def test_kafka_into_write_stream_equals_the_model_also_after_a_kill(spark, kafka, tmp_path):
    """Spark's Kafka source -> writeStream.format("memwal") in a process SIGKILLed mid-stream
    (micro-batches committed, more to come), then run again (in this process's session): the
    table equals the model, bad records are dead letters, and the second run went on from the
    checkpoint."""

    from brokers import produce
    from helpers import sigkill_when, workload

    from memwal.write.dead_letters import dead_letter_uri, read_dead_letters

    vec_schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64()), ("vec", pa.list_(pa.float32(), 4))])
    topic = f"fmt-{time.monotonic_ns()}"
    kafka.create_topic(topic, 3)
    records, model = workload(5000, 700, seed=31)
    records = records[:2500] + [(b"bad", b"{not json", 1)] + records[2500:]
    produce(kafka, topic, records)
    uri = str(tmp_path / "users")
    Table.create(uri, vec_schema, ["id"], "bucket(id, 4)").close()
    ckpt = str(tmp_path / "ckpt")
    script = tmp_path / "stream.py"
    script.write_text(STREAM_SCRIPT)
    args = [sys.executable, str(script), kafka.bootstrap, topic, uri, ckpt, "300"]
    log = (tmp_path / "first.log").open("w")
    first = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path, start_new_session=True)
    commits = tmp_path / "ckpt" / "commits"
    with log:
        sigkill_when(first, lambda: commits.exists() and sum(1 for f in commits.iterdir() if f.name.isdigit()) >= 3,
                     tmp_path / "first.log", "three committed micro-batches")
    taken = kafka_into_memwal(spark, kafka.bootstrap, topic, uri, ckpt, "300")
    assert 0 < sum(taken) < len(records)  # resumed from the checkpoint
    Table.open(uri).flush_stranded(0)
    from helpers import approx, table_rows

    assert approx(table_rows(uri)) == approx(model)
    dlq = read_dead_letters(dead_letter_uri(uri)).to_pylist()
    assert [d["key"] for d in dlq] == [b"bad"]


#: A SparkSession memwal did not build (no local_session, no register call, pushdown off) on
#: local-cluster: two executor JVMs with their own Python workers read the splits and prepare the write.
CLUSTER_SCRIPT = """
import json, sys
from pyspark.sql import SparkSession
uri = sys.argv[1]
spark = SparkSession.builder.master("local-cluster[2,1,1024]").config("spark.ui.enabled", "false").getOrCreate()
df = spark.read.format("memwal").load(uri)
parts = df.rdd.getNumPartitions()
rows = [r.asDict() for r in df.collect()]
one = df.where("id = 150").count()
spark.createDataFrame([(i, "cl", 1.5) for i in range(5000, 5400)], "id long, region string, score double") \\
    .repartition(3).write.format("memwal").mode("append").option("merge", "partial").save(uri)
print("result", json.dumps({"partitions": parts, "ids": sorted(r["id"] for r in rows), "one": one,
                            "after": spark.read.format("memwal").load(uri).where("region = 'cl'").count()}))
spark.stop()
"""


@pytest.mark.slow
def test_a_plain_session_on_local_cluster_finds_the_format_and_reads_and_writes(tmp_path):
    """The format without registration, in a session built by Spark's own builder, on
    separate executor JVMs: every row read, one key found, a partial-merge append written."""
    import json

    uri = str(tmp_path / "t")
    layered_table(uri)
    want = sorted(r["id"] for r in readers.open(uri).scan(columns=["id"]).to_pylist())
    script = tmp_path / "cluster.py"
    script.write_text(CLUSTER_SCRIPT)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_WORKER_DIR": str(tmp_path / "spark-work")}
    p = subprocess.run([sys.executable, str(script), uri], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)
    assert p.returncode == 0, p.stderr[-4000:]
    got = json.loads(p.stdout.split("result ", 1)[1].splitlines()[0])
    assert got["partitions"] >= 2 and got["ids"] == want and got["one"] == 1
    assert got["after"] == 400
