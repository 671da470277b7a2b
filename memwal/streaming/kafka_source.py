"""A Kafka streaming source for Spark 4, written with PySpark's Python Data Source API.

pyspark ships no Kafka connector jars and none can be installed here, so
``format("kafka")`` is unavailable.  This module re-implements the part of
Spark's built-in Kafka source that memwal needs on top of confluent-kafka
(librdkafka), keeping the built-in's option names and output schema so that a
query can switch to ``format("kafka")`` where the jars exist::

    from memwal.streaming.kafka_source import register

    register(spark)
    df = (spark.readStream.format("memwal-kafka")
          .option("kafka.bootstrap.servers", "127.0.0.1:9092")
          .option("subscribe", "events")
          .option("startingOffsets", "earliest")
          .option("maxOffsetsPerTrigger", "10000")
          .load())

Options (names as in Spark's Kafka source; Spark hands Python data sources the
option keys lower-cased, so they are matched case-insensitively):

``kafka.bootstrap.servers`` (required)
    Passed to librdkafka as ``bootstrap.servers``.
``subscribe`` (required)
    Comma-separated topic names.  Topics that do not exist yet contribute no
    partitions until they appear; partitions discovered later start at their
    earliest offset, as with the built-in source.
``startingOffsets`` (default ``latest``)
    ``earliest``, ``latest`` or JSON such as ``{"t": {"0": 23, "1": -2}}``
    (``-2`` earliest, ``-1`` latest).  JSON must name every partition of every
    subscribed topic that exists at start.  Used only when the query has no
    checkpoint.
``maxOffsetsPerTrigger``
    Upper bound on records per micro-batch, spread over partitions in
    proportion to their backlog (largest-remainder rounding, ties broken by
    topic and partition, so the split is deterministic).
``failOnDataLoss`` (default ``true``)
    When offsets to be read are gone (retention, truncation), fail the query.
    ``false`` skips to the earliest offset still available instead.
``kafkaConsumer.pollTimeoutMs`` (default 120000)
    How long a read task may go without receiving anything before failing.  A
    response the consumer can not receive at all (librdkafka's "Invalid response
    size": larger than ``receive.message.max.bytes``) fails the read task at once
    with :class:`KafkaReceiveError` instead: retrying the same fetch gets the same
    response.  Brokers that ignore fetch sizes (noida-db 0.2.3 answers a fetch
    with everything from its offset to the end of the log) cause it once more than
    ``receive.message.max.bytes`` (100 MB by default) waits behind a read task's
    first offset; raise that with ``kafka.receive.message.max.bytes``.
``fetchOffset.numRetries`` (default 3), ``fetchOffset.retryIntervalMs`` (default 1000)
    Retries of offset look-ups on the driver.
``groupIdPrefix`` (default ``memwal-kafka-source``)
    Prefix of the random consumer ``group.id``; ``kafka.group.id`` sets it
    outright.  No offsets are ever committed to the group.
``memwal.minRecordsPerReadTask``
    Group topic-partitions so each read task gets at least this many records of
    the micro-batch (default: one task per topic-partition, as the built-in).
``memwal.batchMapper``, ``memwal.batchMapperConfig``
    A hook that transforms the records inside the read task, before they reach
    the JVM: ``module:callable`` naming a factory, imported with importlib in
    every process that plans or reads, and called with the config string (any
    text, JSON by convention; default empty).  The factory returns a mapper with
    a ``schema`` attribute (the ``pyarrow.Schema`` of its output, which becomes
    the DataFrame's schema) that is called with the iterator of Kafka record
    batches and returns an iterator of batches of that schema.  The mapper's
    module must be importable where the Python workers run; this module knows
    nothing about it.
``memwal.readLimitPolicy``, ``memwal.readLimitPolicyConfig``
    Size micro-batches adaptively instead of by ``maxOffsetsPerTrigger`` (which
    it replaces): ``module:callable`` naming a factory, loaded like the batch
    mapper on the planning side only, called with the config string.  The policy
    is called before every micro-batch with the previous bound (None at first)
    and the records waiting, and returns a JSON-able dict with at least
    ``limit`` (an int >= 1).  The dict is reported with the batch's latest
    offsets under the key ``memwal:readLimit`` (never a Kafka topic name: topics
    can not contain a colon), so the query's progress says why a batch has its
    size.
``kafka.<name>``
    Any other ``kafka.``-prefixed option is passed to librdkafka as ``<name>``.
    librdkafka's property names are all lower-case, so the lower-casing of keys
    does no harm.  Java-client-only names (for example ``sasl.jaas.config``)
    have no librdkafka equivalent and are rejected by librdkafka when the
    consumer is created.  ``enable.auto.commit``, ``auto.offset.reset`` and
    ``enable.partition.eof`` are controlled by the source and rejected;
    ``isolation.level`` defaults to ``read_uncommitted`` like the Java client,
    ``fetch.message.max.bytes`` to 8 MiB unless a fetch or receive size is set.

Options of the built-in source that this one does not implement
(``assign``, ``subscribePattern``, timestamp-based offsets, ``endingOffsets``,
``minOffsetsPerTrigger``, ``maxTriggerDelay``, ``minPartitions``,
``maxRecordsPerPartition``, ``includeHeaders=true``) raise an error rather than
being silently ignored.

Output schema (exactly the built-in's without headers)::

    key binary, value binary, topic string, partition int, offset long,
    timestamp timestamp, timestampType int

``timestampType`` uses the Java client's ids: 0 CreateTime, 1 LogAppendTime.
Brokers before 0.10 (Kafka 0.9) store no record timestamps; such records get a
**null** ``timestamp`` and ``timestampType`` -1 (the Java client's
NO_TIMESTAMP_TYPE).  Null was chosen over epoch 0 so that "no timestamp" can
not be mistaken for a real time in event-time logic; the built-in source
reports -1 ms (1969-12-31T23:59:59.999Z) there.

Offsets live in Spark's checkpoint as ``{"topic": {"partition": next_offset}}``
(the built-in's format).  Each micro-batch has one input partition per
topic-partition with a non-empty range; a read task assigns (never subscribes)
a consumer to that partition, seeks to the range start and stops at the range
end, so a batch replayed after a restart reads exactly the same records.
Nothing is committed to Kafka.
"""

from __future__ import annotations

import importlib
import itertools
import json
import sys
import threading
import time
import uuid
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

# confluent_kafka's classes claim to live in a module "cimpl" that can not be
# imported, so cloudpickle can not pickle a reference to them.  When register()
# ships this module by value its globals are pickled too; referring to the classes
# through the (importable) confluent_kafka module keeps them out of the pickle.
import confluent_kafka
import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

try:  # Spark >= 4.2 (present in 4.3.0)
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
except ImportError:  # pragma: no cover - older Spark: Trigger.AvailableNow falls back
    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Stand-in so the reader class still defines; Spark will not call it."""

__all__ = [
    "SHORT_NAME",
    "KAFKA_SCHEMA",
    "KAFKA_ARROW_SCHEMA",
    "KafkaDataSource",
    "KafkaStreamReader",
    "KafkaInputPartition",
    "KafkaReceiveError",
    "apportion",
    "load_batch_mapper",
    "register",
]

SHORT_NAME = "memwal-kafka"

KAFKA_SCHEMA = StructType([
    StructField("key", BinaryType(), True),
    StructField("value", BinaryType(), True),
    StructField("topic", StringType(), True),
    StructField("partition", IntegerType(), True),
    StructField("offset", LongType(), True),
    StructField("timestamp", TimestampType(), True),
    StructField("timestampType", IntegerType(), True),
])
"""Spark schema of the rows this source produces (the built-in Kafka source's)."""

KAFKA_ARROW_SCHEMA = pa.schema([
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    # Spark compares batches with to_arrow_schema(schema, timezone="UTC").
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("timestampType", pa.int32()),
])
"""Arrow schema of the record batches ``read`` yields; must equal Spark's conversion."""

TopicPart = Tuple[str, int]
OffsetMap = Dict[TopicPart, int]

# Java client ids for timestampType; librdkafka numbers them differently.
_TS_TYPE = {
    confluent_kafka.TIMESTAMP_CREATE_TIME: 0,
    confluent_kafka.TIMESTAMP_LOG_APPEND_TIME: 1,
}
_NO_TIMESTAMP_TYPE = -1

# Options of Spark's built-in source that are deliberately not implemented.
_UNSUPPORTED = (
    "assign", "subscribepattern", "startingtimestamp", "startingoffsetsbytimestamp",
    "startingoffsetsbytimestampstrategy", "endingoffsets", "endingtimestamp",
    "endingoffsetsbytimestamp", "minoffsetspertrigger", "maxtriggerdelay", "minpartitions",
    "maxrecordsperpartition",
)
# librdkafka settings the source owns, because its exactly-once reading depends on them.
_RESERVED_KAFKA = ("enable.auto.commit", "auto.offset.reset", "enable.partition.eof")

_ROWS_PER_ARROW_BATCH = 10_000
# librdkafka's fetch.message.max.bytes unless the user sets it (see _Settings.consumer_conf).
_FETCH_PARTITION_BYTES = 8 << 20
_FETCH_SIZE_KEYS = ("fetch.message.max.bytes", "max.partition.fetch.bytes", "fetch.max.bytes", "receive.message.max.bytes")
# librdkafka's fetch.wait.max.ms unless the user sets it (see _Settings.consumer_conf).
_FETCH_WAIT_MS = 10
# librdkafka's fetch.queue.backoff.ms unless the user sets it (see _Settings.consumer_conf).
_FETCH_QUEUE_BACKOFF_MS = 10


class KafkaReceiveError(RuntimeError):
    """A read task's consumer can not receive the broker's responses (librdkafka's
    ``_BAD_MSG``, e.g. a fetch response larger than ``receive.message.max.bytes``).

    Raised at the first such error rather than after ``kafkaConsumer.pollTimeoutMs``:
    librdkafka reconnects and repeats the same fetch, which gets the same response, so
    waiting can not help.
    """
_METADATA_TIMEOUT_S = 30.0


def _parse_bool(name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in ("true", "false"):
        return v == "true"
    raise ValueError(f"option {name} must be true or false, got {value!r}")


def _parse_positive_int(name: str, value: str) -> int:
    try:
        n = int(value.strip())
    except ValueError:
        raise ValueError(f"option {name} must be an integer, got {value!r}") from None
    if n <= 0:
        raise ValueError(f"option {name} must be positive, got {value!r}")
    return n


class _Settings:
    """Options of one query, validated once.  Plain attributes so it pickles anywhere."""

    def __init__(self, options: Mapping[str, str]) -> None:
        opts = {str(k).lower(): str(v) for k, v in options.items()}
        for name in _UNSUPPORTED:
            if name in opts:
                raise ValueError(f"option {name!r} of Spark's kafka source is not supported by "
                                 f"{SHORT_NAME}")
        if _parse_bool("includeHeaders", opts.get("includeheaders", "false")):
            raise ValueError(f"includeHeaders=true is not supported by {SHORT_NAME}")

        kafka = {k[len("kafka."):]: v for k, v in opts.items() if k.startswith("kafka.")}
        if not kafka.get("bootstrap.servers"):
            raise ValueError("option kafka.bootstrap.servers is required")
        for name in _RESERVED_KAFKA:
            if name in kafka:
                raise ValueError(f"option kafka.{name} is managed by {SHORT_NAME} and can not be "
                                 "set (use startingOffsets / failOnDataLoss)")
        self.kafka_conf: Dict[str, str] = kafka

        topics = [t.strip() for t in opts.get("subscribe", "").split(",") if t.strip()]
        if not topics:
            raise ValueError("option subscribe (comma-separated topic names) is required")
        self.topics: List[str] = sorted(set(topics))

        self.starting_offsets: str = opts.get("startingoffsets", "latest").strip()
        self.starting_json: OffsetMap = {}
        so = self.starting_offsets.lower()
        if so not in ("earliest", "latest"):
            self.starting_json = _parse_offsets_json(self.starting_offsets)
            unknown = sorted(set(t for t, _ in self.starting_json) - set(self.topics))
            if unknown:
                raise ValueError(f"startingOffsets names topics not in subscribe: {unknown}")
        else:
            self.starting_offsets = so

        mopt = opts.get("maxoffsetspertrigger")
        self.max_offsets_per_trigger: Optional[int] = (
            _parse_positive_int("maxOffsetsPerTrigger", mopt) if mopt is not None else None)
        self.fail_on_data_loss: bool = _parse_bool(
            "failOnDataLoss", opts.get("failondataloss", "true"))
        self.poll_timeout_s: float = _parse_positive_int(
            "kafkaConsumer.pollTimeoutMs", opts.get("kafkaconsumer.polltimeoutms", "120000")) / 1000
        self.fetch_retries: int = int(opts.get("fetchoffset.numretries", "3"))
        self.fetch_retry_interval_s: float = int(
            opts.get("fetchoffset.retryintervalms", "1000")) / 1000
        self.group_id_prefix: str = opts.get("groupidprefix", "memwal-kafka-source")
        # One id per query (never used for commits): consumers with equal settings can be
        # reused across read tasks.
        self.group_id: str = f"{self.group_id_prefix}-{uuid.uuid4()}"
        # A batch mapper fuses a consumer's first stage (memwal's sink: decode, validate,
        # route) into the read task, saving a round trip of every record between the JVM
        # and Python.
        self.batch_mapper: Optional[str] = opts.get("memwal.batchmapper")
        self.batch_mapper_config: str = opts.get("memwal.batchmapperconfig", "")
        if self.batch_mapper is not None:
            _split_factory(self.batch_mapper)
        elif "memwal.batchmapperconfig" in opts:
            raise ValueError("option memwal.batchMapperConfig needs memwal.batchMapper")
        # Group topic-partitions so each read task gets at least this many records (largest
        # ranges spread first). Spark's source reads each topic-partition in a task of its
        # own; for a small micro-batch every extra Python read task costs more than the
        # parallel read saves (docs/bench-log/ingest.md, "Ingest").
        # Adaptive micro-batches: a policy (module:callable factory) bounds each batch.
        self.read_limit_policy: Optional[str] = opts.get("memwal.readlimitpolicy")
        self.read_limit_policy_config: str = opts.get("memwal.readlimitpolicyconfig", "")
        if self.read_limit_policy is not None:
            _split_factory(self.read_limit_policy, "memwal.readLimitPolicy")
        elif "memwal.readlimitpolicyconfig" in opts:
            raise ValueError("option memwal.readLimitPolicyConfig needs memwal.readLimitPolicy")
        mrec = opts.get("memwal.minrecordsperreadtask")
        self.min_records_per_read_task: Optional[int] = (
            _parse_positive_int("memwal.minRecordsPerReadTask", mrec) if mrec is not None else None)

    def consumer_conf(self) -> Dict[str, Any]:
        """librdkafka configuration for a consumer that only assign()s and never commits."""
        conf: Dict[str, Any] = {
            # confluent-kafka insists on a group id even without group membership.
            "group.id": self.group_id,
            # The Java client's default, so the same records as Spark's own source.
            # librdkafka defaults to read_committed; when a user asks for that, its
            # offset look-ups return the last stable offset, so plans stay readable.
            "isolation.level": "read_uncommitted",
        }
        if not any(k in self.kafka_conf for k in _FETCH_SIZE_KEYS):
            # A read task reads one partition at a time from its start offset to its end, so
            # the per-partition fetch is all that bounds a round trip; librdkafka's 1 MiB
            # default took ~1.3x the time of 8 MiB to read a 93k-record catch-up range from
            # Kafka 0.9 (bench/decode.py --broker). Only when the user sets no fetch or
            # receive size: Kafka 0.9 has no fetch.max.bytes, so a larger partition fetch
            # could exceed a receive.message.max.bytes the user chose. Brokers that ignore
            # fetch sizes (noida-db) are unaffected; librdkafka's queue settings still bound
            # what is prefetched.
            conf["fetch.message.max.bytes"] = _FETCH_PARTITION_BYTES
        # A read task only reads offsets below the high watermark its plan saw, so a fetch never
        # needs the broker to wait for new records. With librdkafka's default (500 ms) a pooled
        # consumer's long-poll fetch, left waiting at the end of its previous range, held up the
        # first fetch of the next range by up to 500 ms: reading a 3,333-record range from Kafka
        # 0.9 took 0.49-0.52 s in a third of the reads against 0.015 s otherwise, which made
        # reading most of a 10k-record micro-batch (bench/ingest.py --axes --broker kafka09).
        conf["fetch.wait.max.ms"] = _FETCH_WAIT_MS
        # A read task stops at its range's end, with more records prefetched behind it; when
        # they fill the partition's queue, librdkafka postpones that partition's next fetch by
        # fetch.queue.backoff.ms (1,000 ms by default), and a pooled consumer given the same
        # partition again within that second waited for it: in a 1M-record catch-up from
        # Kafka 0.9, a third of the reads' first fetches came after 1.0 s (the 40k and 80k
        # micro-batches took 2.9 and 2.1 s; 0.9 and 1.3 s with 10 ms; docs/bench-log/ingest.md, "The catch-up again").
        conf["fetch.queue.backoff.ms"] = _FETCH_QUEUE_BACKOFF_MS
        conf.update(self.kafka_conf)
        conf.update({
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            # The EOF event tells a read task it reached the high watermark.
            "enable.partition.eof": True,
            # "error" surfaces a seek below the log start instead of silently
            # jumping; with failOnDataLoss=false we jump to the earliest record.
            "auto.offset.reset": "error" if self.fail_on_data_loss else "earliest",
        })
        return conf


def _parse_offsets_json(text: str) -> OffsetMap:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"startingOffsets must be earliest, latest or JSON like "
                         f'{{"topic":{{"0":23}}}}: {e}') from None
    if not isinstance(raw, dict):
        raise ValueError(f"startingOffsets JSON must be an object, got {text!r}")
    out: OffsetMap = {}
    for topic, parts in raw.items():
        if not isinstance(parts, dict):
            raise ValueError(f"startingOffsets: partitions of {topic!r} must be an object")
        for p, off in parts.items():
            if not isinstance(off, int) or isinstance(off, bool) or off < -2:
                raise ValueError(f"startingOffsets: bad offset {off!r} for {topic}:{p}")
            out[(str(topic), int(p))] = off
    return out


def _to_json(offsets: Mapping[TopicPart, int]) -> Dict[str, Dict[str, int]]:
    """Checkpoint form of an offset map.

    Keys are emitted in sorted order so that equal offsets always serialise to the
    same JSON; Spark compares the serialised offsets to decide whether there is
    new data.
    """
    out: Dict[str, Dict[str, int]] = {}
    for topic, part in sorted(offsets):
        out.setdefault(topic, {})[str(part)] = int(offsets[(topic, part)])
    return out


def _from_json(offsets: Optional[Mapping[str, Mapping[str, Any]]]) -> OffsetMap:
    out: OffsetMap = {}
    for topic, parts in (offsets or {}).items():
        for p, off in parts.items():
            out[(topic, int(p))] = int(off)
    return out


def apportion(backlog: Mapping[TopicPart, int], limit: int) -> Dict[TopicPart, int]:
    """Split ``limit`` records over partitions in proportion to their ``backlog``.

    Returns how many records to take from each partition: never more than its
    backlog, in total ``min(limit, sum(backlog))``.  Uses largest-remainder
    rounding; ties go to the smaller (topic, partition), so the result depends
    only on the arguments.  Any ``limit >= 1`` with a backlog makes progress.
    """
    items = sorted((tp, n) for tp, n in backlog.items() if n > 0)
    total = sum(n for _, n in items)
    if total <= limit:
        return {tp: n for tp, n in items}
    take: Dict[TopicPart, int] = {}
    remainders: List[Tuple[int, TopicPart]] = []
    for tp, n in items:
        # Integer arithmetic: floats could round differently across platforms.
        q, r = divmod(n * limit, total)
        take[tp] = q
        remainders.append((r, tp))
    left = limit - sum(take.values())
    for _, tp in sorted(remainders, key=lambda x: (-x[0], x[1]))[:left]:
        take[tp] += 1
    return take


def _split_factory(name: str, option: str = "memwal.batchMapper") -> Tuple[str, List[str]]:
    module, sep, attr = name.strip().partition(":")
    if not sep or not module or not attr or not all(part.isidentifier() for part in attr.split(".")):
        raise ValueError(f"option {option} must be 'module:callable', got {name!r}")
    return module, attr.split(".")


def _load_factory(name: str, option: str) -> Any:
    module, attrs = _split_factory(name, option)
    factory: Any = importlib.import_module(module)
    for attr in attrs:
        factory = getattr(factory, attr)
    return factory


#: Key of the read-limit policy's decision in the reported latest offsets.
READ_LIMIT_KEY = "memwal:readLimit"


def load_read_limit_policy(name: str, config: str) -> Any:
    """The read-limit policy the factory ``name`` makes from ``config``: a callable
    ``(previous_limit or None, backlog) -> {"limit": int, ...}``."""
    policy = _load_factory(name, "memwal.readLimitPolicy")(config)
    if not callable(policy):
        raise TypeError(f"read-limit policy factory {name} must return a callable")
    return policy


def load_batch_mapper(name: str, config: str) -> Any:
    """The mapper the factory ``name`` (``module:callable``, the callable may be dotted, e.g.
    ``pkg.mod:Class.from_config``) makes from ``config``."""
    module, attrs = _split_factory(name)
    factory: Any = importlib.import_module(module)
    for attr in attrs:
        factory = getattr(factory, attr)
    mapper = factory(config)
    if not isinstance(getattr(mapper, "schema", None), pa.Schema) or not callable(mapper):
        raise TypeError(f"batch mapper factory {name} must return a callable with a pyarrow.Schema 'schema'")
    return mapper


class KafkaInputPartition(InputPartition):
    """Records ``[start, end)`` of one topic-partition: the unit of one read task."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end

    def __repr__(self) -> str:
        return f"KafkaInputPartition({self.topic}:{self.partition} [{self.start}, {self.end}))"


class KafkaInputPartitionGroup(InputPartition):
    """Several topic-partition ranges read one after the other by one task."""

    def __init__(self, ranges: Sequence[Tuple[str, int, int, int]]) -> None:
        super().__init__(tuple(ranges))
        self.ranges = [tuple(r) for r in ranges]

    def __repr__(self) -> str:
        return "KafkaInputPartitionGroup(" + ", ".join(f"{t}:{p} [{a}, {b})" for t, p, a, b in self.ranges) + ")"


def group_ranges(ranges: Sequence[Tuple[str, int, int, int]], tasks: int) -> List[List[Tuple[str, int, int, int]]]:
    """Spread ``ranges`` over at most ``tasks`` groups, largest first onto the lightest
    group, so the groups' record counts stay close; each group keeps topic-partition order."""
    groups: List[List[Tuple[str, int, int, int]]] = [[] for _ in range(min(tasks, len(ranges)))]
    load = [0] * len(groups)
    for r in sorted(ranges, key=lambda r: (-(r[3] - r[2]), r[0], r[1])):
        i = load.index(min(load))
        groups[i].append(r)
        load[i] += r[3] - r[2]
    return [sorted(g) for g in groups if g]


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches from Kafka offsets and reads them.

    Spark creates this object several times (to plan on the driver, and again,
    unpickled, in every read task), so nothing connects in ``__init__``: the
    driver's metadata consumer is created on first use and dropped when pickled.
    """

    def __init__(self, settings: _Settings) -> None:
        self._s = settings
        self._consumer: Optional[confluent_kafka.Consumer] = None
        # High watermarks at prepareForTriggerAvailableNow(); caps every later batch.
        self._available_now_target: Optional[OffsetMap] = None
        self._last_latest: Optional[OffsetMap] = None
        # The query's first start offsets, once computed (see initialOffset).
        self._initial: Optional[Dict[str, Dict[str, int]]] = None
        # Adaptive sizing (memwal.readLimitPolicy): the policy, the last bound it chose
        # for a batch with records, and its last decision (reported with the offsets).
        self._policy: Any = None
        self._policy_limit: Optional[int] = None
        self._policy_decision: Optional[Dict[str, Any]] = None

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_consumer"] = None  # a live librdkafka handle can not travel
        state["_policy"] = None  # loaded again where it is needed (planning only)
        return state

    # -- driver side: offsets -----------------------------------------------------------

    def _metadata_consumer(self) -> confluent_kafka.Consumer:
        if self._consumer is None:
            self._consumer = confluent_kafka.Consumer(self._s.consumer_conf())
        return self._consumer

    def _watermarks(self) -> Dict[TopicPart, Tuple[int, int]]:
        """(low, high) watermark of every partition of the subscribed topics.

        Retries like the built-in's fetchOffset.* options, because a leader can be
        briefly unavailable (new topic, leader change).
        """
        attempt = 0
        while True:
            try:
                return self._watermarks_once()
            except confluent_kafka.KafkaException as e:
                attempt += 1
                if attempt > self._s.fetch_retries:
                    raise RuntimeError(
                        f"{SHORT_NAME}: could not fetch offsets of {self._s.topics} from "
                        f"{self._s.kafka_conf.get('bootstrap.servers')}: {e}") from e
                time.sleep(self._s.fetch_retry_interval_s)

    def _watermarks_once(self) -> Dict[TopicPart, Tuple[int, int]]:
        consumer = self._metadata_consumer()
        # Ask for all topics rather than the subscribed ones: with Kafka 0.9 a
        # metadata request naming a missing topic makes librdkafka fail to parse the
        # reply ("Protocol parse failure for Metadata v0"), and retry forever.
        md = consumer.list_topics(timeout=_METADATA_TIMEOUT_S)
        out: Dict[TopicPart, Tuple[int, int]] = {}
        for topic in self._s.topics:
            tmd = md.topics.get(topic)
            if tmd is None or tmd.error is not None:
                continue  # not created yet: no partitions, like the built-in source
            for p in sorted(tmd.partitions):
                low, high = consumer.get_watermark_offsets(
                    confluent_kafka.TopicPartition(topic, p),
                    timeout=_METADATA_TIMEOUT_S, cached=False)
                out[(topic, p)] = (int(low), int(high))
        return out

    def initialOffset(self) -> dict:
        """Offsets to start a query without checkpoint at, from ``startingOffsets``.

        Computed once per reader: Spark asks again when it runs the first micro-batch, and
        with ``latest`` and records arriving a second answer would start that batch past the
        end the first answer planned (the built-in source pins them in a log of its own; the
        offset log pins them once the first micro-batch is planned)."""
        if self._initial is None:
            self._initial = self._initial_offsets()
        return self._initial

    def _initial_offsets(self) -> Dict[str, Dict[str, int]]:
        marks = self._watermarks()
        s = self._s
        if s.starting_offsets == "earliest":
            start = {tp: low for tp, (low, _) in marks.items()}
        elif s.starting_offsets == "latest":
            start = {tp: high for tp, (_, high) in marks.items()}
        else:
            spec = s.starting_json
            missing = sorted(set(marks) - set(spec))
            if missing:
                # Same rule as the built-in: an unnamed partition is more likely a
                # mistake than a wish to start it at some default.
                raise ValueError(
                    "startingOffsets JSON must specify every partition; use -2 for earliest "
                    f"and -1 for latest. Missing: {[f'{t}:{p}' for t, p in missing]}")
            unknown = sorted(set(spec) - set(marks))
            if unknown:
                raise ValueError("startingOffsets JSON names partitions that do not exist: "
                                 f"{[f'{t}:{p}' for t, p in unknown]}")
            start = {}
            for tp, off in spec.items():
                low, high = marks[tp]
                start[tp] = low if off == -2 else high if off == -1 else off
        return _to_json(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        """``ReadMaxRows(maxOffsetsPerTrigger)`` if that option is set, else read all (with a
        read-limit policy too: the policy bounds each batch in ``latestOffset``)."""
        if self._s.max_offsets_per_trigger is not None and self._s.read_limit_policy is None:
            return ReadMaxRows(self._s.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Freeze the end of a ``Trigger.AvailableNow`` run at the current high watermarks.

        Partitions that appear later are not read by this run.
        """
        self._available_now_target = {tp: high for tp, (_, high) in self._watermarks().items()}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """End offsets of the next micro-batch, at most ``limit`` records past ``start``."""
        begin = _from_json(start)
        marks = self._watermarks()
        self._last_latest = {tp: high for tp, (_, high) in marks.items()}
        target = self._available_now_target

        end: OffsetMap = dict(begin)  # partitions that vanished keep their offsets
        first: OffsetMap = {}
        backlog: Dict[TopicPart, int] = {}
        for tp, (low, high) in marks.items():
            if target is not None:
                if tp not in target:
                    continue  # appeared after the AvailableNow snapshot
                high = min(high, target[tp])
            # A partition discovered since the last batch starts at its earliest offset.
            first[tp] = begin.get(tp, low)
            backlog[tp] = max(0, high - first[tp])

        if self._s.read_limit_policy is not None:
            take = self._policy_take(backlog)
        elif isinstance(limit, ReadMaxRows):
            take = apportion(backlog, int(limit.max_rows))
        else:
            take = backlog
        for tp, offset in first.items():
            end[tp] = offset + take.get(tp, 0)
        return _to_json(end)

    def _policy_take(self, backlog: Dict[TopicPart, int]) -> Dict[TopicPart, int]:
        """Records per partition under the read-limit policy's bound for this batch. Only a
        batch with records moves the policy on (an idle trigger plans nothing)."""
        total = sum(backlog.values())
        if total == 0:
            return {}
        if self._policy is None:
            self._policy = load_read_limit_policy(str(self._s.read_limit_policy), self._s.read_limit_policy_config)
        decision = dict(self._policy(self._policy_limit, total))
        limit = int(decision["limit"])
        if limit < 1:
            raise ValueError(f"read-limit policy returned limit {limit}; it must be at least 1")
        self._policy_limit = limit
        self._policy_decision = decision
        return apportion(backlog, limit)

    def reportLatestOffset(self) -> Optional[dict]:
        """High watermarks seen by the last ``latestOffset`` call (for query progress), with
        the read-limit policy's last decision under ``memwal:readLimit`` when one is set."""
        if self._last_latest is None:
            return None
        out: Dict[str, Any] = dict(_to_json(self._last_latest))
        if self._policy_decision is not None:
            out[READ_LIMIT_KEY] = self._policy_decision
        return out

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        """One input partition per topic-partition whose range ``[start, end)`` is non-empty,
        grouped so each task reads at least ``memwal.minRecordsPerReadTask`` records when
        that option is set."""
        begin, stop = _from_json(start), _from_json(end)
        lows: Optional[Dict[TopicPart, Tuple[int, int]]] = None
        out: List[InputPartition] = []
        for tp in sorted(stop):
            if tp in begin:
                first = begin[tp]
            else:
                # New partition: it started at its earliest offset in latestOffset.
                if lows is None:
                    lows = self._watermarks()
                first = lows[tp][0] if tp in lows else 0
            last = stop[tp]
            if last < first:
                # Offsets went backwards: the topic was recreated or truncated.
                if self._s.fail_on_data_loss:
                    raise RuntimeError(
                        f"{SHORT_NAME}: offset of {tp[0]}:{tp[1]} went back from {first} to "
                        f"{last}; data may have been lost (set failOnDataLoss=false to go on)")
                continue
            if last > first:
                out.append(KafkaInputPartition(tp[0], tp[1], first, last))
        per_task = self._s.min_records_per_read_task
        if per_task is not None and len(out) > 1:
            ranges = [(p.topic, p.partition, p.start, p.end) for p in out]  # type: ignore[attr-defined]
            tasks = max(1, sum(b - a for _, _, a, b in ranges) // per_task)
            if tasks < len(out):
                return [KafkaInputPartitionGroup(g) for g in group_ranges(ranges, tasks)]
        return out

    def commit(self, end: dict) -> None:
        """Nothing to do: progress lives in Spark's checkpoint, not in Kafka."""

    def stop(self) -> None:
        """Close the driver-side consumer."""
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            consumer.close()

    # -- executor side: records -------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Yield the records ``[start, end)`` of one topic-partition as Arrow batches."""
        # Duck typing rather than isinstance: when the module is shipped by value the
        # partition's class and this module's class can be distinct objects.
        p: Any = partition
        if hasattr(p, "ranges"):
            s = self._s
            batches = itertools.chain.from_iterable(
                _read_range(s, str(t), int(part), int(a), int(b)) for t, part, a, b in p.ranges)
        else:
            batches = _read_range(self._s, str(p.topic), int(p.partition), int(p.start), int(p.end))
        if self._s.batch_mapper is None:
            return batches
        return load_batch_mapper(self._s.batch_mapper, self._s.batch_mapper_config)(batches)


class _ConsumerPool:
    """Consumers kept per worker process between read tasks.

    Creating a consumer (client, broker connections) costs tens of milliseconds, a large
    share of a small micro-batch. Idle consumers are closed after a while: they hold
    connections, and would keep retrying (and logging) forever once the broker is gone.
    Only effective when this module is imported on the workers (``register(...,
    ship_by_value=False)``): a copy shipped by value is unpickled afresh for every task.
    """

    IDLE_S = 3.0
    MAX_IDLE_PER_CONF = 4

    def __init__(self) -> None:
        self._idle: Dict[str, List[Tuple[float, Any, List[Any]]]] = {}
        self._lock = threading.Lock()
        self._reaper: Optional[threading.Thread] = None

    def __reduce__(self) -> Tuple[Any, Tuple[()]]:
        # A copy of this module shipped by value carries the module's globals, this pool among
        # them once the driver process has read (tests do): its lock, thread and consumers can
        # not be pickled, and the copy needs none of them. It gets an empty pool.
        return (_ConsumerPool, ())

    @staticmethod
    def _key(conf: Mapping[str, Any]) -> str:
        return json.dumps(conf, sort_keys=True, default=str)

    def take(self, conf: Dict[str, Any]) -> Tuple[Any, List[Any]]:
        """An idle consumer for ``conf`` (or a new one) and the list its ``error_cb``
        appends librdkafka's client errors to, emptied: errors of an earlier task are not
        this task's."""
        with self._lock:
            idle = self._idle.get(self._key(conf))
            if idle:
                _, consumer, errors = idle.pop()
                errors.clear()
                return consumer, errors
        errors: List[Any] = []
        # Without an error_cb librdkafka only logs connection-level errors; the read task
        # needs to see them to fail fast on those that retrying can not cure.
        return confluent_kafka.Consumer({**conf, "error_cb": errors.append}), errors

    def give_back(self, conf: Dict[str, Any], consumer: Any, errors: List[Any]) -> None:
        with self._lock:
            if self._reaper is None:
                self._reaper = threading.Thread(target=self._reap, name="memwal-kafka-reaper", daemon=True)
                self._reaper.start()
            idle = self._idle.setdefault(self._key(conf), [])
            if len(idle) < self.MAX_IDLE_PER_CONF:
                idle.append((time.monotonic(), consumer, errors))
                return
        consumer.close()

    def _reap(self) -> None:
        while True:
            time.sleep(self.IDLE_S / 2)
            expired = []
            with self._lock:
                now = time.monotonic()
                for key, idle in self._idle.items():
                    expired += [c for t, c, _ in idle if now - t >= self.IDLE_S]
                    self._idle[key] = [e for e in idle if now - e[0] < self.IDLE_S]
            for c in expired:
                c.close()


# Created on first use, in the worker: a module shipped by value must not carry a lock.
_POOL: Optional[_ConsumerPool] = None


def _pool() -> _ConsumerPool:
    global _POOL
    if _POOL is None:
        _POOL = _ConsumerPool()
    return _POOL


#: Times a read task re-seeks an offset the broker called out of range while its log still
#: holds it (see _read_range), before calling it data loss.
_OFFSET_RESET_RETRIES = 5


def _read_range(s: _Settings, topic: str, part: int, start: int, end: int
                ) -> Iterator[pa.RecordBatch]:
    conf = s.consumer_conf()
    consumer, errors = _pool().take(conf)
    reusable = False
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, part, start)])
        rows = _Rows(topic, part)
        next_offset = start
        last_progress = time.monotonic()
        resets = 0
        while next_offset < end:
            msgs = consumer.consume(num_messages=min(end - next_offset, 5_000), timeout=1.0)
            _raise_receive_failure(errors, s, topic, part, next_offset)
            if not msgs:
                if time.monotonic() - last_progress > s.poll_timeout_s:
                    last = f"; last client error: {errors[-1].str()}" if errors else ""
                    raise TimeoutError(
                        f"{SHORT_NAME}: nothing received from {topic}:{part} at offset "
                        f"{next_offset} for {s.poll_timeout_s:.0f}s (range end {end}){last}")
                continue
            last_progress = time.monotonic()
            taken = rows.take_all(msgs, next_offset, end)
            if taken is not None:
                next_offset = taken
                msgs = ()  # all records, in order, inside the range: no per-record checks left
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.code() == confluent_kafka.KafkaError._PARTITION_EOF:
                        # At the high watermark.  Short of the planned end only if the
                        # log was truncated after planning.
                        eof_at = msg.offset()
                        if eof_at is not None and eof_at < end and s.fail_on_data_loss:
                            raise RuntimeError(
                                f"{SHORT_NAME}: {topic}:{part} ends at {eof_at}, before "
                                f"the planned end {end}; data was lost")
                        next_offset = end
                        break
                    if err.code() == confluent_kafka.KafkaError._AUTO_OFFSET_RESET:
                        # A partition just created or just elected answers "out of range" for
                        # a while; the data is lost only if the offset is outside the log now.
                        low, high = consumer.get_watermark_offsets(confluent_kafka.TopicPartition(topic, part), timeout=10, cached=False)
                        if low <= next_offset < high and resets < _OFFSET_RESET_RETRIES:
                            resets += 1
                            time.sleep(0.2 * resets)
                            consumer.seek(confluent_kafka.TopicPartition(topic, part, next_offset))
                            break
                        raise RuntimeError(
                            f"{SHORT_NAME}: offset {next_offset} of {topic}:{part} is no longer "
                            f"available ({err.str()}); data was lost. Set failOnDataLoss=false "
                            "to skip to the earliest available offset.")
                    if err.code() == confluent_kafka.KafkaError._BAD_MSG:
                        # The same failure, seen by a request (FindCoordinator, Fetch) on the
                        # dropped connection, may come before the error_cb's report of it.
                        errors.append(err)
                        _raise_receive_failure(errors, s, topic, part, next_offset)
                    raise confluent_kafka.KafkaException(err)
                off = msg.offset()
                if off is None:  # only error events lack an offset
                    continue
                if off >= end:
                    # Past the range (compaction or transaction markers can leave the
                    # last planned offset without a record).
                    next_offset = end
                    break
                if off < next_offset:
                    continue  # never emit a record twice
                rows.add(msg)
                next_offset = off + 1
            if len(rows) >= _ROWS_PER_ARROW_BATCH:
                yield rows.flush()
        if len(rows):
            yield rows.flush()
        reusable = True
    finally:
        if reusable:
            # unassign() drops anything prefetched, so the next task starts clean.
            consumer.unassign()
            _pool().give_back(conf, consumer, errors)
        else:
            consumer.close()


def _raise_receive_failure(errors: List[Any], s: _Settings, topic: str, part: int, offset: int) -> None:
    """Raise :class:`KafkaReceiveError` if the consumer reported a response it could not
    receive. Other client errors (a broker down, a refused connection) are transient:
    librdkafka retries them, and the poll timeout bounds the wait."""
    bad = next((e for e in errors if e.code() == confluent_kafka.KafkaError._BAD_MSG), None)
    if bad is None:
        return
    limit = s.kafka_conf.get("receive.message.max.bytes", "100000000 (librdkafka's default)")
    raise KafkaReceiveError(
        f"{SHORT_NAME}: can not receive {topic}:{part} from offset {offset}: {bad.str()}. "
        f"The broker answered a fetch with more than receive.message.max.bytes = {limit}; a broker "
        "that ignores fetch sizes (noida-db) sends everything from the offset to the end of the log. "
        "Raise the option kafka.receive.message.max.bytes (at most 2147483647) or use a broker that "
        "honours fetch.max.bytes.")


class _Rows:
    """Column buffers for one topic-partition, turned into Arrow record batches.

    Only the messages are kept until :meth:`flush`, which reads each attribute of all of them
    with one list comprehension and converts whole columns at once: per record, a handful of
    C calls instead of a Python method call, a dict look-up and five appends (the source's
    share of a catch-up micro-batch, bench/decode.py)."""

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self._clear()

    def _clear(self) -> None:
        self.msgs: List[Any] = []
        self.offsets: List[int] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def add(self, msg: Any) -> None:
        self.msgs.append(msg)
        self.offsets.append(msg.offset())

    def take_all(self, msgs: List[Any], next_offset: int, end: int) -> Optional[int]:
        """Add every one of ``msgs`` and return the next offset, if they are all records
        (no error events) with increasing offsets from ``next_offset`` on and below ``end``
        (the common case: a consume() inside the range); else add nothing and return None,
        and the caller checks them one by one."""
        if not msgs:
            return None
        # `is not None`, not list.count(None): KafkaError's == against None raises inside C
        if any(m.error() is not None for m in msgs):
            return None
        offs = [m.offset() for m in msgs]
        if offs[0] < next_offset or offs[-1] >= end:
            return None
        if len(offs) > 1 and not bool((np.diff(np.asarray(offs, dtype=np.int64)) > 0).all()):
            return None
        self.msgs.extend(msgs)
        self.offsets.extend(offs)
        return offs[-1] + 1

    def flush(self) -> pa.RecordBatch:
        msgs, n = self.msgs, len(self.offsets)
        stamps = [m.timestamp() for m in msgs]
        types = np.array([t for t, _ in stamps], dtype=np.int64)
        kinds = np.full(n, _NO_TIMESTAMP_TYPE, dtype=np.int32)
        for librdkafka_type, kind in _TS_TYPE.items():
            kinds[types == librdkafka_type] = kind
        ms = np.zeros(n, dtype=np.int64)
        known = kinds != _NO_TIMESTAMP_TYPE
        if known.any():
            ms[known] = np.array([v for _, v in stamps], dtype=np.int64)[known]
        # TIMESTAMP_NOT_AVAILABLE (pre-0.10 message format): a null timestamp
        timestamps = pa.array(ms * 1000, pa.timestamp("us", tz="UTC"), mask=kinds == _NO_TIMESTAMP_TYPE)
        topic = self.topic.encode()
        batch = pa.RecordBatch.from_arrays([
            pa.array([m.key() for m in msgs], pa.binary()),
            pa.array([m.value() for m in msgs], pa.binary()),
            # n copies of the topic, built as one buffer rather than n Python strings
            pa.StringArray.from_buffers(n, pa.py_buffer(np.arange(n + 1, dtype=np.int32) * len(topic)), pa.py_buffer(topic * n)),
            pa.array(np.full(n, self.partition, dtype=np.int32), pa.int32()),
            pa.array(np.asarray(self.offsets, dtype=np.int64), pa.int64()),
            timestamps,
            pa.array(kinds, pa.int32()),
        ], schema=KAFKA_ARROW_SCHEMA)
        self._clear()
        return batch


class KafkaDataSource(DataSource):
    """``format("memwal-kafka")``: Spark's Kafka source options and schema on librdkafka.

    Options are validated when the data source is created, so mistakes fail at
    ``load()`` rather than when the query starts.
    """

    def __init__(self, options: Dict[str, str]) -> None:
        super().__init__(options)
        self._settings = _Settings(options)

    @classmethod
    def name(cls) -> str:
        """The short name used with ``spark.readStream.format(...)``."""
        return SHORT_NAME

    def schema(self) -> StructType:
        """The fixed Kafka record schema (or, with ``memwal.batchMapper``, the mapper's);
        user-specified schemas are not supported."""
        s = self._settings
        if s.batch_mapper is not None:
            from pyspark.sql.pandas.types import from_arrow_schema

            return from_arrow_schema(load_batch_mapper(s.batch_mapper, s.batch_mapper_config).schema)
        return KAFKA_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """A reader for one streaming query."""
        if schema != self.schema():
            raise ValueError(f"{SHORT_NAME} has a fixed schema; do not pass a schema to load()")
        return KafkaStreamReader(self._settings)


def register(spark: Any, *, ship_by_value: bool = True) -> None:
    """Register ``format("memwal-kafka")`` with ``spark``.

    With ``ship_by_value`` (the default) this module's classes are pickled by value
    when Spark sends the data source to its Python workers, so the workers need
    only pyspark, pyarrow and confluent-kafka installed, not this project on their
    ``PYTHONPATH``.  Pass ``False`` when the project is installed on the workers.
    """
    if ship_by_value:
        # pyspark pickles with its vendored cloudpickle, not the PyPI one.
        from pyspark import cloudpickle

        cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark.dataSource.register(KafkaDataSource)
