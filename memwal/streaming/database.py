"""Whole-database CDC: one ingest query over many Debezium topics, one table per source table.

Debezium writes each source table's changes to its own topic, named
``<topic.prefix>.<schema>.<table>`` (``<prefix>.<database>.<table>`` for MySQL). One query
reads them all (a topic pattern or a list) and, per micro-batch, writes each topic's records
into the table under a root named after the source table (:func:`table_name`):
``ROOT/public.orders``. A topic's table is created from the first change event of it that
carries its schema (Debezium JSON with ``schemas.enable``, or Avro with a registry): columns of
the event's row fields, the primary key of the event's key fields, sharded by
``bucket(<first key column>, shards)`` (unsharded with one shard). From then on it evolves with
the source as any ingest's table does (``SinkOptions.evolve``).

Each table is written by the ``foreachBatch`` sink (:class:`~memwal.streaming.sink.MemwalSink`),
with its own dead-letter table (``ROOT/public.orders_dead_letters``) and report; the batch's
report sums them and keeps each (:meth:`Reports.tables`, per-table metrics). A micro-batch is
read once (cached) and runs one Spark job per table that has records in it. Exactly once holds
per table as for one: a replayed micro-batch rewrites each table's records idempotently.

A topic whose table cannot be made yet (its events in this micro-batch carry no schema, or no
key), or whose name maps to a table another topic fills (``db1.public.orders`` and
``db2.public.orders``), sends its records to the root's dead-letter table
(``ROOT/_dead_letters``) with the reason, counted in the batch's report; its next events with a
schema create the table.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace

import pyarrow as pa

from memwal.core import paths
from memwal.core.errors import InvalidArgumentError, MemwalError, TableExistsError
from memwal.core.state import resolve_storage, table_exists
from memwal.core.storage import StorageConfig
from memwal.streaming.job import IngestJob, MemwalProgressListener, _trigger, kafka_stream
from memwal.streaming.sink_options import SinkOptions
from memwal.streaming.batch_progress import BatchObserver
from memwal.streaming.reports import Reports
from memwal.streaming.session import make_active
from memwal.streaming.sink import MemwalSink, interruptible
from memwal.write.messages import WriteReport

log = logging.getLogger("memwal.streaming")

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def table_name(topic: str) -> str:
    """The table a Debezium topic fills, named after its source table: the topic's name without
    its first part (Debezium's ``topic.prefix``) when it has three or more, else the whole name;
    characters other than letters, digits, ``_``, ``.`` and ``-`` become ``_``."""
    parts = topic.split(".")
    name = ".".join(parts[1:]) if len(parts) >= 3 else topic
    name = _UNSAFE.sub("_", name)
    return "_" + name if name.startswith((".", "_")) or not name else name  # never a hidden or relative name


def first_event_schema(options: SinkOptions, key: bytes | None, value: bytes) -> tuple[pa.Schema, list[str]]:
    """The columns and primary key of the table a change event's topic fills, from the event
    (``InvalidArgumentError`` when it does not say them: no schema, no key)."""
    if options.value_format == "debezium-json":
        from memwal.streaming.debezium import schema_from_event

        event = schema_from_event((key or b"") + b"\n" + value)
    elif options.value_format == "avro" and options.schema_registry:
        from memwal.streaming.avro import schema_from_avro_event

        event = schema_from_avro_event(value, key, options.schema_registry)
    else:
        raise InvalidArgumentError("a whole-database ingest creates its tables from the events' schemas: "
                                   "--format debezium-json, or avro with --schema-registry")
    if not event.primary_key:
        raise InvalidArgumentError("the change event's Kafka key carries no schema: the table's primary key is unknown "
                                   "(create the table first with `memwal init`)")
    return event.schema, list(event.primary_key)


class DatabaseSink:
    """A ``foreachBatch`` sink writing each topic's records into its own table under ``root``.

    >>> sink = DatabaseSink("/data/shop", SinkOptions(source="kafka-json", value_format="debezium-json"))
    >>> kafka_df.writeStream.foreachBatch(sink).option("checkpointLocation", ckpt).start()
    """

    def __init__(self, root: str, options: SinkOptions | None = None,
                 storage_options: "Mapping[str, str] | StorageConfig | None" = None, shards: int = 1) -> None:
        self.root = paths.normalize_uri(root)
        self.options = options or SinkOptions(source="kafka-json", value_format="debezium-json")
        if self.options.source != "kafka-json":
            raise InvalidArgumentError("a whole-database ingest reads Kafka: options.source must be 'kafka-json'")
        if self.options.dead_letter_uri is not None:
            raise InvalidArgumentError("a whole-database ingest gives each table its own dead-letter table: no dead_letter_uri")
        if shards < 1:
            raise InvalidArgumentError(f"shards must be at least 1, got {shards}")
        self.storage = resolve_storage(storage_options)
        self.shards = shards
        #: topic -> the sink of its table (opened, or created, at its first records)
        self.sinks: dict[str, MemwalSink] = {}
        #: The micro-batches' reports (each the sum of its tables') and, per batch, each table's.
        self.history = Reports()
        self.dead_letter_uri = paths.join(self.root, "_dead_letters")

    def table_uri(self, topic: str) -> str:
        return paths.join(self.root, table_name(topic))

    def table_uris(self) -> list[str]:
        """The tables this sink has written (or found) so far."""
        return sorted({s.uri for s in self.sinks.values()})

    def __call__(self, df, batch_id: int) -> None:
        interruptible(self._write_batch, df, batch_id)

    def _write_batch(self, df, batch_id: int) -> None:
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        t0 = time.perf_counter()
        df = df.persist(StorageLevel.MEMORY_AND_DISK)  # read from Kafka once, whatever the number of tables
        try:
            topics = sorted(r[0] for r in df.select("topic").distinct().collect())
            parts: list[WriteReport] = []
            for topic in topics:
                records = df.filter(F.col("topic") == topic)
                sink = self._sink(topic, records, batch_id)
                if isinstance(sink, WriteReport):  # the topic's records are the root's dead letters
                    parts.append(sink)
                    continue
                sink._write_batch(records, batch_id)
                report = sink.report(batch_id)
                if report is not None:
                    parts.append(replace(report, table=sink.uri))
        finally:
            df.unpersist()
        report = WriteReport.combined(parts, batch_id, seconds=time.perf_counter() - t0)
        self.history.record(report, tuple(parts))
        log.info("%s; %d table(s): %s", report.line(), len(parts), ", ".join(f"{paths.basename(p.table)} {p.rows}" for p in parts))

    def _sink(self, topic: str, records, batch_id: int) -> MemwalSink | WriteReport:
        """The sink of ``topic``'s table, which is created from an event of it that carries its
        schema if there is none; when it cannot be made yet, the records are recorded as the
        root's dead letters and their report returned."""
        sink = self.sinks.get(topic)
        if sink is not None:
            return sink
        from memwal.core.io import file_io_for

        uri = self.table_uri(topic)
        io = file_io_for(uri, self.storage)
        try:
            if not table_exists(uri, io):
                try:
                    self._create(uri, records)
                    log.info("created %s for topic %s", uri, topic)
                except TableExistsError:
                    pass  # another query made it meanwhile
            # Two topics named alike (db1.public.orders, db2.public.orders) would overwrite each
            # other's rows: the table records the topic that fills it, and refuses another.
            claim = json.dumps({"topic": topic}).encode()
            if not io.write_if_absent(paths.source_topic(uri), claim):
                other = json.loads(io.read(paths.source_topic(uri))).get("topic")
                if other != topic:
                    raise InvalidArgumentError(f"its table {uri} is filled from topic {other!r}, named alike")
        except (MemwalError, ValueError) as e:  # (ValueError: a schema that does not parse, UnicodeDecodeError)
            reason = f"no table for topic {topic!r}: {e}"
            n = self._dead_letters(topic, records, batch_id, reason)
            log.warning("topic %s: %d record(s) to %s: %s", topic, n, self.dead_letter_uri, reason)
            return WriteReport(batch_id=batch_id, rows=n, dead_letters=n, table=self.dead_letter_uri)
        sink = self.sinks[topic] = MemwalSink(uri, self.options, self.storage).bind(records.sparkSession)
        return sink

    #: Events of a topic tried for its table's schema (a tombstone or an event written without
    #: its schema says nothing; the first that does is taken).
    SCHEMA_CANDIDATES = 20

    def _create(self, uri: str, records) -> None:
        from pyspark.sql import functions as F

        from memwal.table import Table

        candidates = records.filter(F.col("value").isNotNull()).select("key", "value").limit(self.SCHEMA_CANDIDATES).collect()
        if not candidates:
            raise InvalidArgumentError("its records in this micro-batch are tombstones only")
        why: Exception | None = None
        for row in candidates:
            try:
                schema, primary_key = first_event_schema(self.options, row["key"], row["value"])
                break
            except (MemwalError, ValueError) as e:
                why = e
        else:
            raise InvalidArgumentError(f"none of {len(candidates)} of its events says the table's schema and key: {why}")
        shard_by = "unsharded" if self.shards == 1 else f"bucket({primary_key[0]}, {self.shards})"
        Table.create(uri, schema, primary_key, shard_by, storage_options=self.storage).close()

    def _dead_letters(self, topic: str, records, batch_id: int, reason: str) -> int:
        """Record a topic's records that have no table as dead letters of the root's table."""
        from memwal.write.dead_letters import dead_letter_rows, write_dead_letters
        from memwal.write.messages import DEAD_SCHEMA, ERROR, KEY, KPART, OFFSET, ORDER, RAW, TOPIC

        got = records.select("key", "value", "partition", "offset").toArrow()
        n = got.num_rows
        bad = pa.table({ORDER: pa.array(range(n), pa.int64()), ERROR: pa.array([reason] * n, pa.string()),
                        TOPIC: pa.array([topic] * n, pa.string()), KPART: got.column("partition").cast(pa.int32()),
                        OFFSET: got.column("offset").cast(pa.int64()), KEY: got.column("key"), RAW: got.column("value")},
                       schema=DEAD_SCHEMA)
        return write_dead_letters(self.dead_letter_uri, dead_letter_rows(bad, batch_id, self.root), self.storage)


def ingest_database(
    spark,
    *,
    bootstrap: str,
    root: str,
    checkpoint: str,
    topics: Sequence[str] = (),
    topic_pattern: str | None = None,
    trigger_interval: float | None = None,
    available_now: bool = False,
    starting_offsets: str = "earliest",
    max_offsets_per_trigger: int | None = None,
    kafka_options: dict[str, str] | None = None,
    options: SinkOptions | None = None,
    query_name: str | None = None,
    storage_options: "Mapping[str, str] | StorageConfig | None" = None,
    observers: Sequence[BatchObserver] = (),
    shards: int = 1,
) -> IngestJob:
    """Start one query reading the Debezium topics ``topics`` (or those ``topic_pattern``
    matches, a regular expression, topics created later included) into one table each under
    ``root`` (:mod:`memwal.streaming.database`), through Spark's Kafka connector."""
    if bool(topics) == (topic_pattern is not None):
        raise InvalidArgumentError("give the topics, or a topic pattern (one of them)")
    make_active(spark)
    sink = DatabaseSink(root, options or SinkOptions(source="kafka-json", value_format="debezium-json"), storage_options, shards)
    if checkpoint.startswith(("s3a://", "s3://")):
        from memwal.streaming.session import configure_s3a

        configure_s3a(spark, sink.storage)
    subscription = topic_pattern if topic_pattern is not None else ",".join(topics)
    name = query_name or f"memwal-ingest-database-{paths.basename(sink.root)}"
    listener = MemwalProgressListener(sink.history, name, None, observers)
    spark.streams.addListener(listener)
    stream = kafka_stream(spark, bootstrap, subscription, starting_offsets=starting_offsets,
                          max_offsets_per_trigger=max_offsets_per_trigger, kafka_options=kafka_options, kafka_source="spark",
                          pattern=topic_pattern is not None)
    writer = stream.writeStream.queryName(name).foreachBatch(sink).option("checkpointLocation", checkpoint)
    query = _trigger(writer, available_now, trigger_interval).start()
    log.info("ingesting %s from %s into tables under %s (checkpoint %s)", subscription, bootstrap, sink.root, checkpoint)
    return IngestJob(query=query, reports=sink.history, listener=listener, available_now=available_now, spark=spark,
                     table_uri=sink.root, storage=sink.storage, kafka_source="spark", tables=sink.table_uris)


__all__ = ["DatabaseSink", "first_event_schema", "ingest_database", "table_name"]
