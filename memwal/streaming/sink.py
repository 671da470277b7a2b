"""The memwal Spark sink: ``df.writeStream.foreachBatch(MemwalSink(uri))``.

Per micro-batch, entirely on the executors:

1. **prepare** (``mapInArrow``, or the Kafka source's read task as its batch mapper):
   decode (for Kafka JSON) straight to the table's write schema, validate and route every
   record, once. Good rows get their shard id and a write partition, and travel with the
   shards' values (payload metadata); bad ones (null key, unparseable value, wrong type,
   oversized row, unknown operation) get the reason and their Kafka coordinates.
2. **write** (``repartition`` by that partition, then ``mapInArrow``): every shard in
   exactly one task (the sharding spec maps shards to partitions:
   :meth:`~memwal.sharding.ShardingSpec.partition_of`). The task orders the shard's rows
   by Kafka (partition, offset), or by the sequence column, keeps the newest per key, and
   hands upserts and deletes as :class:`~memwal.routing.RoutedBatch` es, trusted after a
   cheap check, to the shard's Lance ShardWriter, kept in the Python worker process across
   micro-batches (:mod:`memwal.streaming.worker`), or with ``writer_process`` in the
   executor's writer process (:mod:`memwal.streaming.writer_process`, so a task moving to
   another worker keeps its writers). A fenced writer is reopened (claimed)
   and the write retried once. The first partition's task also records the batch's bad
   rows in the dead-letter table.

Only per-shard counters come back to the driver, which logs one line per micro-batch.

**Storage.** The table's :class:`~memwal.storage.StorageConfig` (credentials, endpoint) is
resolved once, on the driver, and travels inside both stages (pickled with ``Write``, in the
JSON config of ``Prepare``) to every executor, its worker cache and the dead-letter table:
an executor's environment need not know the object store.

**Exactly once.** Spark replays an uncommitted micro-batch after a crash with the same
offsets. Writes are idempotent per micro-batch: every key ends at the batch's newest row
for it whether the batch ran once, twice, or half and then once; dead letters are keyed
by their Kafka coordinates. So the table ends as if each batch ran once.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal.errors import BatchInterruptedError, FencedError
from memwal.failpoints import failpoint
from memwal.lsm import newest_per_key
from memwal.metadata import check_durability
from memwal.partial import PRESENT, check_merge, fold, presence_of_columns, presence_type, resolve
from memwal.routing import shard_codes, trusted_batch
from memwal.sharding import ShardingSpec, ShardValues
from memwal.state import TableState, resolve_storage
from memwal.storage import StorageConfig
from memwal.streaming.dead_letters import record_json
from memwal.streaming.decode import ValueDecoder, check_rows, json_presence, operations, value_decoder
from memwal.streaming.worker import WORKER, WorkerTable

log = logging.getLogger("memwal.streaming")

# Columns the prepare stage adds (names chosen not to collide with user columns: memwal
# table columns may not start with "_").
PART = "__memwal_part"
SHARD = "__memwal_shard"
ORDER = "__memwal_order"
DELETE = "__memwal_delete"
ERROR = "__memwal_error"
TOPIC = "__memwal_topic"
KPART = "__memwal_kafka_partition"
OFFSET = "__memwal_offset"
KEY = "__memwal_key"
RAW = "__memwal_raw"

#: Kafka offsets fit in 40 bits for a long time (10^12 records per partition).
_OFFSET_BITS = 40

#: A shard write decided from stored rows is decided again at most this often when another
#: claim fences the writer in between (more means another process keeps claiming the shard).
_DECIDE_ATTEMPTS = 3

SUMMARY_SCHEMA = pa.schema(
    [
        ("shard", pa.string()),
        ("rows", pa.int64()),
        ("upserts", pa.int64()),
        ("deletes", pa.int64()),
        ("stale_dropped", pa.int64()),
        ("dead_letters", pa.int64()),
        ("skipped", pa.int64()),
        ("fenced_retries", pa.int64()),
        ("writer_opens", pa.int64()),
        ("flushed", pa.bool_()),
        ("seconds", pa.float64()),
        ("stall_seconds", pa.float64()),
        ("pid", pa.int64()),
        # Task-seconds of the micro-batch's phases (see memwal.streaming.timing), carried by
        # the write task's timing row (shard ""): reading the source and preparing (decode,
        # validate, route) in the read tasks, waiting for the exchange in the write task.
        ("read_seconds", pa.float64()),
        ("prepare_seconds", pa.float64()),
        ("exchange_seconds", pa.float64()),
    ]
)


@dataclass(frozen=True)
class SinkOptions:
    """How records are interpreted and written."""

    #: "columns": the DataFrame has the table's columns; "kafka-json": it is a Kafka
    #: DataFrame (key, value, topic, partition, offset, ...) whose values are JSON objects.
    source: str = "columns"
    #: Field/column naming the operation ("upsert", "delete", ...); None: all upserts.
    op_field: str | None = "op"
    #: Optional field/column ordering versions of a key (like Paimon's sequence.field):
    #: within a micro-batch the highest wins, ties broken by Kafka (partition, offset).
    sequence_field: str | None = None
    #: With a sequence field: also drop a row older than the version already stored.
    drop_stale_across_batches: bool = False
    #: Rows larger than this go to the dead-letter table.
    max_row_bytes: int = 8 << 20
    #: Flush a shard's MemTable to an SSTable at most this often (seconds), so eventual
    #: readers see new data; strong readers see it at once. None: only when MemTables fill.
    flush_interval_seconds: float | None = 2.0
    #: Partitions for shards of specs without a fixed shard count (identity, time, ...).
    partitions_for_open_specs: int = 8
    #: At most this many write tasks per micro-batch (None: Spark's default parallelism,
    #: i.e. its task slots; ``ingest`` with bounded micro-batches: one per 50k rows). With more shards than that, a task writes several shards in
    #: parallel threads; every shard is still written by exactly one task. A wave of tasks
    #: beyond the slots costs a micro-batch more than the writes it parallelizes
    #: (docs/bench-log/ingest.md, "Ingest").
    max_write_tasks: int | None = None
    #: Dead-letter table; default ``{table}_dead_letters``.
    dead_letter_uri: str | None = None
    #: "full": a record replaces its key's row (upsert). "partial": a record changes only the
    #: columns it carries (a JSON key it lacks keeps the stored value, ``null`` sets null;
    #: with the "columns" source, a column the DataFrame lacks), see :mod:`memwal.partial`.
    merge: str = "full"
    #: Kafka values: "json" (objects with the table's columns and ``op_field``),
    #: "debezium-json" (change events, :mod:`memwal.streaming.debezium`; the source position
    #: fills ``sequence_field``) or "avro" (:mod:`memwal.streaming.avro`).
    value_format: str = "json"
    #: With "avro": the schema (the text of an ``.avsc``) values are written with, or read as.
    avro_schema: str | None = None
    #: With "avro": values carry Confluent's header with this schema id (others are dead letters).
    avro_schema_id: int | None = None
    #: With "avro": values carry Confluent's header; writer schemas come from this registry URL.
    schema_registry: str | None = None
    #: "os" or "fsync" (``WriterConfig.durability``) for this sink's writes; None: the table's default.
    durability: str | None = None
    #: Write shards through the executor's writer process (:mod:`memwal.streaming.writer_process`)
    #: instead of in the Python worker: a task moving between workers does not claim its
    #: shards again. Off by default (opt-in while it is measured).
    writer_process: bool = False
    #: With ``writer_process``: seconds without writes after which a writer process it starts
    #: exits (None: its default, or ``$MEMWAL_WRITER_PROCESS_IDLE_SECONDS``).
    writer_process_idle_seconds: float | None = None
    #: With ``writer_process`` and a single write partition, a micro-batch following one of at
    #: most this many rows runs prepare and write in one Spark stage (``coalesce(1)``: no
    #: shuffle, no second stage to schedule), which shortens the small micro-batches that set
    #: freshness; larger ones keep two stages, whose read tasks run in parallel. Without the
    #: writer process the fused task's writes land in alternating Python workers, each claiming
    #: the shards again (measured: 269 fenced retries a minute), so it stays two stages.
    #: 0: always two stages.
    single_stage_max_rows: int = 20_000

    def __post_init__(self) -> None:
        if self.durability is not None:
            check_durability(self.durability)


@dataclass
class BatchReport:
    """What one micro-batch did (the driver's log line and the listener's metrics)."""

    batch_id: int
    rows: int = 0
    upserts: int = 0
    deletes: int = 0
    stale_dropped: int = 0
    dead_letters: int = 0
    #: Records the format skips on purpose (Debezium tombstones).
    skipped: int = 0
    shards: int = 0
    fenced_retries: int = 0
    writer_opens: int = 0
    flushes: int = 0
    seconds: float = 0.0
    write_seconds_max: float = 0.0
    #: the longest a shard's writes were delayed or stalled by the table's bounds (back-pressure)
    stall_seconds_max: float = 0.0
    #: Task-seconds of the phases (summed over tasks; see memwal.streaming.timing).
    read_seconds: float = 0.0
    prepare_seconds: float = 0.0
    exchange_seconds: float = 0.0
    write_seconds: float = 0.0
    #: Driver seconds in the Spark job that runs both stages (``collect`` of the summaries).
    job_seconds: float = 0.0
    #: Spark stages the micro-batch ran: 2 (prepare, then write after a shuffle), or 1 when
    #: prepare and write ran in one task (``SinkOptions.single_stage_max_rows``).
    stages: int = 2
    #: Why the micro-batch has its size (adaptive micro-batches, memwal.streaming.adaptive);
    #: set by the ingest query's listener, "" when sizes are fixed.
    size_reason: str = ""

    def line(self) -> str:
        return (
            f"batch {self.batch_id}: {self.rows} rows ({self.upserts} upserts, {self.deletes} deletes"
            + (f", {self.stale_dropped} stale" if self.stale_dropped else "")
            + f") into {self.shards} shard(s), {self.dead_letters} dead letter(s), "
            + (f"{self.skipped} skipped, " if self.skipped else "")
            + f"{self.fenced_retries} fenced retr{'y' if self.fenced_retries == 1 else 'ies'}, "
            f"{self.writer_opens} writer open(s), {self.flushes} flush(es), "
            f"stalled {self.stall_seconds_max:.3f}s, {self.seconds:.3f}s"
            + (" (one stage)" if self.stages == 1 else "")
        )


# ---------------------------------------------------------------------------------------
# Partitioning: shard -> Spark partition, one shard per task where the spec allows it.
# ---------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def partition_keys(n: int) -> tuple[int, ...]:
    """For every p in [0, n), an int whose Spark hash partition among n partitions is p.

    ``repartition(n, col)`` puts a row in ``pmod(murmur3(col, seed 42), n)``; choosing the
    column value per target partition gives a one-to-one shard -> task mapping without a
    custom partitioner (which the DataFrame API does not have).
    """
    from memwal.transforms import murmur3_int32

    found: dict[int, int] = {}
    start = 0
    while len(found) < n:
        cand = np.arange(start, start + 64 * n + 64, dtype=np.int32)
        parts = np.mod(murmur3_int32(cand, seed=42).view(np.int32).astype(np.int64), n)
        for c, p in zip(cand.tolist(), parts.tolist()):
            found.setdefault(p, c)
        start += len(cand)
    return tuple(found[p] for p in range(n))


def shard_partitions(spec: ShardingSpec, options: SinkOptions) -> int:
    """Number of write partitions (write tasks per micro-batch)."""
    n = spec.fixed_shard_count or options.partitions_for_open_specs
    return min(n, options.max_write_tasks) if options.max_write_tasks else n


# ---------------------------------------------------------------------------------------
# Stage 1: prepare (decode, validate, route)
# ---------------------------------------------------------------------------------------


#: What the prepare stage hands to Spark: one row per (input batch, write partition) with
#: the routed rows, and the dead letters, as Arrow IPC payloads. Spark shuffles a few
#: opaque blobs instead of converting every row (vectors especially) to its internal
#: format and back.
COUNT_ROWS = "rows"
COUNT_DEAD = "dead_letters"
COUNT_DELETES = "deletes"
COUNT_SKIPPED = "skipped"
PAYLOAD = "payload"
DEAD_PAYLOAD = "dead_payload"
EXCHANGE_SCHEMA = pa.schema(
    [
        pa.field(PART, pa.int32()),
        pa.field(COUNT_ROWS, pa.int64()),
        pa.field(COUNT_DEAD, pa.int64()),
        pa.field(COUNT_DELETES, pa.int64()),
        pa.field(PAYLOAD, pa.binary()),
        pa.field(DEAD_PAYLOAD, pa.binary()),
        pa.field(COUNT_SKIPPED, pa.int64()),
        # Seconds the read task spent reading this input batch from the source and preparing
        # it; on the batch's first exchange row only (null on the others), so sums are right.
        pa.field("read_seconds", pa.float64()),
        pa.field("prepare_seconds", pa.float64()),
    ]
)

#: Schema metadata key of a routed payload: JSON ``{shard id: [shard values...]}`` of the
#: shards its rows belong to, so the write task need not recompute any shard value.
SHARDS_KEY = b"memwal.shards"

#: Dead letters inside a payload; partition 0's task records them.
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


def routed_schema(write_schema: pa.Schema, presence: pa.StructType | None = None) -> pa.Schema:
    """The schema of routed rows inside a payload: each row's shard id, Kafka order and
    operation, then the table's columns exactly as writers take them (types, nullability,
    primary-key metadata), which IPC carries unchanged to the write task; with ``presence``
    (partial updates), last the columns each record carries (:data:`PRESENT`)."""
    internal = [pa.field(SHARD, pa.string(), nullable=False), pa.field(ORDER, pa.int64()), pa.field(DELETE, pa.bool_())]
    tail = [pa.field(PRESENT, presence, nullable=False)] if presence is not None else []
    return pa.schema(internal + list(write_schema) + tail)


def to_payload(rows: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rows.schema) as w:
        w.write_table(rows)
    return sink.getvalue().to_pybytes()


def from_payload(data: bytes) -> pa.Table:
    with pa.ipc.open_stream(data) as r:
        return r.read_all()


@dataclass(frozen=True)
class Prepared:
    """One input batch after the prepare stage."""

    #: :func:`routed_schema` rows plus their write partition (:data:`PART`).
    rows: pa.Table
    #: Shard id -> shard values of every shard in ``rows``.
    shards: dict[str, ShardValues]
    #: :data:`DEAD_SCHEMA` rows.
    dead: pa.Table
    #: Records the format skips on purpose (Debezium tombstones): counted, neither rows nor dead letters.
    skipped: int = 0


class Prepare:
    """The prepare stage, pickled to executors (``mapInArrow``), or run inside the Kafka
    source's read task as its batch mapper (:meth:`from_json` is the factory)."""

    #: The factory, as the Kafka source's ``memwal.batchMapper`` option names it.
    FACTORY = "memwal.streaming.sink:Prepare.from_json"

    #: The Arrow schema of what it yields (the batch-mapper contract).
    schema = EXCHANGE_SCHEMA

    def __init__(self, uri: str, options: SinkOptions, storage: StorageConfig | None = None) -> None:
        self.uri = uri
        self.options = options
        #: None: the executor's own environment (a config written before storage travelled).
        self.storage = storage
        #: The value decoder of this task's batches, made by the first: an Avro decoder's
        #: first batch parses the writer schema and starts Arrow's reader (~2-3 ms per batch).
        self._decoder: ValueDecoder | None = None

    def to_json(self) -> str:
        # Spark redacts a source option whose value matches spark.redaction.regex ("secret",
        # "token", ...), so the credentials in here do not reach the UI or the logs.
        storage = None if self.storage is None else [list(kv) for kv in self.storage.items]
        return json.dumps({"uri": self.uri, "options": asdict(self.options), "storage": storage})

    @classmethod
    def from_json(cls, text: str) -> "Prepare":
        d = json.loads(text)
        items = d.get("storage")
        storage = None if items is None else StorageConfig(tuple((str(k), str(v)) for k, v in items))
        return cls(d["uri"], SinkOptions(**d["options"]), storage)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Exchange rows (see :data:`EXCHANGE_SCHEMA`) for ``batches``."""
        from pyspark import TaskContext

        state = WORKER.table(self.uri, self.storage).state
        ctx = TaskContext.get()
        task_partition = ctx.partitionId() if ctx is not None else 0
        n = shard_partitions(state.spec, self.options)
        row = 0
        it = iter(batches)
        while True:
            t0 = time.perf_counter()
            batch = next(it, None)
            t1 = time.perf_counter()
            if batch is None:
                return
            if batch.num_rows == 0:
                continue
            prepared = self.prepare(state, pa.Table.from_batches([batch]), task_partition, row, n)
            row += batch.num_rows
            out = exchange_rows(prepared)
            if out:
                out[0]["read_seconds"] = t1 - t0
                out[0]["prepare_seconds"] = time.perf_counter() - t1
            yield pa.RecordBatch.from_pylist(out, schema=EXCHANGE_SCHEMA)

    def prepare(self, state: TableState, data: pa.Table, task_partition: int, first_row: int, n: int) -> Prepared:
        """Decode, validate and route ``data``: every good row conformed to the table's write
        schema with its shard and write partition, every bad row with its reason."""
        opts = self.options
        count = data.num_rows
        errors: dict[int, str] = {}
        if opts.source == "kafka-json":
            topic = data.column("topic")
            kpart = data.column("partition").cast(pa.int32())
            offset = data.column("offset").cast(pa.int64())
            order = (np.asarray(kpart.to_numpy(), dtype=np.int64) << _OFFSET_BITS) | np.asarray(offset.to_numpy(), dtype=np.int64)
            raw = data.column("value")
            kkey = data.column("key")
            if self._decoder is None:  # one task, one table state: the same decoder for every batch
                self._decoder = value_decoder(state.schema, opts.value_format, op_field=opts.op_field,
                                              sequence_field=opts.sequence_field, primary_key=state.primary_key,
                                              avro_schema=opts.avro_schema, avro_schema_id=opts.avro_schema_id,
                                              schema_registry=opts.schema_registry)
            decoder = self._decoder
            decoded = decoder.decode_batch(raw, kkey)
            parsed, positions, errors, skipped = decoded.rows, decoded.positions, dict(decoded.errors), decoded.skipped
            op_field = decoder.op_field
        else:
            topic = pa.nulls(count, pa.string())
            kpart = pa.nulls(count, pa.int32())
            offset = pa.nulls(count, pa.int64())
            order = (np.int64(task_partition) << _OFFSET_BITS) + first_row + np.arange(count, dtype=np.int64)
            kkey = pa.nulls(count, pa.binary())
            raw = None
            parsed, positions = data, np.arange(count)
            skipped, op_field = 0, opts.op_field
        # Operation and sequence
        deletes_p, op_errors = operations(parsed, op_field)
        for i, reason in op_errors.items():
            errors[int(positions[i])] = reason
        if opts.sequence_field:
            if opts.sequence_field not in parsed.schema.names:
                seq_null = np.ones(parsed.num_rows, bool)
            else:
                seq_null = np.asarray(parsed.column(opts.sequence_field).is_null())
            for i in np.flatnonzero(seq_null):
                errors.setdefault(int(positions[i]), f"the sequence field {opts.sequence_field!r} is null or missing")
        if errors:  # (a take of every row would copy the whole batch: skipped when none is bad)
            keep = np.flatnonzero(~np.isin(positions, np.fromiter(errors, np.int64, len(errors))))
            parsed = parsed.take(pa.array(keep, pa.int64()))
            positions = positions[keep]
            deletes_p = deletes_p[keep]
        ptype = presence_type(state.write_schema, state.primary_key) if opts.merge == "partial" else None
        if ptype is not None:
            if raw is not None and opts.value_format == "json":
                present = json_presence(raw.to_pylist(), parsed, positions, ptype)
            else:  # a DataFrame of columns: a column it lacks is absent in every row
                present = presence_of_columns(parsed.num_rows, ptype, parsed.schema.names)
        rows, good, row_errors = check_rows(parsed, state.write_schema, state.primary_key, opts.max_row_bytes)
        for i, reason in row_errors.items():
            errors[int(positions[i])] = reason
        positions = positions[good]
        deletes_p = deletes_p[good]

        # Route the good rows, once: the write task trusts this.
        parts_out = np.zeros(len(positions), np.int32)
        shards_out = pa.array([], pa.string())
        shards: dict[str, ShardValues] = {}
        if len(positions):
            codes, values = shard_codes(state.spec.shard_value_arrays(rows))
            ids = [state.shard_id_of(v) for v in values]
            shards = dict(zip(ids, values))
            parts = np.asarray([state.spec.partition_of(v, sid, n) for v, sid in zip(values, ids)], dtype=np.int32)
            parts_out = parts[codes]
            shards_out = pa.array(ids, pa.string()).take(pa.array(codes))
        extra = [present.take(pa.array(good, pa.int64()))] if ptype is not None else []
        good_rows = pa.Table.from_arrays(
            [shards_out, pa.array(order[positions], pa.int64()), pa.array(deletes_p, pa.bool_()), *rows.columns, *extra],
            schema=routed_schema(state.write_schema, ptype),
        ).append_column(PART, pa.array(parts_out, pa.int32()))

        bad = np.array(sorted(errors), dtype=np.int64)
        bad_pa = pa.array(bad, pa.int64())
        if raw is not None:
            raw_bad = raw.take(bad_pa)
        else:
            raw_bad = pa.array([record_json(data.slice(int(i), 1).to_pylist()[0]) for i in bad], pa.binary())
        dead = pa.Table.from_arrays(
            [
                pa.array(order[bad], pa.int64()),
                pa.array([errors[int(i)] for i in bad], pa.string()),
                topic.take(bad_pa),
                kpart.take(bad_pa),
                offset.take(bad_pa),
                kkey.take(bad_pa),
                raw_bad,
            ],
            schema=DEAD_SCHEMA,
        )
        return Prepared(good_rows, shards, dead, skipped)


def exchange_rows(prepared: Prepared) -> list[dict[str, Any]]:
    """The exchange rows of one prepared batch: one per write partition with rows, and
    partition 0's carrying the dead letters."""
    rows, dead = prepared.rows, prepared.dead
    parts = rows.column(PART)
    by_part: dict[int, dict[str, Any]] = {}
    for part in pc.unique(parts).to_pylist():
        mine = rows.filter(pc.equal(parts, part)).drop_columns([PART])
        ids = pc.unique(mine.column(SHARD)).to_pylist()
        meta = {SHARDS_KEY: json.dumps({sid: list(prepared.shards[sid]) for sid in ids}).encode()}
        by_part[part] = {
            PART: part,
            COUNT_ROWS: mine.num_rows,
            COUNT_DEAD: 0,
            COUNT_DELETES: pc.sum(mine.column(DELETE).cast(pa.int64())).as_py() or 0,
            PAYLOAD: to_payload(mine.replace_schema_metadata(meta)),
            DEAD_PAYLOAD: None,
            COUNT_SKIPPED: 0,
        }
    if dead.num_rows or prepared.skipped:
        zero = by_part.setdefault(0, {PART: 0, COUNT_ROWS: 0, COUNT_DEAD: 0, COUNT_DELETES: 0, PAYLOAD: None, DEAD_PAYLOAD: None, COUNT_SKIPPED: 0})
        zero[COUNT_ROWS] += dead.num_rows + prepared.skipped
        zero[COUNT_SKIPPED] = prepared.skipped
    if dead.num_rows:
        zero[COUNT_DEAD] = dead.num_rows
        zero[DEAD_PAYLOAD] = to_payload(dead)
    return list(by_part.values())


def spark_schema(schema: pa.Schema):
    """The Spark StructType of an Arrow schema (what ``mapInArrow`` takes)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


# ---------------------------------------------------------------------------------------
# Stage 2: write (one task per write partition; partition 0 also records dead letters)
# ---------------------------------------------------------------------------------------


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
        shards: dict[str, ShardValues] = {}
        skipped = 0
        t0 = time.perf_counter()
        read_s = prepare_s = 0.0
        for b in batches:
            skipped += pc.sum(b.column(COUNT_SKIPPED)).as_py() or 0
            read_s += sum(x or 0.0 for x in b.column("read_seconds").to_pylist())
            prepare_s += sum(x or 0.0 for x in b.column("prepare_seconds").to_pylist())
            for p in b.column(PAYLOAD).to_pylist():
                if p:
                    t = from_payload(p)
                    shards.update((sid, tuple(v)) for sid, v in json.loads(t.schema.metadata[SHARDS_KEY]).items())
                    routed.append(t)
            for p in b.column(DEAD_PAYLOAD).to_pylist():
                if p:
                    dead.append(from_payload(p))
        # The task's phase timings ride on its first summary row (one row per shard stays).
        waited = time.perf_counter() - t0
        exchange_s = max(0.0, waited - read_s - prepare_s) if self.fused else waited
        timing = {"read_seconds": read_s, "prepare_seconds": prepare_s, "exchange_seconds": exchange_s}
        if dead:
            yield _with_timing(self._dead_letters(pa.concat_tables(dead)), timing)
            timing = {}
        if skipped:
            yield _with_timing(_summary("", skipped=skipped), timing)
            timing = {}
        if not routed:
            return
        data = pa.concat_tables(routed)
        ids = pc.unique(data.column(SHARD)).to_pylist()
        write_shard = self._shard_writer()
        if len(ids) == 1:
            yield _with_timing(write_shard(ids[0], shards[ids[0]], data), timing)
            return
        from concurrent.futures import ThreadPoolExecutor

        column = data.column(SHARD)
        with ThreadPoolExecutor(max_workers=min(8, len(ids))) as pool:
            futures = [pool.submit(write_shard, sid, shards[sid], data.filter(pc.equal(column, sid))) for sid in ids]
            for f in futures:
                yield _with_timing(f.result(), timing)
                timing = {}

    def _shard_writer(self) -> "Callable[[str, ShardValues, pa.Table], pa.RecordBatch]":
        """:meth:`_write_shard` here, or run by the executor's writer process (which keeps
        the shards' writers whichever worker runs the next task)."""
        if not self.options.writer_process:
            return self._write_shard
        from memwal.streaming.writer_process import client

        remote = client(self.options.writer_process_idle_seconds)
        return functools.partial(remote.write_shard, self)

    def _dead_letters(self, bad: pa.Table) -> pa.RecordBatch:
        from memwal.streaming.dead_letters import SCHEMA, write_dead_letters

        t0 = time.perf_counter()
        n = bad.num_rows
        ids = []
        for topic, part, off, order in zip(
            bad.column(TOPIC).to_pylist(), bad.column(KPART).to_pylist(), bad.column(OFFSET).to_pylist(), bad.column(ORDER).to_pylist()
        ):
            ids.append(f"{topic}/{part}/{off}" if topic is not None else f"batch-{self.batch_id}/row-{order}")
        rows = pa.table(
            {
                "dlq_id": ids,
                "error": bad.column(ERROR),
                "topic": bad.column(TOPIC),
                "partition": bad.column(KPART),
                "offset": bad.column(OFFSET),
                "key": bad.column(KEY),
                "value": bad.column(RAW),
                "batch_id": pa.array([self.batch_id] * n, pa.int64()),
                "recorded_at": pa.nulls(n, pa.timestamp("us", tz="UTC")),
                "target": pa.array([self.uri] * n, pa.string()),
            }
        ).cast(SCHEMA.remove_metadata())
        write_dead_letters(self.dead_letter_uri, rows, self.storage)
        return _summary("", rows=0, dead_letters=n, seconds=time.perf_counter() - t0)

    def _write_shard(self, shard_id: str, values: ShardValues, rows: pa.Table) -> pa.RecordBatch:
        """Write one shard's routed rows: the newest per key, deletes and upserts, as routed
        batches trusted after a cheap check. Runs in the one thread writing this shard, so
        the shard's writer counters before and after are this write's alone."""
        t0 = time.perf_counter()
        worker = WORKER.table(self.uri, self.storage)
        worker.writers.durability = self.options.durability
        state = worker.state
        pk = list(state.primary_key)
        seq = self.options.sequence_field
        # Newest row per key: by sequence (when configured), then Kafka (partition, offset).
        sort_keys = ([(seq, "ascending")] if seq else []) + [(ORDER, "ascending")]
        rows = rows.sort_by(sort_keys)
        stats = worker.writers.shard_stats(shard_id)
        before = stats.snapshot()
        drop_stale = bool(seq and self.options.drop_stale_across_batches)
        # Writes decided from what is stored (dropping stale rows, merging partial records) are
        # decided as the shard's owner and never written through another claim: a writer fenced
        # since it decided (a zombie task of a stopped query, a task retried elsewhere) may
        # find a newer version stored by the other writer, which the decision did not see.
        # So: claim, decide, write; fenced, decide again (see ShardWriterPool.claim).
        decided = drop_stale or self.options.merge == "partial"
        key_schema = pa.schema([state.write_schema.field(c) for c in pk])
        for attempt in range(_DECIDE_ATTEMPTS if decided else 1):
            if decided:
                worker.writers.claim(shard_id, values)
            written, stale = rows, 0
            if self.options.merge == "partial":
                if drop_stale:  # per record, before folding: a stale record must not set any column
                    written, stale = _drop_stale(worker, shard_id, rows, str(seq), self.storage)
                dels, ups = _fold_partial(worker, shard_id, written)
                failpoint(f"sink.decided.batch-{self.batch_id}")  # interleaving tests: decided, not written
            else:
                newest = newest_per_key(rows, pk)
                if drop_stale:
                    newest, stale = _drop_stale(worker, shard_id, newest, str(seq), self.storage)
                failpoint(f"sink.decided.batch-{self.batch_id}")
                deletes_mask = newest.column(DELETE)
                dels = newest.filter(deletes_mask)
                ups = newest.filter(pc.invert(deletes_mask))
            try:
                if dels.num_rows:
                    worker.writers.write(trusted_batch(shard_id, values, dels.select(pk), dels.column(SHARD), key_schema, deletes=True),
                                         retry_fenced=not decided)
                if ups.num_rows:
                    worker.writers.write(trusted_batch(shard_id, values, ups.select(state.write_schema.names), ups.column(SHARD), state.write_schema),
                                         retry_fenced=not decided)
            except FencedError:
                if attempt == _DECIDE_ATTEMPTS - 1:
                    raise
                log.info("shard %s: fenced after deciding what to write; deciding again", shard_id)
                continue
            break
        if drop_stale:
            if dels.num_rows:
                from memwal.streaming.deleted import deleted_sequences_uri, record_deletes

                record_deletes(deleted_sequences_uri(self.uri), dels.select(pk + [str(seq)]), shard_id, self.storage)
            _remember_written(worker, shard_id, dels, ups, str(seq))
        failpoint(f"sink.wrote.batch-{self.batch_id}")  # crash tests: some shards written, not all
        flushed = False
        interval = self.options.flush_interval_seconds
        if interval is not None:
            now = time.monotonic()
            last = worker.last_flush.setdefault(shard_id, now)
            if now - last >= interval:
                worker.writers.flush([shard_id])
                worker.last_flush[shard_id] = time.monotonic()
                flushed = True
        return _summary(
            shard_id,
            rows=written.num_rows,
            upserts=ups.num_rows,
            deletes=dels.num_rows,
            stale_dropped=stale,
            fenced_retries=stats.fenced_retries - before["fenced_retries"],
            writer_opens=stats.opens - before["opens"],
            flushed=flushed,
            seconds=time.perf_counter() - t0,
            stall_seconds=stats.stall_seconds - before["stall_seconds"],
        )


def _fold_partial(worker: WorkerTable, shard_id: str, rows: pa.Table) -> tuple[pa.Table, pa.Table]:
    """(keys to delete, full rows to upsert) of one shard's partial records, in order: folded
    per key, then merged over the stored rows of the keys that need them, read strongly
    (this task alone writes the shard, and every earlier write of it is in its WAL)."""
    state = worker.state
    pk = list(state.primary_key)
    data = rows.select(state.write_schema.names)
    folded = fold(data, rows.column(PRESENT), rows.column(DELETE), pk)
    need = folded.needs_stored
    stored = worker.stored_rows(shard_id, folded.rows.filter(pa.array(need)).select(pk)) if need.any() else None
    dels, ups = resolve(folded, stored, pk)
    # Every row here carried this shard id (the task split its rows by it): the folded rows keep it.
    return tuple(t.append_column(SHARD, pa.array([shard_id] * t.num_rows, pa.string())) for t in (dels, ups))  # type: ignore[return-value]


def _key_tuples(rows: pa.Table, pk: list[str]) -> list[tuple[Any, ...]]:
    return list(zip(*(rows.column(c).to_pylist() for c in pk)))


def _drop_stale(worker: WorkerTable, shard_id: str, rows: pa.Table, seq: str, storage: StorageConfig | None = None) -> tuple[pa.Table, int]:
    """Rows (one per key) whose sequence is not older than the stored version of their key.

    Stored sequences come from what this worker wrote to the shard (see
    :class:`~memwal.streaming.worker.StoredSequences`); only keys it does not know are read
    from the table, in this shard, and from the deletes recorded beside it
    (:mod:`memwal.streaming.deleted`): the newer of the live row and the last delete counts.
    """
    from memwal.streaming.deleted import deleted_sequences_uri, read_deletes

    pk = list(worker.state.primary_key)
    cache = worker.sequences(shard_id, check_owner=True)
    if cache.deleted is None:
        cache.deleted = read_deletes(deleted_sequences_uri(worker.state.uri), shard_id, pk, seq, storage)
    keys = _key_tuples(rows, pk)
    stored = {k: cache.known[k] for k in keys if k in cache.known}
    missing = [i for i, k in enumerate(keys) if k not in stored]
    if missing:
        found = worker.stored_sequences(shard_id, rows.take(pa.array(missing, pa.int64())).select(pk), seq)
        looked_up = dict(zip(_key_tuples(found, pk), found.column(seq).to_pylist()))
        for i in missing:
            live, gone = looked_up.get(keys[i]), cache.deleted.get(keys[i])
            stored[keys[i]] = live if gone is None else gone if live is None else max(live, gone)
    keep = [i for i, (k, s) in enumerate(zip(keys, rows.column(seq).to_pylist())) if stored[k] is None or s >= stored[k]]
    if len(keep) == rows.num_rows:
        return rows, 0
    return rows.take(pa.array(keep, pa.int64())), rows.num_rows - len(keep)


def _remember_written(worker: WorkerTable, shard_id: str, dels: pa.Table, ups: pa.Table, seq: str) -> None:
    """Record the sequences just written (deleted keys: no live row). If this write
    (re)opened the shard's writer, :meth:`WorkerTable.sequences` has started over and only
    what was just written is known."""
    cache = worker.sequences(shard_id)
    pk = list(worker.state.primary_key)
    # A delete's sequence too: a replay older than the delete is stale like one older than an
    # upsert. The table keeps no row for it; the deletes recorded beside the table
    # (memwal.streaming.deleted) carry it over to the next writer generation.
    cache.remember(_key_tuples(dels, pk), dels.column(seq).to_pylist())
    if cache.deleted is not None:
        cache.deleted.update(zip(_key_tuples(dels, pk), dels.column(seq).to_pylist()))
    cache.remember(_key_tuples(ups, pk), ups.column(seq).to_pylist())


def _with_timing(summary: pa.RecordBatch, timing: dict[str, float]) -> pa.RecordBatch:
    """``summary`` with the task's phase timings set (none: unchanged)."""
    if not timing:
        return summary
    row = summary.to_pylist()[0]
    row.update(timing)
    return pa.RecordBatch.from_pylist([row], schema=SUMMARY_SCHEMA)


def _summary(shard: str, **counters: Any) -> pa.RecordBatch:
    row = {f.name: 0 for f in SUMMARY_SCHEMA}
    row.update(shard=shard, flushed=False, seconds=0.0, stall_seconds=0.0, pid=os.getpid())
    row.update(counters)
    return pa.RecordBatch.from_pylist([row], schema=SUMMARY_SCHEMA)


# ---------------------------------------------------------------------------------------
# The sink (driver side)
# ---------------------------------------------------------------------------------------


#: Reports a sink keeps (for :meth:`MemwalSink.report`); totals count every batch regardless.
KEPT_REPORTS = 1000

#: The JVM exceptions Spark counts as a query's stop (StreamExecution.isInterruptionException).
_INTERRUPTIONS = ("java.lang.InterruptedException", "java.io.InterruptedIOException", "java.nio.channels.ClosedByInterruptException")


def spark_interruption(e: BaseException) -> str | None:
    """The JVM interruption behind ``e`` (a Py4J or PySpark error), or None if it is not one."""
    try:
        text = str(e)  # a Py4J error renders its Java cause chain and stack
    except Exception:  # noqa: BLE001 - an error that cannot render is not recognisably an interruption
        return None
    return next((name for name in _INTERRUPTIONS if name in text), None)


class MemwalSink:
    """A ``foreachBatch`` sink writing micro-batches into a memwal table.

    >>> sink = MemwalSink("/data/users", SinkOptions(source="kafka-json"))
    >>> kafka_df.writeStream.foreachBatch(sink).option("checkpointLocation", ckpt).start()

    Prefer ``sink.prepare(df)`` on the streaming DataFrame (it adds observed metrics to the
    query's progress); a DataFrame passed unprepared is prepared inside each batch.

    ``storage_options`` (Lance's key names, or a resolved
    :class:`~memwal.storage.StorageConfig`) override the standard environment variables of
    the driver; the result travels to the executors with each stage.
    """

    def __init__(
        self,
        table_uri: str,
        options: SinkOptions | None = None,
        storage_options: "dict[str, str] | StorageConfig | None" = None,
    ) -> None:
        from memwal import paths
        from memwal.streaming.dead_letters import dead_letter_uri

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
            from memwal.streaming.deleted import deleted_sequences_uri, ensure_table

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
        #: The most recent :data:`KEPT_REPORTS` micro-batches' reports, oldest first.
        self.reports: list[BatchReport] = []
        #: Counters summed over every micro-batch this sink ran: kept apart from ``reports``,
        #: which forgets old batches, so totals keep growing however long the query runs.
        self._totals: dict[str, float] = {"batches": 0}
        self._report_lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        """What travels when the sink is pickled: over Spark Connect ``foreachBatch(sink)`` runs
        in a Python process of the server. The lock cannot be pickled, and the reports are this
        process's own: the copy starts with none (its reports reach the client as the query's
        observed metrics, see :meth:`observe`, and the server's log)."""
        state = dict(self.__dict__)
        del state["_report_lock"]
        state["reports"] = []
        state["_totals"] = {"batches": 0}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._report_lock = threading.Lock()

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
        try:
            self._write_batch(df, batch_id)
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
        summaries = exchanged.mapInArrow(write, spark_schema(SUMMARY_SCHEMA)).collect()
        report = BatchReport(batch_id=batch_id, job_seconds=time.perf_counter() - t_job, stages=1 if single else 2)
        for s in summaries:
            report.rows += s.rows
            report.upserts += s.upserts
            report.deletes += s.deletes
            report.stale_dropped += s.stale_dropped
            report.dead_letters += s.dead_letters
            report.skipped += s.skipped
            report.fenced_retries += s.fenced_retries
            report.writer_opens += s.writer_opens
            report.flushes += int(s.flushed)
            report.read_seconds += s.read_seconds
            report.prepare_seconds += s.prepare_seconds
            report.exchange_seconds += s.exchange_seconds
            report.stall_seconds_max = max(report.stall_seconds_max, s.stall_seconds or 0.0)
            if s.shard:
                report.shards += 1
                report.write_seconds += s.seconds
                report.write_seconds_max = max(report.write_seconds_max, s.seconds)
        report.rows += report.dead_letters + report.skipped
        report.seconds = time.perf_counter() - t0
        self._record(report)
        log.info("%s", report.line())

    def _record(self, report: BatchReport) -> None:
        with self._report_lock:
            self.reports.append(report)
            del self.reports[:-KEPT_REPORTS]
            for k, v in asdict(report).items():
                if k != "batch_id" and isinstance(v, (int, float)):
                    self._totals[k] = self._totals.get(k, 0) + v
            self._totals["batches"] += 1

    def report(self, batch_id: int) -> BatchReport | None:
        with self._report_lock:
            for r in reversed(self.reports):
                if r.batch_id == batch_id:
                    return r
        return None

    def totals(self) -> dict[str, float]:
        """Every counter of :class:`BatchReport` summed over all the micro-batches this sink
        ran in this process (``batches``: how many), not only the reports it still keeps."""
        with self._report_lock:
            return dict(self._totals)


__all__ = [
    "BatchReport",
    "MemwalSink",
    "SinkOptions",
    "partition_keys",
]
