"""Evaluating a view's SQL on Arrow rows with DataFusion, the dialect of Lance's filters.

The same text is evaluated over the whole base table on a full refresh and over a
change's rows on an incremental one; using one engine for both is what makes the two
agree, so every query a view runs goes through :func:`run_sql`.
"""

from __future__ import annotations

import threading

import datafusion
import numpy as np
import pyarrow as pa

from memwal.core.transforms import murmur3, murmur3_int64
from memwal.views.definition import ViewDefinition
from memwal.views.errors import ViewError
from memwal.views.layout import ROW_ID, SOURCE_KEY


_contexts = threading.local()


def _context() -> datafusion.SessionContext:
    """This thread's DataFusion context: made once (a few milliseconds each, several per
    refresh), each query registering its rows as ``src`` and removing them after."""
    ctx = getattr(_contexts, "ctx", None)
    if ctx is None:
        ctx = _contexts.ctx = datafusion.SessionContext()
    return ctx


def run_sql(rows: pa.Table, query: str) -> pa.Table:
    """``query`` over ``rows`` registered as the table ``src``."""
    ctx = _context()
    batches = rows.to_batches() if rows.num_rows else [pa.RecordBatch.from_pylist([], schema=rows.schema)]
    ctx.register_record_batches("src", [batches])
    try:
        return ctx.sql(query).to_arrow_table()
    except Exception as e:  # noqa: BLE001 - DataFusion raises its own, untyped exceptions
        raise ViewError(f"view query failed: {e}\n  query: {query}") from None
    finally:
        ctx.deregister_table("src")


def project_rows(defn: ViewDefinition, rows: pa.Table) -> pa.Table:
    """Row view: ``select`` and ``where`` over base rows carrying :data:`SOURCE_KEY` (or,
    for a view keyed by stable row id, ``_rowid``), keyed and sorted by it (so UDF chunks,
    and their checkpoints, are the same rows every time the same change is computed)."""
    if SOURCE_KEY in rows.schema.names:
        select = ", ".join([SOURCE_KEY, *defn.select]) if defn.select else "*"
        out = run_sql(rows, f"SELECT {select} FROM src{defn.where_clause()}")
        return out.sort_by([(SOURCE_KEY, "ascending")])
    select = ", ".join([f"_rowid AS {ROW_ID}", *defn.select]) if defn.select else f"_rowid AS {ROW_ID}, *"
    out = run_sql(rows, f"SELECT {select} FROM src{defn.where_clause()}")
    if not defn.select and "_rowid" in out.schema.names:
        out = out.drop_columns(["_rowid"])
    return out.sort_by([(ROW_ID, "ascending")])


def shuffled(rows: pa.Table, seed: int) -> pa.Table:
    """Row view rows in a deterministic pseudo-random order (a hash of the source key or
    row id), so a scan of the view is a shuffle that does not change from run to run."""
    if rows.num_rows and SOURCE_KEY in rows.schema.names:
        order = np.argsort(murmur3(rows.column(SOURCE_KEY).combine_chunks(), seed=seed), kind="stable")
        return rows.take(pa.array(order))
    if rows.num_rows == 0 or ROW_ID not in rows.schema.names:
        return rows
    order = np.argsort(murmur3_int64(rows.column(ROW_ID).to_numpy().astype(np.int64), seed=seed), kind="stable")
    return rows.take(pa.array(order))
