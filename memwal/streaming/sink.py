"""The memwal Spark sink: ``df.writeStream.foreachBatch(MemwalSink(uri))``; this module is
its driver side.

Per micro-batch, entirely on the executors:

1. **prepare** (:mod:`memwal.streaming.prepare`; ``mapInArrow``, or the Kafka source's read
   task as its batch mapper): decode (for Kafka JSON) straight to the table's write schema,
   validate and route every record, once. Good rows get their shard id and a write partition,
   and travel with the shards' values; bad ones (null key, unparseable value, wrong type,
   oversized row, unknown operation) get the reason and their Kafka coordinates.
2. **exchange** (:mod:`memwal.streaming.exchange`): ``repartition`` by that partition, the
   rows as Arrow IPC payloads; every shard in exactly one task (the sharding spec maps shards
   to partitions: :meth:`~memwal.core.sharding.ShardingSpec.partition_of`).
3. **write** (:mod:`memwal.streaming.write_task`; ``mapInArrow``): each task hands its shards'
   records to the write API (:meth:`TableWrite.prepare <memwal.write.api.TableWrite.prepare>`),
   which writes them through the write path (:mod:`memwal.write.protocol`: the newest record
   per key by Kafka (partition, offset) or the sequence column) in the executor's writer
   process (:mod:`memwal.write.process`, resident shard writers), or with
   ``writer_process=False`` in the Python worker. Each task answers with its write message.

The driver commits the messages (:meth:`TableWrite.commit <memwal.write.api.TableWrite.commit>`:
the dead letters recorded, one :class:`~memwal.write.api.WriteReport`) and logs one line per
micro-batch. This is the path with an exchange: ``format("memwal")`` writes in the tasks that
read, in one stage (:mod:`memwal.spark.write`); the sink remains for a topic whose partitions
do not line up with the table's shards on a cluster (each shard is then written by exactly one
task), and for ``foreachBatch`` users.

**Storage.** The table's :class:`~memwal.core.storage.StorageConfig` (credentials, endpoint) is
resolved once, on the driver, and travels inside both stages (pickled with ``Write``, in the
JSON config of ``Prepare``) to every executor, its worker cache and the dead-letter table:
an executor's environment need not know the object store.

**Exactly once.** Spark replays an uncommitted micro-batch after a crash with the same
offsets. Writes are idempotent per micro-batch: every key ends at the batch's newest row
for it whether the batch ran once, twice, or half and then once; dead letters are keyed
by their Kafka coordinates. So the table ends as if each batch ran once.
"""

from __future__ import annotations

import logging
import pickle
import time
from dataclasses import replace
from typing import Any, Callable

import pyarrow as pa

from memwal.core.errors import BatchInterruptedError
from memwal.core.partial import check_merge
from memwal.core.state import TableState, resolve_storage
from memwal.core.storage import StorageConfig
from memwal.streaming.exchange import (
    COUNT_DEAD,
    COUNT_DELETES,
    COUNT_ROWS,
    COUNT_SKIPPED,
    EXCHANGE_SCHEMA,
    PART,
    partition_keys,
    shard_partitions,
    spark_schema,
)
from memwal.streaming.sink_options import SinkOptions
from memwal.streaming.prepare import Prepare
from memwal.streaming.reports import KEPT_REPORTS, Reports  # noqa: F401 - KEPT_REPORTS: what the sink keeps
from memwal.streaming.write_task import MESSAGE, MESSAGE_SCHEMA, Write
from memwal.write.api import TableWrite, WriteReport

log = logging.getLogger("memwal.streaming")


#: A micro-batch's report: the write API's one report type (deprecated name, kept for callers).
BatchReport = WriteReport



#: The JVM exceptions Spark counts as a query's stop (StreamExecution.isInterruptionException).
_INTERRUPTIONS = ("java.lang.InterruptedException", "java.io.InterruptedIOException", "java.nio.channels.ClosedByInterruptException")


def spark_interruption(e: BaseException) -> str | None:
    """The JVM interruption behind ``e`` (a Py4J or PySpark error), or None if it is not one."""
    try:
        text = str(e)  # a Py4J error renders its Java cause chain and stack
    except Exception:  # noqa: BLE001 - an error that cannot render is not recognisably an interruption
        return None
    return next((name for name in _INTERRUPTIONS if name in text), None)


def interruptible(write: Callable[[Any, int], None], df: Any, batch_id: int) -> None:
    """``write(df, batch_id)``, a ``foreachBatch`` function's body, with Spark's interruption
    of a stopping query raised so that Spark sees a stop, not a failure."""
    try:
        write(df, batch_id)
    except Exception as e:
        interruption = spark_interruption(e)
        if interruption is None:
            raise
        # The cause is dropped below; an interruption that was not a stop stays traceable.
        log.info("micro-batch %d interrupted (%s): %s", batch_id, interruption, str(e).strip().splitlines()[0][:500])
        # Spark tells a stop from a failure by matching the Python traceback against a
        # regex that recurses once per character (SPARK-39218's "Py4JJavaError: An error
        # occurred while calling ... InterruptedException"): the Java stack trace inside
        # the original error overflowed the stream thread's stack (StackOverflowError in
        # java.util.regex) instead of stopping the query. A short error, without its
        # cause, still matches.
        raise BatchInterruptedError(
            f"micro-batch {batch_id} interrupted: its query is stopping "
            f"(py4j.protocol.Py4JJavaError: An error occurred while calling the JVM: {interruption})"
        ) from None


class MemwalSink:
    """A ``foreachBatch`` sink writing micro-batches into a memwal table.

    >>> sink = MemwalSink("/data/users", SinkOptions(source="kafka-json"))
    >>> kafka_df.writeStream.foreachBatch(sink).option("checkpointLocation", ckpt).start()

    Prefer ``sink.prepare(df)`` on the streaming DataFrame (it adds observed metrics to the
    query's progress); a DataFrame passed unprepared is prepared inside each batch.

    ``storage_options`` (Lance's key names, or a resolved
    :class:`~memwal.core.storage.StorageConfig`) override the standard environment variables of
    the driver; the result travels to the executors with each stage.
    """

    def __init__(
        self,
        table_uri: str,
        options: SinkOptions | None = None,
        storage_options: "dict[str, str] | StorageConfig | None" = None,
    ) -> None:
        from memwal.core import paths
        from memwal.write.dead_letters import dead_letter_uri

        self.uri = paths.normalize_uri(table_uri)
        self.options = options or SinkOptions()
        if self.options.source not in ("columns", "kafka-json"):
            raise ValueError(f"source must be 'columns' or 'kafka-json', got {self.options.source!r}")
        self.storage = resolve_storage(storage_options)
        table = TableState.load(self.uri, self.storage)  # fail early, on the driver, if the table is missing
        seq = self.options.sequence_field
        if seq is not None and seq not in table.schema.names:
            raise ValueError(f"sequence field {seq!r} is not a column of {self.uri}; the stored version must be kept")
        if self.options.drop_stale_across_batches and seq is None:
            raise ValueError("drop_stale_across_batches needs a sequence_field")
        if check_merge(self.options.merge) == "partial" and not table.metadata.writer.durable_write:
            raise ValueError("merge='partial' reads stored rows from the WAL; the table's writers are not durable (durable_write=False)")
        if self.options.drop_stale_across_batches:
            from memwal.write.deleted import deleted_sequences_uri, ensure_table

            ensure_table(deleted_sequences_uri(self.uri), table.write_schema, list(table.primary_key), str(seq), self.storage)
        if self.options.source == "kafka-json":
            from memwal.streaming.decode import value_decoder

            # Fail early, on the driver: an unknown format, an Avro schema that does not parse.
            value_decoder(table.schema, self.options.value_format, op_field=self.options.op_field, sequence_field=seq,
                          primary_key=table.primary_key, avro_schema=self.options.avro_schema,
                          avro_schema_id=self.options.avro_schema_id, schema_registry=self.options.schema_registry)
            if self.options.value_format == "debezium-json" and seq is not None and not pa.types.is_integer(table.schema.field(seq).type):
                raise ValueError(f"with debezium-json the sequence field {seq!r} holds the source position: it must be an integer column")
        self.schema = table.schema
        self.partitions = shard_partitions(table.spec, self.options)
        self.dead_letter_uri = self.options.dead_letter_uri or dead_letter_uri(self.uri)
        #: The micro-batches' reports (the newest) and totals over all of them. A copy of the
        #: sink pickled elsewhere (over Spark Connect ``foreachBatch(sink)`` runs in a Python
        #: process of the server) starts with none: its reports reach the client as the
        #: query's observed metrics (:meth:`observe`) and the server's log.
        self.history = Reports()

    @property
    def reports(self) -> list[WriteReport]:
        """The most recent :data:`~memwal.streaming.reports.KEPT_REPORTS` micro-batches' reports, oldest first."""
        return self.history.reports

    def bind(self, spark) -> "MemwalSink":
        """Fix the number of write tasks from ``spark``'s parallelism (once; the prepare and
        write stages must agree on it for the life of the query). Works on classic and Spark
        Connect sessions (:func:`~memwal.streaming.session.default_parallelism`)."""
        if self.options.max_write_tasks is None:
            from memwal.streaming.session import default_parallelism

            self.options = replace(self.options, max_write_tasks=default_parallelism(spark))
            self.partitions = shard_partitions(TableState.load(self.uri, self.storage).spec, self.options)
        return self

    def prepare_spec(self) -> Prepare:
        """The prepare stage, for running it elsewhere."""
        return Prepare(self.uri, self.options, self.storage)

    def batch_mapper_options(self) -> dict[str, str]:
        """Options that make the Kafka source run the prepare stage in its read tasks."""
        return {"memwal.batchMapper": Prepare.FACTORY, "memwal.batchMapperConfig": self.prepare_spec().to_json()}

    def prepare(self, df):
        """``df`` decoded, validated and routed (a lazy transformation; streaming DataFrames too)."""
        self.bind(df.sparkSession)
        return df.mapInArrow(self.prepare_spec(), spark_schema(EXCHANGE_SCHEMA))

    def observe(self, prepared, name: str = "memwal"):
        """``prepared`` with observed metrics (rows, upserts, deletes, dead letters, shards)
        that Spark reports in every ``StreamingQueryProgress.observedMetrics[name]``."""
        from pyspark.sql import functions as F

        rows, dead, deletes, skipped = F.col(COUNT_ROWS), F.col(COUNT_DEAD), F.col(COUNT_DELETES), F.col(COUNT_SKIPPED)
        return prepared.observe(
            name,
            F.coalesce(F.sum(rows), F.lit(0)).alias("rows"),
            F.coalesce(F.sum(dead), F.lit(0)).alias("dead_letters"),
            F.coalesce(F.sum(deletes), F.lit(0)).alias("deletes"),
            F.coalesce(F.sum(rows - dead - deletes - skipped), F.lit(0)).alias("upserts"),
            F.coalesce(F.sum(skipped), F.lit(0)).alias("skipped"),
        )

    def __call__(self, df, batch_id: int) -> None:
        interruptible(self._write_batch, df, batch_id)

    def _write_batch(self, df, batch_id: int) -> None:
        from pyspark.sql import functions as F

        t0 = time.perf_counter()
        self.bind(df.sparkSession)
        prepared = df if PART in df.columns else self.prepare(df)
        # One task per write partition: Spark hash-partitions the magic key of partition p
        # into partition p.
        keys = partition_keys(self.partitions)
        magic = F.element_at(F.array(*[F.lit(k) for k in keys]), F.col(PART) + 1)
        t_job = time.perf_counter()
        # One write task reads every row anyway; after a small micro-batch (the steady state)
        # the next is likely small too, and then one stage costs less than two. Every shard is
        # still written by exactly one task (the only one).
        single = (
            self.options.writer_process
            and self.partitions == 1
            and bool(self.reports)
            and self.reports[-1].rows <= self.options.single_stage_max_rows
        )
        exchanged = prepared.coalesce(1) if single else prepared.repartition(self.partitions, magic)
        write = Write(self.uri, self.options, batch_id, self.dead_letter_uri, self.storage, fused=single)
        messages = [pickle.loads(r[MESSAGE]) for r in exchanged.mapInArrow(write, spark_schema(MESSAGE_SCHEMA)).collect()]
        job_seconds = time.perf_counter() - t_job
        exchange_seconds = sum(m.exchange_seconds for m in messages)
        report = TableWrite(TableState.load(self.uri, self.storage), self.options.write_mode(), dead_letter_uri=self.dead_letter_uri).commit(
            [m.message for m in messages], batch_id, started=t0, job_seconds=job_seconds, exchange_seconds=exchange_seconds,
            stages=1 if single else 2)
        self._record(report)
        log.info("%s", report.line())

    def _record(self, report: WriteReport) -> None:
        self.history.record(report)

    def report(self, batch_id: int) -> WriteReport | None:
        return self.history.report(batch_id)

    def totals(self) -> dict[str, float]:
        """Every counter of :class:`~memwal.write.api.WriteReport` summed over all the
        micro-batches this sink ran in this process (``batches``: how many)."""
        return self.history.totals()


__all__ = [
    "BatchReport",
    "MemwalSink",
    "Prepare",
    "SinkOptions",
    "Write",
    "partition_keys",
]
