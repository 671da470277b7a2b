"""The sink's wire format: what travels between its stages.

The prepare stage hands Spark one row per (input batch, write partition) holding the routed
rows and the dead letters as Arrow IPC payloads (:data:`EXCHANGE_SCHEMA`): Spark shuffles a
few opaque blobs instead of converting every row (vectors especially) to its internal format
and back. Routed rows carry their shard, their Kafka order and their operation beside the
table's columns (:func:`routed_schema`); a payload's metadata names its shards' values. The
write task answers with one summary row per shard (:data:`SUMMARY_SCHEMA`).

Which write task takes which shard: :func:`partition_keys` and :func:`shard_partitions`.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal.core.sharding import ShardingSpec, ShardValues
from memwal.streaming.sink_options import SinkOptions
from memwal.write.messages import DELETE, SHARD, SHARDS_KEY, to_payload

if TYPE_CHECKING:
    from memwal.write.api import WriteBatch

#: The write partition (task) each routed row goes to; the other internal columns and the
#: payload format are the write side's (:mod:`memwal.write.wire`).
PART = "__memwal_part"

@functools.lru_cache(maxsize=64)
def partition_keys(n: int) -> tuple[int, ...]:
    """For every p in [0, n), an int whose Spark hash partition among n partitions is p.

    ``repartition(n, col)`` puts a row in ``pmod(murmur3(col, seed 42), n)``; choosing the
    column value per target partition gives a one-to-one shard -> task mapping without a
    custom partitioner (which the DataFrame API does not have).
    """
    from memwal.core.transforms import murmur3_int32

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
        # The input batch's oldest and newest Kafka timestamp (epoch ms), on the same row.
        pa.field("min_timestamp_ms", pa.int64()),
        pa.field("max_timestamp_ms", pa.int64()),
    ]
)

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

    def write_batch(self, read_seconds: float, prepare_seconds: float,
                    timestamps: tuple[int | None, int | None] = (None, None)) -> "WriteBatch":
        """What the write API takes of it when the task that prepared it also writes it (no
        exchange): each shard's records (the columns it was prepared with), the dead letters,
        the counts and timings."""
        # Here, not at the top: the driver's side of the sink imports this module and no Lance.
        from memwal.write.api import WriteBatch
        from memwal.write.wire import shard_records

        records = shard_records(self.rows.drop_columns([PART]), self.shards)
        return WriteBatch(records, self.dead, self.skipped, read_seconds, prepare_seconds, *timestamps)



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
