"""``option("readChangeFeed", "true")``: the table's change feed (:mod:`memwal.readers.feed`) in Spark.

A stream (``spark.readStream.format("memwal").option("readChangeFeed", "true").load(uri)``)
has as offsets the feed's positions: the anchor base version and, per shard, the highest
generation read. Spark checkpoints them, so a restarted query resumes at the last committed
offset: the micro-batch it had planned but not committed is read again from the same two
offsets (the same changes: generations are immutable), none twice past a committed one.
Each micro-batch reads one split per shard that has new generations, on the executors.
With ``option("consumer", name)`` the stream registers as a feed consumer: each committed
micro-batch moves its hold, so GC keeps what the query has not read (within
``GcConfig.feed_retention_seconds``); a query that falls behind what GC kept fails with
:class:`~memwal.core.errors.ChangesCollectedError` naming the oldest position still readable.

A batch read (``spark.read...``) reads ``startingVersion`` (a base version, ``earliest``
or ``latest``) to ``endingVersion`` (what that base version had folded; by default the
last flush). A stream starts at its consumer's committed position, else at
``startingVersion`` (default ``earliest``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from memwal.spark.format_options import FormatOptions


class FeedSplit(InputPartition):
    """One shard's generations after ``start`` (a position as JSON) up to ``until``."""

    def __init__(self, shard_id: str, start: dict, until: int) -> None:
        super().__init__(shard_id)
        self.shard_id = shard_id
        self.start = start
        self.until = until


def _state(uri: str, opts: FormatOptions) -> Any:
    from memwal.readers.process import PROCESS

    return PROCESS.state(uri, opts.storage)


def _splits(start: dict, end: dict) -> list[InputPartition]:
    from memwal.readers.feed import Position

    a, b = Position.from_json(start), Position.from_json(end)
    return [FeedSplit(s, start, g) for s, g in sorted(b.consumed.items()) if g > a.consumed.get(s, -1)]


def _read(uri: str, opts: FormatOptions, schema: Any, split: FeedSplit) -> Iterator[pa.RecordBatch]:
    from pyspark.sql.pandas.types import to_arrow_schema

    from memwal.readers.feed import FeedReader, Position

    state = _state(uri, opts)
    target = to_arrow_schema(schema, timezone="UTC")
    columns = [n for n in target.names if n in state.schema.names]
    reader = FeedReader(state, Position.from_json(split.start), columns)
    for g in reader.generations({split.shard_id: split.until}):
        yield from g.rows.select(target.names).cast(target).to_batches()


def _start(state: Any, opts: FormatOptions) -> Any:
    from memwal.readers import feed

    if opts.consumer:
        pos = feed.Consumer(state, opts.consumer).position()
        if pos is not None:
            return pos
    return feed.resolve_start(state, opts.starting_version or "earliest")


def _full(state: Any, start: Any) -> Any:
    """``start`` with every shard named (a shard absent reads from what the anchor folded)."""
    from types import MappingProxyType

    from memwal.readers import feed

    anchor = feed.folded(state, start.base_version)
    shards = set(anchor) | set(start.consumed) | set(state.manifests.list_shards())
    return feed.Position(start.base_version, MappingProxyType({s: start.generation(s, anchor) for s in sorted(shards)}))


class ChangeFeedStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, uri: str, opts: FormatOptions, schema: Any) -> None:
        self.uri = uri
        self.opts = opts
        self.schema = schema
        #: Trigger.AvailableNow: the generations flushed when the query started, read no further
        self._target: dict[str, int] | None = None

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 - Spark's name
        # Without this, Spark's generic wrapper settles the target from initialOffset(), and a
        # query restarted on an uncommitted micro-batch ended after replaying it.
        from memwal.readers import feed

        self._target = feed.head(_state(self.uri, self.opts))

    def initialOffset(self) -> dict:  # noqa: N802 - Spark's name
        state = _state(self.uri, self.opts)
        return _full(state, _start(state, self.opts)).to_json()

    def latestOffset(self, start: dict, limit: Any = None) -> dict:  # noqa: N802 - Spark's name
        from types import MappingProxyType

        from memwal.readers import feed

        state = _state(self.uri, self.opts)
        a = feed.Position.from_json(start)
        top = feed.head(state) if self._target is None else self._target
        consumed = {s: max(a.consumed.get(s, 0), top.get(s, 0)) for s in sorted(set(a.consumed) | set(top))}
        if consumed == dict(a.consumed):
            return start  # nothing new: Spark runs no batch
        # the next batch's preimages start from the newest base version that fits (the fewest
        # SSTables to overlay); never older than this batch's own
        anchor = max(a.base_version, feed.anchor_for(state, consumed))
        return feed.Position(anchor, MappingProxyType(consumed)).to_json()

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return _splits(start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, FeedSplit)
        return _read(self.uri, self.opts, self.schema, partition)

    def commit(self, end: dict) -> None:
        from memwal.readers import feed

        if self.opts.consumer:
            feed.Consumer(_state(self.uri, self.opts), self.opts.consumer).commit(feed.Position.from_json(end))


class ChangeFeedBatchReader(DataSourceReader):
    def __init__(self, uri: str, opts: FormatOptions, schema: Any) -> None:
        from memwal.readers import feed

        self.uri = uri
        self.opts = opts
        self.schema = schema
        state = _state(uri, opts)
        start = _full(state, feed.resolve_start(state, opts.starting_version or "earliest"))
        end = feed.end_at(state, opts.ending_version)
        self.start = start.to_json()
        self.end = feed.FeedReader(state, start).end_position(end).to_json()

    def partitions(self) -> Sequence[InputPartition]:
        return _splits(self.start, self.end) or [FeedSplit("", self.start, 0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, FeedSplit)
        if not partition.shard_id:
            return iter(())
        return _read(self.uri, self.opts, self.schema, partition)
