"""Writing through ``format("memwal")``: batch (``df.write``) and streaming (``df.writeStream``).

Spark's Python data source API runs a writer's ``write`` once per input partition, inside the
task that produced the rows (for a Kafka scan: the task that read them, as Arrow batches), and
``commit`` once on the driver with every task's commit message. memwal's writer uses that shape
as it is, through the one write API (:mod:`memwal.write.api`):

- **write**, in each task: every Arrow batch is decoded and checked (Kafka records), or taken
  as the table's columns, and routed to shards, as the sink's prepare stage does
  (:class:`~memwal.streaming.prepare.Prepare`), then written
  (:meth:`TableWrite.prepare <memwal.write.api.TableWrite.prepare>`) through the executor's
  writer process (:mod:`memwal.write.process`): one process per executor keeps the shard
  writers resident and shared by the executor's tasks, so two tasks writing one shard never
  fence each other. While a batch is written the next one is read and decoded. The task's
  message carries counters and its dead letters only: **one stage, no rows through the driver.**
- **commit**, on the driver: the dead letters are recorded and the report logged
  (:meth:`TableWrite.commit <memwal.write.api.TableWrite.commit>`); a batch write also
  flushes every shard it wrote, so the rows are visible to every reader when ``save`` returns.

Order: a task writes its batches in the order it read them, so a key's records from one Kafka
partition are applied in offset order (within one written batch the newest per key wins, by
the sequence column when there is one). Kafka orders nothing across partitions, and neither do
two tasks running at once: a topic that spreads one key over partitions needs a sequence column
with ``dropStale`` (the highest sequence wins, whatever the order), as docs/formats.md says.

Exactly once: Spark commits a micro-batch id at most once in its log and replays an
uncommitted one with the same input. Writes are idempotent (upserts and deletes), so a replayed
micro-batch leaves every key at its newest record again, and dead letters are keyed by their
Kafka coordinates: the table ends as if each micro-batch ran once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

from memwal.core.errors import InvalidArgumentError
from memwal.spark.format_options import FormatOptions
from memwal.streaming.sink_options import SinkOptions
from memwal.write.messages import WriteMessage, WriteReport

#: The change feed's operation column (memwal.readers.feed.CHANGE_TYPE: that module loads Lance, and the
#: driver's commit of a micro-batch imports this one).
CHANGE_TYPE = "_change_type"

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
        avro_schema_id=opts.avro_schema_id,
        schema_registry=opts.schema_registry,
        writer_process_idle_seconds=opts.writer_process_idle_seconds,
        evolve=opts.evolve,
    )


def feed_rows(data: pa.Table) -> pa.Table:
    """Change-feed rows (:mod:`memwal.readers.feed`) as writes: preimages dropped, inserts and
    postimages upserted, deletes deleted; the feed's other columns dropped. A feed read
    straight into ``format('memwal')`` so makes a copy of the table."""
    from memwal.readers.feed import DELETE, FEED_COLUMNS, UPDATE_PREIMAGE

    kind = data.column(CHANGE_TYPE)
    data = data.filter(pc.not_equal(kind, UPDATE_PREIMAGE))
    ops = pc.if_else(pc.equal(data.column(CHANGE_TYPE), DELETE), "delete", "upsert")
    data = data.drop_columns([c for c in FEED_COLUMNS if c in data.column_names])
    return data.append_column(CHANGE_TYPE, ops)


@dataclass
class TaskMessage(WriterCommitMessage):
    """A write task's commit message: what it wrote (:class:`~memwal.write.api.WriteMessage`)."""

    message: WriteMessage


def _batch_label() -> str:
    """The micro-batch a task belongs to ("batch-7"), from Spark's local property; "" outside streams."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    batch = ctx.getLocalProperty("streaming.sql.batchId") if ctx is not None else None
    return f"batch-{batch}" if batch is not None else ""


def write_task(uri: str, opts: FormatOptions, sink: SinkOptions, batches: Iterator[pa.RecordBatch]) -> TaskMessage:
    """Decode, check, route and write one task's input (run in the task that produced it)."""
    from concurrent.futures import Future, ThreadPoolExecutor

    from pyspark import TaskContext

    from memwal.streaming.prepare import Prepare, timestamp_range
    from memwal.streaming.write_task import shard_writes
    from memwal.write.api import TableWrite
    from memwal.write.worker import WORKER

    state = WORKER.table(uri, opts.storage).state
    prepare = Prepare(uri, sink, opts.storage)
    write = TableWrite(state, sink.write_mode(), shards=shard_writes(uri, sink, opts.storage))
    ctx = TaskContext.get()
    task = ctx.partitionId() if ctx is not None else 0
    label = _batch_label()
    message = WriteMessage()
    first = 0
    pending: Future[WriteMessage] | None = None
    # One batch written while the next is read and prepared: the writer process writes while
    # this process decodes. One at a time, so the task's batches are applied in order.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="memwal-task-write") as writer:
        # The writer process starts (or loads the table) while this task reads its first records.
        warm = getattr(write.shards, "warm", None)
        pending_warm: Future[None] | None = writer.submit(warm) if warm is not None else None
        it = iter(batches)
        while True:
            t0 = time.perf_counter()
            batch = next(it, None)
            t1 = time.perf_counter()
            if batch is None:
                break
            if batch.num_rows == 0:
                continue
            data = pa.Table.from_batches([batch])
            if sink.op_field == CHANGE_TYPE:
                data = feed_rows(data)
            if sink.op_field == _OPERATION:
                data = data.append_column(_OPERATION, pa.array(["delete"] * data.num_rows, pa.string()))
            p = prepare.prepare(state, data, task, first, 1)
            first += data.num_rows
            stamps = timestamp_range(batch) if sink.source != "columns" else (None, None)
            prepared = p.write_batch(t1 - t0, time.perf_counter() - t1, stamps)
            if pending is not None:
                message = message.merge(pending.result())
            pending = writer.submit(write.prepare, prepared, label=label)
        if pending is not None:
            message = message.merge(pending.result())
        if pending_warm is not None:
            pending_warm.result()  # (its error, if the writes did not already raise one)
    return TaskMessage(message)


def commit(uri: str, opts: FormatOptions, sink: SinkOptions, messages: list[Any], batch_id: int | None) -> WriteReport:
    """Commit a write (``batch_id`` None: flush every shard written) or a micro-batch."""
    from memwal.write.api import TableWrite

    # The table is loaded only to record dead letters or to flush (a batch write): a
    # micro-batch's commit, in a Python process of the driver, loads no Lance otherwise.
    write = TableWrite(uri=uri, storage=opts.storage, mode=sink.write_mode(), dead_letter_uri=sink.dead_letter_uri)
    report = write.commit([m.message for m in messages if isinstance(m, TaskMessage)], batch_id, flush=batch_id is None, stages=1)
    log.info("format(memwal) %s", report.line())
    if opts.report_dir:
        publish(report, opts.report_dir)
    return report


def publish(report: WriteReport, directory: str) -> None:
    """Leave a micro-batch's report where the query's listener reads it
    (:func:`memwal.streaming.job.read_report`): the commit runs in a Python process of the
    driver that is not the one running the query's listener."""
    import json
    import os

    os.makedirs(directory, exist_ok=True)
    name = os.path.join(directory, f"{report.batch_id if report.batch_id is not None else 'write'}.json")
    tmp = f"{name}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(report.to_dict(), f)
    os.replace(tmp, name)


class BatchWriter(DataSourceArrowWriter):
    """``df.write.format("memwal").mode("append").save(uri)``."""

    def __init__(self, uri: str, opts: FormatOptions, sink: SinkOptions) -> None:
        self.uri, self.opts, self.sink = uri, opts, sink

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskMessage:
        return write_task(self.uri, self.opts, self.sink, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        commit(self.uri, self.opts, self.sink, list(messages), None)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """What the tasks that finished wrote stays written (and durable); the failed write
        can be run again, as upserts and deletes are idempotent. Spark raises the task's error."""


class StreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("memwal").option("checkpointLocation", c).start(uri)``."""

    def __init__(self, uri: str, opts: FormatOptions, sink: SinkOptions) -> None:
        self.uri, self.opts, self.sink = uri, opts, sink

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskMessage:
        return write_task(self.uri, self.opts, self.sink, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803 - Spark's name
        commit(self.uri, self.opts, self.sink, list(messages), batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        """What the finished tasks wrote stays written: Spark runs the micro-batch again from
        its offsets, and its writes are idempotent."""
