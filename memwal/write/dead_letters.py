"""The dead-letter table: records that cannot be written, with the reason and where they came from.

A Lance table beside the target (``{table}_dead_letters``), keyed by ``dlq_id`` (the Kafka
coordinates ``topic/partition/offset``, or the micro-batch and row for other sources), so
a micro-batch that Spark replays after a crash records each bad record once. It lives on
the target's object store, so every Lance call takes the target's storage options (they
travel to the executors with the sink; see :mod:`memwal.core.storage`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import lance
import pyarrow as pa

from memwal.core import paths
from memwal.core.jsonvalues import row_to_json
from memwal.core.schema import with_primary_key
from memwal.core.state import resolve_storage
from memwal.core.storage import StorageConfig
from memwal.write.messages import ERROR, KEY, KPART, OFFSET, ORDER, RAW, TOPIC

#: What the functions here take as storage: a resolved config, or Lance options resolved over the environment.
Storage = StorageConfig | Mapping[str, str] | None

SCHEMA = with_primary_key(
    pa.schema(
        [
            pa.field("dlq_id", pa.string()),
            pa.field("error", pa.string()),
            pa.field("topic", pa.string()),
            pa.field("partition", pa.int32()),
            pa.field("offset", pa.int64()),
            pa.field("key", pa.binary()),
            pa.field("value", pa.binary()),
            pa.field("batch_id", pa.int64()),
            pa.field("recorded_at", pa.timestamp("us", tz="UTC")),
            pa.field("target", pa.string()),
        ]
    ),
    ["dlq_id"],
)


def record_json(row: dict[str, Any]) -> bytes:
    """A record that arrived as columns (not as Kafka bytes), as the dead letter's ``value``:
    the JSON a person can read back (:mod:`memwal.core.jsonvalues`)."""
    return row_to_json(row).encode()


def dead_letter_rows(bad: pa.Table, batch_id: int, target_uri: str) -> pa.Table:
    """The dead-letter rows (:data:`SCHEMA`, ``recorded_at`` null) of a micro-batch's bad
    records as the prepare stage left them (:data:`~memwal.write.wire.DEAD_SCHEMA`):
    keyed by their Kafka coordinates, or by batch and row for other sources."""
    n = bad.num_rows
    ids = []
    for topic, part, off, order in zip(
        bad.column(TOPIC).to_pylist(), bad.column(KPART).to_pylist(), bad.column(OFFSET).to_pylist(), bad.column(ORDER).to_pylist()
    ):
        ids.append(f"{topic}/{part}/{off}" if topic is not None else f"batch-{batch_id}/row-{order}")
    return pa.table(
        {
            "dlq_id": ids,
            "error": bad.column(ERROR),
            "topic": bad.column(TOPIC),
            "partition": bad.column(KPART),
            "offset": bad.column(OFFSET),
            "key": bad.column(KEY),
            "value": bad.column(RAW),
            "batch_id": pa.array([batch_id] * n, pa.int64()),
            "recorded_at": pa.nulls(n, pa.timestamp("us", tz="UTC")),
            "target": pa.array([target_uri] * n, pa.string()),
        }
    ).cast(SCHEMA.remove_metadata())


def dead_letter_uri(table_uri: str) -> str:
    return paths.dead_letter_table(paths.normalize_uri(table_uri))


def _open_or_create(uri: str, options: dict[str, str] | None) -> lance.LanceDataset:
    try:
        return lance.dataset(uri, storage_options=options)
    except (FileNotFoundError, ValueError, OSError):
        pass  # not there yet: create it
    try:
        return lance.write_dataset(SCHEMA.empty_table(), uri, mode="create", storage_options=options)
    except (OSError, ValueError):
        # Another task created it first (its first manifest is a create-if-absent PUT on object stores).
        return lance.dataset(uri, storage_options=options)


def write_dead_letters(uri: str, rows: pa.Table, storage: Storage = None) -> int:
    """Record ``rows`` (in :data:`SCHEMA`, ``recorded_at`` may be null) unless already recorded.

    ``storage``: the target table's storage (its :class:`~memwal.core.storage.StorageConfig`, or Lance
    options resolved over this process's environment)."""
    if rows.num_rows == 0:
        return 0
    now = pa.array([int(time.time() * 1e6)] * rows.num_rows, pa.timestamp("us", tz="UTC"))
    rows = rows.set_column(rows.schema.get_field_index("recorded_at"), "recorded_at", now).cast(SCHEMA)
    ds = _open_or_create(uri, resolve_storage(storage).lance_options())
    ds.merge_insert("dlq_id").when_not_matched_insert_all().execute(rows)
    return rows.num_rows


def read_dead_letters(uri: str, storage: Storage = None) -> pa.Table:
    """Everything in a dead-letter table (empty if it does not exist)."""
    try:
        return lance.dataset(uri, storage_options=resolve_storage(storage).lance_options()).to_table()
    except (FileNotFoundError, ValueError, OSError):
        return SCHEMA.empty_table()
