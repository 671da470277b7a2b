"""A Kafka streaming source for Spark 4, written with PySpark's Python Data Source API.

pyspark ships no Kafka connector jars and none can be installed here, so
``format("kafka")`` is unavailable.  This package re-implements the part of
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
    module must be importable where the Python workers run; this package knows
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

The package ships alone (it imports the standard library and third-party packages, nothing
else of memwal): this module holds the data source and its stream reader (planning on the
driver), :mod:`.options` the options, schemas and offsets, :mod:`.records` the read side.
"""

from __future__ import annotations

import itertools
import sys
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

# confluent_kafka's classes claim to live in a module "cimpl" that can not be
# imported, so cloudpickle can not pickle a reference to them (see records.py).
import confluent_kafka
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import StructType

from .settings import (
    KAFKA_ARROW_SCHEMA,
    KAFKA_SCHEMA,
    READ_LIMIT_KEY,
    SHORT_NAME,
    OffsetMap,
    Settings,
    TopicPart,
    apportion,
    load_batch_mapper,
    load_read_limit_policy,
    offsets_from_json,
    offsets_to_json,
)
from .records import KafkaReceiveError, read_range

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
    "Settings",
    "apportion",
    "group_ranges",
    "load_batch_mapper",
    "register",
]

_METADATA_TIMEOUT_S = 30.0


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

    def __init__(self, settings: Settings) -> None:
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
        return offsets_to_json(start)

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
        begin = offsets_from_json(start)
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
        return offsets_to_json(end)

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
        out: Dict[str, Any] = dict(offsets_to_json(self._last_latest))
        if self._policy_decision is not None:
            out[READ_LIMIT_KEY] = self._policy_decision
        return out

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        """One input partition per topic-partition whose range ``[start, end)`` is non-empty,
        grouped so each task reads at least ``memwal.minRecordsPerReadTask`` records when
        that option is set."""
        begin, stop = offsets_from_json(start), offsets_from_json(end)
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
        # partition's class and this package's class can be distinct objects.
        p: Any = partition
        if hasattr(p, "ranges"):
            s = self._s
            batches = itertools.chain.from_iterable(
                read_range(s, str(t), int(part), int(a), int(b)) for t, part, a, b in p.ranges)
        else:
            batches = read_range(self._s, str(p.topic), int(p.partition), int(p.start), int(p.end))
        if self._s.batch_mapper is None:
            return batches
        return load_batch_mapper(self._s.batch_mapper, self._s.batch_mapper_config)(batches)


class KafkaDataSource(DataSource):
    """``format("memwal-kafka")``: Spark's Kafka source options and schema on librdkafka.

    Options are validated when the data source is created, so mistakes fail at
    ``load()`` rather than when the query starts.
    """

    def __init__(self, options: Dict[str, str]) -> None:
        super().__init__(options)
        self._settings = Settings(options)

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

    With ``ship_by_value`` (the default) this package's classes (its modules' too) are pickled by value
    when Spark sends the data source to its Python workers, so the workers need
    only pyspark, pyarrow and confluent-kafka installed, not this project on their
    ``PYTHONPATH``.  Pass ``False`` when the project is installed on the workers.
    """
    if ship_by_value:
        # pyspark pickles with its vendored cloudpickle, not the PyPI one.
        from pyspark import cloudpickle

        cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark.dataSource.register(KafkaDataSource)
