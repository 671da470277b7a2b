"""Running a view's UDF columns: one runner, used in this process and on Spark executors.

A UDF is called on chunks of at most ``chunk_rows`` rows (a ``RecordBatch`` of its input
columns) and must return one value per row; the result is cast to the declared type. Run
locally, each chunk's result is checkpointed before the next chunk starts, so a refresh
that dies midway and is rerun calls the UDF only for chunks that had not finished. On
Spark, every executor runs the same :meth:`UdfRunner.run` on its share of the rows,
without checkpoints (a failed Spark task is retried by Spark).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator, Mapping

import pyarrow as pa

from memwal.core.failpoints import failpoint
from memwal.views.checkpoints import Checkpoints, ChunkId
from memwal.views.definition import UdfColumn
from memwal.views.errors import ViewError
from memwal.views.layout import ROW_ID


@dataclass
class UdfStats:
    """UDF work done by one refresh."""

    calls: int = 0
    rows: int = 0
    reused_chunks: int = 0


def call_udf(udf: UdfColumn, fn: Callable[[pa.RecordBatch], Any], rows: pa.Table) -> pa.Array | pa.ChunkedArray:
    """``fn`` on the UDF's input columns of ``rows``: one value per row, of its declared type."""
    inputs = rows.select(list(udf.inputs))
    batches = inputs.combine_chunks().to_batches()
    out = fn(batches[0] if batches else pa.RecordBatch.from_pylist([], schema=inputs.schema))
    result = out if isinstance(out, (pa.Array, pa.ChunkedArray)) else pa.array(out, type=udf.arrow_type())
    result = result.cast(udf.arrow_type())
    if len(result) != rows.num_rows:
        raise ViewError(f"UDF {udf.name} returned {len(result)} values for {rows.num_rows} rows")
    return result


@dataclass(frozen=True)
class UdfRunner:
    """Appends a view's UDF columns to its projected rows, chunk by chunk.

    ``refresh_key`` names the refresh the chunks belong to (see
    :mod:`memwal.views.checkpoints`); with ``checkpoints`` None nothing is checkpointed.
    """

    udfs: tuple[UdfColumn, ...]
    chunk_rows: int
    checkpoints: Checkpoints | None = None
    refresh_key: str = ""
    #: each UDF's identity (name -> :meth:`UdfColumn.identity`), if the caller has it
    identities: Mapping[str, str] | None = None

    def run(self, rows: pa.Table, stats: UdfStats | None = None) -> pa.Table:
        if rows.num_rows == 0:
            for u in self.udfs:
                rows = rows.append_column(u.name, pa.nulls(0, u.arrow_type()))
            return rows
        for u in self.udfs:
            rows = rows.append_column(u.name, self._column(u, rows, stats))
        return rows

    def _column(self, u: UdfColumn, rows: pa.Table, stats: UdfStats | None) -> pa.ChunkedArray:
        fn = u.load()
        identity = "" if self.checkpoints is None else (self.identities or {}).get(u.name) or u.identity()
        parts = []
        for start in range(0, rows.num_rows, self.chunk_rows):
            chunk = rows.slice(start, self.chunk_rows)
            cid = ChunkId(self.refresh_key, u.name, identity, start, chunk.num_rows)
            saved = self.checkpoints.get(cid) if self.checkpoints is not None else None
            if saved is not None:
                parts.append(saved)
                if stats is not None:
                    stats.reused_chunks += 1
                continue
            result = call_udf(u, fn, chunk)
            if stats is not None:
                stats.calls += 1
                stats.rows += chunk.num_rows
            if self.checkpoints is not None:
                self.checkpoints.put(cid, result)
                failpoint("view.udf_chunk_done")
            parts.append(result)
        chunks = [c for p in parts for c in (p.chunks if isinstance(p, pa.ChunkedArray) else [p])]
        return pa.chunked_array(chunks, type=u.arrow_type())

    def run_on_spark(self, spark: Any, rows: pa.Table, stats: UdfStats | None = None) -> pa.Table:
        """:meth:`run` on Spark executors (``mapInArrow``), without checkpoints. ``rows``
        are projected view rows; the result comes back sorted by :data:`ROW_ID`, as they are."""
        from pyspark.sql.pandas.types import from_arrow_schema

        out_schema = rows.schema
        for u in self.udfs:
            out_schema = out_schema.append(pa.field(u.name, u.arrow_type()))
        if rows.num_rows == 0:
            return out_schema.empty_table()
        remote = replace(self, checkpoints=None)
        # Spark has no unsigned integers: the source row id (uint64, but a counter far below
        # 2**63) travels as int64 and is cast back.
        signed = pa.schema([f.with_type(pa.int64()) if pa.types.is_unsigned_integer(f.type) else f for f in out_schema])
        sent = rows.cast(pa.schema([signed.field(n) for n in rows.schema.names]))

        def evaluate(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for b in batches:
                yield from remote.run(pa.Table.from_batches([b])).cast(signed).to_batches()

        result = spark.createDataFrame(sent.to_pandas()).mapInArrow(evaluate, from_arrow_schema(signed)).toArrow()
        if stats is not None:
            stats.calls += max(1, rows.num_rows // self.chunk_rows)
            stats.rows += rows.num_rows
        return result.cast(out_schema).sort_by([(ROW_ID, "ascending")])
