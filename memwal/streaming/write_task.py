"""The sink's write stage: one task per write partition, every shard in exactly one task.

The task reads its partition's exchange rows (:mod:`memwal.streaming.exchange`), turns the
routed rows back into each shard's records and hands them, with the micro-batch's dead letters
it received, to the write API (:meth:`TableWrite.prepare <memwal.write.api.TableWrite.prepare>`),
whose shard writes run in the executor's writer process (:mod:`memwal.write.process`) or, with
``SinkOptions(writer_process=False)``, in this Python worker. Its one output row is the pickled
:class:`~memwal.write.api.WriteMessage`, for the driver's commit.
"""

from __future__ import annotations

import pickle
import time
from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from memwal.core.storage import StorageConfig
from memwal.streaming.exchange import COUNT_SKIPPED, DEAD_PAYLOAD, PAYLOAD
from memwal.streaming.sink_options import SinkOptions
from memwal.write.api import ShardWrites, TableWrite, WriteBatch, WriteMessage
from memwal.write.messages import from_payload
from memwal.write.wire import shard_records, shards_of
from memwal.write.worker import WORKER, WorkerShards

#: The write stage's output: one row per task, its write message pickled.
MESSAGE = "message"
MESSAGE_SCHEMA = pa.schema([pa.field(MESSAGE, pa.binary())])


@dataclass(frozen=True)
class TaskMessage:
    """A write task's message and the seconds it waited for its input beyond reading and
    preparing it (the exchange)."""

    message: WriteMessage
    exchange_seconds: float = 0.0


def shard_writes(uri: str, options: SinkOptions, storage: StorageConfig | None) -> ShardWrites:
    """Where a Spark task's shard writes run: the executor's writer process, or this worker."""
    if options.writer_process:
        from memwal.write.process import ProcessShards

        return ProcessShards(uri, storage, options.durability, options.flush_interval_seconds, options.writer_process_idle_seconds)
    return WorkerShards(uri, storage, options.durability, options.flush_interval_seconds)


class Write:
    """The write stage, pickled to executors (``mapInArrow`` after ``repartition``)."""

    def __init__(self, uri: str, options: SinkOptions, batch_id: int, dead_letter_uri: str, storage: StorageConfig | None = None,
                 *, fused: bool = False) -> None:
        self.uri = uri
        #: prepare runs in this same task (one stage): waiting for input is then reading and
        #: preparing, already counted as such, not an exchange.
        self.fused = fused
        self.options = options
        self.batch_id = batch_id
        self.dead_letter_uri = dead_letter_uri
        #: None: the executor's own environment.
        self.storage = storage

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        routed: list[pa.Table] = []
        dead: list[pa.Table] = []
        skipped = 0
        t0 = time.perf_counter()
        read_s = prepare_s = 0.0
        stamps: list[int] = []
        for b in batches:
            skipped += pc.sum(b.column(COUNT_SKIPPED)).as_py() or 0
            read_s += sum(x or 0.0 for x in b.column("read_seconds").to_pylist())
            prepare_s += sum(x or 0.0 for x in b.column("prepare_seconds").to_pylist())
            stamps += [x for c in ("min_timestamp_ms", "max_timestamp_ms") for x in b.column(c).to_pylist() if x is not None]
            routed += [from_payload(p) for p in b.column(PAYLOAD).to_pylist() if p]
            dead += [from_payload(p) for p in b.column(DEAD_PAYLOAD).to_pylist() if p]
        waited = time.perf_counter() - t0
        state = WORKER.table(self.uri, self.storage).state
        shards = {sid: v for t in routed for sid, v in shards_of(t).items()}
        # Prepare tasks on both sides of a column's addition send rows with and without it.
        rows = pa.concat_tables([t.replace_schema_metadata(None) for t in routed], promote_options="permissive") if routed else None
        records = shard_records(rows, shards) if rows is not None else []
        batch = WriteBatch(records, pa.concat_tables(dead) if dead else None, skipped, read_s, prepare_s,
                           min(stamps, default=None), max(stamps, default=None))
        write = TableWrite(state, self.options.write_mode(), shards=shard_writes(self.uri, self.options, self.storage))
        message = write.prepare(batch, label=f"batch-{self.batch_id}")
        exchange_s = max(0.0, waited - read_s - prepare_s) if self.fused else waited
        yield pa.RecordBatch.from_pylist([{MESSAGE: pickle.dumps(TaskMessage(message, exchange_s))}], schema=MESSAGE_SCHEMA)
