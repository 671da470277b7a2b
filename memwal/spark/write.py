"""Writing through ``format("memwal")``: batch (``df.write``) and streaming (``df.writeStream``).

Spark's Python data source API runs a writer's ``write`` once per input partition on the
executors and ``commit`` once on the driver, and gives a writer no say in how rows are
partitioned: a shard's rows arrive in every task. A shard has one writer at a time (a second
one fences the first), so the tasks do not write shards. Each task does what the Spark sink's
prepare stage does (:class:`~memwal.streaming.prepare.Prepare`: decode Kafka records or take
the table's columns, validate, route to shards, order, separate dead letters) and returns
its routed rows in its commit message, in the sink's wire format
(:mod:`memwal.streaming.exchange`). ``commit`` then writes every shard once through the write
path (:mod:`memwal.writepath`, via the sink's :class:`~memwal.streaming.worker.ShardJob`):

- a batch write in the commit's own process, flushing every shard before it returns (the
  rows are visible to every reader when ``save`` returns);
- a micro-batch through the driver host's writer process
  (:mod:`memwal.streaming.writer_process`), whose shard writers live across micro-batches
  (a commit runs in a new Python process each time, which would claim every shard and replay
  its WAL per micro-batch), flushing each shard at most every ``flushIntervalSeconds``.

Exactly once: Spark commits a micro-batch id at most once in its log, and replays an
uncommitted one with the same input. A replayed commit writes the same newest record per key
again (upserts and deletes are idempotent; the order within the micro-batch decides), and
dead letters are keyed by their Kafka coordinates, so the table ends as if it ran once.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

from memwal.errors import InvalidArgumentError
from memwal.feed import CHANGE_TYPE
from memwal.spark.options import FormatOptions
from memwal.streaming.exchange import PART, SHARD, SHARDS_KEY, from_payload, to_payload
from memwal.streaming.options import SinkOptions

log = logging.getLogger("memwal.spark")

#: Spark's Kafka source's columns a DataFrame must have to be read as Kafka records.
KAFKA_COLUMNS = frozenset({"key", "value", "topic", "partition", "offset"})

#: The operation column a delete write adds to its rows (memwal columns never start with "_").
_OPERATION = "__memwal_operation"


def reads_kafka(opts: FormatOptions, columns: list[str]) -> bool:
    """Whether the input is Kafka records (``input`` option, or ``auto``: Spark's Kafka columns)."""
    if opts.input == "kafka":
        missing = KAFKA_COLUMNS - set(columns)
        if missing:
            raise InvalidArgumentError(f"option input=kafka: the DataFrame lacks Spark's Kafka columns {sorted(missing)}")
        return True
    return opts.input == "auto" and KAFKA_COLUMNS <= set(columns)


def sink_options(opts: FormatOptions, columns: list[str], table_columns: list[str], *, streaming: bool) -> SinkOptions:
    """The sink's options for a write of a DataFrame with ``columns``."""
    kafka = reads_kafka(opts, columns)
    if opts.operation == "delete":
        if kafka:
            raise InvalidArgumentError("option operation=delete takes a DataFrame of keys, not Kafka records (their values carry the operation)")
        op_field: str | None = _OPERATION
    elif kafka:
        op_field = opts.op_field
    elif CHANGE_TYPE in columns and CHANGE_TYPE not in table_columns:
        op_field = CHANGE_TYPE  # change-feed rows (feed_rows): each row says what it was
    else:
        # A column naming the operation, if the DataFrame has one that is not the table's.
        op_field = opts.op_field if opts.op_field in columns and opts.op_field not in table_columns else None
    return SinkOptions(
        source="kafka-json" if kafka else "columns",
        op_field=op_field,
        sequence_field=opts.sequence_column,
        drop_stale_across_batches=opts.drop_stale,
        max_row_bytes=opts.max_row_bytes,
        flush_interval_seconds=opts.flush_interval_seconds if streaming else None,
        dead_letter_uri=opts.dead_letter_table,
        merge=opts.merge,
        value_format=opts.value_format,
        avro_schema=opts.avro_schema,
        durability=opts.durability,
        writer_process=streaming,
    )


def feed_rows(data: pa.Table) -> pa.Table:
    """Change-feed rows (:mod:`memwal.feed`) as writes: preimages dropped, inserts and
    postimages upserted, deletes deleted; the feed's other columns dropped. A feed read
    straight into ``format('memwal')`` so makes a copy of the table."""
    from memwal.feed import DELETE, FEED_COLUMNS, UPDATE_PREIMAGE

    kind = data.column(CHANGE_TYPE)
    data = data.filter(pc.not_equal(kind, UPDATE_PREIMAGE))
    ops = pc.if_else(pc.equal(data.column(CHANGE_TYPE), DELETE), "delete", "upsert")
    data = data.drop_columns([c for c in FEED_COLUMNS if c in data.column_names])
    return data.append_column(CHANGE_TYPE, ops)


@dataclass
class PreparedTask(WriterCommitMessage):
    """One write task's rows, routed (the sink's wire format) and its dead letters: the commit
    message it sends to the driver (pickled, so plain bytes and numbers)."""

    payload: bytes | None = None
    dead: bytes | None = None
    rows: int = 0
    skipped: int = 0
    seconds: float = 0.0

    @property
    def dead_letters(self) -> int:
        return 0 if self.dead is None else from_payload(self.dead).num_rows


def prepare_task(uri: str, opts: FormatOptions, sink: SinkOptions, batches: Iterator[pa.RecordBatch]) -> PreparedTask:
    """Decode, validate and route one task's input (run on an executor)."""
    from pyspark import TaskContext

    from memwal.streaming.prepare import Prepare
    from memwal.streaming.worker import WORKER

    t0 = time.perf_counter()
    state = WORKER.table(uri, opts.storage).state
    prepare = Prepare(uri, sink, opts.storage)
    ctx = TaskContext.get()
    task = ctx.partitionId() if ctx is not None else 0
    routed: list[pa.Table] = []
    dead: list[pa.Table] = []
    shards: dict[str, Any] = {}
    first = skipped = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        data = pa.Table.from_batches([batch])
        if sink.op_field == CHANGE_TYPE:
            data = feed_rows(data)
        if sink.op_field == _OPERATION:
            data = data.append_column(_OPERATION, pa.array(["delete"] * data.num_rows, pa.string()))
        p = prepare.prepare(state, data, task, first, 1)
        first += data.num_rows
        skipped += p.skipped
        if p.rows.num_rows:
            routed.append(p.rows.drop_columns([PART]))
            shards.update(p.shards)
        if p.dead.num_rows:
            dead.append(p.dead)
    out = PreparedTask(rows=first, skipped=skipped)
    if routed:
        rows = pa.concat_tables(routed)
        meta = {SHARDS_KEY: json.dumps({sid: list(v) for sid, v in shards.items()}).encode()}
        out.payload = to_payload(rows.replace_schema_metadata(meta))
    if dead:
        out.dead = to_payload(pa.concat_tables(dead))
    out.seconds = time.perf_counter() - t0
    return out


@dataclass
class CommitReport:
    """What one write or micro-batch did (logged on the driver, one line)."""

    batch_id: int | None
    rows: int = 0
    upserts: int = 0
    deletes: int = 0
    stale_dropped: int = 0
    dead_letters: int = 0
    skipped: int = 0
    shards: int = 0
    fenced_retries: int = 0
    writer_opens: int = 0
    flushes: int = 0
    seconds: float = 0.0
    task_seconds: list[float] = field(default_factory=list)

    def line(self) -> str:
        what = "write" if self.batch_id is None else f"micro-batch {self.batch_id}"
        return (f"format(memwal) {what}: {self.rows} rows ({self.upserts} upserts, {self.deletes} deletes"
                + (f", {self.stale_dropped} stale" if self.stale_dropped else "")
                + f") into {self.shards} shard(s), {self.dead_letters} dead letter(s), {self.fenced_retries} fenced retries, "
                f"{self.writer_opens} writer open(s), {self.flushes} flush(es), {self.seconds:.3f}s")


def commit(uri: str, opts: FormatOptions, sink: SinkOptions, messages: list[Any], batch_id: int | None) -> CommitReport:
    """Write every shard of a write (``batch_id`` None) or a micro-batch, from its tasks' messages."""
    from memwal.streaming.dead_letters import dead_letter_rows, dead_letter_uri, write_dead_letters
    from memwal.streaming.worker import WORKER, ShardJob

    t0 = time.perf_counter()
    report = CommitReport(batch_id)
    tasks = [m for m in messages if isinstance(m, PreparedTask)]
    routed = [from_payload(m.payload) for m in tasks if m.payload]
    dead = [from_payload(m.dead) for m in tasks if m.dead]
    report.skipped = sum(m.skipped for m in tasks)
    report.task_seconds = [m.seconds for m in tasks]
    label = batch_id if batch_id is not None else -1
    if dead:
        bad = pa.concat_tables(dead)
        write_dead_letters(sink.dead_letter_uri or dead_letter_uri(uri), dead_letter_rows(bad, label, uri), opts.storage)
        report.dead_letters = bad.num_rows
    if routed:
        shards: dict[str, tuple[Any, ...]] = {}
        for t in routed:
            shards.update((sid, tuple(v)) for sid, v in json.loads(t.schema.metadata[SHARDS_KEY]).items())
        rows = pa.concat_tables([t.replace_schema_metadata(None) for t in routed])
        job = ShardJob(uri, sink, label, opts.storage)
        if sink.writer_process:
            from memwal.streaming.writer_process import client

            run = client().write_shard
            results = [run(job, sid, shards[sid], rows.filter(pc.equal(rows.column(SHARD), sid))) for sid in sorted(shards)]
        else:
            results = [job.run(sid, shards[sid], rows.filter(pc.equal(rows.column(SHARD), sid))) for sid in sorted(shards)]
            WORKER.table(uri, opts.storage).writer.flush()  # a batch write is visible to every reader on return
            report.flushes = len(shards)
        for r in (s.to_pylist()[0] for s in results):
            report.rows += r["rows"]
            report.upserts += r["upserts"]
            report.deletes += r["deletes"]
            report.stale_dropped += r["stale_dropped"]
            report.fenced_retries += r["fenced_retries"]
            report.writer_opens += r["writer_opens"]
            report.flushes += int(r["flushed"])
        report.shards = len(shards)
    report.rows += report.dead_letters + report.skipped
    report.seconds = time.perf_counter() - t0
    log.info("%s", report.line())
    return report


class BatchWriter(DataSourceArrowWriter):
    """``df.write.format("memwal").mode("append").save(uri)``."""

    def __init__(self, uri: str, opts: FormatOptions, sink: SinkOptions) -> None:
        self.uri, self.opts, self.sink = uri, opts, sink

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PreparedTask:
        return prepare_task(self.uri, self.opts, self.sink, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        commit(self.uri, self.opts, self.sink, list(messages), None)
        from memwal.streaming.worker import WORKER

        WORKER.clear()  # the commit's process ends: release the shards' writers now

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing was written: the tasks only prepared rows."""


class StreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("memwal").option("checkpointLocation", c).start(uri)``."""

    def __init__(self, uri: str, opts: FormatOptions, sink: SinkOptions) -> None:
        self.uri, self.opts, self.sink = uri, opts, sink

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PreparedTask:
        return prepare_task(self.uri, self.opts, self.sink, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803 - Spark's name
        commit(self.uri, self.opts, self.sink, list(messages), batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        """Nothing was written: the tasks only prepared rows; Spark runs the micro-batch again."""
