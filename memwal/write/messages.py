"""What the write side's processes tell each other: the plain records of the write API.

A write mode, what writing one shard did, a task's write message and a write's report, the
columns and dead letters' schema of records in transit, and Arrow IPC payloads. Only
dataclasses over PyArrow: the driver's Python processes of a Spark query (which create the
data source's writer and commit a micro-batch's messages) import this much of the write
side and nothing that loads Lance (:mod:`memwal.write.api` holds the rest of the API).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from typing import Any

import pyarrow as pa

from memwal.core.errors import InvalidArgumentError
from memwal.core.partial import check_merge

# Columns beside the table's (names chosen not to collide with user columns: memwal table
# columns may not start with "_").
SHARD = "__memwal_shard"
ORDER = "__memwal_order"
DELETE = "__memwal_delete"
ERROR = "__memwal_error"
TOPIC = "__memwal_topic"
KPART = "__memwal_kafka_partition"
OFFSET = "__memwal_offset"
KEY = "__memwal_key"
RAW = "__memwal_raw"

#: A record's arrival order is ``partition << OFFSET_BITS | offset``: Kafka offsets fit in 40
#: bits for a long time (10^12 records per partition).
OFFSET_BITS = 40

#: Schema metadata key of routed rows: JSON ``{shard id: [shard values...]}`` of their shards.
SHARDS_KEY = b"memwal.shards"

#: Records that cannot be written: why, and where they came from (Kafka coordinates; for
#: records that arrived as columns, their order and the record as JSON in ``RAW``).
DEAD_SCHEMA = pa.schema(
    [
        pa.field(ORDER, pa.int64()),
        pa.field(ERROR, pa.string()),
        pa.field(TOPIC, pa.string()),
        pa.field(KPART, pa.int32()),
        pa.field(OFFSET, pa.int64()),
        pa.field(KEY, pa.binary()),
        pa.field(RAW, pa.binary()),
    ]
)


def to_payload(rows: pa.Table | pa.RecordBatch) -> bytes:
    return ipc_buffer(rows).to_pybytes()


def ipc_buffer(rows: pa.Table | pa.RecordBatch) -> pa.Buffer:
    """``rows`` as an Arrow IPC stream in one buffer (no copy to Python bytes)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rows.schema) as w:
        w.write(rows)
    return sink.getvalue()


#: IPC streams align buffers to 8 bytes; Lance (arrow-rs) refuses a buffer not aligned for its
#: type (decimal128: 16; it panics). Arrow's type-specific alignment lets a decimal at 8 bytes
#: through (tests/test_writer_process.py), so buffers not at 64 bytes are copied as they are read
#: (one copy of what a message holds).
_ALIGNED = pa.ipc.IpcReadOptions(ensure_alignment=pa.ipc.Alignment.At64Byte)


def from_payload(data: bytes | pa.Buffer) -> pa.Table:
    with pa.ipc.open_stream(data, options=_ALIGNED) as r:
        return r.read_all()


@dataclass(frozen=True)
class WriteMode:
    """How records become writes (the same for every shard of a batch)."""

    #: "full": a record replaces its key's row. "partial": it changes the columns it carries.
    merge: str = "full"
    #: Orders versions of a key (highest wins), ties by arrival order.
    sequence_field: str | None = None
    #: Drop records older than their key's stored version (needs ``sequence_field``).
    drop_stale: bool = False

    def __post_init__(self) -> None:
        check_merge(self.merge)
        if self.drop_stale and self.sequence_field is None:
            raise InvalidArgumentError("dropping stale records needs a sequence field")

    @property
    def reads_stored(self) -> bool:
        """Whether a plan depends on stored data (then it is decided as the shard's owner)."""
        return self.drop_stale or self.merge == "partial"


#: Full upserts and deletes, in arrival order: the mode of a write that says nothing else.
FULL = WriteMode()


@dataclass(frozen=True)
class ShardWriteResult:
    """What writing one shard's records did: the record a caller reports (picklable)."""

    shard_id: str
    records: int
    upserts: int
    deletes: int
    stale_dropped: int = 0
    #: Plans made: 1, plus one per fence between deciding and writing.
    decisions: int = 1
    fenced_retries: int = 0
    writer_opens: int = 0
    #: Seconds the shard's writes were delayed or stalled by the table's bounds, and how many
    #: of its writes were.
    stall_seconds: float = 0.0
    backpressure_waits: int = 0
    #: MemTables sealed with the writer open (timed seals), and writers closed to flush one.
    seals: int = 0
    flushes: int = 0
    seconds: float = 0.0
    #: The process that wrote the shard (``host:pid``): a shard written by several in one
    #: batch costs fenced retries (each claims it from the other).
    writer: str = ""


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
    #: The table written ("" where one query writes one table; a whole-database ingest's
    #: per-table reports name theirs, :mod:`memwal.streaming.database`).
    table: str = ""

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

    @classmethod
    def combined(cls, parts: Iterable["WriteReport"], batch_id: int | None = None, **extra: Any) -> "WriteReport":
        """Reports of one batch's writes to several tables as one (counters summed, extremes
        kept; ``extra``: fields set as given)."""
        report = cls(batch_id=batch_id)
        for p in parts:
            for name, value in p.counters().items():
                if name.endswith("_max"):
                    setattr(report, name, max(getattr(report, name), value))
                else:
                    setattr(report, name, getattr(report, name) + value)
            report.oldest_record_ms = _lo(report.oldest_record_ms, p.oldest_record_ms)
            report.newest_record_ms = _hi(report.newest_record_ms, p.newest_record_ms)
            report.written_at = max(report.written_at, p.written_at)
            report.stages = max(report.stages, p.stages)
        for name, value in extra.items():
            setattr(report, name, value)
        return report

    def line(self) -> str:
        what = ("write" if self.batch_id is None else f"batch {self.batch_id}") + (f" of {self.table}" if self.table else "")
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
