"""End-to-end tests of the ``memwal-kafka`` streaming source against real brokers.

Every test runs against both broker kinds of :mod:`brokers` (Apache Kafka 0.9.0.1
and kafka-db) with a real local SparkSession; nothing is mocked.  Queries use
``trigger(availableNow=True)`` so they end by themselves, and a ``foreachBatch``
collector so each micro-batch can be inspected.

The ``spark`` fixture (one SparkSession for the whole test session) is in ``conftest.py``.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, TypeVar

import pyarrow as pa
import pytest
from memwal import jvm
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql.streaming.datasource import ReadAllAvailable

from brokers import Broker, produce

from memwal.streaming.kafka_source import (
    KAFKA_SCHEMA, SHORT_NAME, KafkaInputPartition, KafkaStreamReader, Settings, apportion,
    group_ranges, register,
)

QUERY_TIMEOUT_S = 120

_F = TypeVar("_F", bound=Callable[..., Any])


def spark_kafka(test: _F) -> _F:
    """Marks a test that starts Spark and a broker (markers declared in pyproject.toml)."""
    return pytest.mark.spark(pytest.mark.kafka(test))


# --------------------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------------------


@pytest.fixture
def broker(kafka: Broker) -> Broker:
    """The session's broker (each test makes topics of its own)."""
    return kafka


def spark_options(broker: Broker) -> Dict[str, str]:
    return {"kafka.bootstrap.servers": broker.bootstrap}


@pytest.fixture(scope="module")
def kafka_spark(spark: Any) -> Any:
    """``spark`` with the memwal-kafka source registered."""
    register(spark)
    return spark


# --------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------

Row = Tuple[Optional[bytes], Optional[bytes], str, int, int]


def new_topic(broker: Broker, partitions: int = 3) -> str:
    name = f"t-{uuid.uuid4().hex[:10]}"
    broker.create_topic(name, partitions)
    return name


def fill(broker: Broker, topic: str, per_partition: Dict[int, int], tag: str = "a"
         ) -> List[Row]:
    """Produce ``per_partition[p]`` records to each partition; return the expected rows."""
    records = [
        (f"{tag}-k{p}-{i}".encode(), f"{tag}-v{p}-{i}".encode(), p)
        for p, n in sorted(per_partition.items())
        for i in range(n)
    ]
    placed = produce(broker, topic, records)
    return [(k, v, topic, p, off) for (k, v, _), (p, off) in zip(records, placed, strict=True)]


def run_available_now(spark: Any, broker: Broker, topic: str, checkpoint: Path, fmt: str = SHORT_NAME,
                      **options: str) -> List[List[Any]]:
    """Run one ``availableNow`` query (source ``fmt``) to its end; return each micro-batch's rows."""
    batches: Dict[int, List[Any]] = {}

    def collect(df: Any, batch_id: int) -> None:
        batches[batch_id] = df.collect()

    reader = (spark.readStream.format(fmt)
              .options(**spark_options(broker))
              .option("subscribe", topic))
    for k, v in options.items():
        reader = reader.option(k, v)
    query = (reader.load().writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True)
             .start())
    try:
        finished = query.awaitTermination(QUERY_TIMEOUT_S)
    finally:
        if query.isActive:
            query.stop()
    assert finished, f"availableNow query did not finish in {QUERY_TIMEOUT_S}s"
    if query.exception() is not None:
        raise AssertionError(f"query failed: {query.exception()}")
    return [batches[b] for b in sorted(batches)]


def as_tuples(rows: List[Any]) -> List[Row]:
    return [(r.key, r.value, r.topic, r.partition, r.offset) for r in rows]


def flat(batches: List[List[Any]]) -> List[Any]:
    return [r for b in batches for r in b]


# --------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------


@spark_kafka
def test_available_now_reads_every_record_once(kafka_spark: Any, broker: Broker,
                                               tmp_path: Path) -> None:
    topic = new_topic(broker, 3)
    expected = fill(broker, topic, {0: 7, 1: 5, 2: 6})
    # A record without key and value (a tombstone) must come through as nulls.
    [(p, off)] = produce(broker, topic, [(None, None, 1)])
    expected.append((None, None, topic, p, off))

    batches = run_available_now(kafka_spark, broker, topic, tmp_path / "ck",
                                startingOffsets="earliest")
    rows = flat(batches)

    got = as_tuples(rows)
    assert len(got) == len(set(got)), "a record was delivered twice"
    assert sorted(got, key=repr) == sorted(expected, key=repr)
    assert all(r.timestamp is not None and r.timestampType == 0 for r in rows)


@spark_kafka
@pytest.mark.skipif(not jvm.jars("spark-kafka"), reason="Spark's Kafka connector is not fetched (python -m memwal.jvm fetch spark-kafka)")
def test_the_python_source_delivers_what_sparks_connector_delivers(kafka_spark: Any, broker: Broker, tmp_path: Path) -> None:
    """The same topic (keys, headers, CreateTime timestamps before 1970 and after now, a
    tombstone, partitions of different sizes) read by memwal's source and by Spark's own
    connector: the same rows, column for column, also when each resumes from its checkpoint
    after more records arrived."""
    topic = new_topic(broker, 3)
    now_ms = 1_790_000_000_000

    def produce_some(n: int, tag: str) -> None:
        records = [(f"{tag}-k{i}".encode() if i % 5 else None, f"{tag}-v{i}".encode() if i % 11 else None, i % 3 if i % 4 else None)
                   for i in range(n)]
        produce(broker, topic, records, headers=[[("h", str(i).encode())] if i % 2 else None for i in range(n)],
                timestamps_ms=[-86_400_000 * 400 + i if i % 6 == 0 else now_ms + i for i in range(n)])

    def read_both() -> Dict[str, List[tuple]]:
        out = {}
        for fmt in (SHORT_NAME, "kafka"):
            rows = flat(run_available_now(kafka_spark, broker, topic, tmp_path / f"ck-{fmt}", fmt,
                                          startingOffsets="earliest", maxOffsetsPerTrigger="40"))
            out[fmt] = sorted(((r.key, r.value, r.topic, r.partition, r.offset, r.timestamp, r.timestampType) for r in rows), key=lambda t: (t[3], t[4]))
        return out

    produce_some(150, "a")
    first = read_both()
    assert len(first[SHORT_NAME]) == 150 and first[SHORT_NAME] == first["kafka"]
    produce_some(60, "b")
    second = read_both()
    assert len(second[SHORT_NAME]) == 60 and second[SHORT_NAME] == second["kafka"]


@spark_kafka
def test_schema_matches_builtin_kafka_source(kafka_spark: Any, broker: Broker) -> None:
    df = (kafka_spark.readStream.format(SHORT_NAME).options(**spark_options(broker))
          .option("subscribe", "anything").load())
    assert df.schema == KAFKA_SCHEMA
    assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == [
        ("key", "binary"), ("value", "binary"), ("topic", "string"), ("partition", "int"),
        ("offset", "bigint"), ("timestamp", "timestamp"), ("timestampType", "int")]


@spark_kafka
def test_max_offsets_per_trigger_splits_batches(kafka_spark: Any, broker: Broker,
                                                tmp_path: Path) -> None:
    topic = new_topic(broker, 3)
    expected = fill(broker, topic, {0: 6, 1: 3, 2: 1})

    batches = run_available_now(kafka_spark, broker, topic, tmp_path / "ck",
                                startingOffsets="earliest", maxOffsetsPerTrigger="4")

    sizes = [len(b) for b in batches if b]
    assert sizes == [4, 4, 2], sizes
    got = as_tuples(flat(batches))
    assert sorted(got, key=repr) == sorted(expected, key=repr)
    # Within a partition, batches follow offset order.
    for p in range(3):
        offsets = [r.offset for b in batches for r in b if r.partition == p]
        assert offsets == sorted(offsets)


@spark_kafka
def test_restart_from_checkpoint_reads_only_new_records(kafka_spark: Any, broker: Broker,
                                                        tmp_path: Path) -> None:
    topic = new_topic(broker, 3)
    first = fill(broker, topic, {0: 3, 1: 3, 2: 3}, tag="first")
    checkpoint = tmp_path / "ck"

    run1 = as_tuples(flat(run_available_now(kafka_spark, broker, topic, checkpoint,
                                            startingOffsets="earliest")))
    assert sorted(run1, key=repr) == sorted(first, key=repr)

    second = fill(broker, topic, {0: 2, 1: 0, 2: 4}, tag="second")
    # startingOffsets only applies to a fresh checkpoint; "latest" here must not matter.
    run2 = as_tuples(flat(run_available_now(kafka_spark, broker, topic, checkpoint,
                                            startingOffsets="latest")))
    assert sorted(run2, key=repr) == sorted(second, key=repr)

    run3 = flat(run_available_now(kafka_spark, broker, topic, checkpoint))
    assert run3 == []


@spark_kafka
def test_starting_offsets_latest(kafka_spark: Any, broker: Broker, tmp_path: Path) -> None:
    topic = new_topic(broker, 3)
    fill(broker, topic, {0: 2, 1: 2, 2: 2}, tag="old")
    checkpoint = tmp_path / "ck"

    assert flat(run_available_now(kafka_spark, broker, topic, checkpoint,
                                  startingOffsets="latest")) == []

    # The first run checkpointed "latest" as concrete offsets: only newer records follow.
    new = fill(broker, topic, {0: 1, 1: 0, 2: 2}, tag="new")
    got = as_tuples(flat(run_available_now(kafka_spark, broker, topic, checkpoint,
                                           startingOffsets="latest")))
    assert sorted(got, key=repr) == sorted(new, key=repr)


@pytest.mark.kafka
def test_latest_start_offsets_stay_put_while_records_arrive(broker: Broker) -> None:
    """Spark asks for the initial offsets again when it runs the first micro-batch: records
    produced in between must not move the batch's start past the end it planned."""
    topic = new_topic(broker, 2)
    fill(broker, topic, {0: 2, 1: 2}, tag="old")
    reader = KafkaStreamReader(Settings({**spark_options(broker), "subscribe": topic, "startingOffsets": "latest"}))
    try:
        start = reader.initialOffset()
        new = fill(broker, topic, {0: 3, 1: 1}, tag="new")
        assert reader.initialOffset() == start
        end = reader.latestOffset(start, ReadAllAvailable())
        got = [(r["key"], r["value"], r["topic"], r["partition"], r["offset"])
               for p in reader.partitions(reader.initialOffset(), end) for b in reader.read(p) for r in b.to_pylist()]
    finally:
        reader.stop()
    assert sorted(got, key=repr) == sorted(new, key=repr)


@spark_kafka
def test_starting_offsets_json(kafka_spark: Any, broker: Broker, tmp_path: Path) -> None:
    topic = new_topic(broker, 3)
    expected = fill(broker, topic, {0: 4, 1: 4, 2: 4})
    start = {topic: {"0": 1, "1": -2, "2": -1}}  # offset 1, earliest, latest

    got = as_tuples(flat(run_available_now(kafka_spark, broker, topic, tmp_path / "ck",
                                           startingOffsets=json.dumps(start))))

    want = [r for r in expected if (r[3] == 0 and r[4] >= 1) or r[3] == 1]
    assert sorted(got, key=repr) == sorted(want, key=repr)


@spark_kafka
def test_starting_offsets_json_must_name_every_partition(kafka_spark: Any, broker: Broker,
                                                         tmp_path: Path) -> None:
    topic = new_topic(broker, 2)
    with pytest.raises(Exception, match="must specify every partition"):
        run_available_now(kafka_spark, broker, topic, tmp_path / "ck",
                          startingOffsets=json.dumps({topic: {"0": 0}}))


@spark_kafka
def test_unsupported_option_fails_at_load(kafka_spark: Any, broker: Broker) -> None:
    reader = (kafka_spark.readStream.format(SHORT_NAME).options(**spark_options(broker))
              .option("subscribePattern", "t-.*"))
    with pytest.raises(Exception, match="not supported"):
        reader.load()


def test_apportion_is_proportional_and_deterministic() -> None:
    backlog = {("a", 0): 6, ("a", 1): 3, ("a", 2): 1, ("b", 0): 0}
    assert apportion(backlog, 4) == {("a", 0): 3, ("a", 1): 1, ("a", 2): 0}
    assert apportion(backlog, 100) == {("a", 0): 6, ("a", 1): 3, ("a", 2): 1}
    # Ties go to the lower (topic, partition); the total is always the limit.
    even = {("a", 0): 1, ("a", 1): 1, ("a", 2): 1}
    assert apportion(even, 2) == {("a", 0): 1, ("a", 1): 1, ("a", 2): 0}
    for limit in range(1, 12):
        take = apportion(backlog, limit)
        assert sum(take.values()) == min(limit, 10)
        assert all(0 <= take[tp] <= backlog[tp] for tp in take)


@spark_kafka
def test_subscribe_several_topics_one_missing(kafka_spark: Any, broker: Broker,
                                              tmp_path: Path) -> None:
    # A topic that does not exist yet contributes no partitions instead of failing
    # or hanging (Kafka 0.9 + librdkafka cannot even parse metadata naming it).
    t1, t2 = new_topic(broker, 2), new_topic(broker, 1)
    expected = fill(broker, t1, {0: 2, 1: 1}) + fill(broker, t2, {0: 2})
    missing = f"missing-{uuid.uuid4().hex[:8]}"

    got = as_tuples(flat(run_available_now(kafka_spark, broker, f"{t1}, {missing},{t2}",
                                           tmp_path / "ck", startingOffsets="earliest")))
    assert sorted(got, key=repr) == sorted(expected, key=repr)


@given(backlog=st.dictionaries(st.tuples(st.sampled_from("abc"), st.integers(0, 7)),
                               st.integers(0, 10_000), max_size=12),
       limit=st.integers(1, 50_000))
def test_apportion_properties(backlog: Dict[Tuple[str, int], int], limit: int) -> None:
    take = apportion(backlog, limit)
    total = sum(backlog.values())
    assert sum(take.values()) == min(limit, total)
    for tp, n in take.items():
        assert 0 <= n <= backlog[tp]
        # Within one record of the exact proportional share.
        assert abs(n * total - backlog[tp] * min(limit, total)) < total or total == 0
    # Depends only on the contents, not on the order of the mapping.
    assert apportion(dict(reversed(list(backlog.items()))), limit) == take


@spark_kafka
def test_grouped_read_tasks_read_every_record_once(kafka_spark: Any, broker: Broker,
                                                  tmp_path: Path) -> None:
    topic = new_topic(broker, 3)
    expected = fill(broker, topic, {0: 9, 1: 4, 2: 6})
    options = {**spark_options(broker), "subscribe": topic, "memwal.minRecordsPerReadTask": "8"}
    # 19 records, at least 8 per task: two tasks, the 9-record partition alone
    planned = KafkaStreamReader(Settings(options)).partitions(
        {topic: {"0": 0, "1": 0, "2": 0}}, {topic: {"0": 9, "1": 4, "2": 6}})
    assert sorted(p.ranges for p in planned) == [[(topic, 0, 0, 9)], [(topic, 1, 0, 4), (topic, 2, 0, 6)]]
    batches = run_available_now(kafka_spark, broker, topic, tmp_path / "ck", startingOffsets="earliest",
                                **{"memwal.minRecordsPerReadTask": "8"})
    got = as_tuples(flat(batches))
    assert len(got) == len(set(got)), "a record was delivered twice"
    assert sorted(got, key=repr) == sorted(expected, key=repr)


@pytest.mark.kafka
def test_a_range_behind_more_log_than_the_receive_limit_reads(broker: Broker) -> None:
    """4 MB of log behind a 10-record range, a 2 MB receive limit: Kafka honours the 1 MB
    fetch size, so the range reads. (A broker that ignores fetch sizes makes the read task
    fail at once with KafkaReceiveError instead; no broker the tests run does that.)"""
    topic = new_topic(broker, 1)
    produce(broker, topic, [(None, bytes(1000), 0)] * 4_000)
    options = {**spark_options(broker), "subscribe": topic, "kafkaConsumer.pollTimeoutMs": "30000",
               "kafka.receive.message.max.bytes": str(2 << 20), "kafka.fetch.max.bytes": str(1 << 20)}
    reader = KafkaStreamReader(Settings(options))
    read = lambda: sum(b.num_rows for b in reader.read(KafkaInputPartition(topic, 0, 0, 10)))  # noqa: E731
    assert read() == 10


@given(ranges=st.lists(st.tuples(st.sampled_from("ab"), st.integers(0, 7), st.integers(0, 100), st.integers(0, 5_000)),
                       min_size=1, max_size=12, unique_by=lambda r: (r[0], r[1])),
       tasks=st.integers(1, 16))
def test_group_ranges_covers_every_range_once_and_balances(ranges: List[Tuple[str, int, int, int]], tasks: int) -> None:
    ranges = [(t, p, a, a + n) for t, p, a, n in ranges]
    groups = group_ranges(ranges, tasks)
    assert 1 <= len(groups) <= min(tasks, len(ranges))
    assert sorted(r for g in groups for r in g) == sorted(ranges)
    assert all(g == sorted(g) for g in groups)
    loads = [sum(b - a for _, _, a, b in g) for g in groups]
    # greedy largest-first: no group exceeds the lightest by more than the largest range
    assert max(loads) - min(loads) <= max(b - a for _, _, a, b in ranges)


# --------------------------------------------------------------------------------------
# Standalone: the source needs nothing from memwal; consumers plug in a batch mapper
# --------------------------------------------------------------------------------------


def test_the_source_imports_nothing_from_memwal() -> None:
    """Its package alone, copied elsewhere and loaded in a fresh interpreter, imports no other
    memwal module; nor does any import statement in its files (lazy ones included) name one
    (its own modules it imports relatively)."""
    import ast
    import shutil
    import subprocess
    import tempfile

    import memwal.streaming.kafka_source as ks

    package = Path(ks.__file__).parent
    files = sorted(package.glob("*.py"))
    assert len(files) >= 2
    imported = [
        name
        for path in files
        for node in ast.walk(ast.parse(path.read_text()))
        for name in ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
    ]
    assert not [n for n in imported if n == "memwal" or n.startswith("memwal.")]
    with tempfile.TemporaryDirectory() as work:
        shutil.copytree(package, Path(work) / "standalone_kafka_source", ignore=shutil.ignore_patterns("__pycache__"))
        code = (
            "import sys\n"
            f"sys.path.insert(0, {work!r})\n"
            "import standalone_kafka_source\n"
            "assert standalone_kafka_source.KafkaDataSource.name() == 'memwal-kafka'\n"
            "print(sorted(n for n in sys.modules if n == 'memwal' or n.startswith('memwal.')))\n"
        )
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd="/", check=True)
    assert out.stdout.strip() == "[]"


class Upper:
    """A batch mapper for the tests: upper-cases the values of the records."""

    def __init__(self, config: str) -> None:
        self.suffix = json.loads(config)["suffix"].encode() if config else b""
        self.schema = pa.schema([pa.field("value", pa.binary())])

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            values = [None if v is None else v.upper() + self.suffix for v in b.column("value").to_pylist()]
            yield pa.RecordBatch.from_arrays([pa.array(values, pa.binary())], schema=self.schema)


def test_batch_mapper_is_loaded_from_its_factory_name() -> None:
    from memwal.streaming.kafka_source import KAFKA_ARROW_SCHEMA, load_batch_mapper

    mapper = load_batch_mapper(f"{__name__}:Upper", json.dumps({"suffix": "!"}))
    assert mapper.schema == pa.schema([pa.field("value", pa.binary())])
    batch = pa.RecordBatch.from_pylist(
        [{"key": None, "value": b"ab", "topic": "t", "partition": 0, "offset": 0, "timestamp": None, "timestampType": 0}],
        schema=KAFKA_ARROW_SCHEMA)
    assert [b.to_pylist() for b in mapper(iter([batch]))] == [[{"value": b"AB!"}]]
    # dotted callables (e.g. a classmethod) too
    assert load_batch_mapper("memwal.streaming.sink:Prepare.from_json",
                             '{"uri": "/t", "options": {}}').schema.names[0] == "__memwal_part"
    with pytest.raises(TypeError):
        load_batch_mapper("json:loads", "{}")  # a dict is no mapper


@pytest.mark.parametrize("options, error", [
    ({"memwal.batchMapper": "no_colon"}, "module:callable"),
    ({"memwal.batchMapper": "mod:not an identifier"}, "module:callable"),
    ({"memwal.batchMapperConfig": "{}"}, "needs memwal.batchMapper"),
])
def test_batch_mapper_options_are_checked(options: Dict[str, str], error: str) -> None:
    base = {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t"}
    with pytest.raises(ValueError, match=error):
        Settings({**base, **{k.lower(): v for k, v in options.items()}})


def test_the_source_pickles_by_value_once_this_process_has_read() -> None:
    """Shipped by value, the module travels with its globals; once this process has read
    (its consumer pool exists, with a lock), pickling must still work, and the copy starts
    with an empty pool."""
    from pyspark import cloudpickle

    from memwal.streaming import kafka_source

    pool = kafka_source.records.pool()
    registered = kafka_source.__name__ in cloudpickle.list_registry_pickle_by_value()
    cloudpickle.register_pickle_by_value(kafka_source)
    try:
        copy = cloudpickle.loads(cloudpickle.dumps(pool))
        assert copy is not pool and copy._idle == {}
        assert cloudpickle.loads(cloudpickle.dumps(kafka_source.KafkaDataSource)).__name__ == "KafkaDataSource"
    finally:
        if not registered:  # leave the process as other tests found it
            cloudpickle.unregister_pickle_by_value(kafka_source)


def test_fetches_do_not_wait_for_new_records_or_back_off_unless_the_user_says_so() -> None:
    """A read task reads planned offsets only; a long-poll fetch, or a fetch backed off because
    the previous range's prefetch filled the queue, would hold up the next range."""
    from memwal.streaming import kafka_source as src

    base = {"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "t"}
    for key, default in (("fetch.wait.max.ms", src.settings._FETCH_WAIT_MS), ("fetch.queue.backoff.ms", src.settings._FETCH_QUEUE_BACKOFF_MS)):
        assert src.Settings(base).consumer_conf()[key] == default
        assert src.Settings({**base, f"kafka.{key}": "250"}).consumer_conf()[key] == "250"
    import confluent_kafka

    confluent_kafka.Consumer(src.Settings(base).consumer_conf()).close()  # librdkafka knows both settings
