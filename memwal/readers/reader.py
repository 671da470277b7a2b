"""The LSM read API: point lookups and scans over base table + uncompacted SSTables.

A :class:`Reader` works on a :class:`~memwal.snapshot.Snapshot` (a pinned base version
plus the live SSTables of every shard) and refreshes it on demand or every
``refresh_interval_ms``, either in the read that finds it stale or, for a serving process,
on a thread of its own (``refresh_in_background``). Lance's LSM planners do the merging
(newest row per key by generation, tombstones hide keys); memwal decides what they read.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Literal, Mapping, Sequence

import lance
import lance.mem_wal
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal.readers import sstables
from memwal.readers.merge import int_key as merge_int_key
from memwal.readers.stream import Level, MergedScan, ShadowKeys, take
from memwal.readers.config import ReadConfig
from memwal.readers.keys import keys_predicate, keys_table, quote_ident, sql_literal, typed_key
from memwal.readers.points import BaseLookup, base_point_read, first_row, point_lookup
from memwal.readers.pruning import Pruning, prune
from memwal.readers import text, timetravel
from memwal.readers.sql import filter_rows
from memwal.readers.vectors import as_matrix, distances, top_k, vector_columns
from memwal import paths
from memwal.errors import InvalidArgumentError, MemwalError, UnknownColumnError
from memwal.lsm import without_keys
from memwal.schema import TOMBSTONE
from memwal.manifest import SsTable
from memwal.snapshot import Snapshot
from memwal.state import TableState
from memwal.storage import StorageConfig
from memwal.wal import WalTailReader

Consistency = Literal["eventual", "strong"]

log = logging.getLogger(__name__)

#: A reader refreshed in the background refreshes in the read itself once its snapshot is this
#: many intervals old (the refresh thread is stuck or failing), so staleness stays bounded.
BACKGROUND_STALE_INTERVALS = 5

#: Up to this many keys, get_many runs point lookups (bloom filters, short-circuit per key);
#: above it one filtered scan per shard is cheaper.
POINT_LOOKUP_BATCH = 32


@dataclass(frozen=True)
class ReadPlan:
    """What a read touches, for ``explain``: shards kept after pruning and their SSTables."""

    base_version: int
    shards: tuple[str, ...]
    pruned_shards: tuple[str, ...]
    sstables: tuple[str, ...]
    pruning: str = ""


class Reader:
    """Reads a memwal table. Obtain one with :func:`memwal.readers.open`."""

    def __init__(
        self,
        state: TableState,
        *,
        consistency: Consistency = "eventual",
        refresh_interval_ms: int | None = 1000,
        version: int | None = None,
        cache_bytes: int = sstables.DEFAULT_CACHE_BYTES,
        refresh_in_background: bool = False,
        config: ReadConfig | None = None,
        as_of: timetravel.AsOf | None = None,
    ) -> None:
        if consistency not in ("eventual", "strong"):
            raise InvalidArgumentError(f"consistency must be 'eventual' or 'strong', got {consistency!r}")
        if version is not None and as_of is not None:
            raise InvalidArgumentError("give as_of or version (its older name), not both")
        as_of = version if as_of is None else as_of
        if as_of is not None and consistency == "strong":
            raise InvalidArgumentError("time travel (as_of=) reads a past state; it cannot be strongly consistent")
        self.state = state
        self.config = config or ReadConfig()
        self.consistency = consistency
        self.refresh_interval_ms = refresh_interval_ms
        #: the past state a time-travel reader reads (resolved now: a bad ``as_of`` fails here)
        self.past = timetravel.resolve(state, as_of) if as_of is not None else None
        self._snapshot: Snapshot | None = None
        #: when the current snapshot was started (monotonic): its age, and which of two is newer
        self._taken_at = 0.0
        self._publishing = threading.Lock()
        self._wal = WalTailReader(state.uri, state.io, state.manifests, state.primary_key)
        #: immutable SSTable data this reader has read, bounded by ``cache_bytes``
        self.sstables = sstables.SSTableCache(cache_bytes, state.storage_options)
        #: the base table's full-text corpus statistics (BM25), per base version
        self.text_stats = text.BaseTextStats()
        #: per snapshot and vector column: what a vector search takes from the SSTables
        self._deltas: dict[tuple, DeltaVectors] = {}
        self._valid_filters: set[str] = set()
        #: the last point lookup's base predicate, replayed on each new base version by the
        #: background refresh so the first lookup on it finds its index pages loaded
        self._warm_predicate: str | None = None
        #: per shard: its state in the snapshot last looked up, and its live SSTables' key sets
        self._point_keys: dict[str, tuple[Any, list[tuple[str, sstables.KeySet]]]] = {}
        self._base_lookups: BaseLookup | None = None
        self._schemas: dict[tuple[str, ...] | None, pa.Schema] = {}
        self._refresher: _Refresher | None = None
        if refresh_in_background:
            if consistency != "eventual" or as_of is not None or refresh_interval_ms is None or refresh_interval_ms <= 0:
                raise InvalidArgumentError("refresh_in_background needs an eventual reader of the latest version with a refresh_interval_ms")
            self.refresh()  # the first snapshot in the caller's thread: a bad table fails here
            self._refresher = _Refresher(self, refresh_interval_ms / 1000)

    # -- snapshots ------------------------------------------------------------------------------

    def refresh(self) -> Snapshot:
        """Take a new snapshot now: latest base version and shard manifests."""
        started = time.monotonic()
        if self.past is not None:
            # Time travel: the base version and the SSTables the shards listed then.
            snap = timetravel.past_snapshot(self.state, self.past)
        else:
            snap = self.state.snapshot()
        return self._publish(snap, started)

    def _publish(self, snap: Snapshot, started: float) -> Snapshot:
        """Make ``snap`` (started at ``started``) the current snapshot unless one started later
        already is, and return the current one. Invariant: the snapshot a read sees never goes
        back in time, though a background refresh that started before a read's own refresh
        finishes after it."""
        with self._publishing:
            if self._snapshot is None or started >= self._taken_at:
                self._snapshot, self._taken_at = snap, started
            return self._snapshot

    def _refresh_and_warm(self) -> None:
        """The background refresh: take a snapshot, load what the next lookups on it would load
        first, then publish it; until then reads use the previous snapshot. For a reader that
        serves point lookups, what they load first is the key sets of SSTables not seen yet
        and, on a new base version, its deletion files and index pages (through the last
        lookup's predicate); a reader that only scans loads nothing ahead."""
        started = time.monotonic()
        snap = self.state.snapshot()
        predicate = self._warm_predicate
        if predicate is not None:
            pk = list(self.state.primary_key)
            for shard in snap.shards:
                self._newest_sstables(snap, shard.shard_id)
            current = self._snapshot
            if current is None or snap.base_version != current.base_version:
                # Not base_point_read: asked for live rows only, Lance builds the deletion mask
                # of every fragment, which loads each fragment's deletion file of the new version
                # (every compaction commit rewrites those of the fragments its updates touch).
                snap.dataset.to_table(columns=pk, filter=predicate)
        self._publish(snap, started)

    def close(self) -> None:
        """Stop the background refresh, if any, waiting for one in progress (a reader left to
        the garbage collector stops it too, within one interval). The reader still reads,
        refreshing in the read as an inline reader does."""
        if self._refresher is not None:
            self._refresher.stop()
            self._refresher = None

    def __enter__(self) -> "Reader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def snapshot(self) -> Snapshot:
        """The current snapshot, refreshed if older than ``refresh_interval_ms`` (with a
        background refresh: only once it is ``BACKGROUND_STALE_INTERVALS`` intervals old)."""
        if self._snapshot is None:
            return self.refresh()
        if self.past is None and self.refresh_interval_ms is not None:
            age_ms = (time.monotonic() - self._taken_at) * 1000
            stale_ms = self.refresh_interval_ms * (BACKGROUND_STALE_INTERVALS if self._refresher is not None else 1)
            if age_ms >= stale_ms:
                return self.refresh()
        return self._snapshot

    def _view(self, shard_ids: list[str] | None = None) -> tuple[Snapshot, pa.Table | None]:
        """What a read merges: a snapshot and, in strong mode, the shards' unflushed WAL rows.

        Strong reads take a fresh snapshot every time: a strong read must see every write
        acknowledged before it started, wherever it was written.
        """
        if self.consistency == "eventual":
            snap = self.snapshot
            return (snap.restrict(shard_ids) if shard_ids is not None else snap), None
        snap = self.state.snapshot(shard_ids=shard_ids)
        tails = [t for s in snap.shards if (t := self._wal.tail(s.manifest)) is not None]
        if not tails:
            return snap, None
        return snap, pa.concat_tables(tails, promote_options="permissive") if len(tails) > 1 else tails[0]

    # -- point lookups -------------------------------------------------------------------------

    def _lookup(self, key: dict[str, Any], columns: Sequence[str] | None, pinned: Snapshot | None = None) -> pa.Table:
        shard_id = self.state.shard_of_key(key)
        if pinned is not None:
            snap, tail = pinned, None
        elif self.consistency == "eventual":
            snap, tail = self.snapshot, None  # the whole snapshot: restricting it costs more than it saves
        else:
            snap, tail = self._view([shard_id])
        out_schema = self._output_schema(columns)
        if tail is not None:
            hit = tail.filter(_key_mask(tail, key))
            if hit.num_rows:  # the unflushed WAL holds the newest version of this key
                if hit.column(TOMBSTONE)[0].as_py():
                    return out_schema.empty_table()
                return hit.select(out_schema.names)
        pk = self.state.primary_key
        wanted = sstables.lookup_key(key, pk)
        for path, keys in self._newest_sstables(snap, shard_id):
            found = keys.find(wanted)
            if found is not None:
                tombstone, position = found
                if tombstone:  # the newest version is a delete
                    return out_schema.empty_table()
                return self.sstables.take(path, [position], out_schema.names)
        # No SSTable holds the key: the base table's row (via its primary-key index), if any.
        predicate = " AND ".join(f"{quote_ident(c)} = {sql_literal(key[c])}" for c in pk)
        self._warm_predicate = predicate
        return base_point_read(self._base_lookup(snap), out_schema.names, predicate)

    def _newest_sstables(self, snap: Snapshot, shard_id: str) -> list[tuple[str, sstables.KeySet]]:
        """The shard's live SSTables in ``snap``, newest first, with their key sets.

        Kept for the shard's state in the current snapshot, so a lookup walks a list instead
        of asking the byte-bounded cache for each SSTable's key set (~6 us each, 0.6 ms a
        lookup at 100 SSTables). The list holds the live SSTables' key sets until the next
        snapshot: beyond the cache's bound if that is smaller than the key sets of one
        shard's live SSTables.
        """
        state = snap.shard(shard_id)
        if state is None:
            return []
        cached = self._point_keys.get(shard_id)
        if cached is not None and cached[0] is state:
            return cached[1]
        pk = list(self.state.primary_key)
        paths_ = [paths.sstable_path(snap.dataset.uri, shard_id, sst.path) for sst in reversed(state.live_sstables)]
        newest = [(path, self.sstables.keys(path, pk)) for path in paths_]
        self._point_keys[shard_id] = (state, newest)
        return newest

    def _base_lookup(self, snap: Snapshot) -> BaseLookup:
        """Point reads of ``snap``'s base version, their scanner options built once."""
        lookup = self._base_lookups
        if lookup is None or lookup.dataset is not snap.dataset:
            lookup = self._base_lookups = point_lookup(snap.dataset)
        return lookup

    def get(self, key: Any, columns: Sequence[str] | None = None) -> dict[str, Any] | None:
        """The live row with primary key ``key`` (scalar, tuple or dict), or None.

        A key value that is not of its column's type is a :class:`PrimaryKeyError`, as in
        :meth:`get_many`: :func:`typed_key` types it as :func:`keys_table` does.
        """
        t = self._lookup(typed_key(key, self.state.primary_key, self.state.schema), columns)
        return first_row(t) if t.num_rows else None

    def get_many(self, keys: Iterable[Any], columns: Sequence[str] | None = None) -> pa.Table:
        """The live rows of ``keys`` (absent keys are left out), as one Arrow table."""
        kt = keys_table(keys, self.state.primary_key, self.state.schema)
        out_schema = self._output_schema(columns)
        if kt.num_rows == 0:
            return out_schema.empty_table()
        if kt.num_rows <= POINT_LOOKUP_BATCH:
            # An eventual reader's lookups share one snapshot, as one scan would: a refresh
            # between two of them must not show one key before a change and the next after it.
            pinned = self.snapshot if self.consistency == "eventual" else None
            parts = [self._lookup(k, columns, pinned) for k in kt.to_pylist()]
            parts = [p for p in parts if p.num_rows]
            return pa.concat_tables([p.cast(out_schema) for p in parts]) if parts else out_schema.empty_table()
        snap, tail = self._view()
        return self._rows_of(kt, out_schema, snap, tail)

    def rows_of_keys(self, keys: pa.Table, shard_id: str | None = None) -> pa.Table:
        """The live rows (every column) of ``keys`` (a table of the key columns, typed as the
        table's), all in ``shard_id`` when given; absent keys are left out.

        A vectorized semi-join on the keys instead of a SQL predicate of literals: partial
        updates read thousands of keys per write, and parsing (then evaluating) one literal
        per key cost more than the read itself (docs/bench-log/partial-updates.md).
        """
        snap, tail = self._view([shard_id] if shard_id is not None else None)
        return self._rows_of(keys.select(list(self.state.primary_key)), self.state.schema, snap, tail)

    def _rows_of(self, keys: pa.Table, out_schema: pa.Schema, snap: Snapshot, tail: pa.Table | None) -> pa.Table:
        """The live rows of ``keys`` (the key columns, typed, each key once) in ``snap`` and
        ``tail``, columns ``out_schema``'s; absent keys left out, in no particular order.

        Each key is looked up where its newest version is, as a point lookup does, but for all
        keys at once: the WAL tail by a semi-join, then every live SSTable newest first by its
        key set (one vectorised search per SSTable for an integer key), read by position with
        one ``take`` per SSTable, then the base for the rest with one filter. Reading the
        SSTables whole and merging them (as a scan does) cost more than the lookups for a
        thousand keys, and a SQL list of a thousand literals more than the read
        (docs/bench-log/reads.md, "Lookups of many keys").
        """
        pk = list(self.state.primary_key)
        names = out_schema.names
        parts: list[pa.Table] = []
        if tail is not None:
            mine = _semi_join(tail, keys, pk)
            if mine.num_rows:
                keys = without_keys(keys, mine, pk)  # the WAL tail holds their newest version
                parts.append(mine.filter(pc.invert(mine.column(TOMBSTONE))).select(names))
        todo = _KeysToFind(keys, pk)
        for shard in snap.shards:
            for path, key_set in self._newest_sstables(snap, shard.shard_id):
                if todo.done:
                    break
                positions = todo.find(key_set)
                if positions:
                    parts.append(self.sstables.take(path, positions, names))
        rest = todo.remaining()
        if rest.num_rows:
            if len(pk) == 1:
                where = pc.field(pk[0]).isin(rest.column(0).combine_chunks())
                base = snap.dataset.to_table(columns=names, filter=where)
            else:
                base = snap.dataset.to_table(columns=names, filter=keys_predicate(rest))
            parts.append(base)
        if not parts:
            return out_schema.empty_table()
        return pa.concat_tables([p.cast(out_schema) for p in parts])

    # -- scans ---------------------------------------------------------------------------------

    def _output_schema(self, columns: Sequence[str] | None) -> pa.Schema:
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
        if len(self._schemas) >= 256:
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
        if len(self._valid_filters) >= 1024:  # get_many's key predicates differ on every call
            self._valid_filters.clear()
        self._valid_filters.add(where)

    def pruning(self, where: str | None) -> Pruning:
        """The shards a read filtered by ``where`` must look at (shard pruning)."""
        self.check_filter(where)
        return prune(where, self.state.spec, self.state.resolver, self.state.schema)

    def plan(self, where: str | None = None) -> ReadPlan:
        """Which shards and SSTables a read with ``where`` would touch."""
        snap = self.snapshot
        p = self.pruning(where)
        kept = snap.restrict(p.shard_ids) if p.shard_ids is not None else snap
        read = tuple(s.shard_id for s in kept.shards)
        pruned = tuple(s.shard_id for s in snap.shards if s.shard_id not in set(read))
        return ReadPlan(snap.base_version, read, pruned, tuple(kept.sstable_paths()), p.reason)

    def _stream(
        self, snap: Snapshot, tail: pa.Table | None, wanted: Sequence[str], where: str | None, limit: int | None
    ) -> Iterator[pa.RecordBatch]:
        """Live rows matching ``where``, columns ``wanted`` (which hold the primary key), as
        record batches: the levels newest first, each minus the keys of newer ones
        (:class:`~memwal.readers.stream.MergedScan`), cut after ``limit`` rows."""
        pk = list(self.state.primary_key)
        wanted = list(wanted)
        batch_rows = self.config.scan_batch_rows
        if tail is None and snap.num_live_sstables == 0:  # the base alone: Lance applies the limit
            return iter(snap.dataset.scanner(columns=wanted, filter=where, limit=limit, batch_size=batch_rows).to_reader())
        read_columns = [*wanted, TOMBSTONE]

        def level(shard_id: str, sst: SsTable) -> Level:
            path = paths.sstable_path(snap.dataset.uri, shard_id, sst.path)

            def read() -> tuple[sstables.KeySet, pa.Table]:
                if where is None:
                    if self.sstables.worth_caching(sst.in_memory_bytes):
                        rows = self.sstables.rows(path, wanted)  # cached: an SSTable never changes
                    else:
                        rows = self.sstables.read(path, columns=read_columns)
                    return self.sstables.keys(path, pk, rows), rows
                return self.sstables.keys(path, pk), self.sstables.read(path, columns=read_columns, filter=where)

            return Level(path, read)

        shards = [[level(s.shard_id, t) for t in reversed(s.live_sstables)] for s in snap.shards]

        def base() -> pa.RecordBatchReader:
            return snap.dataset.scanner(columns=wanted, filter=where, batch_size=batch_rows).to_reader()

        # A limited scan reads one SSTable at a time: it usually ends inside the newest.
        ahead = self.config.scan_sstables_ahead if limit is None else 1
        base_ahead = self.config.scan_base_batches_ahead if limit is None else 0
        merged = MergedScan(shards, base, tail, wanted, pk, self.state.schema, where, batch_rows, ahead, base_ahead)
        return take(iter(merged), limit)

    def _scan_batches(self, columns: Sequence[str] | None, where: str | None, limit: int | None) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise InvalidArgumentError(f"limit must be a non-negative integer, got {limit!r}")
        schema = self._output_schema(columns)
        out = schema.names
        p = self.pruning(where)
        snap, tail = self._view(sorted(p.shard_ids) if p.shard_ids is not None else None)
        wanted = list(dict.fromkeys([*out, *self.state.primary_key]))
        batches = self._stream(snap, tail, wanted, where, limit)
        if wanted == out:
            return schema, batches
        return schema, (b.select(out) for b in batches)

    def scan(
        self,
        columns: Sequence[str] | None = None,
        where: str | None = None,
        limit: int | None = None,
    ) -> pa.Table:
        """Live rows (newest version per key, deleted keys absent) matching ``where`` (SQL)."""
        schema, batches = self._scan_batches(columns, where, limit)
        return pa.Table.from_batches(list(batches), schema)

    def to_batches(
        self,
        columns: Sequence[str] | None = None,
        where: str | None = None,
        limit: int | None = None,
    ) -> pa.RecordBatchReader:
        """Like :meth:`scan`, as a stream of record batches read as they are consumed: the
        newest SSTables first, then the base, then the WAL tail, never the whole table in
        memory (``ReadConfig.scan_batch_rows`` and ``scan_sstables_ahead`` bound what is
        held). The snapshot is taken when this is called."""
        schema, batches = self._scan_batches(columns, where, limit)
        return pa.RecordBatchReader.from_batches(schema, batches)

    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object:
        """The live rows as an Arrow C stream (the Arrow PyCapsule interface): DuckDB, Polars,
        DataFusion and pyarrow read the fresh view from a reader directly, batch by batch."""
        return self.to_batches().__arrow_c_stream__(requested_schema)

    def to_arrow(self, columns: Sequence[str] | None = None, where: str | None = None) -> pa.RecordBatchReader:
        """The live rows as a :class:`pyarrow.RecordBatchReader`, for other engines
        (``duckdb.sql("SELECT ... FROM r")`` with ``r = reader.to_arrow()``,
        ``polars.from_arrow(...)``, DataFusion's ``from_arrow``); :meth:`to_batches` with a name
        other engines' users look for."""
        return self.to_batches(columns, where)

    def count(self, where: str | None = None) -> int:
        """Number of live rows matching ``where``."""
        p = self.pruning(where)
        snap, tail = self._view(sorted(p.shard_ids) if p.shard_ids is not None else None)
        if tail is None and snap.num_live_sstables == 0:
            return snap.dataset.count_rows(filter=where)
        return sum(b.num_rows for b in self._stream(snap, tail, list(self.state.primary_key), where, None))


    # -- vector search ---------------------------------------------------------------------------

    def _vector_column(self, column: str | None) -> str:
        if column is not None:
            return column
        configured = self.state.metadata.indexes.vector_column
        if configured:
            return configured
        candidates = vector_columns(self.state.schema)
        if len(candidates) != 1:
            raise InvalidArgumentError(f"name the vector column to search (candidates: {candidates})")
        return candidates[0]

    def search(
        self,
        vector: Sequence[float] | np.ndarray,
        k: int = 10,
        *,
        column: str | None = None,
        where: str | None = None,
        nprobes: int | None = None,
        columns: Sequence[str] | None = None,
        metric: str | None = None,
        overfetch: float | None = None,
        refine_factor: int | None = None,
    ) -> pa.Table:
        """The ``k`` live rows nearest to ``vector``, with their ``_distance`` (nearest first).

        Only the newest version of a row can appear. The base table is searched by Lance
        through its vector index (``nprobes``, ``refine_factor``: ``ReadConfig``'s by default;
        exactly when it has none, and its unindexed fragments exactly either way), asking for
        ``overfetch`` candidates per result so that those an SSTable or the WAL tail supersedes
        can be dropped; the SSTables' newest live rows are scored exactly (large ones through
        their own index), and so is a strong reader's WAL tail. ``where`` filters every level
        before the nearest are chosen. docs/bench-log/reads.md has the measurements behind
        the defaults.
        """
        if k <= 0:
            raise InvalidArgumentError(f"k must be positive, got {k}")
        cfg = self.config
        nprobes = cfg.vector_nprobes if nprobes is None else nprobes
        refine = cfg.vector_refine_factor if refine_factor is None else refine_factor
        overfetch = cfg.vector_overfetch if overfetch is None else overfetch
        if overfetch < 1:
            raise InvalidArgumentError(f"overfetch must be at least 1, got {overfetch}")
        col = self._vector_column(column)
        metric = metric or self.state.metadata.indexes.vector_metric
        dim = self.state.schema.field(col).type.list_size
        query = np.asarray(vector, dtype=np.float32).reshape(-1)
        if query.shape[0] != dim:
            raise InvalidArgumentError(f"the query has {query.shape[0]} dimensions; {col!r} has {dim}")
        pk = list(self.state.primary_key)
        out = list(self._output_schema(columns).names)
        wanted = list(dict.fromkeys([*pk, *out]))
        p = self.pruning(where)
        snap, tail = self._view(sorted(p.shard_ids) if p.shard_ids is not None else None)
        delta = self._vector_delta(snap, col)
        shadow = delta.keys
        newest = tail_keys(tail, pk, self.state.schema) if tail is not None else None
        if newest is not None:
            shadow = ShadowKeys(pk, self.state.schema)
            shadow.merge(delta.keys)
            shadow.merge(newest)
        parts = [self._search_base(snap, col, query, k, wanted, where, metric, nprobes, refine, overfetch, shadow)]
        if delta.rows.num_rows:
            keep = delta.where_mask(where)
            if newest is not None:  # the WAL tail supersedes these keys
                unshadowed = newest.keep_mask(delta.rows)
                keep = unshadowed if keep is None else keep & unshadowed
            dist = delta.distances(query, metric)  # all rows, then the kept ones: no copy of the matrix
            rows = delta.rows if keep is None else delta.rows.filter(pa.array(keep))
            parts.append(top_k(rows.select(wanted), dist if keep is None else dist[keep], k))
        for path, newer in delta.indexed:
            found = self.sstables.dataset(path).to_table(
                nearest={"column": col, "q": query, "k": max(k, int(k * overfetch)), "nprobes": nprobes, "refine_factor": refine, "metric": metric},
                columns=[*wanted, TOMBSTONE, "_distance"], filter=where, prefilter=True)
            for keys in newer:
                found = found.filter(pa.array([keys.find(v) is None for v in _key_values(found, pk)], pa.bool_())) if found.num_rows else found
            if newest is not None:
                found = newest.drop(found)
            parts.append(found.filter(pc.invert(found.column(TOMBSTONE))).select([*wanted, "_distance"]))
        if tail is not None:
            live = tail.filter(pc.invert(tail.column(TOMBSTONE))).drop_columns([TOMBSTONE])
            newer = filter_rows(live, where)
            parts.append(top_k(newer.select(wanted), distances(as_matrix(newer.column(col), dim), query, metric), k))
        schema = parts[0].schema
        found = pa.concat_tables([t.cast(schema) for t in parts])
        found = found.sort_by([("_distance", "ascending")]).slice(0, k)
        return found.select([*out, "_distance"])

    def _search_base(
        self, snap: Snapshot, col: str, query: np.ndarray, k: int, wanted: list[str], where: str | None, metric: str,
        nprobes: int, refine: int, overfetch: float, shadow: ShadowKeys,
    ) -> pa.Table:
        """The base's ``k`` nearest live rows that no newer level supersedes: Lance's search
        through the vector index (flat when there is none), ``overfetch`` candidates per
        result, fetched again four times as many while superseded ones leave fewer than
        ``k`` and the base has more."""
        indexed = self._vector_delta(snap, col).base_indexed
        fetch = max(k, int(np.ceil(k * overfetch)))
        while True:
            nearest: dict[str, Any] = {"column": col, "q": query, "k": fetch, "metric": metric}
            if indexed:
                nearest.update(nprobes=nprobes, refine_factor=refine)
            else:
                nearest["use_index"] = False
            # A prefilter only with a filter: asked for without one it cost 2.4 ms of 8 here.
            found = snap.dataset.to_table(nearest=nearest, columns=[*wanted, "_distance"], filter=where, prefilter=True if where else None)
            kept = shadow.drop(found)
            if kept.num_rows >= k or found.num_rows < fetch:
                return kept
            fetch *= 4

    def _vector_delta(self, snap: Snapshot, col: str) -> "DeltaVectors":
        """What a vector search of ``snap`` takes from its SSTables, built once per snapshot."""
        key = (snap.base_version, col, tuple(snap.sstable_paths()))
        cached = self._deltas.get(key)
        if cached is not None:
            return cached
        pk = list(self.state.primary_key)
        names = self.state.schema.names
        every = ShadowKeys(pk, self.state.schema)
        exact: list[pa.Table] = []
        indexed: list[tuple[str, list[sstables.KeySet]]] = []
        limit = self.config.vector_exact_sstable_rows
        for shard in snap.shards:
            newer = ShadowKeys(pk, self.state.schema)
            newer_sets: list[sstables.KeySet] = []
            sizes = {paths.sstable_path(snap.dataset.uri, shard.shard_id, t.path): t.physical_rows for t in shard.live_sstables}
            for path, keys in self._newest_sstables(snap, shard.shard_id):
                if sizes.get(path, 0) > limit and self.sstables.has_index(path, col, "VectorIndexDetails"):
                    indexed.append((path, list(newer_sets)))
                else:
                    rows = newer.drop(self.sstables.rows(path))
                    exact.append(rows.filter(pc.invert(rows.column(TOMBSTONE))).select(names))
                newer.add_key_set(keys)
                newer_sets.append(keys)
                every.add_key_set(keys)
        rows = pa.concat_tables(exact, promote_options="permissive").cast(self.state.schema) if exact else self.state.schema.empty_table()
        dim = self.state.schema.field(col).type.list_size
        delta = DeltaVectors(every, rows, as_matrix(rows.column(col), dim), indexed, vector_index_name(snap.dataset, col) is not None)
        if len(self._deltas) >= 4:
            self._deltas.clear()
        self._deltas[key] = delta
        return delta

    # -- full-text search -------------------------------------------------------------------------

    def text_search(
        self,
        query: str,
        k: int = 10,
        *,
        column: str | None = None,
        where: str | None = None,
        columns: Sequence[str] | None = None,
    ) -> pa.Table:
        """The ``k`` live rows best matching ``query`` by BM25, with their ``_score`` (best first).

        Scores use corpus statistics of the live rows across every LSM level (GlobalBM25),
        so rows from the base table, SSTables and the WAL tail are comparable.
        """
        col = column or self.state.metadata.indexes.fts_column
        if col is None:
            raise InvalidArgumentError("name the text column to search (or configure the table's fts_column)")
        # No shard pruning: BM25 statistics are those of the whole live table.
        snap, tail = self._view()
        out = list(columns) if columns else self.state.schema.names
        return text.search(self.state, self.sstables, self.text_stats, snap, tail, query, k, col, where, out)


def vector_index_name(ds: lance.LanceDataset, column: str) -> str | None:
    """The name of the vector (IVF) index on ``column``, if the dataset has one."""
    field_id = ds.lance_schema.field(column).id()
    for d in ds.describe_indices():
        if field_id in d.fields and "VectorIndexDetails" in d.type_url:
            return d.name
    return None


@dataclass
class DeltaVectors:
    """A snapshot's SSTables as a vector search sees them: every key they hold (which
    supersede the base), the newest live rows of those scored exactly with their vectors as
    one matrix, and the large indexed SSTables with the key sets of their shard's newer ones."""

    keys: ShadowKeys
    rows: pa.Table
    matrix: np.ndarray
    indexed: list[tuple[str, list[sstables.KeySet]]]
    #: whether the snapshot's base has a vector index on the column
    base_indexed: bool
    _masks: dict[str, np.ndarray] | None = None
    _norms: np.ndarray | None = None

    def distances(self, query: np.ndarray, metric: str) -> np.ndarray:
        """Exact distances of every row, as :func:`distances`; squared L2 as
        ``|m|^2 - 2 m.q + |q|^2`` with the rows' norms kept: one matrix-vector product
        instead of a copy of the matrix per query."""
        if metric != "l2":
            return distances(self.matrix, query, metric)
        if self._norms is None:
            self._norms = np.einsum("ij,ij->i", self.matrix, self.matrix)
        q = query.astype(np.float32)
        return np.maximum(self._norms - 2 * (self.matrix @ q) + float(q @ q), 0.0)

    def where_mask(self, where: str | None) -> np.ndarray | None:
        """Which exact rows match ``where`` (None: all), evaluated once per filter."""
        if not where:
            return None
        if self._masks is None:
            self._masks = {}
        mask = self._masks.get(where)
        if mask is None:
            marked = self.rows.append_column("__memwal_row", pa.array(np.arange(self.rows.num_rows, dtype=np.int64)))
            hit = filter_rows(marked, where).column("__memwal_row").to_numpy()
            mask = np.zeros(self.rows.num_rows, dtype=bool)
            mask[hit] = True
            if len(self._masks) >= 16:
                self._masks.clear()
            self._masks[where] = mask
        return mask


def tail_keys(tail: pa.Table, primary_key: list[str], schema: pa.Schema) -> ShadowKeys:
    """The WAL tail's keys, which supersede every other level."""
    keys = ShadowKeys(primary_key, schema)
    keys.add_rows(tail)
    return keys


def _key_values(rows: pa.Table, primary_key: list[str]) -> list[Any]:
    """The keys of ``rows`` in :meth:`KeySet.find`'s form."""
    cols = [rows.column(c).to_pylist() for c in primary_key]
    return cols[0] if len(cols) == 1 else list(zip(*cols))


class _KeysToFind:
    """Keys being looked up in SSTables newest first: which are still unresolved, and the
    positions of those an SSTable holds (tombstones resolve a key without a row)."""

    def __init__(self, keys: pa.Table, primary_key: list[str]) -> None:
        self.keys = keys
        self.primary_key = primary_key
        ints = merge_int_key(keys, primary_key)
        self.ints = ints
        self.open = np.ones(keys.num_rows, dtype=bool)
        self.values: list[Any] | None = None if ints is not None else [sstables.lookup_key(k, primary_key) for k in keys.to_pylist()]

    @property
    def done(self) -> bool:
        return not self.open.any()

    def find(self, key_set: sstables.KeySet) -> list[int]:
        """Resolve the open keys ``key_set`` holds; the positions of those it holds as rows."""
        found: list[int] = []
        if self.ints is not None and key_set.ints is not None:
            assert key_set.tombstones is not None and key_set.positions is not None
            at = np.flatnonzero(self.open)
            if not len(key_set.ints) or not len(at):
                return found
            i = np.searchsorted(key_set.ints, self.ints[at], side="right") - 1
            hit = (i >= 0) & (key_set.ints[np.maximum(i, 0)] == self.ints[at])
            self.open[at[hit]] = False
            rows = i[hit][~key_set.tombstones[i[hit]]]
            return np.unique(key_set.positions[rows]).tolist()  # a key asked twice is one row
        values = self.values if self.values is not None else [sstables.lookup_key(k, self.primary_key) for k in self.keys.to_pylist()]
        self.values = values
        for j in np.flatnonzero(self.open):
            hit = key_set.find(values[j])
            if hit is not None:
                self.open[j] = False
                if not hit[0]:
                    found.append(hit[1])
        return sorted(set(found))

    def remaining(self) -> pa.Table:
        """The keys no SSTable held."""
        return self.keys if self.open.all() else self.keys.filter(pa.array(self.open))


def _semi_join(rows: pa.Table, keys: pa.Table, pk: list[str]) -> pa.Table:
    """``rows`` whose primary key appears in ``keys`` (on the key columns only: Arrow's joins
    cannot carry every column type)."""
    if rows.num_rows == 0 or keys.num_rows == 0:
        return rows.slice(0, 0)
    if len(pk) == 1:
        return rows.filter(pc.is_in(rows.column(pk[0]), value_set=keys.column(pk[0]).combine_chunks()))
    probe = rows.select(pk).append_column("__memwal_row", pa.array(np.arange(rows.num_rows, dtype=np.int64)))
    hit = probe.join(keys.select(pk), keys=pk, join_type="left semi").column("__memwal_row")
    return rows.take(pc.take(hit, pc.sort_indices(hit)))


def _key_mask(rows: pa.Table, key: dict[str, Any]) -> pa.ChunkedArray:
    mask = None
    for col, value in key.items():
        m = pc.equal(rows.column(col), pa.scalar(value, rows.schema.field(col).type))
        mask = m if mask is None else pc.and_(mask, m)
    return mask


class _Refresher:
    """Refreshes a reader's snapshot every ``interval`` seconds on a daemon thread.

    It holds the reader only weakly between refreshes, so a reader nobody uses any more is
    collected and its thread ends within one interval; :meth:`Reader.close` ends it, after the
    refresh in progress if any. A failed refresh is logged and retried at the next interval;
    meanwhile reads use the last snapshot, and once it is ``BACKGROUND_STALE_INTERVALS``
    intervals old (counted from when it was started) they refresh themselves.
    """

    def __init__(self, reader: Reader, interval: float) -> None:
        self._reader = weakref.ref(reader)
        self._interval = interval
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"memwal-refresh {reader.state.uri}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(self._interval):
            reader = self._reader()
            if reader is None:
                return
            try:
                reader._refresh_and_warm()
            except Exception as e:  # noqa: BLE001 - the thread must outlive a failed refresh
                log.warning("background refresh of %s failed (retried in %.1f s): %s: %s",
                            reader.state.uri, self._interval, type(e).__name__, str(e).splitlines()[0] if str(e) else "")
            del reader

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not threading.current_thread():
            self._thread.join()


def open(  # noqa: A001 - mirrors lance.dataset / builtin open naming users expect
    uri: str,
    *,
    consistency: Consistency = "eventual",
    refresh_interval_ms: int | None = 1000,
    version: int | None = None,
    refresh_in_background: bool = False,
    config: ReadConfig | None = None,
    as_of: timetravel.AsOf | None = None,
    storage_options: "Mapping[str, str] | StorageConfig | None" = None,
) -> Reader:
    """Open a reader on the memwal table at ``uri``.

    ``consistency="eventual"`` reads the base table and every uncompacted SSTable, with a
    snapshot refreshed every ``refresh_interval_ms`` (None: only on :meth:`Reader.refresh`).
    By default the read that finds the snapshot stale refreshes it and pays for it (opening
    the new base version, reading new SSTables' keys). ``refresh_in_background=True`` does
    that on a thread of the reader's own and swaps the snapshot in when it is ready, so
    lookups do not wait for a refresh (unless the thread falls five intervals behind): for a
    process that serves reads (close it with
    :meth:`Reader.close` or a ``with`` block). ``as_of`` reads the table as it was (time
    travel, base and SSTables): at a base version (an int: when it was committed) or a time
    (a ``datetime``, naive meaning UTC, or Unix seconds), while GC keeps that state
    (``GcConfig.time_travel_seconds``); :class:`~memwal.errors.StateNotRetainedError` names
    the oldest readable state otherwise. ``version`` is ``as_of``'s older name for a base version.
    ``storage_options``: as :meth:`memwal.Table.open` takes them (Lance's key names, over the
    ``AWS_*``/``GOOGLE_*``/``AZURE_*`` environment variables).
    """
    return Reader(TableState.load(uri, storage_options), consistency=consistency, refresh_interval_ms=refresh_interval_ms,
                  version=version, refresh_in_background=refresh_in_background, config=config, as_of=as_of)
