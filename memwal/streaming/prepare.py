"""The sink's prepare stage: decode, validate and route every record, once.

Runs on the executors: as ``mapInArrow`` over the source DataFrame, or inside the Kafka
source's read task as its batch mapper (:meth:`Prepare.from_json` is the factory). Good rows
leave conformed to the table's write schema with their shard, write partition and Kafka order;
bad ones with the reason and their Kafka coordinates (dead letters). The write task trusts the
routing (:mod:`memwal.streaming.exchange` is the format between them).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal.core.lance_errors import is_commit_conflict
from memwal.core.partial import presence_of_columns, presence_type
from memwal.core.routing import shard_codes
from memwal.core.sharding import ShardValues
from memwal.core.state import TableState
from memwal.core.storage import StorageConfig
from memwal.write.dead_letters import record_json
from memwal.write.messages import DEAD_SCHEMA, OFFSET_BITS
from memwal.write.wire import routed_schema
from memwal.write.worker import WORKER
from memwal.streaming.decode import ValueDecoder, check_rows, json_presence, operations, value_decoder
from memwal.streaming.exchange import EXCHANGE_SCHEMA, PART, Prepared, exchange_rows, shard_partitions
from memwal.streaming.sink_options import SinkOptions

log = logging.getLogger("memwal.streaming")


#: Tries of one schema change a batch's source asks for, while other tasks commit parts of it.
EVOLVE_ATTEMPTS = 5


class Prepare:
    """The prepare stage, pickled to executors (``mapInArrow``), or run inside the Kafka
    source's read task as its batch mapper (:meth:`from_json` is the factory)."""

    #: The factory, as the Kafka source's ``memwal.batchMapper`` option names it.
    FACTORY = "memwal.streaming.prepare:Prepare.from_json"

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
        #: Source fields this task could not add as columns (see :meth:`_evolve`): not tried again.
        self._not_added: set[str] = set()
        #: The table as :meth:`_evolve` last reloaded it: newer than a state a caller kept.
        self._evolved: TableState | None = None

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

        ctx = TaskContext.get()
        task_partition = ctx.partitionId() if ctx is not None else 0
        n = shard_partitions(WORKER.table(self.uri, self.storage).state.spec, self.options)
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
            # Per batch: a batch before this one may have added columns (_evolve reloads the table).
            state = WORKER.table(self.uri, self.storage).state
            prepared = self.prepare(state, pa.Table.from_batches([batch]), task_partition, row, n)
            row += batch.num_rows
            out = exchange_rows(prepared)
            if out:
                out[0]["read_seconds"] = t1 - t0
                out[0]["prepare_seconds"] = time.perf_counter() - t1
                if self.options.source != "columns":  # a table's own column may be named "timestamp"
                    out[0]["min_timestamp_ms"], out[0]["max_timestamp_ms"] = timestamp_range(batch)
            yield pa.RecordBatch.from_pylist(out, schema=EXCHANGE_SCHEMA)

    def prepare(self, state: TableState, data: pa.Table, task_partition: int, first_row: int, n: int) -> Prepared:
        """Decode, validate and route ``data``: every good row conformed to the table's write
        schema with its shard and write partition, every bad row with its reason."""
        if self._evolved is not None:  # this task added columns: the caller's state predates them
            state = self._evolved
        opts = self.options
        count = data.num_rows
        errors: dict[int, str] = {}
        if opts.source == "kafka-json":
            topic = data.column("topic")
            kpart = data.column("partition").cast(pa.int32())
            offset = data.column("offset").cast(pa.int64())
            order = (np.asarray(kpart.to_numpy(), dtype=np.int64) << OFFSET_BITS) | np.asarray(offset.to_numpy(), dtype=np.int64)
            raw = data.column("value")
            kkey = data.column("key")
            if self._decoder is None:  # one task, one table state: the same decoder for every batch
                self._decoder = value_decoder(state.schema, opts.value_format, op_field=opts.op_field,
                                              sequence_field=opts.sequence_field, primary_key=state.primary_key,
                                              avro_schema=opts.avro_schema, avro_schema_id=opts.avro_schema_id,
                                              schema_registry=opts.schema_registry)
            decoder = self._decoder
            decoded = decoder.decode_batch(raw, kkey)
            wider = decoded.wider_columns if opts.evolve == "compatible" else {}
            new = decoded.new_columns if opts.evolve != "none" else {}
            if (set(new) | set(wider)) - self._not_added:
                evolved = self._evolve(state, new, wider)
                if evolved is not None:  # the table has (some of) them now: decode the batch again
                    return self.prepare(evolved, data, task_partition, first_row, n)
            parsed, positions, errors, skipped = decoded.rows, decoded.positions, dict(decoded.errors), decoded.skipped
            op_field = decoder.op_field
        else:
            topic = pa.nulls(count, pa.string())
            kpart = pa.nulls(count, pa.int32())
            offset = pa.nulls(count, pa.int64())
            order = (np.int64(task_partition) << OFFSET_BITS) + first_row + np.arange(count, dtype=np.int64)
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


    def _evolve(self, state: TableState, new: dict[str, pa.Field], wider: dict[str, pa.Field]) -> TableState | None:
        """Add the source's new fields to the table as nullable columns and widen the columns
        the source widened (``SinkOptions.evolve``), then reload it; the reloaded state, or
        None if nothing changed. Tasks of one micro-batch race to make the same change: one
        another made meanwhile is found on reload. A change that cannot be made (a dropped
        column's name while stored data still holds it, a key column widened:
        docs/schema-evolution.md) is logged and not tried again by this task: the field's values
        stay unread, or are converted to the column's type (dead letters where they do not fit)."""
        from memwal.core.errors import MemwalError
        from memwal.maintain.evolve import SchemaUpdate

        def done(s: pa.Schema) -> set[str]:
            return ({n for n in new if n in s.names}
                    | {n for n, f in wider.items() if n in s.names and s.field(n).type.equals(f.type)})

        for attempt in range(EVOLVE_ATTEMPTS):
            todo = (set(new) | set(wider)) - done(state.dataset().schema) - self._not_added
            if not todo:
                break
            update = SchemaUpdate(state)
            for name in todo:
                if name in new:
                    update.add_column(name, new[name].type)
                else:
                    update.widen_column(name, wider[name].type)
            try:
                change = update.commit()
                log.info("table %s: the source's columns changed; added %s, widened %s", self.uri, list(change.added),
                         list(change.widened))
                break
            except (MemwalError, OSError, ValueError) as e:
                if is_commit_conflict(e) and attempt < EVOLVE_ATTEMPTS - 1:
                    # Another task of the micro-batch committed part of the same change first
                    # (its added column, while it widens the next): look again at what is left.
                    # Giving up here left the rest unfollowed for this task, and its rows' wide
                    # values went to dead letters.
                    time.sleep(state.storage.retry.backoff(attempt + 1))
                    state = WORKER.reload(self.uri, self.storage).state
                    continue
                log.warning("table %s: the source's changed fields %s were not followed (%s)", self.uri, sorted(todo), e)
                break
        reloaded = self._evolved = WORKER.reload(self.uri, self.storage).state
        self._decoder = None
        made = done(reloaded.write_schema)
        self._not_added |= (set(new) | set(wider)) - made
        return reloaded if made else None


def timestamp_range(batch: pa.RecordBatch) -> tuple[int | None, int | None]:
    """The oldest and newest Kafka timestamp of a batch of Kafka records in epoch ms (None, None without them)."""
    if "timestamp" not in batch.schema.names or not pa.types.is_timestamp(batch.schema.field("timestamp").type):
        return None, None
    lo_hi = pc.min_max(batch.column("timestamp").cast(pa.timestamp("ms", tz="UTC")).cast(pa.int64()))
    return lo_hi["min"].as_py(), lo_hi["max"].as_py()
