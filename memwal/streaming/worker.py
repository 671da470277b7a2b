"""What a Spark Python worker process keeps between tasks: per table, its state and writers.

Spark reuses a Python worker process for many tasks and micro-batches. Opening a shard
writer claims the shard and replays its WAL, and loading a table's state reads its
metadata, so both are done once per worker and kept in a :class:`WorkerTable`, owned by
the process's :class:`WorkerCache` (:data:`WORKER`), keyed by the table's URI and the
:class:`~memwal.storage.StorageConfig` the sink shipped with the task (an executor's own
environment need not know the table's object store). Their lifetime is the worker's:
:meth:`WorkerCache.clear` (tests, shutdown) flushes the writers and forgets the tables.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Sequence

import pyarrow as pa

from memwal.state import TableState
from memwal.storage import StorageConfig
from memwal.writer import ShardWriterPool


@dataclass
class StoredSequences:
    """The stored sequence (``SinkOptions.sequence_field``) of keys of one shard, as far as
    this worker knows: key tuple -> sequence of its newest version (a delete's too, as this
    worker wrote it), None for a key with no live row in the table.

    Invariant: an entry is the sequence of the key's newest stored version. It holds because
    only this worker's writer writes the shard while the writer stays open (a writer that
    another one claimed is fenced, and reopening it counts as an open), and every write of
    the sink records what it wrote here. So the cache belongs to one writer generation (the
    shard's open count, :attr:`opens`): when the writer was (re)opened, what happened in
    between is unknown and the cache starts empty. Keys it does not know are read from the
    table, this shard only, once.
    """

    #: Keep at most this many keys; beyond that the cache starts over (memory stays bounded).
    MAX_KEYS = 1_000_000

    opens: int = -1
    known: dict[tuple[Any, ...], Any] = field(default_factory=dict)
    reader: Any = None
    #: Key tuple -> newest delete sequence of keys deleted in the shard (read once per writer
    #: generation, then kept up to date by this worker; :mod:`memwal.streaming.deleted`).
    deleted: dict[tuple[Any, ...], Any] | None = None

    def restart(self, opens: int) -> None:
        self.opens = opens
        self.known.clear()
        self.deleted = None
        self.reader = None  # its snapshot may predate another writer's writes

    def remember(self, keys: Sequence[tuple[Any, ...]], sequences: Sequence[Any]) -> None:
        if len(self.known) + len(keys) > self.MAX_KEYS:
            self.known.clear()
        self.known.update(zip(keys, sequences))


@dataclass
class WorkerTable:
    """One table in one worker process: its state, its writer pool (one writer per shard the
    worker writes), and per shard the time of its last flush and its :class:`StoredSequences`."""

    state: TableState
    writers: ShardWriterPool
    last_flush: dict[str, float] = field(default_factory=dict)
    _sequences: dict[str, StoredSequences] = field(default_factory=dict, repr=False)
    _guard: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def load(cls, uri: str, storage: StorageConfig) -> "WorkerTable":
        state = TableState.load(uri, storage)
        return cls(state, ShardWriterPool(state))

    def sequences(self, shard_id: str, check_owner: bool = False) -> StoredSequences:
        """The shard's stored sequences, started over if its writer was (re)opened since.

        ``check_owner`` (before deciding from them): also start over if the shard's writer
        lease names another pool. Another worker that wrote the shard since fenced this
        worker's writer, but this worker finds out only at its next write, after the
        decision: the lease, written by every claim, tells it before."""
        with self._guard:
            cache = self._sequences.setdefault(shard_id, StoredSequences())
        opens = self.writers.shard_stats(shard_id).opens
        if cache.opens != opens or (check_owner and not self._owns(shard_id)):
            cache.restart(opens)
        return cache

    def _owns(self, shard_id: str) -> bool:
        held = self.writers.lease(shard_id)
        return held is not None and held.owner == self.writers.owner

    def stored_sequences(self, shard_id: str, keys: pa.Table, sequence_field: str) -> pa.Table:
        """Key columns and ``sequence_field`` of the live rows of ``keys`` in ``shard_id``
        (strongly consistent: the shard's unflushed WAL included)."""
        from memwal.readers import Reader
        from memwal.readers.keys import keys_predicate

        cache = self.sequences(shard_id)
        if cache.reader is None:
            # One reader per shard: its WAL-tail cache is per shard, and threads write shards.
            cache.reader = Reader(self.state, consistency="strong")
        pk = list(self.state.primary_key)
        return cache.reader.scan(columns=pk + [sequence_field], where=keys_predicate(keys.select(pk)))

    def stored_rows(self, shard_id: str, keys: pa.Table) -> pa.Table:
        """The live rows of ``keys`` in ``shard_id`` (strongly consistent), for partial updates."""
        from memwal.readers import Reader

        cache = self.sequences(shard_id)
        if cache.reader is None:
            cache.reader = Reader(self.state, consistency="strong")
        return cache.reader.rows_of_keys(keys, shard_id)

    def close(self) -> None:
        self.writers.close()


class WorkerCache:
    """The worker process's tables by (URI, storage), loaded on first use.

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
