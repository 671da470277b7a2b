"""The executor side of a shard write: what a process writing shards keeps between tasks, and
the one job it runs per shard.

Spark reuses a Python worker process for many tasks and micro-batches. Opening a shard
writer claims the shard and replays its WAL, and loading a table's state reads its
metadata, so both are done once per process and kept in a :class:`WorkerTable` (the table's
:class:`~memwal.write.protocol.TableWriter`), owned by the process's
:class:`WorkerCache` (:data:`WORKER`), keyed by the table's URI and the
:class:`~memwal.core.storage.StorageConfig` the sink shipped with the task (an executor's own
environment need not know the table's object store). Their lifetime is the process's:
:meth:`WorkerCache.clear` (tests, shutdown) flushes the writers and forgets the tables.

A :class:`WriteRequest` is one batch's write of some shards, as a task hands it to the process
that writes: its own, or the executor's writer process (:mod:`memwal.write.process`), which
runs the same request against its own cache.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

from memwal.core.schema import takes
from memwal.core.state import TableState
from memwal.core.storage import StorageConfig
from memwal.write.messages import FULL, ShardWriteResult, WriteMode
from memwal.write.protocol import ShardRecords, TableWriter


@dataclass
class WorkerTable:
    """One table in one process: its write path (one writer per shard the process writes)."""

    writer: TableWriter

    @property
    def state(self) -> TableState:
        return self.writer.state

    @classmethod
    def load(cls, uri: str, storage: StorageConfig) -> "WorkerTable":
        return cls(TableWriter(TableState.load(uri, storage)))

    def close(self, *, reopen_fenced: bool = True) -> None:
        self.writer.close(reopen_fenced=reopen_fenced)


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

    def reload(self, uri: str, storage: StorageConfig | None = None) -> WorkerTable:
        """The table loaded again, its old handle's writers flushed: its columns changed
        (:mod:`memwal.maintain.evolve`), and a process that writes or decodes them needs the new ones."""
        storage = storage if storage is not None else StorageConfig.resolve()
        with self._lock:
            old = self._tables.pop((uri, storage), None)
            if old is not None:
                old.close(reopen_fenced=False)
            t = self._tables[(uri, storage)] = WorkerTable.load(uri, storage)
            return t

    def flush_overdue(self) -> None:
        """Flush every open shard writer whose timed seal is overdue (no write sealed it)."""
        with self._lock:
            tables = list(self._tables.values())
        for t in tables:
            t.writer.flush_overdue()

    def clear(self, *, reopen_fenced: bool = True) -> None:
        """Flush and forget every table (tests, shutdown; ``reopen_fenced``: see
        :meth:`~memwal.write.pool.ShardWriterPool.flush`)."""
        with self._lock:
            tables, self._tables = list(self._tables.values()), {}
        for t in tables:
            try:
                t.close(reopen_fenced=reopen_fenced)
            except Exception:  # noqa: BLE001 - best effort at shutdown
                pass


#: This process's cache.
WORKER = WorkerCache()


@dataclass(frozen=True)
class WriteRequest:
    """One batch's writes into some shards of one table, run where the shards' writers live:
    in this process (:data:`WORKER`), or pickled, with the records, to the executor's writer
    process (:mod:`memwal.write.process`), which runs it against its own cache."""

    uri: str
    #: None: the process's own environment.
    storage: StorageConfig | None = None
    mode: WriteMode = FULL
    #: "os" or "fsync" for these writes (None: the table's).
    durability: str | None = None
    #: Timed seals of the shards' MemTables (:attr:`ShardWriterPool.seal_interval_seconds`).
    seal_interval_seconds: float | None = None
    #: Names the batch in failpoints and logs ("batch-7").
    label: str = ""

    def run(self, records: Sequence[ShardRecords]) -> list[ShardWriteResult]:
        table = WORKER.table(self.uri, self.storage)
        if any(not takes(table.state.write_schema, r.rows.schema) for r in records):
            table = WORKER.reload(self.uri, self.storage)  # rows of a column added or widened since this process loaded the table
        writer = table.writer
        writer.writers.durability = self.durability
        writer.writers.seal_interval_seconds = self.seal_interval_seconds
        return writer.write(records, self.mode, label=self.label)

    def flush(self, shard_ids: Sequence[str] | None = None) -> None:
        """Flush this process's open writers of the table (all, or ``shard_ids``)."""
        WORKER.table(self.uri, self.storage).writer.flush(None if shard_ids is None else list(shard_ids))


@dataclass(frozen=True)
class WorkerShards:
    """Shard writes run in this process, by its cached writers (:data:`WORKER`; a
    :class:`~memwal.write.api.ShardWrites`)."""

    uri: str
    storage: StorageConfig | None = None
    durability: str | None = None
    seal_interval_seconds: float | None = None

    def write(self, records: Sequence[ShardRecords], mode: WriteMode = FULL, *, label: str = "") -> list[ShardWriteResult]:
        return WriteRequest(self.uri, self.storage, mode, self.durability, self.seal_interval_seconds, label).run(records)

    def flush(self, shard_ids: list[str] | None = None) -> None:
        WriteRequest(self.uri, self.storage).flush(shard_ids)
