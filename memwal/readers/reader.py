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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Mapping, Sequence

import lance
import lance.mem_wal
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal.readers import sstables
from memwal.readers.merge import base_without_delta, drop_keys
from memwal.readers.keys import keys_predicate, keys_table, quote_ident, sql_literal, typed_key
from memwal.readers.pruning import Pruning, prune
from memwal.readers import text
from memwal.readers.sql import filter_rows
from memwal.readers.vectors import as_matrix, distances, vector_columns
from memwal import paths
from memwal.errors import InvalidArgumentError, MemwalError, UnknownColumnError
from memwal.lsm import without_keys
from memwal.schema import TOMBSTONE
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


def base_point_read(dataset: lance.LanceDataset, columns: Sequence[str], predicate: str) -> pa.Table:
    """The live base rows matching ``predicate`` (a point predicate on the primary key).

    Asked for its live rows, Lance builds the whole table's deletion mask for every query, at
    about 9 ns per deleted row: every base row the compactor updated or deleted and base
    compaction has not yet rewritten away, 1.6 ms of a 2.6 ms lookup on a soaked 1.9M-row
    table against 0.8 ms on the same rows written fresh (docs/bench-log/lookup-history.md). Asked for
    deleted rows too, it skips the mask; a deleted row then comes back with a null
    ``_rowid``, so dropping those rows leaves exactly the live ones. The index narrows the
    read to the key's few versions first, so the extra rows cost nothing measurable.
    """
    rows = dataset.to_table(columns=list(columns), filter=predicate, with_row_id=True, include_deleted_rows=True, late_materialization=False)
    return rows.filter(pc.is_valid(rows.column("_rowid"))).drop_columns(["_rowid"])


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
    ) -> None:
        if consistency not in ("eventual", "strong"):
            raise InvalidArgumentError(f"consistency must be 'eventual' or 'strong', got {consistency!r}")
        if version is not None and consistency == "strong":
            raise InvalidArgumentError("time travel (version=) reads a base table version; it cannot be strongly consistent")
        self.state = state
        self.consistency = consistency
        self.refresh_interval_ms = refresh_interval_ms
        self.version = version
        self._snapshot: Snapshot | None = None
        #: when the current snapshot was started (monotonic): its age, and which of two is newer
        self._taken_at = 0.0
        self._publishing = threading.Lock()
        self._wal = WalTailReader(state.uri, state.io, state.manifests, state.primary_key)
        #: immutable SSTable data this reader has read, bounded by ``cache_bytes``
        self.sstables = sstables.SSTableCache(cache_bytes, state.storage_options)
        #: the base table's full-text corpus statistics (BM25), per base version
        self.text_stats = text.BaseTextStats()
        #: which plan the last vector search used (for explain and the benchmark)
        self.last_vector_plan = ""
        self._valid_filters: set[str] = set()
        #: the last point lookup's base predicate, replayed on each new base version by the
        #: background refresh so the first lookup on it finds its index pages loaded
        self._warm_predicate: str | None = None
        self._refresher: _Refresher | None = None
        if refresh_in_background:
            if consistency != "eventual" or version is not None or refresh_interval_ms is None or refresh_interval_ms <= 0:
                raise InvalidArgumentError("refresh_in_background needs an eventual reader of the latest version with a refresh_interval_ms")
            self.refresh()  # the first snapshot in the caller's thread: a bad table fails here
            self._refresher = _Refresher(self, refresh_interval_ms / 1000)

    # -- snapshots ------------------------------------------------------------------------------

    def refresh(self) -> Snapshot:
        """Take a new snapshot now: latest base version and shard manifests."""
        started = time.monotonic()
        if self.version is not None:
            # Time travel reads the base table as it was at that version: the table state
            # that compaction had produced then. SSTables carry no base version, so mixing
            # today's SSTables into an old base would be neither then nor now.
            snap = Snapshot(self.state.dataset(self.version), self.state.manifests.mem_wal_index(self.version), ())
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
            for path in snap.sstable_paths():
                self.sstables.keys(path, pk)
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
        if self.version is None and self.refresh_interval_ms is not None:
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
        schema = self._output_schema(columns)
        shard_id = self.state.shard_of_key(key)
        snap, tail = (pinned.restrict([shard_id]), None) if pinned is not None else self._view([shard_id])
        if tail is not None:
            hit = tail.filter(_key_mask(tail, key))
            if hit.num_rows:  # the unflushed WAL holds the newest version of this key
                if hit.column(TOMBSTONE)[0].as_py():
                    return schema.empty_table()
                return hit.select(schema.names)
        out = schema.names
        pk = list(self.state.primary_key)
        predicate = " AND ".join(f"{quote_ident(c)} = {sql_literal(key[c])}" for c in pk)
        state = snap.shard(shard_id)
        wanted = sstables.lookup_key(key, pk)
        for sst in reversed(state.live_sstables if state is not None else ()):  # newest first
            path = paths.sstable_path(snap.dataset.uri, shard_id, sst.path)
            tombstone = self.sstables.keys(path, pk).tombstone(wanted)
            if tombstone is not None:
                if tombstone:  # the newest version is a delete
                    return schema.empty_table()
                return self.sstables.read(path, columns=out, filter=predicate)
        # No SSTable holds the key: the base table's row (via its primary-key index), if any.
        self._warm_predicate = predicate
        return base_point_read(snap.dataset, out, predicate)

    def get(self, key: Any, columns: Sequence[str] | None = None) -> dict[str, Any] | None:
        """The live row with primary key ``key`` (scalar, tuple or dict), or None.

        A key value that is not of its column's type is a :class:`PrimaryKeyError`, as in
        :meth:`get_many`: :func:`typed_key` types it as :func:`keys_table` does.
        """
        t = self._lookup(typed_key(key, self.state.primary_key, self.state.schema), columns)
        return t.to_pylist()[0] if t.num_rows else None

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
        return self.scan(columns=columns, where=keys_predicate(kt))

    def rows_of_keys(self, keys: pa.Table, shard_id: str | None = None) -> pa.Table:
        """The live rows (every column) of ``keys`` (a table of the key columns, typed as the
        table's), all in ``shard_id`` when given; absent keys are left out.

        A vectorized semi-join on the keys instead of a SQL predicate of literals: partial
        updates read thousands of keys per write, and parsing (then evaluating) one literal
        per key cost more than the read itself (docs/bench-log/partial-updates.md).
        """
        pk = list(self.state.primary_key)
        names = self.state.schema.names
        snap, tail = self._view([shard_id] if shard_id is not None else None)
        delta = self.sstables.delta(snap, tail, names, pk)
        keys = keys.select(pk)
        live = None
        if delta is not None:
            mine = _semi_join(delta, keys, pk)
            keys = without_keys(keys, mine, pk)  # the delta holds their newest version
            live = mine.filter(pc.invert(mine.column(TOMBSTONE))).drop_columns([TOMBSTONE])
        if keys.num_rows == 0:
            base = self.state.schema.empty_table()
        elif len(pk) == 1:
            base = snap.dataset.to_table(columns=names, filter=pc.field(pk[0]).isin(keys.column(0).combine_chunks()))
        else:
            base = snap.dataset.to_table(columns=names, filter=keys_predicate(keys))
        if live is None or live.num_rows == 0:
            return base
        return pa.concat_tables([base, live.select(names).cast(base.schema)])

    # -- scans ---------------------------------------------------------------------------------

    def _output_schema(self, columns: Sequence[str] | None) -> pa.Schema:
        schema = self.state.schema
        if not columns:
            return schema
        unknown = [c for c in columns if c not in schema.names]
        if unknown:
            raise UnknownColumnError(f"no column(s) {unknown} in the table; its columns are {schema.names}")
        return pa.schema([schema.field(c) for c in columns])

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

    def _merge(
        self, snap: Snapshot, tail: pa.Table | None, wanted: Sequence[str], where: str | None, limit: int | None
    ) -> pa.Table:
        """Live rows matching ``where`` (``wanted`` holds the primary key): the base rows whose
        key the delta does not hold, plus the delta's live rows.

        This is the LSM merge with the base table read once, filtered and projected by Lance,
        and the (small) delta merged in memory, rather than deduplicating every row of every
        level as Lance's LsmScanner does (docs/bench-log/reads.md, "Reads", measures the difference).
        """
        pk = list(self.state.primary_key)
        # The delta is projected early, except when ``where`` must be evaluated on its rows
        # (it may name columns the read does not return).
        columns = list(wanted) if where is None else self.state.schema.names
        if tail is None and snap.num_live_sstables == 0:
            return snap.dataset.to_table(columns=list(wanted), filter=where, limit=limit)
        if limit is None:
            # The delta and the base scan are independent until the anti-join: read the
            # SSTables while Lance scans the base (both release the GIL).
            with ThreadPoolExecutor(1) as pool:
                pending = pool.submit(self.sstables.delta, snap, tail, columns, pk)
                scan = snap.dataset.scanner(columns=list(wanted), filter=where).to_reader()
                base, delta = base_without_delta(scan, pending, pk)
            if delta is None:
                return base
        else:
            # A limited scan fetches as many more base rows as the delta could shadow.
            delta = self.sstables.delta(snap, tail, columns, pk)
            if delta is None:
                return snap.dataset.to_table(columns=list(wanted), filter=where, limit=limit)
            base = drop_keys(snap.dataset.to_table(columns=list(wanted), filter=where, limit=limit + delta.num_rows), delta, pk)
        live = delta.filter(pc.invert(delta.column(TOMBSTONE))).drop_columns([TOMBSTONE])
        newer = filter_rows(live, where).select(list(wanted))
        rows = pa.concat_tables([base, newer.cast(base.schema)])
        return rows.slice(0, limit) if limit is not None else rows

    def scan(
        self,
        columns: Sequence[str] | None = None,
        where: str | None = None,
        limit: int | None = None,
    ) -> pa.Table:
        """Live rows (newest version per key, deleted keys absent) matching ``where`` (SQL)."""
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise InvalidArgumentError(f"limit must be a non-negative integer, got {limit!r}")
        out = self._output_schema(columns).names
        p = self.pruning(where)
        snap, tail = self._view(sorted(p.shard_ids) if p.shard_ids is not None else None)
        wanted = list(dict.fromkeys([*out, *self.state.primary_key]))
        return self._merge(snap, tail, wanted, where, limit).select(out)

    def to_batches(
        self,
        columns: Sequence[str] | None = None,
        where: str | None = None,
    ) -> pa.RecordBatchReader:
        """Like :meth:`scan`, as a record batch reader."""
        t = self.scan(columns, where)
        return pa.RecordBatchReader.from_batches(t.schema, t.to_batches())

    def count(self, where: str | None = None) -> int:
        """Number of live rows matching ``where``."""
        p = self.pruning(where)
        snap, tail = self._view(sorted(p.shard_ids) if p.shard_ids is not None else None)
        if tail is None and snap.num_live_sstables == 0:
            return snap.dataset.count_rows(filter=where)
        return self._merge(snap, tail, list(self.state.primary_key), where, None).num_rows


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
        nprobes: int = 20,
        columns: Sequence[str] | None = None,
        metric: str | None = None,
        overfetch: float = 4.0,
    ) -> pa.Table:
        """The ``k`` live rows nearest to ``vector``, with their ``_distance`` (nearest first).

        ``overfetch`` candidates per result are re-ranked with exact distances (recall
        against latency, see docs/bench-log/reads.md, "Reads").

        Only the newest version of a row can appear. With an IVF index on the base table,
        Lance's LSM vector planner searches every level (distances re-ranked exactly);
        without one the search is exact over the live rows. Strong readers also search the
        unflushed WAL tail.
        """
        if k <= 0:
            raise InvalidArgumentError(f"k must be positive, got {k}")
        col = self._vector_column(column)
        metric = metric or self.state.metadata.indexes.vector_metric
        dim = self.state.schema.field(col).type.list_size
        query = np.asarray(vector, dtype=np.float32).reshape(-1)
        if query.shape[0] != dim:
            raise InvalidArgumentError(f"the query has {query.shape[0]} dimensions; {col!r} has {dim}")
        pk = list(self.state.primary_key)
        out = list(columns) if columns else self.state.schema.names
        wanted = list(dict.fromkeys([*pk, col, *out]))
        p = self.pruning(where)
        snap, tail = self._view(sorted(p.shard_ids) if p.shard_ids is not None else None)
        fetch = k + (tail.num_rows if tail is not None else 0)
        index_name = vector_index_name(snap.dataset, col)
        if index_name is not None:
            # Lance's LSM planner searches only the part of the base its index covers. The
            # rows compacted since the index last caught up are found either through the
            # SSTables they came from (the spec's indexed read plan: their own indexes) or
            # by an exact search of the unindexed base fragments, whichever costs less.
            gap_snap = snap.with_index_gap(index_name)
            gap = gap_snap.num_live_sstables - snap.num_live_sstables
            unindexed = unindexed_fragments(snap.dataset, index_name)
            unindexed_rows = sum(f.count_rows() for f in unindexed)
            use_gap = gap > 0 and unindexed_rows > GAP_PLAN_MIN_ROWS_PER_SSTABLE * gap
            plan_snap = gap_snap if use_gap else snap
            self.last_vector_plan = "index gap SSTables" if use_gap else ("flat unindexed" if unindexed_rows else "indexed")
            planner = lance.mem_wal.LsmVectorSearchPlanner(
                plan_snap.dataset, plan_snap.lance_snapshots(), col, pk, distance_type=metric, filter=where
            )
            found = planner.plan_search(
                pa.array(query), fetch, nprobes, wanted, refine_base_table=True, overfetch_factor=overfetch
            ).to_table().select([*wanted, "_distance"])
            extra = []
            # Lance's planner also skips SSTables flushed from MemTables that predate the
            # vector index (they have none): search their newest rows exactly. Small SSTables
            # are scored exactly too: Lance indexes a flushed MemTable with IVF_HNSW_SQ, whose
            # graph search can miss a small SSTable's nearest row (seen: the nearest of 77).
            # Every column: ``where`` may name columns the result does not return.
            exact_sst = _unindexed_sstable_rows(self.sstables, plan_snap, col, self.state.schema.names, pk)
            if exact_sst is not None:
                # These rows are their keys' newest: they replace whatever the index found for
                # those keys, whether or not they match ``where``, and count if they match it.
                found = without_keys(found, exact_sst, pk)
                extra.append(filter_rows(exact_sst, where).select(wanted))
            if unindexed_rows and not use_gap:
                flat = snap.dataset.scanner(fragments=unindexed, columns=wanted, filter=where).to_table()
                newer = self.sstables.delta(snap, None, self.state.schema.names, pk)
                extra.append(without_keys(flat, newer, pk) if newer is not None else flat)
            for rows in extra:
                d = distances(as_matrix(rows.column(col), dim), query, metric)
                rows = rows.select(wanted).append_column("_distance", pa.array(d, pa.float32()))
                found = pa.concat_tables([found, rows.cast(found.schema)])
        else:
            rows = self._merge(snap, tail, wanted, where, None)  # exact: every live row, the WAL tail's too
            d = distances(as_matrix(rows.column(col), dim), query, metric)
            order = np.argsort(d, kind="stable")[:k]
            found = rows.take(pa.array(order, pa.int64())).append_column("_distance", pa.array(d[order], pa.float32()))
            tail = None
        if tail is not None:
            newer = filter_rows(tail.filter(pc.invert(tail.column(TOMBSTONE))).drop_columns([TOMBSTONE]), where)
            d = distances(as_matrix(newer.column(col), dim), query, metric)
            newer = newer.select(wanted).append_column("_distance", pa.array(d, pa.float32()))
            found = without_keys(found.select([*wanted, "_distance"]), tail, pk)
            found = pa.concat_tables([found, newer.cast(found.schema)])
        found = found.sort_by([("_distance", "ascending")]).slice(0, k)
        return found.select([*out, "_distance"])

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


def _unindexed_sstable_rows(cache: sstables.SSTableCache, snap: Snapshot, column: str, columns: list[str], pk: list[str]) -> pa.Table | None:
    """Live rows of SSTables without a vector index on ``column``, or with fewer than
    ``EXACT_SSTABLE_MAX_ROWS`` rows, that no newer generation of their shard supersedes
    (tombstones dropped); None if there are none."""
    out = []
    for shard in snap.shards:
        ssts = shard.live_sstables
        for i, sst in enumerate(ssts):
            path = paths.sstable_path(snap.dataset.uri, shard.shard_id, sst.path)
            small = 0 < sst.physical_rows < EXACT_SSTABLE_MAX_ROWS
            if not small and cache.has_index(path, column, "VectorIndexDetails"):
                continue
            # A small SSTable's rows (whole: one cache entry whatever the columns asked) and
            # every newer SSTable's keys come from the reader's cache (an SSTable never
            # changes), with one anti-join against all newer keys: uncached, one read per pair,
            # this cost a search with 12 small SSTables 22 ms (docs/bench-log/reads.md). A large one
            # without an index is read uncached, so it cannot push the key sets out.
            rows = cache.rows(path) if small else cache.read(path, columns=[*columns, TOMBSTONE])
            rows = rows.filter(pc.invert(rows.column(TOMBSTONE))).select(columns)
            newer = [cache.rows(paths.sstable_path(snap.dataset.uri, shard.shard_id, n.path), columns=pk).select(pk) for n in ssts[i + 1 :]]
            if newer:
                rows = without_keys(rows, pa.concat_tables(newer), pk)
            out.append(rows)
    if not out:
        return None
    return pa.concat_tables(out)


#: SSTables with fewer rows than this are scored exactly in a vector search, beside what
#: Lance's planner finds through their own (approximate, IVF_HNSW_SQ) index: it makes a small
#: SSTable's recall 1, for ~0.4 ms per ~500-row SSTable (bench/read.py, docs/bench-log/reads.md).
EXACT_SSTABLE_MAX_ROWS = 4096

#: The indexed read plan reads the index gap's SSTables instead of scanning the unindexed
#: base fragments when those hold more than this many rows per gap SSTable. Measured here
#: (bench/read.py, docs/bench-log/reads.md): an exact scan costs ~0.3 us per 64-d row, probing a
#: gap SSTable's index ~2 ms, break-even near 7,000 rows per SSTable.
GAP_PLAN_MIN_ROWS_PER_SSTABLE = 10_000


def unindexed_fragments(ds: lance.LanceDataset, index_name: str) -> list:
    """The base fragments index ``index_name`` does not cover yet."""
    covered: set[int] = set()
    for d in ds.describe_indices():
        if d.name == index_name:
            for seg in d.segments:
                covered.update(int(f) for f in seg.fragment_ids)
    return [f for f in ds.get_fragments() if f.fragment_id not in covered]


def vector_index_name(ds: lance.LanceDataset, column: str) -> str | None:
    """The name of the vector (IVF) index on ``column``, if the dataset has one."""
    field_id = ds.lance_schema.field(column).id()
    for d in ds.describe_indices():
        if field_id in d.fields and "VectorIndexDetails" in d.type_url:
            return d.name
    return None


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
    :meth:`Reader.close` or a ``with`` block). ``version`` reads the base table as of that
    version (time travel). ``storage_options``: as :meth:`memwal.Table.open` takes them (Lance's
    key names, over the ``AWS_*``/``GOOGLE_*``/``AZURE_*`` environment variables).
    """
    return Reader(TableState.load(uri, storage_options), consistency=consistency, refresh_interval_ms=refresh_interval_ms,
                  version=version, refresh_in_background=refresh_in_background)
