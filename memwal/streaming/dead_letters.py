"""The dead-letter table: records that cannot be written, with the reason and where they came from.

A Lance table beside the target (``{table}_dead_letters``), keyed by ``dlq_id`` (the Kafka
coordinates ``topic/partition/offset``, or the micro-batch and row for other sources), so
a micro-batch that Spark replays after a crash records each bad record once.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import math
import time
from typing import Any

import lance
import pyarrow as pa

from memwal import paths
from memwal.schema import with_primary_key

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
    a JSON object, bytes as base64, times as ISO 8601, decimals and non-finite floats as
    strings, so any row can be recorded and read back by a person."""

    def plain(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return str(v)
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        return v

    def other(v: Any) -> Any:
        if isinstance(v, bytes):
            return base64.b64encode(v).decode("ascii")
        if isinstance(v, (dt.datetime, dt.date, dt.time)):
            return v.isoformat()
        if isinstance(v, dt.timedelta):
            return v.total_seconds()
        if isinstance(v, decimal.Decimal):
            return str(v)
        raise TypeError(f"cannot record a {type(v).__name__} value as JSON")

    return json.dumps(plain(row), default=other, ensure_ascii=False).encode()


def dead_letter_uri(table_uri: str) -> str:
    return paths.dead_letter_table(paths.normalize_uri(table_uri))


def _open_or_create(uri: str) -> lance.LanceDataset:
    try:
        return lance.dataset(uri)
    except (FileNotFoundError, ValueError, OSError):
        pass  # not there yet: create it
    try:
        return lance.write_dataset(SCHEMA.empty_table(), uri, mode="create")
    except (OSError, ValueError):
        return lance.dataset(uri)  # another task created it first


def write_dead_letters(uri: str, rows: pa.Table) -> int:
    """Record ``rows`` (in :data:`SCHEMA`, ``recorded_at`` may be null) unless already recorded."""
    if rows.num_rows == 0:
        return 0
    now = pa.array([int(time.time() * 1e6)] * rows.num_rows, pa.timestamp("us", tz="UTC"))
    rows = rows.set_column(rows.schema.get_field_index("recorded_at"), "recorded_at", now).cast(SCHEMA)
    ds = _open_or_create(uri)
    ds.merge_insert("dlq_id").when_not_matched_insert_all().execute(rows)
    return rows.num_rows


def read_dead_letters(uri: str) -> pa.Table:
    """Everything in a dead-letter table (empty if it does not exist)."""
    try:
        return lance.dataset(uri).to_table()
    except (FileNotFoundError, ValueError, OSError):
        return SCHEMA.empty_table()
