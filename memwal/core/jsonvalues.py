"""Rows as JSON a person can read back: the one encoding memwal prints rows and records
dead letters with (bytes as base64, times as ISO 8601, decimals and non-finite floats as
strings, durations as seconds)."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
from typing import Any


def jsonable(v: Any) -> Any:
    """``v`` with the values JSON cannot hold made representable."""
    if isinstance(v, bytes):
        return base64.b64encode(v).decode("ascii")
    if isinstance(v, (dt.datetime, dt.date, dt.time)):
        return v.isoformat()
    if isinstance(v, dt.timedelta):
        return v.total_seconds()
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, dict):
        return {k: jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return str(v)
    return v


def row_to_json(row: dict[str, Any]) -> str:
    """One row as a JSON object (bytes as base64, times as ISO 8601)."""
    return json.dumps(jsonable(row), ensure_ascii=False)
