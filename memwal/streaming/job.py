"""Kafka -> Spark Structured Streaming -> memwal, wired up in one call (``memwal ingest``): the ingest job."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable

from memwal.core.storage import StorageConfig

from memwal.streaming.adaptive import AdaptiveSizing, SizeDecision, bound_decision, decision_of
from memwal.streaming.kafka_source import SHORT_NAME, register
from memwal.streaming.batch_progress import BatchObserver, BatchProgress, partition_lag
from memwal.streaming.reports import Reports
from memwal.streaming.session import default_parallelism, make_active
from memwal.streaming.sink import MemwalSink, SinkOptions
from memwal.streaming.timing import BatchTiming

log = logging.getLogger("memwal.streaming")


def _listener_base():
    from pyspark.sql.streaming import StreamingQueryListener

    return StreamingQueryListener


def observed_metrics(progress: Any, name: str = "memwal") -> dict[str, Any]:
    """The observed metrics ``name`` of one ``StreamingQueryProgress`` (a listener event's, or
    an element of ``query.recentProgress``/``query.lastProgress``) as a dict; empty if absent.

    Spark hands them as Rows of the metrics, except over Spark Connect where progress read
    back from the query is parsed from its JSON and each entry is a Row of ``values`` and
    ``schema``: both forms give the same dict.
    """
    metrics = progress.observedMetrics if hasattr(progress, "observedMetrics") else progress.get("observedMetrics")
    row = (metrics or {}).get(name)
    if row is None:
        return {}
    d = row.asDict() if hasattr(row, "asDict") else dict(row)
    if set(d) == {"values", "schema"} and isinstance(d["schema"], dict):
        return {f["name"]: v for f, v in zip(d["schema"]["fields"], d["values"])}
    return d


class MemwalProgressListener(_listener_base()):  # type: ignore[misc]
    """Joins every ``StreamingQueryProgress`` of a memwal query with the write side's report
    of the same micro-batch (fenced retries, shards, write latency): ``listener.progress[batch_id]``.

    Over Spark Connect the listener runs in the client and the writes commit in the server,
    so only the query's observed metrics arrive (``"observed"``); ``"sink"`` is None there and
    the write side's line is in the server's log."""

    def __init__(self, reports: Reports, query_name: str, fixed_sizing: AdaptiveSizing | None = None,
                 observers: Sequence[BatchObserver] = (), log_reports: bool = False) -> None:
        super().__init__()
        #: Called with every micro-batch's :class:`BatchProgress` (metrics, progress bars).
        self.observers: list[BatchObserver] = list(observers)
        #: The query's micro-batch reports (the sink's, or those its commits leave).
        self.reports = reports
        #: Log each report's line here (the query's process): the sink logs its own; the
        #: commits of ``format("memwal")`` run in another process, whose log is Spark's.
        self.log_reports = log_reports
        self.query_name = query_name
        #: Adaptive sizes through a source that takes one fixed bound (Spark's Kafka source):
        #: each batch's decision is derived from its offsets (:func:`bound_decision`).
        self.fixed_sizing = fixed_sizing
        self.progress: dict[int, dict[str, Any]] = {}
        #: Per micro-batch: where its time went (joined with the sink's report) and, with
        #: adaptive micro-batches, the size decision the source took.
        self.timings: dict[int, BatchTiming] = {}
        self.sizes: dict[int, SizeDecision] = {}
        #: The last batch whose progress was handled to the end (observers included): what
        #: :meth:`IngestJob.await_termination` waits for, so metrics and bars miss no batch.
        self.handled_batch = -1

    def onQueryStarted(self, event) -> None:  # noqa: N802 - Spark's API names
        """Spark requires every callback; only progress carries memwal's counters."""

    def onQueryProgress(self, event) -> None:  # noqa: N802
        p = event.progress
        if p.name != self.query_name:
            return
        report = self.reports.report(p.batchId)
        if report is not None and self.log_reports:
            log.info("%s", report.line())
        self.progress[p.batchId] = {
            "batch_id": p.batchId,
            "input_rows": p.numInputRows,
            "observed": observed_metrics(p),
            "sink": asdict(report) if report is not None else None,
            "duration_ms": dict(p.durationMs or {}),
            "timestamp": p.timestamp,  # when the trigger started (ISO 8601, UTC)
        }
        decision = decision_of(p.sources[0].latestOffset) if p.sources and p.numInputRows else None
        if decision is None and self.fixed_sizing is not None and p.sources and p.numInputRows:
            src = p.sources[0]
            decision = bound_decision(self.fixed_sizing, src.endOffset, src.latestOffset, src.numInputRows)
        if decision is not None:
            self.sizes[p.batchId] = decision
            if report is not None:
                report.size_reason = decision.reason
            log.info("batch %d: %d records, bound %d (%s)", p.batchId, decision.rows, decision.limit, decision.reason)
        if report is not None:
            # The source's rows are the prepare stage's exchange rows: count the sink's.
            self.timings[p.batchId] = BatchTiming.join(p.batchId, report.rows, p.durationMs or {}, report)
        if self.observers:
            src = p.sources[0] if p.sources else None
            batch = BatchProgress(p.batchId, p.numInputRows, report, self.timings.get(p.batchId), decision,
                                  partition_lag(src.endOffset, src.latestOffset) if src is not None else (),
                                  self.reports.tables(p.batchId))
            for observe in self.observers:
                try:
                    observe(batch)
                except Exception:  # noqa: BLE001 - an observer's failure must not stop the query's listener
                    log.exception("observer %r failed on batch %d", observe, p.batchId)
        for kept in (self.progress, self.timings, self.sizes):
            while len(kept) > 1000:
                kept.pop(min(kept))
        self.handled_batch = max(self.handled_batch, p.batchId)

    def onQueryIdle(self, event) -> None:  # noqa: N802
        """Nothing to record."""

    def onQueryTerminated(self, event) -> None:  # noqa: N802
        """Nothing to record."""


@dataclass
class IngestJob:
    """A running ingest query and what observes it."""

    query: Any
    #: The micro-batches' reports (:meth:`Reports.totals`, :meth:`Reports.report`).
    reports: Reports
    listener: MemwalProgressListener
    available_now: bool
    spark: Any = field(repr=False)
    #: The table written, and its storage (resolved once on the driver).
    table_uri: str = ""
    storage: StorageConfig | None = None
    #: The source that reads the topic (:data:`KAFKA_SOURCES`).
    kafka_source: str = "python"
    #: With an exchange by shard between reading and writing (:data:`EXCHANGES`), the sink
    #: that runs it (``foreachBatch``); None when the tasks that read also write (one stage).
    sink: MemwalSink | None = None
    #: A whole-database ingest: the tables written (:meth:`DatabaseSink.table_uris`) instead of :attr:`table_uri`.
    tables: Callable[[], list[str]] | None = None

    def await_termination(self, timeout: float | None = None) -> bool:
        """Wait for the query; for an ``availableNow`` run that ended, flush what the
        executors' writers still hold in MemTables so eventual readers see all of it."""
        done = self.query.awaitTermination(timeout) if timeout is not None else (self.query.awaitTermination() or True)
        if done:
            self._finish()
        return bool(done)

    def stop(self) -> None:
        self.query.stop()
        self._finish()

    def _finish(self) -> None:
        # Listener events are delivered asynchronously, and observers (a metrics scrape, a
        # bar) run inside them: wait until the last progress went through all of them.
        last = self.query.lastProgress
        deadline = time.monotonic() + 30
        while last and self.listener.handled_batch < last["batchId"] and time.monotonic() < deadline:
            time.sleep(0.05)
        try:
            self.spark.streams.removeListener(self.listener)
        except Exception:  # noqa: BLE001 - already removed
            pass
        if self.query.exception() is None:
            from memwal.table import Table

            # The writers stay open in the executors' writer processes (they exit when idle):
            # claiming a shard from here replays and flushes what they still hold.
            for uri in self.tables() if self.tables is not None else [self.table_uri]:
                flushed = Table.open(uri, self.storage).flush_stranded(0)
                if flushed:
                    log.info("flushed %d shard(s) of %s left unflushed by the stopped query", len(flushed), uri)


#: Rows of a micro-batch each Python task gets at least: read tasks group topic-partitions
#: to reach it, and ``ingest`` with bounded micro-batches sizes its write tasks by it (up to
#: Spark's task slots). Below it a second wave of Python tasks costs a micro-batch more than
#: the parallel work saves (docs/bench-log/ingest.md, "Ingest").
MIN_ROWS_PER_TASK = 50_000


#: The Kafka sources ``kafka_stream`` and ``ingest`` read with: ``"spark"`` is Spark's own
#: connector (``format("kafka")``, its jars from :mod:`memwal.jvm`), ``"python"`` memwal's
#: own source (:mod:`memwal.streaming.kafka_source`, on librdkafka: for pip-only installs).
KAFKA_SOURCES = ("spark", "python")

#: Spark's Kafka source reads with this ``fetch.max.wait.ms`` unless told otherwise (see :func:`kafka_stream`).
FETCH_MAX_WAIT_MS = 10

#: The class Spark resolves ``format("kafka")`` to.
_KAFKA_PROVIDER = "org.apache.spark.sql.kafka010.KafkaSourceProvider"


def spark_kafka_available(spark) -> bool:
    """True when ``spark`` resolves ``format("kafka")`` (Spark's connector is on its classpath)."""
    from memwal.streaming.session import is_connect

    if not is_connect(spark):
        try:
            loader = spark._jvm.org.apache.spark.util.Utils.getContextOrSparkClassLoader()
            spark._jvm.java.lang.Class.forName(_KAFKA_PROVIDER, False, loader)
            return True
        except Exception:  # noqa: BLE001 - Py4J's error for a missing class: the connector is absent
            return False
    try:  # a Connect client resolves data sources on the server, when the schema is asked for
        schema = spark.readStream.format("kafka").option("kafka.bootstrap.servers", "127.0.0.1:9").option("subscribe", "probe").load().schema
        return bool(schema.fields)
    except Exception:  # noqa: BLE001 - the server's AnalysisException: the connector is absent there
        return False


def choose_kafka_source(spark, requested: str | None = None) -> str:
    """The source to read with: ``requested``, else ``"spark"`` when its connector is on the
    classpath, else ``"python"`` (saying so in one log line). Asking for ``"spark"`` without
    the connector is an error naming the fix."""
    if requested is not None and requested not in KAFKA_SOURCES:
        raise ValueError(f"kafka_source must be one of {', '.join(KAFKA_SOURCES)}, got {requested!r}")
    if requested == "python":
        return "python"
    if spark_kafka_available(spark):
        return "spark"
    if requested == "spark":
        from memwal.core.errors import InvalidArgumentError

        raise InvalidArgumentError(
            "Spark's Kafka connector (spark-sql-kafka-0-10) is not on the session's classpath: fetch it with "
            "`python -m memwal.jvm fetch spark-kafka` for local_session(), or give your cluster "
            "--packages org.apache.spark:spark-sql-kafka-0-10_2.13:<its Spark version> (docs/deploy.md)"
        )
    log.warning("Spark's Kafka connector is not on the classpath: reading Kafka with memwal's Python source "
                "(`python -m memwal.jvm fetch spark-kafka` installs the connector)")
    return "python"


def read_tasks(bound: int | None, min_rows_per_task: int | None, slots: int) -> int | None:
    """How many read tasks a micro-batch of Spark's Kafka source is merged into: enough for
    each to get ``min_rows_per_task`` of a ``bound``-record micro-batch, at most ``slots``
    (one wave). None: not merged (one task per topic-partition, Spark's own plan)."""
    if min_rows_per_task is None:
        return None
    if not bound:
        return max(1, slots)
    return max(1, min(slots, -(-bound // max(1, min_rows_per_task))))


def kafka_stream(spark, bootstrap: str, topic: str, *, starting_offsets: str = "earliest",
                 max_offsets_per_trigger: int | None = None, kafka_options: dict[str, str] | None = None,
                 prepare_for: MemwalSink | None = None, min_records_per_read_task: int | None = MIN_ROWS_PER_TASK,
                 adaptive: AdaptiveSizing | None = None, kafka_source: str | None = None, whole_partitions: bool = False,
                 pattern: bool = False):
    """A Kafka topic as a streaming DataFrame with the schema of Spark's Kafka source (key,
    value, topic, partition, offset, timestamp, timestampType), read by ``kafka_source``
    (:data:`KAFKA_SOURCES`; default: Spark's connector when it is on the classpath, see
    :func:`choose_kafka_source`).

    With ``prepare_for``, the DataFrame holds that sink's prepared rows, ready for
    ``foreachBatch(sink)``: Spark's source feeds them through the prepare stage
    (``mapInArrow``) in the tasks of :func:`read_tasks` (each topic-partition's records
    merged so a task gets at least ``min_records_per_read_task`` of a micro-batch's bound);
    memwal's own source runs it inside its read tasks, which it groups the same way.
    ``kafka_options`` are the consumer's settings (``kafka.`` prefixed or not): the Java
    client's names for Spark's source, librdkafka's for memwal's (most are the same).
    With ``adaptive``, micro-batches are sized by that policy (memwal.streaming.adaptive):
    memwal's source grows the bound per micro-batch while a backlog waits; Spark's source
    takes no policy, so its bound is the policy's largest (``max_rows``, within
    ``max_bytes``): a backlog drains in micro-batches of at most that size, and a caught-up
    query's micro-batches hold what arrived meanwhile.

    ``whole_partitions`` (without ``prepare_for``): the records, grouped into the read tasks of
    :func:`read_tasks` by whole topic-partitions, never split: a task reads each of its
    partitions in offset order, and no two tasks hold records of one partition (what a writer
    in the reading task needs to apply a key's records in order).

    ``pattern``: ``topic`` is a regular expression naming the topics to read (Spark's
    ``subscribePattern``; Spark's connector only); else a topic, or topics separated by commas.
    """
    source = choose_kafka_source(spark, kafka_source)
    if pattern and source != "spark":
        raise ValueError("a topic pattern needs Spark's Kafka connector (kafka_source='spark')")
    if source == "spark":
        limit = adaptive.ceiling if adaptive is not None else max_offsets_per_trigger
        reader = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribePattern" if pattern else "subscribe", topic)
            .option("startingOffsets", starting_offsets)
        )
        if limit:
            reader = reader.option("maxOffsetsPerTrigger", str(limit))
        # A task reads fixed offset ranges: once a partition's range is read, the consumer's next
        # fetch of it (sent ahead) waits up to fetch.max.wait.ms (Kafka's default: 500 ms) for
        # records the task does not want. A micro-batch of 25k records over four partitions
        # read in one task spent 2.4 s there, 0.37 s with 10 ms.
        if not any(k.removeprefix("kafka.") == "fetch.max.wait.ms" for k in (kafka_options or {})):
            reader = reader.option("kafka.fetch.max.wait.ms", str(FETCH_MAX_WAIT_MS))
        if prepare_for is not None and min_records_per_read_task is not None:
            # A large micro-batch's topic-partitions are split into ranges of this size, so
            # the merge into read tasks below shares them out evenly (three partitions in
            # two tasks would give one task twice the other's records).
            reader = reader.option("maxRecordsPerPartition", str(min_records_per_read_task))
        for k, v in (kafka_options or {}).items():
            reader = reader.option(k if k.startswith("kafka.") else f"kafka.{k}", v)
        df = reader.load()
        tasks = read_tasks(limit, min_records_per_read_task, default_parallelism(spark))
        if prepare_for is None:
            # Fewer read tasks than topic-partitions: each Python task costs a micro-batch its
            # start (a small micro-batch of four partitions ran in two waves of two tasks).
            return df.coalesce(tasks) if whole_partitions and tasks is not None else df
        # Spark's source plans one task per topic-partition; merged (no shuffle) into fewer,
        # each starts one Python worker for the prepare stage, not one per partition, and
        # three partitions on two slots no longer take two waves.
        return prepare_for.prepare(df.coalesce(tasks) if tasks is not None else df)
    # memwal is installed where the Python workers run, so the source is imported there
    # rather than shipped by value (which would also defeat its consumer reuse).
    register(spark, ship_by_value=False)
    reader = (
        spark.readStream.format(SHORT_NAME)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", starting_offsets)
    )
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    for k, v in (kafka_options or {}).items():
        reader = reader.option(k if k.startswith("kafka.") else f"kafka.{k}", v)
    if adaptive is not None:
        reader = reader.option("memwal.readLimitPolicy", AdaptiveSizing.FACTORY)
        reader = reader.option("memwal.readLimitPolicyConfig", adaptive.to_json())
    if prepare_for is not None:
        for k, v in prepare_for.batch_mapper_options().items():
            reader = reader.option(k, v)
    if min_records_per_read_task is not None:
        reader = reader.option("memwal.minRecordsPerReadTask", str(min_records_per_read_task))
    return reader.load()


def ingest(
    spark,
    *,
    bootstrap: str,
    topic: str,
    table_uri: str,
    checkpoint: str,
    trigger_interval: float | None = None,
    available_now: bool = False,
    starting_offsets: str = "earliest",
    max_offsets_per_trigger: int | None = None,
    kafka_options: dict[str, str] | None = None,
    options: SinkOptions | None = None,
    query_name: str | None = None,
    storage_options: "Mapping[str, str] | StorageConfig | None" = None,
    adaptive: AdaptiveSizing | None = None,
    kafka_source: str | None = None,
    observers: Sequence[BatchObserver] = (),
    min_records_per_read_task: int | None = MIN_ROWS_PER_TASK,
    exchange: str = "auto",
) -> IngestJob:
    """Start a query reading records from ``topic`` into the memwal table at ``table_uri``.

    By default each record's value is a JSON object with the table's columns and an operation
    field (``options.op_field``, default ``op``: ``upsert``/``delete``...);
    ``options.value_format`` selects Debezium change events or Avro instead (docs/formats.md).
    Progress is logged per micro-batch and available as ``job.listener.progress``.

    ``storage_options`` reach the table's object store (Lance's key names, over the driver's
    standard environment variables; see :mod:`memwal.core.storage`): they are resolved here, once,
    and travel with the sink to every executor, its writers and the dead-letter table.

    ``adaptive``: size micro-batches by backlog (:mod:`memwal.streaming.adaptive`): its
    ``steady_rows`` when caught up, growing while a backlog waits; each decision is in
    ``job.listener.sizes`` and the batch's log line. It replaces ``max_offsets_per_trigger``.

    ``kafka_source``: ``"spark"`` (Spark's connector) or ``"python"`` (memwal's source); by
    default Spark's when its jars are on the classpath (:func:`choose_kafka_source`).

    ``observers`` are called on the driver with every micro-batch's
    :class:`~memwal.streaming.batch_progress.BatchProgress` (e.g.
    :class:`memwal.observe.ingest.IngestMetrics` for Prometheus), from the first batch on.

    ``min_records_per_read_task``: with an exchange, the records a read task gets at least
    (see :func:`kafka_stream`; None: one read task per topic-partition).

    ``exchange`` (:data:`EXCHANGES`): by default the tasks that read the topic decode and write
    it (``format("memwal")``, one stage per micro-batch) unless the session has several
    executors, where rows are first exchanged by shard (the ``foreachBatch`` sink).
    """
    options = options or SinkOptions(source="kafka-json")
    if options.source != "kafka-json":
        raise ValueError("ingest reads Kafka: options.source must be 'kafka-json'")
    # Python data sources (format("memwal"), memwal's Kafka source) are found by name through
    # the calling thread's active session: ingest may be called from any thread.
    make_active(spark)
    source = choose_kafka_source(spark, kafka_source)
    name = query_name or f"memwal-ingest-{topic}"
    use_exchange = exchange_needed(spark, exchange)
    if not use_exchange:
        return _ingest_one_stage(spark, bootstrap=bootstrap, topic=topic, table_uri=table_uri, checkpoint=checkpoint,
                                 trigger_interval=trigger_interval, available_now=available_now, starting_offsets=starting_offsets,
                                 max_offsets_per_trigger=max_offsets_per_trigger, kafka_options=kafka_options, options=options,
                                 name=name, storage_options=storage_options, adaptive=adaptive, source=source, observers=observers)
    bound = adaptive.steady_rows if adaptive is not None else max_offsets_per_trigger
    if options.max_write_tasks is None and bound:
        # Micro-batches are bounded: give each write task at least MIN_ROWS_PER_TASK rows (of
        # a steady-state batch, with adaptive sizes: latency matters there, not in catch-up).
        slots = default_parallelism(spark)
        options = replace(options, max_write_tasks=max(1, min(slots, bound // MIN_ROWS_PER_TASK)))
    sink = MemwalSink(table_uri, options, storage_options).bind(spark)
    if checkpoint.startswith(("s3a://", "s3://")):
        from memwal.streaming.session import configure_s3a

        configure_s3a(spark, sink.storage)  # the checkpoint's store: the table's settings
    listener = MemwalProgressListener(sink.history, name, adaptive if source == "spark" else None, observers)
    spark.streams.addListener(listener)
    stream = kafka_stream(
        spark,
        bootstrap,
        topic,
        starting_offsets=starting_offsets,
        max_offsets_per_trigger=max_offsets_per_trigger,
        kafka_options=kafka_options,
        prepare_for=sink,
        adaptive=adaptive,
        kafka_source=source,
        min_records_per_read_task=min_records_per_read_task,
    )
    writer = (
        sink.observe(stream)
        .writeStream.queryName(name)
        .foreachBatch(sink)
        .option("checkpointLocation", checkpoint)
    )
    query = _trigger(writer, available_now, trigger_interval).start()
    log.info("ingesting %s from %s into %s (checkpoint %s, %s Kafka source, exchange by shard: two stages)",
             topic, bootstrap, sink.uri, checkpoint, source)
    return IngestJob(query=query, reports=sink.history, listener=listener, available_now=available_now, spark=spark,
                     table_uri=sink.uri, storage=sink.storage, kafka_source=source, sink=sink)


#: How ``ingest`` gets each shard's records to its writer: ``"none"``, the tasks that read the
#: topic write (one stage: ``format("memwal")``); ``"shard"``, rows are exchanged by shard
#: first, so every shard is written by one task (two stages: the ``foreachBatch`` sink);
#: ``"auto"``, no exchange when the session has one executor (local mode: its one writer
#: process writes every shard), an exchange when it has several, whose writer processes would
#: each claim every shard unless the topic's partitions line up with the shards.
EXCHANGES = ("auto", "none", "shard")


def exchange_needed(spark, exchange: str = "auto") -> bool:
    """Whether ``ingest`` exchanges rows by shard (:data:`EXCHANGES`)."""
    if exchange not in EXCHANGES:
        raise ValueError(f"exchange must be one of {', '.join(EXCHANGES)}, got {exchange!r}")
    if exchange != "auto":
        return exchange == "shard"
    from memwal.streaming.session import executor_count

    return executor_count(spark) > 1


def format_options(options: SinkOptions, storage: StorageConfig, report_dir: str | None = None) -> dict[str, str]:
    """The ``format("memwal")`` writer options that write Kafka records as ``options`` says."""
    out: dict[str, str] = {"input": "kafka", "valueFormat": options.value_format, "opField": options.op_field or "",
                           "merge": options.merge, "maxRowBytes": str(options.max_row_bytes), "evolve": options.evolve,
                           "flushIntervalSeconds": "none" if options.flush_interval_seconds is None else str(options.flush_interval_seconds)}
    for key, value in (("sequenceColumn", options.sequence_field), ("deadLetterTable", options.dead_letter_uri),
                       ("avroSchema", options.avro_schema), ("avroSchemaId", options.avro_schema_id),
                       ("schemaRegistry", options.schema_registry), ("durability", options.durability),
                       ("writerProcessIdleSeconds", options.writer_process_idle_seconds), ("reportDir", report_dir)):
        if value is not None:
            out[key] = str(value)
    if options.drop_stale_across_batches:
        out["dropStale"] = "true"
    out.update({f"storage.{k}": v for k, v in storage.items})
    return out


def _trigger(writer, available_now: bool, trigger_interval: float | None):
    if available_now:
        return writer.trigger(availableNow=True)
    if trigger_interval:
        return writer.trigger(processingTime=f"{trigger_interval} seconds")
    return writer


def _ingest_one_stage(spark, *, bootstrap: str, topic: str, table_uri: str, checkpoint: str, trigger_interval: float | None,
                      available_now: bool, starting_offsets: str, max_offsets_per_trigger: int | None,
                      kafka_options: dict[str, str] | None, options: SinkOptions, name: str,
                      storage_options: "Mapping[str, str] | StorageConfig | None", adaptive: AdaptiveSizing | None, source: str,
                      observers: Sequence[BatchObserver]) -> IngestJob:
    """``ingest`` through ``format("memwal")``: the tasks that read the topic write it."""
    import tempfile

    from memwal.core import paths
    from memwal.core.state import TableState, resolve_storage

    uri = paths.normalize_uri(table_uri)
    storage = resolve_storage(storage_options)
    TableState.load(uri, storage)  # fail early, on the driver, if the table is missing
    MemwalSink(uri, options, storage)  # the same checks of the options against the table, on the driver
    if checkpoint.startswith(("s3a://", "s3://")):
        from memwal.streaming.session import configure_s3a

        configure_s3a(spark, storage)
    reports = Reports(tempfile.mkdtemp(prefix="memwal-reports-"))
    listener = MemwalProgressListener(reports, name, adaptive if source == "spark" else None, observers, log_reports=True)
    spark.streams.addListener(listener)
    # Whole topic-partitions per task, never split (a partition's records must be written in
    # offset order, which two tasks of one partition at once would not keep), grouped into
    # fewer tasks for small micro-batches.
    stream = kafka_stream(spark, bootstrap, topic, starting_offsets=starting_offsets, max_offsets_per_trigger=max_offsets_per_trigger,
                          kafka_options=kafka_options, adaptive=adaptive, kafka_source=source, whole_partitions=True)
    from pyspark.sql import functions as F

    # The records each micro-batch read, in the query's progress (what a Spark Connect client
    # sees of it; the rest of the batch's report is made by its commit, on the server).
    observed = stream.observe("memwal", F.count(F.lit(1)).alias("rows"))
    writer = (observed.writeStream.queryName(name).format("memwal").options(**format_options(options, storage, reports.directory))
              .option("checkpointLocation", checkpoint))
    query = _trigger(writer, available_now, trigger_interval).start(uri)
    log.info("ingesting %s from %s into %s (checkpoint %s, %s Kafka source, one stage: the tasks that read write)",
             topic, bootstrap, uri, checkpoint, source)
    return IngestJob(query=query, reports=reports, listener=listener, available_now=available_now, spark=spark, table_uri=uri,
                     storage=storage, kafka_source=source)
