"""The one write API: ``prepare(batch) -> message``, ``commit(messages) -> report``.

Shaped like Paimon's write -> commit messages -> commit. Every writer of a memwal table goes
through :class:`TableWrite`:

- ``Table.write``/``delete``: one process prepares and commits;
- ``format("memwal")``, batch and streaming (:mod:`memwal.spark.write`): every Spark task
  prepares what it read, in the task that read it (one stage, no rows through the driver);
  the driver commits the tasks' messages;
- the ``foreachBatch`` sink (:mod:`memwal.streaming.sink`), which exchanges rows by shard
  first: its write tasks prepare, its driver commits.

**prepare** takes one :class:`WriteBatch` (records already decoded, validated and routed to
shards, and those that cannot be written, with the reason) and writes each shard's records
through the write path (:mod:`memwal.write.protocol`: newest record per key, partial merges,
drop-stale, fencing) where the shards' writers live (:class:`ShardWrites`): this process, or
the executor's writer process (:mod:`memwal.write.process`), whose resident writers all of
an executor's tasks share. A prepared batch is durable (in the shards' WALs) when ``prepare``
returns; its :class:`WriteMessage` says what was written and carries the dead letters.

**commit** records the dead letters of every message (keyed by their Kafka coordinates, so a
batch replayed after a failure records each once), for a batch write flushes the shards that
were written so every reader sees them, and sums the messages into the one report,
:class:`WriteReport`.

Why the writes happen in ``prepare`` and not in ``commit``: a MemWAL write is durable once
acknowledged, and upserts and deletes are idempotent, so a batch that fails half way and runs
again rewrites the same newest row per key; nothing needs the commit to make it atomic.
Writing at commit instead sent every row through one process (the driver).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from memwal.write.messages import FULL, ShardWriteResult, WriteMessage, WriteMode, WriteReport, to_payload

if TYPE_CHECKING:
    from memwal.core.state import TableState
    from memwal.core.storage import StorageConfig
    from memwal.write.protocol import ShardRecords

log = logging.getLogger("memwal.write")


class ShardWrites(Protocol):
    """Where a batch's shard writes run: this process's writers (a
    :class:`~memwal.write.protocol.TableWriter`), or the executor's writer process
    (:class:`memwal.write.process.ProcessShards`)."""

    def write(self, records: Sequence[ShardRecords], mode: WriteMode = ..., *, label: str = "") -> list[ShardWriteResult]: ...

    def flush(self, shard_ids: list[str] | None = None) -> None: ...


@dataclass(frozen=True)
class WriteBatch:
    """What :meth:`TableWrite.prepare` takes: one batch's records, routed to shards, and those
    that cannot be written."""

    records: Sequence[ShardRecords] = ()
    #: Records that cannot be written (:data:`~memwal.write.wire.DEAD_SCHEMA`), with the reason.
    dead: pa.Table | None = None
    #: Records the input format skips on purpose (Debezium tombstones): neither rows nor dead letters.
    skipped: int = 0
    #: Seconds spent reading the batch from its source and preparing it (decode, validate, route).
    read_seconds: float = 0.0
    prepare_seconds: float = 0.0
    #: The batch's oldest and newest Kafka record timestamp (epoch ms), if it has them.
    min_timestamp_ms: int | None = None
    max_timestamp_ms: int | None = None

    @property
    def rows(self) -> int:
        """Records taken in: routed, dead and skipped."""
        return sum(r.rows.num_rows for r in self.records) + (0 if self.dead is None else self.dead.num_rows) + self.skipped


class TableWrite:
    """Writes into one table: :meth:`prepare` batches, :meth:`commit` their messages.

    The table is a loaded ``state``, or a ``uri`` (and ``storage``) loaded when first needed: a
    commit that records no dead letter and flushes nothing (a Spark micro-batch's, in a Python
    process of the driver) reads nothing of the table and does not load Lance.

    ``shards``: where shard writes run (default: a :class:`~memwal.write.protocol.TableWriter`
    of this process for the table). ``dead_letter_uri``: where commit records dead letters
    (default ``{table}_dead_letters``).
    """

    def __init__(self, state: "TableState | None" = None, mode: WriteMode = FULL, *, uri: str | None = None,
                 storage: "StorageConfig | None" = None, shards: ShardWrites | None = None, dead_letter_uri: str | None = None) -> None:
        if state is None and uri is None:
            raise TypeError("TableWrite needs a table: a state or a uri")
        self._state = state
        self.uri = state.uri if state is not None else str(uri)
        self.storage = state.storage if state is not None else storage
        self.mode = mode
        self._shards = shards
        self.dead_letter_uri = dead_letter_uri

    @property
    def state(self) -> "TableState":
        if self._state is None:
            from memwal.core.state import TableState

            self._state = TableState.load(self.uri, self.storage)
        return self._state

    @property
    def shards(self) -> ShardWrites:
        if self._shards is None:
            from memwal.write.protocol import TableWriter

            self._shards = TableWriter(self.state)
        return self._shards

    def prepare(self, batch: WriteBatch, *, label: str = "") -> WriteMessage:
        """Write ``batch``'s shards (durable on return); the message for :meth:`commit`."""
        started_at = time.time()
        t0 = time.perf_counter()
        records = [r for r in batch.records if r.rows.num_rows]
        results = self.shards.write(records, self.mode, label=label) if records else []
        dead = batch.dead if batch.dead is not None and batch.dead.num_rows else None
        return WriteMessage(
            shards=tuple(results),
            rows=batch.rows,
            dead=to_payload(dead) if dead is not None else None,
            dead_letters=0 if dead is None else dead.num_rows,
            skipped=batch.skipped,
            read_seconds=batch.read_seconds,
            prepare_seconds=batch.prepare_seconds,
            write_seconds=time.perf_counter() - t0 if records else 0.0,
            min_timestamp_ms=batch.min_timestamp_ms,
            max_timestamp_ms=batch.max_timestamp_ms,
            started_at=started_at - batch.read_seconds - batch.prepare_seconds,
        )

    def commit(self, messages: Sequence[WriteMessage | None], batch_id: int | None = None, *, flush: bool = False,
               started: float | None = None, **extra: Any) -> WriteReport:
        """Record the messages' dead letters; with ``flush`` (a batch write: visible to every
        reader on return) flush every shard written; the write's report. ``started``: when the
        write began (``time.perf_counter()``), for the report's seconds. ``extra``: report
        fields set as given (stages, job seconds)."""
        t0 = time.perf_counter()
        kept = [m for m in messages if m is not None]
        dead = [m.dead_rows() for m in kept if m.dead]
        if dead:
            from memwal.write.dead_letters import dead_letter_rows, dead_letter_uri, write_dead_letters

            uri = self.dead_letter_uri or dead_letter_uri(self.uri)
            write_dead_letters(uri, dead_letter_rows(pa.concat_tables(dead), -1 if batch_id is None else batch_id, self.uri), self.state.storage)
        written = sorted({s.shard_id for m in kept for s in m.shards})
        flushed = 0
        if flush and written:
            self.flush(written)
            flushed = len(written)
        report = WriteReport.of(kept, batch_id, written_at=time.time(), **extra)
        report.flushes += flushed
        report.commit_seconds = time.perf_counter() - t0
        if started is not None:
            report.seconds = time.perf_counter() - started
        else:  # from the earliest message's start (Spark tasks: their clocks are the hosts')
            began = min((m.started_at for m in kept if m.started_at is not None), default=None)
            report.seconds = max(report.commit_seconds, time.time() - began) if began is not None else report.commit_seconds
        if report.shared_shards:
            log.warning("%s: %d shard(s) were written by more than one process (%d writers); each claims the shard "
                        "from the other (fenced retries). Align the topic's partitions with the table's shards, or "
                        "let memwal exchange rows by shard (docs/deploy.md, \"Shards and Kafka partitions\")",
                        "write" if batch_id is None else f"batch {batch_id}", report.shared_shards, report.writers)
        return report

    def flush(self, shard_ids: list[str]) -> None:
        """Flush ``shard_ids`` so every reader sees what was written to them. This process's
        open writers flush themselves; a shard another process wrote (a Spark task's writer
        process, perhaps on another host) is claimed and flushed from here: the claim replays
        its WAL, so nothing acknowledged is missed, and its writer reopens on its next write."""
        from memwal.write.protocol import TableWriter

        local = self._shards if isinstance(self._shards, TableWriter) else None
        mine = [s for s in shard_ids if local is not None and s in local.writers.open_shards]
        if local is not None and mine:
            local.flush(mine)
        if len(mine) < len(shard_ids):
            from memwal.write.pool import ShardWriterPool

            pool = local.writers if local is not None else ShardWriterPool(self.state)
            for shard_id in shard_ids:
                if shard_id not in mine:
                    pool.claim_and_flush(shard_id)


def with_timing(message: WriteMessage, **timing: float) -> WriteMessage:
    """``message`` with phase timings added (read/prepare seconds measured by the caller)."""
    return replace(message, **{k: getattr(message, k) + v for k, v in timing.items()})


__all__ = ["ShardWrites", "TableWrite", "WriteBatch", "WriteMessage", "WriteReport", "with_timing"]
