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
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Protocol

import pyarrow as pa

from memwal.state import TableState
from memwal.write.protocol import FULL, ShardRecords, ShardWriteResult, TableWriter, WriteMode
from memwal.write.wire import DEAD_SCHEMA, from_payload, to_payload

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


def _lo(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else min(a, b)


def _hi(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else max(a, b)


@dataclass(frozen=True)
class WriteMessage:
    """What one ``prepare`` (or several, :meth:`merge`) wrote: the commit message a Spark task
    sends its driver. Picklable, small: counters, and the dead letters as Arrow IPC."""

    shards: tuple[ShardWriteResult, ...] = ()
    #: Records taken in: written, dead and skipped.
    rows: int = 0
    dead: bytes | None = None
    dead_letters: int = 0
    skipped: int = 0
    read_seconds: float = 0.0
    prepare_seconds: float = 0.0
    #: Wall seconds of the shard writes (the task waited for them).
    write_seconds: float = 0.0
    min_timestamp_ms: int | None = None
    max_timestamp_ms: int | None = None
    #: When the work behind the message began (epoch seconds; None: not said).
    started_at: float | None = None

    def merge(self, other: "WriteMessage") -> "WriteMessage":
        """Both messages as one (a task that prepared several batches sends one message)."""
        dead = [from_payload(d) for d in (self.dead, other.dead) if d]
        return WriteMessage(
            shards=self.shards + other.shards,
            rows=self.rows + other.rows,
            dead=to_payload(pa.concat_tables(dead)) if dead else None,
            dead_letters=self.dead_letters + other.dead_letters,
            skipped=self.skipped + other.skipped,
            read_seconds=self.read_seconds + other.read_seconds,
            prepare_seconds=self.prepare_seconds + other.prepare_seconds,
            write_seconds=self.write_seconds + other.write_seconds,
            min_timestamp_ms=_lo(self.min_timestamp_ms, other.min_timestamp_ms),
            max_timestamp_ms=_hi(self.max_timestamp_ms, other.max_timestamp_ms),
            started_at=_lo(self.started_at, other.started_at),  # type: ignore[arg-type]
        )

    def dead_rows(self) -> pa.Table:
        return from_payload(self.dead) if self.dead else DEAD_SCHEMA.empty_table()


@dataclass
class WriteReport:
    """What one write did (a ``Table.write``, a Spark write, one micro-batch): the one report
    every writer returns, logs (:meth:`line`) and hands to its observers (metrics, progress)."""

    #: The micro-batch (None: a write that is not part of a stream).
    batch_id: int | None = None
    #: Records taken in: upserts, deletes, stale ones dropped, dead letters and skipped.
    rows: int = 0
    upserts: int = 0
    deletes: int = 0
    stale_dropped: int = 0
    dead_letters: int = 0
    #: Records the format skips on purpose (Debezium tombstones).
    skipped: int = 0
    #: Shards written.
    shards: int = 0
    fenced_retries: int = 0
    writer_opens: int = 0
    #: MemTables made visible to eventual readers: sealed with the writer open, or flushed by closing it.
    flushes: int = 0
    #: Wall seconds of the whole write (a micro-batch: from its start to its commit).
    seconds: float = 0.0
    #: The longest a shard's write took.
    write_seconds_max: float = 0.0
    #: The longest a shard's writes were delayed or stalled by the table's bounds (back-pressure) ...
    stall_seconds_max: float = 0.0
    #: ... and, summed over shards, the writes delayed or stalled and the seconds they waited.
    backpressure_waits: int = 0
    stall_seconds: float = 0.0
    #: Kafka timestamps (epoch ms) of the oldest and newest record written; None without them.
    oldest_record_ms: int | None = None
    newest_record_ms: int | None = None
    #: Wall-clock time (epoch seconds) when every shard write had returned.
    written_at: float = 0.0
    #: Task-seconds of the phases (summed over tasks; see memwal.streaming.timing).
    read_seconds: float = 0.0
    prepare_seconds: float = 0.0
    exchange_seconds: float = 0.0
    write_seconds: float = 0.0
    #: Driver seconds in the Spark job that ran the tasks (the ``foreachBatch`` sink's).
    job_seconds: float = 0.0
    #: Driver seconds in ``commit`` (dead letters, and for a batch write its flush).
    commit_seconds: float = 0.0
    #: Spark stages the micro-batch ran: 1 (read, prepare and write in one task), 2 (an exchange
    #: by shard between them), 0 (no Spark).
    stages: int = 0
    #: Processes that wrote shards, and shards written by more than one of them (each such
    #: shard is claimed back and forth: fenced retries; a misaligned topic on a cluster).
    writers: int = 0
    shared_shards: int = 0
    #: Why the micro-batch has its size (adaptive micro-batches); "" when sizes are fixed.
    size_reason: str = ""

    @classmethod
    def of(cls, messages: Iterable[WriteMessage], batch_id: int | None = None, **extra: Any) -> "WriteReport":
        """The messages of one write summed into its report (``extra``: fields set as given)."""
        report = cls(batch_id=batch_id)
        writers_of: dict[str, set[str]] = {}
        for m in messages:
            report.rows += m.rows
            report.dead_letters += m.dead_letters
            report.skipped += m.skipped
            report.read_seconds += m.read_seconds
            report.prepare_seconds += m.prepare_seconds
            report.oldest_record_ms = _lo(report.oldest_record_ms, m.min_timestamp_ms)
            report.newest_record_ms = _hi(report.newest_record_ms, m.max_timestamp_ms)
            for s in m.shards:
                report.upserts += s.upserts
                report.deletes += s.deletes
                report.stale_dropped += s.stale_dropped
                report.fenced_retries += s.fenced_retries
                report.writer_opens += s.writer_opens
                report.flushes += s.seals + s.flushes
                report.write_seconds += s.seconds
                report.write_seconds_max = max(report.write_seconds_max, s.seconds)
                report.stall_seconds += s.stall_seconds
                report.stall_seconds_max = max(report.stall_seconds_max, s.stall_seconds)
                report.backpressure_waits += s.backpressure_waits
                writers_of.setdefault(s.shard_id, set()).add(s.writer)
        report.shards = len(writers_of)
        report.writers = len(set().union(*writers_of.values())) if writers_of else 0
        report.shared_shards = sum(1 for w in writers_of.values() if len(w) > 1)
        for k, v in extra.items():
            setattr(report, k, v)
        return report

    def line(self) -> str:
        what = "write" if self.batch_id is None else f"batch {self.batch_id}"
        return (
            f"{what}: {self.rows} rows ({self.upserts} upserts, {self.deletes} deletes"
            + (f", {self.stale_dropped} stale" if self.stale_dropped else "")
            + f") into {self.shards} shard(s), {self.dead_letters} dead letter(s), "
            + (f"{self.skipped} skipped, " if self.skipped else "")
            + f"{self.fenced_retries} fenced retr{'y' if self.fenced_retries == 1 else 'ies'}, "
            f"{self.writer_opens} writer open(s), {self.flushes} flush(es), "
            f"stalled {self.stall_seconds_max:.3f}s, {self.seconds:.3f}s"
            + (f" ({self.stages} stage{'s' if self.stages != 1 else ''})" if self.stages else "")
            + (f"; {self.shared_shards} shard(s) written by several processes" if self.shared_shards else "")
        )

    def counters(self) -> dict[str, float]:
        """The report's numbers that add up over batches (for totals)."""
        skip = {"batch_id", "oldest_record_ms", "newest_record_ms", "written_at", "size_reason", "stages"}
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip and isinstance(getattr(self, f.name), (int, float))}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class TableWrite:
    """Writes into one table: :meth:`prepare` batches, :meth:`commit` their messages.

    ``shards``: where shard writes run (default: a :class:`TableWriter` of this process made
    for ``state``). ``dead_letter_uri``: where commit records dead letters (default
    ``{table}_dead_letters``). ``label`` names the writes in logs and failpoints.
    """

    def __init__(self, state: TableState, mode: WriteMode = FULL, *, shards: ShardWrites | None = None,
                 dead_letter_uri: str | None = None) -> None:
        self.state = state
        self.mode = mode
        self.shards: ShardWrites = shards if shards is not None else TableWriter(state)
        self.dead_letter_uri = dead_letter_uri

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

            uri = self.dead_letter_uri or dead_letter_uri(self.state.uri)
            write_dead_letters(uri, dead_letter_rows(pa.concat_tables(dead), -1 if batch_id is None else batch_id, self.state.uri),
                               self.state.storage)
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
        local = self.shards if isinstance(self.shards, TableWriter) else None
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
