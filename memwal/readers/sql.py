"""SQL filters over in-memory rows (the unflushed WAL tail), in the DataFusion dialect that
Lance's own filters use, so one ``where`` string means the same on every LSM level."""

from __future__ import annotations

import datafusion
import pyarrow as pa

from memwal.core.errors import MemwalError


def filter_rows(rows: pa.Table, where: str | None) -> pa.Table:
    """The rows of ``rows`` that satisfy ``where`` (all of them when None)."""
    if not where or rows.num_rows == 0:
        return rows
    ctx = datafusion.SessionContext()
    ctx.register_record_batches("rows", [rows.to_batches()])
    try:
        out = ctx.sql(f"SELECT * FROM rows WHERE {where}").to_arrow_table()
    except Exception as e:  # noqa: BLE001 - datafusion raises its own exception types, none of them a common base
        raise MemwalError(f"cannot evaluate filter {where!r}: {e}") from None
    return out.cast(rows.schema) if out.num_rows else rows.schema.empty_table()
