"""The change feed through Spark (``option("readChangeFeed", "true")``) and the command line:
the three forms agree, a feed streamed into a second table reproduces the first, and
Kafka -> table -> change feed -> second table survives a SIGKILL of both queries."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pyarrow as pa
import pytest
from test_spark_format import SCHEMA, rows_of

from memwal import readers, Table
from memwal.readers import feed
from memwal.maintain.compactor import Compactor

pytestmark = pytest.mark.spark


def changing_table(uri: str) -> int:
    """A table with inserts, updates and deletes over several generations, some folded;
    returns the base version the changes start after."""
    t = Table.create(uri, SCHEMA, ["id"], "bucket(id, 3)")
    since = t.dataset().version
    t.write(rows_of(300))
    t.flush()
    t.write(rows_of(100, start=250, tag="v2"))
    t.delete({"id": list(range(0, 60, 6))})
    t.flush()
    Compactor(t.state).run_once()
    t.write(rows_of(40, start=20, tag="v1"))
    t.delete({"id": [1, 2, 3, 349]})
    t.flush()  # above the base
    t.close()
    return since


def _canon(rows: list[dict]) -> list[tuple]:
    out = []
    for r in rows:
        r = dict(r)
        r[feed.COMMIT_TIME] = r[feed.COMMIT_TIME].timestamp() if r[feed.COMMIT_TIME] is not None else None
        out.append(tuple(sorted((k, str(v)) for k, v in r.items())))
    return sorted(out)


def test_python_cli_and_spark_read_the_same_changes(spark, tmp_path):
    uri = str(tmp_path / "t")
    since = changing_table(uri)
    python = readers.open(uri).changes(since=since).to_pylist()
    kinds = {r[feed.CHANGE_TYPE] for r in python}
    assert kinds == set(feed.CHANGE_TYPES)
    cli = subprocess.run([sys.executable, "-m", "memwal", "changes", uri, "--since", str(since), "--json"],
                         capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr
    via_cli = [json.loads(line) for line in cli.stdout.splitlines()]
    assert len(via_cli) == len(python)
    assert sorted((r["id"], r[feed.CHANGE_TYPE], r[feed.GENERATION], str(r["amount"])) for r in via_cli) == sorted(
        (r["id"], r[feed.CHANGE_TYPE], r[feed.GENERATION], str(r["amount"])) for r in python
    )
    # the position printed resumes after everything: nothing more
    position = cli.stderr.split("next position: ", 1)[1].strip()
    again = subprocess.run([sys.executable, "-m", "memwal", "changes", uri, "--since", position, "--json"],
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and again.stdout == "", again.stderr
    df = spark.read.format("memwal").option("readChangeFeed", "true").option("startingVersion", str(since)).load(uri)
    assert df.columns == [*SCHEMA.names, *feed.FEED_COLUMNS]
    assert _canon([r.asDict() for r in df.collect()]) == _canon(python)
    # up to a base version: what it had folded
    folded_at = Table.open(uri).dataset().version
    until = readers.open(uri).changes(since=since, until=folded_at).to_pylist()
    ended = spark.read.format("memwal").option("readChangeFeed", "true").option("startingVersion", str(since)) \
        .option("endingVersion", str(folded_at)).load(uri)
    assert _canon([r.asDict() for r in ended.collect()]) == _canon(until)
    assert 0 < len(until) < len(python)


def test_a_change_feed_stream_into_a_second_table_reproduces_the_first(spark, tmp_path):
    uri, copy = str(tmp_path / "a"), str(tmp_path / "b")
    changing_table(uri)
    Table.create(copy, SCHEMA, ["id"], "bucket(id, 2)").close()
    ckpt = str(tmp_path / "ckpt")

    def run() -> None:
        q = (spark.readStream.format("memwal").option("readChangeFeed", "true").option("consumer", "copy").load(uri)
             .writeStream.format("memwal").option("checkpointLocation", ckpt).trigger(availableNow=True).start(copy))
        q.awaitTermination()

    run()
    t = Table.open(uri)
    t.write(rows_of(30, start=500))
    t.delete({"id": [250, 251]})
    t.flush()
    t.close()
    run()  # resumes at the checkpointed offsets
    Table.open(copy).flush_stranded(0)
    a = {r["id"]: r for r in readers.open(uri).scan().to_pylist()}
    b = {r["id"]: r for r in readers.open(copy).scan().to_pylist()}
    assert b == a
    assert feed.consumers(Table.open(uri).state) == ["copy"]


ACCEPTANCE_SCRIPT = """
import json, sys, time
from memwal import Table
from memwal.streaming import local_session
bootstrap, topic, uri, copy, ckpt, mode = sys.argv[1:7]
spark = local_session(app="feed-acceptance")
kafka = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
         .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "400").load())
ingest = kafka.writeStream.format("memwal").option("checkpointLocation", ckpt + "/ingest").option("flushIntervalSeconds", "0.5")
changes = (spark.readStream.format("memwal").option("readChangeFeed", "true").option("consumer", "copy").load(uri)
           .writeStream.format("memwal").option("checkpointLocation", ckpt + "/feed"))

def run(start):
    # Spark waits 10 s (fixed) for a Python streaming source's process to start; on a machine
    # loaded past that the query fails before reading anything, and a restart resumes it
    for attempt in range(10):
        q = start()
        try:
            q.awaitTermination()
            return q
        except Exception as e:
            if "connect back" not in str(e):
                raise
            print("restarting the feed query:", str(e).splitlines()[0], file=sys.stderr)
    raise RuntimeError("the feed query did not start")

if mode == "forever":
    a = ingest.trigger(processingTime="1 second").start(uri)
    run(lambda: changes.trigger(processingTime="1 second").start(copy))
else:
    a = ingest.trigger(availableNow=True).start(uri)
    a.awaitTermination()
    Table.open(uri).flush_stranded(0)
    b = run(lambda: changes.trigger(availableNow=True).start(copy))
    print("progress", json.dumps([p["numInputRows"] for p in b.recentProgress]))
spark.stop()
"""


@pytest.mark.kafka
@pytest.mark.slow
def test_kafka_to_table_to_change_feed_to_second_table_also_after_a_kill(kafka, tmp_path):
    """Acceptance: Kafka -> memwal table -> readStream change feed -> second memwal table, both
    queries in a process SIGKILLed once each has committed micro-batches, then run again to the
    end: the second table equals the first, which equals the model."""
    from brokers import produce
    from helpers import approx, sigkill_when, table_rows, workload

    schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64()), ("vec", pa.list_(pa.float32(), 4))])
    topic = f"feed-{time.monotonic_ns()}"
    kafka.create_topic(topic, 3)
    records, model = workload(2400, 500, seed=47)
    produce(kafka, topic, records)
    uri, copy = str(tmp_path / "a"), str(tmp_path / "b")
    Table.create(uri, schema, ["id"], "bucket(id, 3)").close()
    Table.create(copy, schema, ["id"], "bucket(id, 2)").close()
    ckpt = str(tmp_path / "ckpt")
    script = tmp_path / "both.py"
    script.write_text(ACCEPTANCE_SCRIPT)
    args = [sys.executable, str(script), kafka.bootstrap, topic, uri, copy, ckpt]
    log = (tmp_path / "first.log").open("w")
    first = subprocess.Popen([*args, "forever"], stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path, start_new_session=True)

    def commits(name: str) -> int:
        d = tmp_path / "ckpt" / name / "commits"
        return sum(1 for f in d.iterdir() if f.name.isdigit()) if d.exists() else 0

    with log:
        sigkill_when(first, lambda: commits("ingest") >= 2 and commits("feed") >= 1, tmp_path / "first.log", "progress of both streams", 600)
    fed_before = commits("feed")
    second = subprocess.run([*args, "drain"], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert second.returncode == 0, second.stderr[-4000:]
    taken = json.loads(second.stdout.split("progress ", 1)[1].splitlines()[0])
    assert fed_before >= 1 and sum(taken) > 0  # the feed query was killed mid-stream and resumed
    Table.open(copy).flush_stranded(0)
    assert approx(table_rows(uri)) == approx(model)
    assert approx(table_rows(copy)) == approx(model)
