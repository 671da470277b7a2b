"""Kafka partitions that line up with a table's shards: what a producer computes for each record.

``memwal ingest`` writes each micro-batch in the Spark tasks that read it (one stage). On one
executor that is all it takes: the executor's writer process writes every shard. On several
executors each one's writer process writes the shards its tasks' records belong to, and a
shard whose records arrive through two executors is claimed back and forth (fenced retries,
WAL replays). A topic whose partition of a record is a function of the record's shard keeps
every shard in one partition, so in one task, so on one executor (Spark places a partition's
tasks on the executor that read it before): the shards line up with the partitions.

This module is that function, for producers: ``partitions(uri, rows, n)`` gives each row
(the table's primary-key columns at least) the partition of its shard among ``n``, the same
one the table's sharding spec assigns (:meth:`~memwal.core.sharding.ShardingSpec.partition_of`:
for ``bucket(col, N)`` the bucket modulo ``n``, so with ``n`` = ``N`` one shard a partition).
Kafka's default partitioner (murmur2 of the key bytes) does not line up: it puts a key's
records in one partition, which is what the table's correctness needs, but spreads each shard
over every partition.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from memwal.core.routing import shard_codes
from memwal.core.schema import as_table
from memwal.core.state import TableState
from memwal.core.storage import StorageConfig


def partitions(table: str | TableState, rows: Any, num_partitions: int,
               storage_options: "Mapping[str, str] | StorageConfig | None" = None) -> np.ndarray:
    """The Kafka partition (of ``num_partitions``) for each of ``rows`` (anything with the
    table's primary-key columns: an Arrow table, a list of dicts, a DataFrame) such that every
    partition holds the records of whole shards."""
    state = table if isinstance(table, TableState) else TableState.load(table, storage_options)
    data = as_table(rows)
    if data.num_rows == 0:
        return np.zeros(0, np.int32)
    pk = [c for c in state.primary_key]
    keys = data.select(pk).cast(pa.schema([state.write_schema.field(c) for c in pk]))
    codes, values = shard_codes(state.spec.shard_value_arrays(keys))
    per_shard = np.array([state.spec.partition_of(v, state.shard_id_of(v), num_partitions) for v in values], np.int32)
    return per_shard[codes]
