"""What a worker process keeps across the read tasks an engine gives it (Spark's executors
reading ``format("memwal")`` splits): each table's state and SSTable cache, so a task reads
the SSTables earlier tasks of the process read from memory. A table's cache reads SSTables
as its columns are now (one written before a column was added or widened is read as the
table's), so it is made anew with the state when the columns change."""

from __future__ import annotations

from typing import Any

from memwal.readers import sstables
from memwal.readers.config import ReadConfig
from memwal.readers.splits import ScanPlan, SplitReader
from memwal.core.schema import stored_schema
from memwal.core.state import TableState


class ProcessReads:
    """The table states and SSTable caches this process keeps between read tasks."""

    def __init__(self) -> None:
        self._states: dict[tuple[str, Any], TableState] = {}
        self._caches: dict[tuple[str, Any], sstables.SSTableCache] = {}

    def state(self, uri: str, storage: Any) -> TableState:
        key = (uri, storage)
        if key not in self._states:
            self._states[key] = TableState.load(uri, storage)
        return self._states[key]

    def state_of(self, uri: str, storage: Any, names: list[str]) -> TableState:
        """The table's state for reading a base version whose columns are ``names``: reloaded
        when the kept one has other columns and a fresh load has these (they were added,
        widened or dropped since this process loaded it; a time-travel read of an older
        version keeps the latest state)."""
        state = self.state(uri, storage)
        if names != state.write_schema.names:
            fresh = TableState.load(uri, storage)
            if fresh.write_schema.names == names:
                self._states[(uri, storage)] = state = fresh
                self._caches.pop((uri, storage), None)
        return state

    def cache(self, uri: str, storage: Any) -> sstables.SSTableCache:
        """The SSTable cache of the table at ``uri`` (as its state has it)."""
        key = (uri, storage)
        if key not in self._caches:
            state = self.state(uri, storage)
            self._caches[key] = sstables.SSTableCache(sstables.DEFAULT_CACHE_BYTES, state.storage_options, stored_schema(state.write_schema))
        return self._caches[key]

    def split_reader(self, uri: str, storage: Any, plan: ScanPlan, config: ReadConfig | None = None) -> SplitReader:
        """What reads ``plan``'s splits of the table at ``uri`` in this process."""
        base = self.state(uri, storage).dataset(plan.base_version)
        state = self.state_of(uri, storage, base.schema.names)
        snap = plan.open(state, base)
        return SplitReader(plan, snap, self.cache(uri, storage), config or ReadConfig(), state.primary_key, state.schema)


#: This process's reads.
PROCESS = ProcessReads()
