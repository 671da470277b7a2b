"""The Kafka source's options, schemas and offsets: what a query asks for, validated once.

Part of :mod:`memwal.streaming.kafka_source`, which ships alone (standard library and
third-party packages only, no other memwal module); its package docstring documents the options.
"""

from __future__ import annotations

import importlib
import json
import uuid
from typing import Any, Dict, List, Mapping, Optional, Tuple

import pyarrow as pa
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

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

# Options of Spark's built-in source that are deliberately not implemented.
_UNSUPPORTED = (
    "assign", "subscribepattern", "startingtimestamp", "startingoffsetsbytimestamp",
    "startingoffsetsbytimestampstrategy", "endingoffsets", "endingtimestamp",
    "endingoffsetsbytimestamp", "minoffsetspertrigger", "maxtriggerdelay", "minpartitions",
    "maxrecordsperpartition",
)
# librdkafka settings the source owns, because its exactly-once reading depends on them.
_RESERVED_KAFKA = ("enable.auto.commit", "auto.offset.reset", "enable.partition.eof")

# librdkafka's fetch.message.max.bytes unless the user sets it (see _Settings.consumer_conf).
_FETCH_PARTITION_BYTES = 8 << 20
_FETCH_SIZE_KEYS = ("fetch.message.max.bytes", "max.partition.fetch.bytes", "fetch.max.bytes", "receive.message.max.bytes")
# librdkafka's fetch.wait.max.ms unless the user sets it (see _Settings.consumer_conf).
_FETCH_WAIT_MS = 10
# librdkafka's fetch.queue.backoff.ms unless the user sets it (see _Settings.consumer_conf).
_FETCH_QUEUE_BACKOFF_MS = 10


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


class Settings:
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


def offsets_to_json(offsets: Mapping[TopicPart, int]) -> Dict[str, Dict[str, int]]:
    """Checkpoint form of an offset map.

    Keys are emitted in sorted order so that equal offsets always serialise to the
    same JSON; Spark compares the serialised offsets to decide whether there is
    new data.
    """
    out: Dict[str, Dict[str, int]] = {}
    for topic, part in sorted(offsets):
        out.setdefault(topic, {})[str(part)] = int(offsets[(topic, part)])
    return out


def offsets_from_json(offsets: Optional[Mapping[str, Mapping[str, Any]]]) -> OffsetMap:
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
