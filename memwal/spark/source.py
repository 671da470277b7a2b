"""``format("memwal")``: memwal tables as a Spark data source (Spark's Python Data Source API).

Spark finds it without a registration call: a top-level module ``pyspark_memwal`` (installed
with memwal) names :class:`MemwalDataSource` its ``DefaultSource``, and Spark registers the
data sources of every ``pyspark_*`` module on the Python path when a session first asks for
one. ``spark.read.format("memwal").load(uri)`` reads (:mod:`memwal.spark.scan`);
``df.write.format("memwal").mode("append").save(uri)`` and ``df.writeStream.format("memwal")
...start(uri)`` write (:mod:`memwal.spark.write`); with ``option("readChangeFeed", "true")``,
``read`` and ``readStream`` read the table's change feed (:mod:`memwal.spark.changes`), and the
writer takes change rows back (``_change_type``: preimages dropped, deletes deleted). Options:
:class:`memwal.spark.format_options.FormatOptions`.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSource

from memwal.core.errors import InvalidArgumentError
from memwal.spark.format_options import NAME, FormatOptions


class MemwalDataSource(DataSource):
    """The data source Spark instantiates per query with the query's options."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.opts = FormatOptions.parse(options)

    def _state(self) -> Any:
        from memwal.core.state import TableState

        return TableState.load(self.opts.path, self.opts.storage)

    def schema(self) -> Any:
        """The table's columns (the write schema; a read returns them, or those asked for)."""
        from pyspark.sql.pandas.types import from_arrow_schema

        state = self._state()
        if self.opts.read_change_feed:
            from memwal.readers.feed import feed_schema

            return from_arrow_schema(feed_schema(state.schema))
        return from_arrow_schema(state.schema)

    def reader(self, schema: Any) -> Any:
        from memwal.spark.scan import PushdownScanReader, ScanReader, pushdown_enabled

        state = self._state()
        if self.opts.read_change_feed:
            from memwal.spark.changes import ChangeFeedBatchReader

            return ChangeFeedBatchReader(state.uri, self.opts, schema)
        columns = [f.name for f in schema.fields]
        unknown = [c for c in columns if c not in state.schema.names]
        if unknown:
            raise InvalidArgumentError(f"no column(s) {unknown} in {state.uri}; its columns are {state.schema.names}")
        cls = PushdownScanReader if pushdown_enabled() else ScanReader
        return cls(state.uri, self.opts, schema)

    def streamReader(self, schema: Any) -> Any:  # noqa: N802 - Spark's name
        from memwal.spark.changes import ChangeFeedStreamReader

        if not self.opts.read_change_feed:
            raise InvalidArgumentError(
                "readStream.format('memwal') streams the table's change feed: set option('readChangeFeed', 'true')"
            )
        return ChangeFeedStreamReader(self._state().uri, self.opts, schema)

    def _writer_args(self, schema: Any, *, streaming: bool) -> tuple[str, FormatOptions, Any]:
        from memwal.core import paths
        from memwal.spark.write import reads_kafka, sink_options

        columns = [f.name for f in schema.fields]
        if reads_kafka(self.opts, columns):
            # Kafka records need nothing of the table to plan their write, and Spark makes the
            # writer again for every micro-batch's commit: no table load (and no Lance) there.
            return paths.normalize_uri(self.opts.path), self.opts, sink_options(self.opts, columns, [], streaming=streaming)
        state = self._state()
        return state.uri, self.opts, sink_options(self.opts, columns, state.schema.names, streaming=streaming)

    def writer(self, schema: Any, overwrite: bool) -> Any:
        from memwal.spark.write import BatchWriter

        if overwrite:
            raise InvalidArgumentError(
                "format('memwal') writes upserts (mode 'append') and deletes (option operation=delete); "
                "it does not replace a table's contents (mode 'overwrite')"
            )
        return BatchWriter(*self._writer_args(schema, streaming=False))

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:  # noqa: N802 - Spark's name
        from memwal.spark.write import StreamWriter

        if overwrite:
            raise InvalidArgumentError("format('memwal') streams upserts and deletes (output mode 'append'), not 'complete'")
        return StreamWriter(*self._writer_args(schema, streaming=True))
