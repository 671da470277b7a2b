"""What a read asks for and what it touches: its output columns, its filter, the shards the
filter keeps (shard pruning), and :class:`ReadPlan`, the summary ``explain`` shows.

Every read entry point of a :class:`~memwal.readers.Reader` checks its columns and filter
here first, so an unknown column or a bad filter is refused the same way whichever kind of
read asked, and whatever the table holds at the time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import pyarrow as pa

from memwal.core.errors import InvalidArgumentError, MemwalError, UnknownColumnError
from memwal.readers.pruning import Pruning, prune
from memwal.readers.sql import filter_rows
from memwal.core.snapshot import Snapshot
from memwal.core.state import TableState

#: At most this many output schemas (one per column list asked for) are kept ...
SCHEMAS_KEPT = 256
#: ... and this many filters known to be valid (get_many's key predicates differ on every call).
FILTERS_KEPT = 1024


@dataclass(frozen=True)
class ReadPlan:
    """What a read touches, for ``explain``: shards kept after pruning and their SSTables."""

    base_version: int
    shards: tuple[str, ...]
    pruned_shards: tuple[str, ...]
    sstables: tuple[str, ...]
    pruning: str = ""


class Planner:
    """A reader's checks of what reads ask for, each made once per column list or filter."""

    def __init__(self, state: TableState) -> None:
        self.state = state
        self._schemas: dict[tuple[str, ...] | None, pa.Schema] = {}
        self._valid_filters: set[str] = set()

    def output_schema(self, columns: Sequence[str] | None) -> pa.Schema:
        """The schema of a read returning ``columns`` (None or empty: every column);
        :class:`UnknownColumnError` if the table lacks one."""
        key = tuple(columns) if columns else None
        cached = self._schemas.get(key)
        if cached is not None:
            return cached
        schema = self.state.schema
        if columns:
            unknown = [c for c in columns if c not in schema.names]
            if unknown:
                raise UnknownColumnError(f"no column(s) {unknown} in the table; its columns are {schema.names}")
            schema = pa.schema([schema.field(c) for c in columns])
        if len(self._schemas) >= SCHEMAS_KEPT:
            self._schemas.clear()
        self._schemas[key] = schema
        return schema

    def check_filter(self, where: str | None) -> None:
        """Raise :class:`InvalidArgumentError` if ``where`` is not one SQL predicate over the
        table's columns. Checked once per filter by evaluating it on one row of nulls with the
        engine that filters the WAL tail and SSTable rows, so a filter means the same on every
        LSM level and a bad one is refused whatever the table holds right now."""
        if not where or where in self._valid_filters:
            return
        probe = pa.Table.from_pylist([{}], schema=pa.schema([f.with_nullable(True) for f in self.state.schema]))
        try:
            filter_rows(probe, where)
        except MemwalError as e:
            raise InvalidArgumentError(f"{e}; a filter is one SQL predicate over the table's columns {self.state.schema.names}") from None
        if len(self._valid_filters) >= FILTERS_KEPT:
            self._valid_filters.clear()
        self._valid_filters.add(where)

    def pruning(self, where: str | None) -> Pruning:
        """The shards a read filtered by ``where`` must look at (shard pruning)."""
        self.check_filter(where)
        return prune(where, self.state.spec, self.state.resolver, self.state.schema)

    def plan(self, snap: Snapshot, where: str | None) -> ReadPlan:
        """Which shards and SSTables of ``snap`` a read with ``where`` would touch."""
        p = self.pruning(where)
        kept = snap.restrict(p.shard_ids) if p.shard_ids is not None else snap
        read = tuple(s.shard_id for s in kept.shards)
        pruned = tuple(s.shard_id for s in snap.shards if s.shard_id not in set(read))
        return ReadPlan(snap.base_version, read, pruned, tuple(kept.sstable_paths()), p.reason)
