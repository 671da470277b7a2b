"""The executor side of a shard write: what a process writing shards keeps between tasks, and
the one job it runs per shard.

Spark reuses a Python worker process for many tasks and micro-batches. Opening a shard
writer claims the shard and replays its WAL, and loading a table's state reads its
metadata, so both are done once per process and kept in a :class:`WorkerTable` (the table's
:class:`~memwal.writepath.TableWriter` and its flush times), owned by the process's
:class:`WorkerCache` (:data:`WORKER`), keyed by the table's URI and the
:class:`~memwal.storage.StorageConfig` the sink shipped with the task (an executor's own
environment need not know the table's object store). Their lifetime is the process's:
:meth:`WorkerCache.clear` (tests, shutdown) flushes the writers and forgets the tables.

A :class:`ShardJob` is one micro-batch's write of one shard, as the write task hands it to
the process that writes: its own Python worker, or the executor's writer process
(:mod:`memwal.streaming.writer_process`), which runs the same job against its own cache.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from memwal.failpoints import failpoint
from memwal.routing import check_row_shards
from memwal.sharding import ShardValues
from memwal.state import TableState
from memwal.storage import StorageConfig
from memwal.streaming.exchange import DELETE, ORDER, SHARD, summary
from memwal.streaming.options import SinkOptions
from memwal.partial import PRESENT
from memwal.writepath import ShardRecords, TableWriter


@dataclass
class WorkerTable:
    """One table in one process: its write path (one writer per shard the process writes) and,
    per shard, the time of its last flush."""

    writer: TableWriter
    last_flush: dict[str, float] = field(default_factory=dict)

    @property
    def state(self) -> TableState:
        return self.writer.state

    @classmethod
    def load(cls, uri: str, storage: StorageConfig) -> "WorkerTable":
        return cls(TableWriter(TableState.load(uri, storage)))

    def close(self) -> None:
        self.writer.close()


class WorkerCache:
    """The process's tables by (URI, storage), loaded on first use.

    The storage is part of the key because it is how the files are reached: two sinks naming
    the same URI with different credentials or endpoints must not share a handle.
    """

    def __init__(self) -> None:
        self._tables: dict[tuple[str, StorageConfig], WorkerTable] = {}
        self._lock = threading.Lock()

    def table(self, uri: str, storage: StorageConfig | None = None) -> WorkerTable:
        """``storage``: as the sink resolved it on the driver (None: this process's environment)."""
        storage = storage if storage is not None else StorageConfig.resolve()
        with self._lock:
            t = self._tables.get((uri, storage))
            if t is None:
                t = self._tables[(uri, storage)] = WorkerTable.load(uri, storage)
            return t

    def clear(self) -> None:
        """Flush and forget every table (tests, shutdown)."""
        with self._lock:
            tables, self._tables = list(self._tables.values()), {}
        for t in tables:
            try:
                t.close()
            except Exception:  # noqa: BLE001 - best effort at shutdown
                pass


#: This process's cache.
WORKER = WorkerCache()


@dataclass(frozen=True)
class ShardJob:
    """One micro-batch's write of one shard, run where the shard's writer lives (pickled to
    the executor's writer process, or run in the task's own worker).

    Hands the shard's routed rows (:func:`~memwal.streaming.exchange.routed_schema`, trusted
    after a cheap check) to the write path, then flushes the shard if its last flush is
    ``flush_interval_seconds`` old, and answers with the shard's summary row.
    """

    uri: str
    options: SinkOptions
    batch_id: int
    #: None: the process's own environment.
    storage: StorageConfig | None = None

    def run(self, shard_id: str, values: ShardValues, rows: pa.Table) -> pa.RecordBatch:
        t0 = time.perf_counter()
        worker = WORKER.table(self.uri, self.storage)
        worker.writer.writers.durability = self.options.durability
        state = worker.state
        check_row_shards(shard_id, rows.column(SHARD))
        present = rows.column(PRESENT) if PRESENT in rows.schema.names else None
        records = ShardRecords(
            shard_id,
            values,
            rows.select(state.write_schema.names),
            deletes=np.asarray(rows.column(DELETE).to_numpy(zero_copy_only=False), bool),
            order=rows.column(ORDER).to_numpy(),
            present=present,
        )
        # Counted around the flush too: a writer fenced while it sat idle finds out when it flushes.
        stats = worker.writer.writers.shard_stats(shard_id)
        before = stats.snapshot()
        result = worker.writer.write_shard(records, self.options.write_mode(), label=f"batch-{self.batch_id}")
        failpoint(f"sink.wrote.batch-{self.batch_id}")  # crash tests: some shards written, not all
        flushed = False
        interval = self.options.flush_interval_seconds
        if interval is not None:
            now = time.monotonic()
            last = worker.last_flush.setdefault(shard_id, now)
            if now - last >= interval:
                worker.writer.flush([shard_id])
                worker.last_flush[shard_id] = time.monotonic()
                flushed = True
        return summary(
            shard_id,
            rows=result.records,
            upserts=result.upserts,
            deletes=result.deletes,
            stale_dropped=result.stale_dropped,
            fenced_retries=stats.fenced_retries - before["fenced_retries"],
            writer_opens=stats.opens - before["opens"],
            flushed=flushed,
            seconds=time.perf_counter() - t0,
            stall_seconds=stats.stall_seconds - before["stall_seconds"],
            backpressure_waits=stats.slowdowns + stats.stalls - before["slowdowns"] - before["stalls"],
        )
