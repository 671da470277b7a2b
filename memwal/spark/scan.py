"""Reading through ``format("memwal")``: one consistent snapshot, split over Spark's tasks.

The driver plans the read once with a reader (:meth:`memwal.readers.Reader.plan_scan`): a
pinned snapshot (the base version and every shard's manifest; for a strong read the WAL
tail) and its splits (:mod:`memwal.readers.splits`): one per shard with live SSTables, the
base version's fragments grouped up to ``rowsPerPartition`` rows, the tail. Each split is a
Spark partition; an executor reads it through :data:`memwal.readers.process.PROCESS`, which
keeps the table and an SSTable cache across tasks. The merge is the readers' own, so the
splits' union is exactly what ``readers.open(uri).scan()`` returns.

When the filters name every primary-key column by equality (``id = 5``, ``id IN (...)``),
the read is a point lookup: shard pruning leaves the keys' shards, and one base split reads
all fragments through the key's index.

Filters Spark pushes (``spark.sql.python.filterPushdown.enabled``, which memwal's
``local_session`` sets) become one SQL predicate: shard pruning and Lance's filter on the base
and the SSTables. They are all handed back to Spark too, which evaluates them again on what
the splits return: pushing them changes how much is read, never the answer.
"""

from __future__ import annotations

import datetime as dt
import decimal
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceReader,
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
)

from memwal.spark.format_options import FormatOptions
from memwal.core.sqltext import quote_ident, sql_literal

_OPS = {EqualTo: "=", GreaterThan: ">", GreaterThanOrEqual: ">=", LessThan: "<", LessThanOrEqual: "<="}


def filter_sql(f: Filter) -> str | None:
    """``f`` as a SQL predicate over the table's columns (DataFusion, Lance's dialect), or None
    when memwal does not translate it (Spark evaluates it alone)."""
    attr = getattr(f, "attribute", None)
    if attr is not None and len(attr) != 1:
        return None  # a nested field
    try:
        if type(f) in _OPS:
            return f"{quote_ident(attr[0])} {_OPS[type(f)]} {_literal(f.value)}"
        if isinstance(f, EqualNullSafe):
            return f"{quote_ident(attr[0])} IS NOT DISTINCT FROM {_literal(f.value)}"
        if isinstance(f, In):
            if not f.value:
                return "false"
            return f"{quote_ident(attr[0])} IN ({', '.join(_literal(v) for v in f.value)})"
        if isinstance(f, IsNull):
            return f"{quote_ident(attr[0])} IS NULL"
        if isinstance(f, IsNotNull):
            return f"{quote_ident(attr[0])} IS NOT NULL"
        if isinstance(f, Not):
            inner = filter_sql(f.child)
            return None if inner is None else f"NOT ({inner})"
    except (TypeError, ValueError):
        return None
    return None


def _literal(value: Any) -> str:
    if isinstance(value, float) and value != value:
        raise ValueError("NaN")  # no SQL literal; Spark filters it
    if isinstance(value, (dt.date, dt.datetime, decimal.Decimal, str, int, float, bool, bytes)) or value is None:
        from memwal.core.errors import PrimaryKeyError

        try:
            return sql_literal(value)
        except PrimaryKeyError as e:
            raise ValueError(str(e)) from None
    raise ValueError(f"no literal for {type(value).__name__}")


def pushdown_enabled() -> bool:
    """Whether Spark runs this planning with filter pushdown.

    Spark refuses a reader that implements ``pushFilters`` when
    ``spark.sql.python.filterPushdown.enabled`` is false, and tells the data source nothing
    about the setting: it plans in a worker of its own (the pushdown worker) only when the
    setting is on. So a reader that pushes filters is made only inside that worker, and a plain
    session with the setting off still reads (Spark then filters on its own).
    """
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__") == "pyspark.sql.worker.data_source_pushdown_filters":
            return True
        frame = frame.f_back
    return False


class SplitPartition(InputPartition):
    """A Spark partition: one split of the plan (:mod:`memwal.readers.splits`)."""

    def __init__(self, split: Any) -> None:
        super().__init__(split)
        self.split = split


class ScanReader(DataSourceReader):
    """The batch reader: plans on the driver, reads splits on the executors."""

    def __init__(self, uri: str, opts: FormatOptions, schema: Any) -> None:
        self.uri = uri
        self.opts = opts
        #: The Spark schema of what Spark expects back (the table's, or the user's subset).
        self.schema = schema
        self.columns = tuple(f.name for f in schema.fields)
        self.predicates: list[str] = []
        #: The filters name every primary-key column by equality: a point lookup.
        self.point_lookup = False
        self._plan: Any = None

    # -- planning (driver) ----------------------------------------------------------------------

    def _push(self, filters: list[Filter]) -> list[Filter]:
        """Translate the filters memwal can use; hand every one back to Spark (see the module)."""
        from memwal.core.state import TableState

        state = TableState.load(self.uri, self.opts.storage)
        pk = list(state.primary_key)
        equal: dict[str, list[Any]] = {}
        for f in filters:
            sql = filter_sql(f)
            if sql is not None:
                self.predicates.append(sql)
            attr = getattr(f, "attribute", ())
            if len(attr) == 1 and attr[0] in pk and isinstance(f, (EqualTo, In)) and sql is not None:
                values = [f.value] if isinstance(f, EqualTo) else list(f.value)
                prior = equal.get(attr[0])
                equal[attr[0]] = values if prior is None else [v for v in prior if v in values]
        self.point_lookup = bool(pk) and all(c in equal for c in pk)
        return list(filters)

    def plan(self) -> Any:
        """The read's :class:`~memwal.readers.splits.ScanPlan`, made once on the driver."""
        if self._plan is not None:
            return self._plan
        from memwal.readers.reader import Reader
        from memwal.core.state import TableState

        state = TableState.load(self.uri, self.opts.storage)
        where = " AND ".join(f"({p})" for p in self.predicates) or None
        # A point lookup reads every fragment through the key's index in one task.
        rows_per_split = None if self.point_lookup else self.opts.rows_per_partition
        with Reader(state, consistency=self.opts.consistency, as_of=self.opts.past()) as reader:
            self._plan = reader.plan_scan(self.columns, where, rows_per_split)
        return self._plan

    def partitions(self) -> Sequence[InputPartition]:
        return [SplitPartition(s) for s in self.plan().splits]

    # -- reading (executors) --------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from pyspark.sql.pandas.types import to_arrow_schema

        from memwal.readers.process import PROCESS

        if not isinstance(partition, SplitPartition):
            return  # Spark's own partition for a plan of no splits (an empty table)
        plan = self.plan()
        target = to_arrow_schema(self.schema, timezone="UTC")
        out = list(self.columns)
        for batch in PROCESS.split_reader(self.uri, self.opts.storage, plan).read(partition.split):
            yield batch.select(out).cast(target)


class PushdownScanReader(ScanReader):
    """:class:`ScanReader` with filter pushdown (made only where Spark pushes filters)."""

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:  # noqa: N802 - Spark's name
        return iter(self._push(filters))
