"""Records as they travel between processes: Arrow IPC, one format for all.

A shard's records (:class:`~memwal.write.protocol.ShardRecords`) leave the process that routed
them as *routed rows*: each row's shard id, arrival order and operation beside the table's
columns exactly as writers take them (types, nullability, primary-key metadata), and for
partial records the columns each one carries (:data:`~memwal.core.partial.PRESENT`). The shards'
values ride in the schema metadata (:data:`SHARDS_KEY`), so the receiver recomputes nothing.
Records that cannot be written travel as :data:`DEAD_SCHEMA` rows. Who sends them: a Spark
task to the executor's writer process (:mod:`memwal.write.process`), the Spark sink's prepare
stage to its write tasks through Spark's exchange (:mod:`memwal.streaming.exchange`), a task's
commit message to the driver (:mod:`memwal.write.api`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal.core.partial import PRESENT
from memwal.core.routing import check_row_shards
from memwal.core.sharding import ShardValues
from memwal.write.messages import DELETE, ORDER, SHARD, SHARDS_KEY, from_payload, ipc_buffer
from memwal.write.protocol import ShardRecords


def routed_schema(write_schema: pa.Schema, presence: pa.StructType | None = None) -> pa.Schema:
    """The schema of routed rows: each row's shard id, arrival order and operation, then the
    table's columns as writers take them; with ``presence`` (partial records), last the
    columns each record carries."""
    internal = [pa.field(SHARD, pa.string(), nullable=False), pa.field(ORDER, pa.int64()), pa.field(DELETE, pa.bool_())]
    tail = [pa.field(PRESENT, presence, nullable=False)] if presence is not None else []
    return pa.schema(internal + list(write_schema) + tail)


def with_shards(rows: pa.Table, shards: dict[str, ShardValues]) -> pa.Table:
    """``rows`` (routed) with the values of their shards in the schema metadata."""
    return rows.replace_schema_metadata({SHARDS_KEY: json.dumps({sid: list(v) for sid, v in shards.items()}).encode()})


def shards_of(rows: pa.Table) -> dict[str, ShardValues]:
    """The shard values routed rows carry in their metadata."""
    meta = rows.schema.metadata or {}
    return {sid: tuple(v) for sid, v in json.loads(meta.get(SHARDS_KEY, b"{}")).items()}


def routed_rows(records: Sequence[ShardRecords], write_schema: pa.Schema | None = None) -> pa.Table:
    """Shards' records as one table of routed rows (their shards' values in the metadata).
    ``write_schema``: the columns to carry (default: the first records' own, which every
    record then has: the table's columns, or its key columns for deletes only)."""
    if write_schema is None:
        write_schema = records[0].rows.schema if records else pa.schema([])
    presence = next((r.present.type for r in records if r.present is not None), None)
    schema = routed_schema(write_schema, presence)
    parts = []
    for r in records:
        n = r.rows.num_rows
        deletes = np.zeros(n, bool) if r.deletes is None else np.asarray(r.deletes, bool)
        order = np.arange(n, dtype=np.int64) if r.order is None else np.asarray(r.order, np.int64)
        sid = pa.array([r.shard_id], pa.string()).take(pa.array(np.zeros(n, np.int64)))
        cols = [sid, pa.array(order, pa.int64()), pa.array(deletes, pa.bool_())]
        for f in write_schema:
            cols.append(r.rows.column(f.name) if f.name in r.rows.schema.names else pa.nulls(n, f.type))
        if presence is not None:
            cols.append(r.present)
        parts.append(pa.Table.from_arrays(cols, schema=schema))
    table = pa.concat_tables(parts) if parts else schema.empty_table()
    return with_shards(table, {r.shard_id: r.values for r in records})


def shard_records(rows: pa.Table, shards: dict[str, ShardValues] | None = None) -> list[ShardRecords]:
    """Routed rows back as each shard's records, in the order the shards first appear, with
    the table columns they carry: those of the table as the sender prepared them, which may be
    newer than the receiver's (a column added since, :mod:`memwal.maintain.evolve`: the receiver's write
    path reloads the table then).

    The routing is trusted (the sender routed them) after a cheap check that every row of a
    shard's slice names that shard."""
    shards = shards_of(rows) if shards is None else shards
    if rows.num_rows == 0:
        return []
    columns = [c for c in rows.schema.names if c not in (SHARD, ORDER, DELETE, PRESENT)]
    column = rows.column(SHARD)
    ids = pc.unique(column).to_pylist()
    out = []
    for sid in ids:
        mine = rows if len(ids) == 1 else rows.filter(pc.equal(column, sid))
        check_row_shards(sid, mine.column(SHARD))
        out.append(ShardRecords(
            sid,
            shards[sid],
            mine.select(columns),
            deletes=np.asarray(mine.column(DELETE).to_numpy(zero_copy_only=False), bool),
            order=mine.column(ORDER).to_numpy(),
            present=mine.column(PRESENT) if PRESENT in mine.schema.names else None,
        ))
    return out


def records_payload(records: ShardRecords) -> pa.Buffer:
    """One shard's records as an Arrow IPC stream: its rows, each row's operation and arrival
    order, and for partial records their presence (the shard travels beside it)."""
    rows = records.rows
    n = rows.num_rows
    rows = rows.append_column(pa.field(DELETE, pa.bool_()),
                              pa.array(np.zeros(n, bool) if records.deletes is None else np.asarray(records.deletes, bool)))
    if records.order is not None:
        rows = rows.append_column(pa.field(ORDER, pa.int64()), pa.array(np.asarray(records.order, np.int64)))
    if records.present is not None:
        rows = rows.append_column(pa.field(PRESENT, records.present.type, nullable=False), records.present)
    return ipc_buffer(rows)


def records_from_payload(shard_id: str, values: ShardValues, payload: pa.Buffer | bytes | bytearray) -> ShardRecords:
    """What :func:`records_payload` sent (read without copying the rows out of ``payload``)."""
    rows = from_payload(payload if isinstance(payload, (pa.Buffer, bytes)) else pa.py_buffer(payload))
    names = rows.schema.names
    extra = [c for c in (DELETE, ORDER, PRESENT) if c in names]
    return ShardRecords(
        shard_id,
        values,
        rows.drop_columns(extra),
        deletes=np.asarray(rows.column(DELETE).to_numpy(zero_copy_only=False), bool),
        order=rows.column(ORDER).to_numpy() if ORDER in names else None,
        present=rows.column(PRESENT) if PRESENT in names else None,
    )
