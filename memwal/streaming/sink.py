"""The memwal Spark sink: ``df.writeStream.foreachBatch(MemwalSink(uri))``.

Per micro-batch, entirely on the executors:

1. **prepare** (``mapInArrow``): decode (for Kafka JSON), validate and route every
   record. Good rows get their shard and a partition key; bad ones (null key, unparseable
   value, wrong type, oversized row, unknown operation) get the reason and their Kafka
   coordinates.
2. **write** (``repartition`` by that key, then ``mapInArrow``): one task per shard
   (bucket and unsharded specs map shards to partitions one to one; other specs hash
   shards over a fixed number of partitions, each shard still in exactly one task). The
   task orders the shard's rows by Kafka (partition, offset), or by the sequence column,
   keeps the newest per key, and writes upserts and deletes through a Lance ShardWriter
   cached in the Python worker process across micro-batches. A fenced writer is reopened
   (claimed) and the write retried once. The first partition's task also records the
   batch's bad rows in the dead-letter table.

Only per-shard counters come back to the driver, which logs one line per micro-batch.

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
import zlib
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal.failpoints import failpoint
from memwal.streaming.decode import JsonDecoder, check_rows, operations

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
INTERNAL = [PART, SHARD, ORDER, DELETE, ERROR, TOPIC, KPART, OFFSET, KEY, RAW]

#: Kafka offsets fit in 40 bits for a long time (10^12 records per partition).
_OFFSET_BITS = 40

SUMMARY_SCHEMA = pa.schema(
    [
        ("shard", pa.string()),
        ("rows", pa.int64()),
        ("upserts", pa.int64()),
        ("deletes", pa.int64()),
        ("stale_dropped", pa.int64()),
        ("dead_letters", pa.int64()),
        ("fenced_retries", pa.int64()),
        ("writer_opens", pa.int64()),
        ("flushed", pa.bool_()),
        ("seconds", pa.float64()),
        ("pid", pa.int64()),
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
    #: (docs/benchmarks.md).
    max_write_tasks: int | None = None
    #: Dead-letter table; default ``{table}_dead_letters``.
    dead_letter_uri: str | None = None


@dataclass
class BatchReport:
    """What one micro-batch did (the driver's log line and the listener's metrics)."""

    batch_id: int
    rows: int = 0
    upserts: int = 0
    deletes: int = 0
    stale_dropped: int = 0
    dead_letters: int = 0
    shards: int = 0
    fenced_retries: int = 0
    writer_opens: int = 0
    flushes: int = 0
    seconds: float = 0.0
    write_seconds_max: float = 0.0

    def line(self) -> str:
        return (
            f"batch {self.batch_id}: {self.rows} rows ({self.upserts} upserts, {self.deletes} deletes"
            + (f", {self.stale_dropped} stale" if self.stale_dropped else "")
            + f") into {self.shards} shard(s), {self.dead_letters} dead letter(s), "
            f"{self.fenced_retries} fenced retr{'y' if self.fenced_retries == 1 else 'ies'}, "
            f"{self.writer_opens} writer open(s), {self.flushes} flush(es), {self.seconds:.3f}s"
        )


# ---------------------------------------------------------------------------------------
# Executor-side state: cached per Python worker process, reused across micro-batches.
# ---------------------------------------------------------------------------------------

_TABLES: dict[str, Any] = {}
_LAST_FLUSH: dict[tuple[str, str], float] = {}
_LOCK = threading.Lock()


def _table(uri: str):
    """The worker's Table for ``uri`` (its writer pool keeps one ShardWriter per shard)."""
    with _LOCK:
        t = _TABLES.get(uri)
        if t is None:
            from memwal.table import Table

            t = _TABLES[uri] = Table.open(uri)
        return t


def clear_worker_cache() -> None:
    """Flush and forget the cached tables of this process (tests, shutdown)."""
    with _LOCK:
        for t in _TABLES.values():
            try:
                t.close()
            except Exception:  # noqa: BLE001 - best effort at shutdown
                pass
        _TABLES.clear()
        _LAST_FLUSH.clear()


# ---------------------------------------------------------------------------------------
# Partitioning: shard -> Spark partition, one shard per task where the spec allows it.
# ---------------------------------------------------------------------------------------


@lru_cache(maxsize=64)
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


def _fixed_shard_count(spec) -> int | None:
    from memwal.transforms import Bucket, MultiBucket, Unsharded

    if len(spec.fields) != 1:
        return None
    t = spec.fields[0].transform
    if isinstance(t, Unsharded):
        return 1
    if isinstance(t, (Bucket, MultiBucket)):
        return t.num_buckets
    return None


def shard_partitions(spec, options: SinkOptions) -> int:
    """Number of write partitions (write tasks per micro-batch)."""
    n = _fixed_shard_count(spec) or options.partitions_for_open_specs
    return min(n, options.max_write_tasks) if options.max_write_tasks else n


def _partition_of(spec, values: tuple, shard_id: str, n: int) -> int:
    if _fixed_shard_count(spec) is not None:
        v = values[0]
        return 0 if v is None else int(v) % n
    return zlib.crc32(shard_id.encode()) % n


# ---------------------------------------------------------------------------------------
# Stage 1: prepare (decode, validate, route)
# ---------------------------------------------------------------------------------------


#: What the prepare stage hands to Spark: one row per (input task, write partition) with
#: the prepared rows as an Arrow IPC payload. Spark shuffles a few opaque blobs instead
#: of converting every row (vectors especially) to its internal format and back.
COUNT_ROWS = "rows"
COUNT_DEAD = "dead_letters"
COUNT_DELETES = "deletes"
PAYLOAD = "payload"
EXCHANGE_SCHEMA = pa.schema(
    [
        pa.field(PART, pa.int32()),
        pa.field(COUNT_ROWS, pa.int64()),
        pa.field(COUNT_DEAD, pa.int64()),
        pa.field(COUNT_DELETES, pa.int64()),
        pa.field(PAYLOAD, pa.binary()),
    ]
)


def to_payload(rows: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rows.schema) as w:
        w.write_table(rows)
    return sink.getvalue().to_pybytes()


def from_payload(data: bytes) -> pa.Table:
    with pa.ipc.open_stream(data) as r:
        return r.read_all()


def prepared_schema(table_schema: pa.Schema) -> pa.Schema:
    """The schema of prepared rows inside a payload."""
    internal = [
        pa.field(PART, pa.int32()),
        pa.field(SHARD, pa.string()),
        pa.field(ORDER, pa.int64()),
        pa.field(DELETE, pa.bool_()),
        pa.field(ERROR, pa.string()),
        pa.field(TOPIC, pa.string()),
        pa.field(KPART, pa.int32()),
        pa.field(OFFSET, pa.int64()),
        pa.field(KEY, pa.binary()),
        pa.field(RAW, pa.binary()),
    ]
    return pa.schema(internal + [pa.field(f.name, f.type, nullable=True) for f in table_schema])


class Prepare:
    """The prepare stage, pickled to executors (``mapInArrow``), or run inside the Kafka
    source's read task (``memwal.prepare`` option)."""

    def __init__(self, uri: str, options: SinkOptions) -> None:
        self.uri = uri
        self.options = options

    def to_json(self) -> str:
        return json.dumps({"uri": self.uri, "options": asdict(self.options)})

    @classmethod
    def from_json(cls, text: str) -> "Prepare":
        d = json.loads(text)
        return cls(d["uri"], SinkOptions(**d["options"]))

    def spark_schema(self):
        return spark_schema(EXCHANGE_SCHEMA)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Exchange rows (see :data:`EXCHANGE_SCHEMA`) for ``batches``."""
        from pyspark import TaskContext

        table = _table(self.uri)
        ctx = TaskContext.get()
        task_partition = ctx.partitionId() if ctx is not None else 0
        schema = prepared_schema(table.schema)
        n = shard_partitions(table.spec, self.options)
        row = 0
        for batch in batches:
            if batch.num_rows == 0:
                continue
            out = self.prepare(table, pa.Table.from_batches([batch]), task_partition, row, n).cast(schema)
            row += batch.num_rows
            parts = out.column(PART)
            exchange = []
            for part in pc.unique(parts).to_pylist():
                rows = out.filter(pc.equal(parts, part))
                bad = pc.is_valid(rows.column(ERROR))
                exchange.append(
                    {
                        PART: part,
                        COUNT_ROWS: rows.num_rows,
                        COUNT_DEAD: pc.sum(bad.cast(pa.int64())).as_py() or 0,
                        COUNT_DELETES: pc.sum(pc.and_(rows.column(DELETE), pc.invert(bad)).cast(pa.int64())).as_py() or 0,
                        PAYLOAD: to_payload(rows),
                    }
                )
            yield pa.RecordBatch.from_pylist(exchange, schema=EXCHANGE_SCHEMA)

    def prepare(self, table, data: pa.Table, task_partition: int, first_row: int, n: int) -> pa.Table:
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
            decoder = JsonDecoder(table.schema, opts.op_field, opts.sequence_field)
            parsed, positions, errors = decoder.decode(raw.to_pylist())
        else:
            topic = pa.nulls(count, pa.string())
            kpart = pa.nulls(count, pa.int32())
            offset = pa.nulls(count, pa.int64())
            order = (np.int64(task_partition) << _OFFSET_BITS) + first_row + np.arange(count, dtype=np.int64)
            kkey = pa.nulls(count, pa.binary())
            raw = None
            parsed, positions = data, np.arange(count)
        # Operation and sequence
        deletes_p, op_errors = operations(parsed, opts.op_field)
        for i, reason in op_errors.items():
            errors[int(positions[i])] = reason
        if opts.sequence_field:
            if opts.sequence_field not in parsed.schema.names:
                seq_null = np.ones(parsed.num_rows, bool)
            else:
                seq_null = np.asarray(parsed.column(opts.sequence_field).is_null())
            for i in np.flatnonzero(seq_null):
                errors.setdefault(int(positions[i]), f"the sequence field {opts.sequence_field!r} is null or missing")
        keep = np.array([i for i in range(parsed.num_rows) if int(positions[i]) not in errors], dtype=np.int64)
        parsed = parsed.take(pa.array(keep, pa.int64()))
        positions = positions[keep]
        deletes_p = deletes_p[keep]
        rows, good, row_errors = check_rows(parsed, table.write_schema, table.primary_key, opts.max_row_bytes)
        for i, reason in row_errors.items():
            errors[int(positions[i])] = reason
        positions = positions[good]
        deletes_p = deletes_p[good]

        # Route the good rows.
        parts_out = np.zeros(len(positions), np.int32)
        shards_out: list[str] = [""] * len(positions)
        if len(positions):
            arrays = table.spec.shard_value_arrays(rows)
            from memwal.routing import shard_codes

            codes, values = shard_codes(arrays)
            ids = [table.shard_id_of(v) for v in values]
            parts = np.asarray([_partition_of(table.spec, v, sid, n) for v, sid in zip(values, ids)], dtype=np.int32)
            parts_out = parts[codes]
            shards_out = [ids[c] for c in codes]

        pos_pa = pa.array(positions, pa.int64())
        good_cols: dict[str, pa.Array | pa.ChunkedArray] = {
            PART: pa.array(parts_out, pa.int32()),
            SHARD: pa.array(shards_out, pa.string()),
            ORDER: pa.array(order[positions], pa.int64()),
            DELETE: pa.array(deletes_p, pa.bool_()),
            ERROR: pa.nulls(len(positions), pa.string()),
            TOPIC: topic.take(pos_pa),
            KPART: kpart.take(pos_pa),
            OFFSET: offset.take(pos_pa),
            KEY: pa.nulls(len(positions), pa.binary()),
            RAW: pa.nulls(len(positions), pa.binary()),
        }
        for f in table.schema:
            good_cols[f.name] = rows.column(f.name)
        good_table = pa.table(good_cols)
        if not errors:
            return good_table

        bad = np.array(sorted(errors), dtype=np.int64)
        bad_pa = pa.array(bad, pa.int64())
        if raw is not None:
            raw_bad = raw.take(bad_pa)
        else:
            raw_bad = pa.array([_row_json(data, int(i)).encode() for i in bad], pa.binary())
        bad_cols = {
            PART: pa.array([0] * len(bad), pa.int32()),  # partition 0 records them
            SHARD: pa.array([""] * len(bad), pa.string()),
            ORDER: pa.array(order[bad], pa.int64()),
            DELETE: pa.array([False] * len(bad), pa.bool_()),
            ERROR: pa.array([errors[int(i)] for i in bad], pa.string()),
            TOPIC: topic.take(bad_pa),
            KPART: kpart.take(bad_pa),
            OFFSET: offset.take(bad_pa),
            KEY: kkey.take(bad_pa),
            RAW: raw_bad,
        }
        for f in table.schema:
            bad_cols[f.name] = pa.nulls(len(bad), f.type)
        return pa.concat_tables([good_table, pa.table(bad_cols).cast(good_table.schema)])


def spark_schema(schema: pa.Schema):
    """The Spark StructType of an Arrow schema (what ``mapInArrow`` takes)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


def _row_json(data: pa.Table, i: int) -> str:
    from memwal.formats import row_to_json

    return row_to_json(data.slice(i, 1).to_pylist()[0])


# ---------------------------------------------------------------------------------------
# Stage 2: write (one task per shard; the last partition holds dead letters)
# ---------------------------------------------------------------------------------------


class Write:
    """The write stage, pickled to executors (``mapInArrow`` after ``repartition``)."""

    def __init__(self, uri: str, options: SinkOptions, batch_id: int, dead_letter_uri: str) -> None:
        self.uri = uri
        self.options = options
        self.batch_id = batch_id
        self.dead_letter_uri = dead_letter_uri

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        tables = [from_payload(p) for b in batches for p in b.column(PAYLOAD).to_pylist() if p]
        if not tables:
            return
        data = pa.concat_tables(tables)
        errors = data.column(ERROR)
        bad_mask = pc.is_valid(errors)
        if pc.any(bad_mask).as_py():
            yield self._dead_letters(data.filter(bad_mask))
            data = data.filter(pc.invert(bad_mask))
        if data.num_rows == 0:
            return
        shards = data.column(SHARD)
        ids = pc.unique(shards).to_pylist()
        if len(ids) == 1:
            yield self._write_shard(ids[0], data)
            return
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(8, len(ids))) as pool:
            futures = [pool.submit(self._write_shard, sid, data.filter(pc.equal(shards, sid))) for sid in ids]
            for f in futures:
                yield f.result()

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
        write_dead_letters(self.dead_letter_uri, rows)
        return _summary("", rows=0, dead_letters=n, seconds=time.perf_counter() - t0)

    def _write_shard(self, shard_id: str, rows: pa.Table) -> pa.RecordBatch:
        t0 = time.perf_counter()
        table = _table(self.uri)
        pk = list(table.primary_key)
        seq = self.options.sequence_field
        # Newest row per key: by sequence (when configured), then Kafka (partition, offset).
        sort_keys = ([(seq, "ascending")] if seq else []) + [(ORDER, "ascending")]
        rows = rows.sort_by(sort_keys)
        from memwal.lsm import newest_per_key

        newest = newest_per_key(rows.select(pk + [c for c in rows.schema.names if c not in pk]), pk)
        stale = 0
        if seq and self.options.drop_stale_across_batches:
            newest, stale = _drop_stale(table, shard_id, newest, seq)
        deletes_mask = newest.column(DELETE)
        dels = newest.filter(deletes_mask).select(pk)
        ups = newest.filter(pc.invert(deletes_mask)).select(table.schema.names)
        stats = table.writers.stats
        before = (stats.fenced_retries, stats.opens)
        first = (ups if ups.num_rows else dels).slice(0, 1).to_pylist()[0]
        values = table.spec.shard_values_of(first, table.schema)
        if dels.num_rows:
            table.write_shard(shard_id, values, dels, deletes=True)
        if ups.num_rows:
            table.write_shard(shard_id, values, ups)
        failpoint(f"sink.wrote.batch-{self.batch_id}")  # crash tests: some shards written, not all
        flushed = False
        interval = self.options.flush_interval_seconds
        if interval is not None:
            key = (self.uri, shard_id)
            now = time.monotonic()
            last = _LAST_FLUSH.setdefault(key, now)
            if now - last >= interval:
                table.writers.flush([shard_id])
                _LAST_FLUSH[key] = time.monotonic()
                flushed = True
        return _summary(
            shard_id,
            rows=rows.num_rows,
            upserts=ups.num_rows,
            deletes=dels.num_rows,
            stale_dropped=stale,
            fenced_retries=stats.fenced_retries - before[0],
            writer_opens=stats.opens - before[1],
            flushed=flushed,
            seconds=time.perf_counter() - t0,
        )


def _drop_stale(table, shard_id: str, rows: pa.Table, seq: str) -> tuple[pa.Table, int]:
    """Rows whose sequence is not older than the stored version of their key."""
    from memwal.readers import Reader
    from memwal.readers.keys import keys_predicate

    pk = list(table.primary_key)
    reader = Reader(table.state, consistency="strong")
    stored = reader.scan(columns=pk + [seq], where=keys_predicate(rows.select(pk)))
    if stored.num_rows == 0:
        return rows, 0
    stored = stored.rename_columns(pk + ["__stored_seq"])
    # Join keys and positions only: Arrow joins cannot carry every column type (e.g. vectors).
    probe = rows.select(pk + [seq]).append_column("__pos", pa.array(range(rows.num_rows), pa.int64()))
    joined = probe.join(stored, keys=pk, join_type="left outer")
    stored_seq = joined.column("__stored_seq")
    keep = pc.or_kleene(pc.is_null(stored_seq), pc.greater_equal(joined.column(seq), stored_seq))
    positions = pc.sort_indices(joined.filter(keep).column("__pos"))
    kept = rows.take(pc.take(joined.filter(keep).column("__pos"), positions))
    return kept, rows.num_rows - kept.num_rows


def _summary(shard: str, **counters: Any) -> pa.RecordBatch:
    row = {f.name: 0 for f in SUMMARY_SCHEMA}
    row.update(shard=shard, flushed=False, seconds=0.0, pid=os.getpid())
    row.update(counters)
    return pa.RecordBatch.from_pylist([row], schema=SUMMARY_SCHEMA)


# ---------------------------------------------------------------------------------------
# The sink (driver side)
# ---------------------------------------------------------------------------------------


class MemwalSink:
    """A ``foreachBatch`` sink writing micro-batches into a memwal table.

    >>> sink = MemwalSink("/data/users", SinkOptions(source="kafka-json"))
    >>> kafka_df.writeStream.foreachBatch(sink).option("checkpointLocation", ckpt).start()

    Prefer ``sink.prepare(df)`` on the streaming DataFrame (it adds observed metrics to the
    query's progress); a DataFrame passed unprepared is prepared inside each batch.
    """

    def __init__(self, table_uri: str, options: SinkOptions | None = None) -> None:
        from memwal import paths
        from memwal.streaming.dead_letters import dead_letter_uri
        from memwal.state import TableState

        self.uri = paths.normalize_uri(table_uri)
        self.options = options or SinkOptions()
        if self.options.source not in ("columns", "kafka-json"):
            raise ValueError(f"source must be 'columns' or 'kafka-json', got {self.options.source!r}")
        table = TableState.load(self.uri)  # fail early, on the driver, if the table is missing
        seq = self.options.sequence_field
        if seq is not None and seq not in table.schema.names:
            raise ValueError(f"sequence field {seq!r} is not a column of {self.uri}; the stored version must be kept")
        if self.options.drop_stale_across_batches and seq is None:
            raise ValueError("drop_stale_across_batches needs a sequence_field")
        self.schema = table.schema
        self.partitions = shard_partitions(table.spec, self.options)
        self.dead_letter_uri = self.options.dead_letter_uri or dead_letter_uri(self.uri)
        self.reports: list[BatchReport] = []
        self._report_lock = threading.Lock()

    def bind(self, spark) -> "MemwalSink":
        """Fix the number of write tasks from ``spark``'s parallelism (once; the prepare and
        write stages must agree on it for the life of the query)."""
        if self.options.max_write_tasks is None:
            self.options = replace(self.options, max_write_tasks=max(1, spark.sparkContext.defaultParallelism))
            from memwal.state import TableState

            self.partitions = shard_partitions(TableState.load(self.uri).spec, self.options)
        return self

    def prepare_spec(self) -> Prepare:
        """The prepare stage, for running it elsewhere (the Kafka source's ``memwal.prepare``)."""
        return Prepare(self.uri, self.options)

    def prepare(self, df):
        """``df`` decoded, validated and routed (a lazy transformation; streaming DataFrames too)."""
        self.bind(df.sparkSession)
        return df.mapInArrow(self.prepare_spec(), spark_schema(EXCHANGE_SCHEMA))

    def observe(self, prepared, name: str = "memwal"):
        """``prepared`` with observed metrics (rows, upserts, deletes, dead letters, shards)
        that Spark reports in every ``StreamingQueryProgress.observedMetrics[name]``."""
        from pyspark.sql import functions as F

        rows, dead, deletes = F.col(COUNT_ROWS), F.col(COUNT_DEAD), F.col(COUNT_DELETES)
        return prepared.observe(
            name,
            F.coalesce(F.sum(rows), F.lit(0)).alias("rows"),
            F.coalesce(F.sum(dead), F.lit(0)).alias("dead_letters"),
            F.coalesce(F.sum(deletes), F.lit(0)).alias("deletes"),
            F.coalesce(F.sum(rows - dead - deletes), F.lit(0)).alias("upserts"),
        )

    def __call__(self, df, batch_id: int) -> None:
        from pyspark.sql import functions as F

        t0 = time.perf_counter()
        self.bind(df.sparkSession)
        prepared = df if PART in df.columns else self.prepare(df)
        write = Write(self.uri, self.options, batch_id, self.dead_letter_uri)
        # One task per write partition: Spark hash-partitions the magic key of partition p
        # into partition p.
        keys = partition_keys(self.partitions)
        magic = F.element_at(F.array(*[F.lit(k) for k in keys]), F.col(PART) + 1)
        summaries = prepared.repartition(self.partitions, magic).mapInArrow(write, spark_schema(SUMMARY_SCHEMA)).collect()
        report = BatchReport(batch_id=batch_id)
        for s in summaries:
            report.rows += s.rows
            report.upserts += s.upserts
            report.deletes += s.deletes
            report.stale_dropped += s.stale_dropped
            report.dead_letters += s.dead_letters
            report.fenced_retries += s.fenced_retries
            report.writer_opens += s.writer_opens
            report.flushes += int(s.flushed)
            report.write_seconds_max = max(report.write_seconds_max, s.seconds)
            if s.shard:
                report.shards += 1
        report.rows += report.dead_letters
        report.seconds = time.perf_counter() - t0
        with self._report_lock:
            self.reports.append(report)
            del self.reports[:-1000]
        log.info("%s", report.line())

    def report(self, batch_id: int) -> BatchReport | None:
        with self._report_lock:
            for r in reversed(self.reports):
                if r.batch_id == batch_id:
                    return r
        return None

    def totals(self) -> dict[str, float]:
        with self._report_lock:
            reports = list(self.reports)
        out: dict[str, float] = {}
        for r in reports:
            for k, v in asdict(r).items():
                if k != "batch_id" and isinstance(v, (int, float)):
                    out[k] = out.get(k, 0) + v
        out["batches"] = len(reports)
        return out


def progress_json(report: BatchReport) -> str:
    return json.dumps(asdict(report), sort_keys=True)


__all__ = [
    "BatchReport",
    "MemwalSink",
    "SinkOptions",
    "clear_worker_cache",
    "partition_keys",
]
