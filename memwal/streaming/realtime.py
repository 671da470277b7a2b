"""Real-time ingest: Spark's Real-Time Mode hands each Kafka record to memwal's resident
shard writers within milliseconds.

Why this shape (docs/bench-log/ingest.md, "Real-Time Mode"): in Real-Time Mode (Spark 4.1+,
``Trigger.RealTime``) a task runs for a whole real-time batch (seconds) and its sink sees each
record as it is read, but Spark allows only JVM sinks there (``RealTimeModeAllowlist``): a
Python data source writer is refused, and PySpark's ``foreach`` writer pickles rows to its
Python worker in batches that fill only at the end of the task, seconds later. So the sink is a
small JVM ``ForeachWriter`` (``memwal/jvm/realtime/KafkaRowWriter.java``, built by ``python -m
memwal.jvm fetch``) that buffers records for at most ``linger_ms`` and sends them, undecoded, to
the executor's writer process (:mod:`memwal.write.process`) over its Unix socket. There
:class:`KafkaWrite` decodes, checks and routes them exactly as a micro-batch task does
(:class:`~memwal.streaming.prepare.Prepare`) and writes them with the write API to the
process's resident shard writers; the JVM task goes on once the WAL holds them.

Semantics: a record is durable (and visible to strong readers) when its send returned; eventual
readers see it once its MemTable seals, every ``SinkOptions.flush_interval_seconds`` (the next
write seals it with the writer open; the writer process's sweeper flushes it when writes pause). Spark checkpoints the offsets at the end of each real-time
batch (``batch_seconds``); a crash replays from the last checkpoint, and upserts and deletes
are idempotent, so the table ends equal to the topic's last values. During a replay a reader
may see a key go back to an older value and forward again (records after the checkpoint are
written twice, in order). Bad records become dead letters with their reason, the rest goes on.

Limits (Spark 4.2): Kafka is the only source; one long-running task per Kafka partition (the
session needs at least as many task slots); no exchange, so each partition's task writes the
shards its records route to (align partitions with shards:
:func:`memwal.streaming.partitioning.partitions`).
"""

from __future__ import annotations

import base64
import logging
import pickle
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from memwal.core.storage import StorageConfig
from memwal.streaming.sink_options import SinkOptions

log = logging.getLogger("memwal.streaming")

#: Spark's shortest real-time batch (``spark.sql.streaming.realTimeMode.minBatchDuration``).
MIN_BATCH_SECONDS = 5.0

#: The seal cadence of a real-time ingest that was not given one (``SinkOptions``'s default is a
#: micro-batch's): eventual readers see a record ~0.65 s after it was sent (p50), at four
#: SSTables a second for maintenance to fold on a four-shard table (docs/benchmarks.md).
SEAL_SECONDS = 1.0


def records_frame(offsets, timestamps_ms, partitions, keys, values, epoch: int = 0) -> bytes:
    """Kafka records laid out as the JVM writer sends them (big-endian): the count and the
    real-time batch (epoch) as int64; offsets and timestamps (ms) as int64 each; partitions,
    key lengths and value lengths as int32 each (-1: null); then the keys' bytes and the
    values' bytes. (Tests build frames with it; the JVM writer is the other producer.)"""
    n = len(offsets)
    klen = np.array([-1 if k is None else len(k) for k in keys], ">i4")
    vlen = np.array([-1 if v is None else len(v) for v in values], ">i4")
    return b"".join([
        np.array([n, epoch], ">i8").tobytes(), np.asarray(offsets, ">i8").tobytes(), np.asarray(timestamps_ms, ">i8").tobytes(),
        np.asarray(partitions, ">i4").tobytes(), klen.tobytes(), vlen.tobytes(),
        b"".join(k for k in keys if k is not None), b"".join(v for v in values if v is not None),
    ])


def _binary(lengths: np.ndarray, data: pa.Buffer) -> pa.Array:
    valid = lengths >= 0
    offsets = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(np.where(valid, lengths, 0), out=offsets[1:])
    bitmap = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(pa.binary(), len(lengths), [bitmap, pa.py_buffer(offsets), data])


def kafka_batch(frame: pa.Buffer | bytes, topic: str) -> tuple[pa.RecordBatch, int]:
    """The Kafka records of a frame (:func:`records_frame`), as Spark's Kafka source names its
    columns, and the real-time batch they belong to."""
    buf = frame if isinstance(frame, pa.Buffer) else pa.py_buffer(frame)
    n, epoch = (int(x) for x in np.frombuffer(buf, ">i8", 2, 0))
    pos = 16

    def take(dtype: str) -> np.ndarray:
        nonlocal pos
        out = np.frombuffer(buf, dtype, n, pos).astype(dtype[1:])
        pos += out.nbytes
        return out

    offsets, stamps = take(">i8"), take(">i8")
    partitions, klen, vlen = take(">i4"), take(">i4"), take(">i4")
    kbytes, vbytes = int(np.maximum(klen, 0).sum()), int(np.maximum(vlen, 0).sum())
    keys = _binary(klen, buf.slice(pos, kbytes))
    values = _binary(vlen, buf.slice(pos + kbytes, vbytes))
    batch = pa.RecordBatch.from_arrays(
        [keys, values, pa.repeat(pa.scalar(topic, pa.string()), n), pa.array(partitions, pa.int32()), pa.array(offsets, pa.int64()),
         pa.array(stamps, pa.int64()).cast(pa.timestamp("ms", tz="UTC"))],
        names=["key", "value", "topic", "partition", "offset", "timestamp"],
    )
    return batch, epoch


@dataclass(frozen=True)
class KafkaWrite:
    """A real-time task's request, run by the writer process: decode, check, route and write
    one frame of Kafka records (the same steps as a micro-batch task's), and record its dead
    letters. Its answer (UTF-8 JSON) counts what it did."""

    uri: str
    topic: str
    sink: SinkOptions
    storage: StorageConfig | None = None

    def run(self, frame: pa.Buffer) -> dict[str, int]:
        from memwal.streaming.prepare import timestamp_range

        t0 = time.perf_counter()
        batch, epoch = kafka_batch(frame, self.topic)
        prepare, write = _machinery(self)
        state = write.state
        p = prepare.prepare(state, pa.Table.from_batches([batch]), 0, 0, 1)
        message = write.prepare(p.write_batch(0.0, time.perf_counter() - t0, timestamp_range(batch)),
                                label=f"real-time-{epoch}")
        if message.dead:
            write.commit([message], epoch)
        return {"rows": batch.num_rows, "dead": p.dead.num_rows, "shards": len(p.shards)}


#: Keyed by the request itself (frozen, hashable): equal requests share one.
_MACHINERY: dict[KafkaWrite, tuple[Any, Any]] = {}


def _machinery(request: KafkaWrite) -> tuple[Any, Any]:
    """The request's Prepare (its value decoder) and TableWrite (the process's resident shard
    writers), made by its first frame: the JVM sends the same request for every frame."""
    found = _MACHINERY.get(request)
    if found is None:
        from memwal.streaming.prepare import Prepare
        from memwal.write.api import TableWrite
        from memwal.write.worker import WORKER, WorkerShards

        sink = request.sink
        state = WORKER.table(request.uri, request.storage).state
        shards = WorkerShards(request.uri, request.storage, sink.durability, sink.flush_interval_seconds)
        found = (Prepare(request.uri, sink, request.storage),
                 TableWrite(state, sink.write_mode(), shards=shards, dead_letter_uri=sink.dead_letter_uri))
        _MACHINERY[request] = found
    return found


def partition_count(bootstrap: str, topic: str, timeout: float = 30.0) -> int:
    """The partitions of ``topic`` (a real-time query runs one task per partition)."""
    from confluent_kafka.admin import AdminClient

    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=timeout)
    found = md.topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        raise ValueError(f"topic {topic!r} has no partitions at {bootstrap}" + (f": {found.error}" if found is not None and found.error else ""))
    return len(found.partitions)


@dataclass
class RealTimeJob:
    """A running real-time ingest query."""

    query: Any
    spark: Any
    table_uri: str
    storage: StorageConfig | None

    def await_termination(self, timeout: float | None = None) -> bool:
        return bool(self.query.awaitTermination(timeout) if timeout is not None else (self.query.awaitTermination() or True))

    def stop(self) -> None:
        self.query.stop()


def ingest_real_time(
    spark,
    *,
    bootstrap: str,
    topic: str,
    table_uri: str,
    checkpoint: str,
    options: SinkOptions | None = None,
    batch_seconds: float = 60.0,
    linger_ms: int = 5,
    max_rows: int = 5000,
    starting_offsets: str = "earliest",
    kafka_options: Mapping[str, str] | None = None,
    storage_options: "Mapping[str, str] | StorageConfig | None" = None,
    query_name: str | None = None,
) -> RealTimeJob:
    """Start a Real-Time Mode query from ``topic`` into the memwal table at ``table_uri`` (see
    the module docstring). ``batch_seconds``: Spark's real-time batch, its checkpoint interval
    (at least :data:`MIN_BATCH_SECONDS`); ``linger_ms``/``max_rows``: how long and how many
    records the JVM writer buffers before it sends them. Without ``options``, JSON records
    sealed every :data:`SEAL_SECONDS`; ``options.flush_interval_seconds`` is the seal cadence
    otherwise (eventual readers' freshness, docs/deploy.md)."""
    from pyspark.sql.streaming.query import StreamingQuery

    from memwal import jvm as jars
    from memwal.core.state import resolve_storage
    from memwal.streaming.session import make_active
    from memwal.write.process import Endpoint, ensure_command

    if not jars.jars("realtime"):
        raise RuntimeError("the real-time writer's jar is not built: run python -m memwal.jvm fetch")
    if batch_seconds < MIN_BATCH_SECONDS:
        raise ValueError(f"batch_seconds must be at least {MIN_BATCH_SECONDS:g} (Spark's shortest real-time batch)")
    options = options or SinkOptions(source="kafka-json", flush_interval_seconds=SEAL_SECONDS)
    make_active(spark)
    storage = resolve_storage(storage_options)
    endpoint = Endpoint.for_environment()
    header = pickle.dumps(("kafka", KafkaWrite(table_uri, topic, options, storage), None))
    reader = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
              .option("startingOffsets", starting_offsets))
    for key, value in (kafka_options or {}).items():
        reader = reader.option(key, value)
    jvm = spark._jvm
    writer = jvm.memwal.realtime.KafkaRowWriter(str(endpoint.socket), base64.b64encode(header).decode(),
                                                "\t".join(ensure_command(endpoint)), max_rows, linger_ms)
    trigger = jvm.org.apache.spark.sql.streaming.Trigger.RealTime(f"{batch_seconds:g} seconds")
    jwriter = (reader.load()._jdf.writeStream().foreach(writer).outputMode("update").trigger(trigger)
               .option("checkpointLocation", checkpoint).queryName(query_name or f"memwal-real-time-{topic}"))
    query = StreamingQuery(jwriter.start())
    log.info("ingesting %s from %s into %s in real time (checkpoint %s, real-time batches of %gs, records sent within %d ms)",
             topic, bootstrap, table_uri, checkpoint, batch_seconds, linger_ms)
    return RealTimeJob(query, spark, table_uri, storage)
