"""Vector search over every LSM level: the ``k`` live rows nearest to a query vector.

The base table is searched one of two ways, chosen per query by :class:`VectorPlanner` from
what this reader measured: by Lance through its vector index, asking for more candidates
than wanted so that those a newer level supersedes can be dropped; or exactly, from a matrix
of the base's vectors kept per base version, the superseded rows masked (a small base: one
matrix-vector product beats the index's graph walk there, and its recall is 1). The SSTables' newest live
rows are scored exactly from a matrix built once per snapshot (:class:`DeltaVectors`; large
indexed SSTables through their own index, minus the keys of newer ones; many rows through a
shortlist: scored first in a reduced space, then the nearest of those exactly,
:class:`~memwal.readers.vectors.Shortlisted`), and so is a strong reader's WAL tail; the
nearest of all are returned. Lance's own LSM vector planner cost
100 ms of planning and 100 ms of execution per search on 16.5k rows with 24 SSTables, where
the base's own search took 5 ms (docs/bench-log/reads.md, "Vector search on real embeddings").
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal.core import paths
from memwal.core.errors import InvalidArgumentError
from memwal.readers.config import ReadConfig
from memwal.readers.points import BaseLookup
from memwal.readers.sql import filter_rows
from memwal.readers.sstables import KeySet, LiveKeySets, SSTableCache
from memwal.readers.stream import ShadowKeys
from memwal.readers.vectors import (
    METRICS, Projection, Shortlisted, as_matrix, distances, matvec, nearest, rows_at, top_k, vector_columns,
)
from memwal.core.schema import TOMBSTONE
from memwal.core.snapshot import Snapshot
from memwal.core.state import TableState

#: At most this many snapshots' :class:`DeltaVectors` are kept (a few columns of the current one).
DELTAS_KEPT = 4
#: At most this many filters' row masks are kept per :class:`DeltaVectors`.
MASKS_KEPT = 16


@dataclass(frozen=True)
class VectorQuery:
    """A checked vector search: the column, the query vector (float32, of the column's
    dimension), ``k`` and the search parameters, the reader's defaults filled in."""

    column: str
    vector: np.ndarray
    k: int
    metric: str
    nprobes: int
    refine_factor: int
    overfetch: float


class VectorSearch:
    """A reader's vector searches, with what they build once per snapshot."""

    def __init__(self, state: TableState, config: ReadConfig, cache: SSTableCache, live_keys: LiveKeySets) -> None:
        self.state = state
        self.config = config
        self.cache = cache
        self.live_keys = live_keys
        #: per snapshot and vector column: what a vector search takes from the SSTables
        self._deltas: dict[tuple, DeltaVectors] = {}
        #: the WAL tail last searched, as a search takes it
        self._last_tail: TailVectors | None = None
        #: the base's vectors as a matrix, for exact scoring (the latest base version searched)
        self._base: BaseVectors | None = None
        #: (base version, its live rows), counted once per version
        self._base_rows: tuple[int | None, int] = (None, 0)
        #: the base version last searched through its index
        self._lookup: BaseLookup | None = None
        #: ((base version, column, dimensions), projection) of the SSTable rows' shortlist
        self._projection: tuple[tuple, Projection] | None = None
        self.planner = VectorPlanner(config)

    def query(
        self,
        vector: Sequence[float] | np.ndarray,
        k: int,
        column: str | None,
        metric: str | None,
        nprobes: int | None,
        refine_factor: int | None,
        overfetch: float | None,
    ) -> VectorQuery:
        """The search asked for, checked, with ``ReadConfig``'s and the table's defaults for
        what is not given; :class:`InvalidArgumentError` if it cannot run."""
        if k <= 0:
            raise InvalidArgumentError(f"k must be positive, got {k}")
        cfg = self.config
        overfetch = cfg.vector_overfetch if overfetch is None else overfetch
        if overfetch < 1:
            raise InvalidArgumentError(f"overfetch must be at least 1, got {overfetch}")
        col = self._column(column)
        dim = self.state.schema.field(col).type.list_size
        query = np.asarray(vector, dtype=np.float32).reshape(-1)
        if query.shape[0] != dim:
            raise InvalidArgumentError(f"the query has {query.shape[0]} dimensions; {col!r} has {dim}")
        return VectorQuery(
            col, query, k, metric or self.state.metadata.indexes.vector_metric,
            cfg.vector_nprobes if nprobes is None else nprobes,
            cfg.vector_refine_factor if refine_factor is None else refine_factor, overfetch)

    def _column(self, column: str | None) -> str:
        if column is not None:
            return column
        configured = self.state.metadata.indexes.vector_column
        if configured:
            return configured
        candidates = vector_columns(self.state.schema)
        if len(candidates) != 1:
            raise InvalidArgumentError(f"name the vector column to search (candidates: {candidates})")
        return candidates[0]

    def search(self, q: VectorQuery, snap: Snapshot, tail: pa.Table | None, out: list[str], where: str | None) -> pa.Table:
        """The ``q.k`` live rows of ``snap`` and ``tail`` matching ``where`` nearest to
        ``q.vector``, columns ``out`` and ``_distance``, nearest first."""
        col, query, k, metric = q.column, q.vector, q.k, q.metric
        pk = list(self.state.primary_key)
        wanted = list(dict.fromkeys([*pk, *out]))
        delta = self._delta(snap, col)
        newest = self._tail(tail, col, delta) if tail is not None else None
        shadows = [delta.keys] if newest is None else [delta.keys, newest.keys]
        parts = [self._base_part(snap, q, wanted, where, shadows, delta, newest)]
        if delta.rows.num_rows:
            keep = delta.where_mask(where)
            if newest is not None:  # the WAL tail supersedes these keys
                keep = newest.unshadowed if keep is None else keep & newest.unshadowed
            shortlisted = self._shortlisted(delta, col)
            if shortlisted is None:
                dist = delta.distances(query, metric)  # all rows, then the kept ones: no copy of the matrix
                parts.append(top_k(delta.rows.select(wanted), dist, k, None if keep is None else np.flatnonzero(keep)))
            else:
                cfg = self.config
                picked = shortlisted.nearest(query, metric, k, cfg.vector_shortlist, cfg.vector_shortlist_probe, keep)
                parts.append(rows_at(delta.rows.select(wanted), *picked))
        for path, newer in delta.indexed:
            found = self.cache.read(
                path,
                nearest={"column": col, "q": query, "k": max(k, int(k * q.overfetch)), "nprobes": q.nprobes,
                         "refine_factor": q.refine_factor, "metric": metric},
                columns=[*wanted, TOMBSTONE, "_distance"], filter=where, prefilter=True)
            for keys in newer:
                found = found.filter(pa.array([keys.find(v) is None for v in _key_values(found, pk)], pa.bool_())) if found.num_rows else found
            if newest is not None:
                found = newest.keys.drop(found)
            parts.append(found.filter(pc.invert(found.column(TOMBSTONE))).select([*wanted, "_distance"]))
        if newest is not None and newest.rows.num_rows:
            among = newest.where_rows(where)
            parts.append(top_k(newest.rows.select(wanted), newest.distances(query, metric), k, among))
        schema = parts[0].schema
        found = pa.concat_tables([t.cast(schema) for t in parts])
        found = found.sort_by([("_distance", "ascending")]).slice(0, k)
        return found.select([*out, "_distance"])

    def _shortlisted(self, delta: "DeltaVectors", col: str) -> Shortlisted | None:
        """The SSTable rows' matrix scored through a projection, when it is large enough to
        be worth it (``ReadConfig.vector_shortlist_*``); built once per snapshot. The
        projection and its partitions are fitted on the first such matrix of a base version
        and kept for the version's snapshots until they hold twice its rows: new SSTables
        come from the same distribution, and fitting costs more than projecting."""
        cfg = self.config
        dims = cfg.vector_shortlist_dims
        if not dims or delta.rows.num_rows < max(cfg.vector_shortlist_min_rows, 1) or dims >= delta.matrix.shape[1]:
            return None
        if delta.shortlisted is None:
            key = (delta.base_version, col, dims)
            n = delta.rows.num_rows
            last = self._projection
            if last is None or last[0] != key or n > 2 * last[1].fitted_rows:
                partitions = n // cfg.vector_shortlist_partition_rows if cfg.vector_shortlist_partition_rows else 1
                last = self._projection = (key, Projection.fit(delta.matrix, dims, partitions))
            delta.shortlisted = Shortlisted.build(delta.matrix, last[1])
        return delta.shortlisted

    def _tail(self, tail: pa.Table, col: str, delta: "DeltaVectors") -> "TailVectors":
        """What a search takes from a strong reader's WAL tail, built once per tail (the
        reader hands out the same table while the tail's entries do not change) and snapshot."""
        last = self._last_tail
        if last is not None and last.tail is tail and last.delta is delta:
            return last
        dim = self.state.schema.field(col).type.list_size
        live = tail.filter(pc.invert(tail.column(TOMBSTONE))).drop_columns([TOMBSTONE])
        keys = tail_keys(tail, list(self.state.primary_key), self.state.schema)
        self._last_tail = TailVectors(tail, delta, keys, live, as_matrix(live.column(col), dim), keys.keep_mask(delta.rows))
        return self._last_tail

    def _base_part(self, snap: Snapshot, q: VectorQuery, wanted: list[str], where: str | None, shadows: list[ShadowKeys],
                   delta: "DeltaVectors", newest: "TailVectors | None") -> pa.Table:
        """The base's ``k`` nearest live rows that no newer level supersedes, by the plan the
        planner chooses; its time is recorded for the next choice."""
        ds = snap.dataset
        dim = self.state.schema.field(q.column).type.list_size
        if self._base_rows[0] != ds.version:
            self._base_rows = (ds.version, ds.count_rows())
        rows = self._base_rows[1]
        exact_ok = (q.metric in METRICS and (not where or len(self.state.primary_key) == 1)
                    and rows * dim * 4 <= self.config.vector_exact_max_bytes)
        self.planner.searched(ds.version)
        built = self._base is not None and self._base.version == ds.version and self._base.column == q.column
        plan = self.planner.choose(rows * dim, exact_ok, delta.base_indexed, built)
        if plan == "exact" and not built:
            t0 = time.perf_counter()
            self._base_vectors(ds, q.column)
            self.planner.built(time.perf_counter() - t0)
        t0 = time.perf_counter()
        if plan == "exact":
            found = self._search_base_exact(ds, q, wanted, where, delta, newest)
        else:
            found = self._search_base(snap, q, wanted, where, shadows, delta.base_indexed)
        self.planner.record(plan, rows * dim, time.perf_counter() - t0)
        return found

    def _base_lookup(self, ds: lance.LanceDataset) -> BaseLookup:
        """The base version's searches through Lance's native scanner (pylance's Python
        builder deep-copies its options on every call: 0.25 ms of a 2.4 ms search)."""
        if self._lookup is None or self._lookup.dataset is not ds:
            self._lookup = BaseLookup(ds)
        return self._lookup

    def _base_vectors(self, ds: lance.LanceDataset, col: str) -> "BaseVectors":
        """The base version's vectors as one matrix with its keys, read once per version."""
        base = self._base
        if base is None or base.version != ds.version or base.column != col:
            pk = list(self.state.primary_key)
            t = ds.to_table(columns=[*pk, col])
            dim = self.state.schema.field(col).type.list_size
            matrix = as_matrix(t.column(col), dim)
            base = self._base = BaseVectors(ds.version, col, t.select(pk), matrix, t.num_rows)
        return base

    def _search_base_exact(self, ds: lance.LanceDataset, q: VectorQuery, wanted: list[str], where: str | None,
                           delta: "DeltaVectors", newest: "TailVectors | None") -> pa.Table:
        """The base's ``k`` nearest live rows, scored exactly: every row's distance from the
        version's matrix, the rows a newer level supersedes (and those ``where`` leaves out)
        masked, the ``k`` nearest taken from the base by position."""
        base = self._base_vectors(ds, q.column)
        dist = base.distances(q.vector, q.metric)
        keep = base.keep_mask(delta)
        if newest is not None:
            keep = keep & base.keep_mask(newest)
        if where:
            keep = keep & base.where_mask(ds, where, self.state.primary_key[0])
        among = np.flatnonzero(keep & ~np.isnan(dist))  # a null vector has no distance: never a result (as in Lance)
        if len(among) == 0:
            return ds.schema.empty_table().select(wanted).append_column("_distance", pa.array([], pa.float32()))
        picked, d = nearest(dist, q.k, among)
        return ds.take(picked.tolist(), columns=wanted).append_column("_distance", pa.array(d, pa.float32()))

    def _search_base(
        self, snap: Snapshot, q: VectorQuery, wanted: list[str], where: str | None, shadows: list[ShadowKeys], indexed: bool
    ) -> pa.Table:
        """The base's ``k`` nearest live rows that no newer level supersedes: Lance's search
        through the vector index (flat when there is none), ``overfetch`` candidates per
        result, fetched again four times as many while superseded ones leave fewer than
        ``k`` and the base has more."""
        k = q.k
        fetch = max(k, int(np.ceil(k * q.overfetch)))
        while True:
            nearest: dict[str, Any] = {"column": q.column, "q": q.vector, "k": fetch, "metric": q.metric}
            if indexed:
                nearest.update(nprobes=q.nprobes, refine_factor=q.refine_factor)
            else:
                nearest["use_index"] = False
            # A prefilter only with a filter: asked for without one it cost 2.4 ms of 8 here.
            found = self._base_lookup(snap.dataset).search([*wanted, "_distance"], nearest, where, True if where else None)
            kept = found
            for shadow in shadows:  # each level's keys apart: merging them cost a sort per search
                kept = shadow.drop(kept)
            if kept.num_rows >= k or found.num_rows < fetch:
                return kept
            fetch *= 4

    def _delta(self, snap: Snapshot, col: str) -> "DeltaVectors":
        """What a vector search of ``snap`` takes from its SSTables, built once per snapshot."""
        # A strong reader takes a new snapshot per search: the key is what makes two equal
        # (each shard's manifest version and where its live SSTables start), cheap to build.
        key = (snap.base_version, col, tuple((s.shard_id, s.manifest.version, s.compacted_generation, s.read_after) for s in snap.shards))
        cached = self._deltas.get(key)
        if cached is not None:
            return cached
        pk = list(self.state.primary_key)
        names = self.state.schema.names
        every = ShadowKeys(pk, self.state.schema)
        exact: list[pa.Table] = []
        indexed: list[tuple[str, list[KeySet]]] = []
        limit = self.config.vector_exact_sstable_rows
        for shard in snap.shards:
            newer = ShadowKeys(pk, self.state.schema)
            newer_sets: list[KeySet] = []
            sizes = {paths.sstable_path(snap.dataset.uri, shard.shard_id, t.path): t.physical_rows for t in shard.live_sstables}
            for path, keys in self.live_keys.newest(snap, shard.shard_id):
                if sizes.get(path, 0) > limit and self.cache.has_index(path, col, "VectorIndexDetails"):
                    indexed.append((path, list(newer_sets)))
                else:
                    rows = newer.drop(self.cache.rows(path))
                    exact.append(rows.filter(pc.invert(rows.column(TOMBSTONE))).select(names))
                newer.add_key_set(keys)
                newer_sets.append(keys)
                every.add_key_set(keys)
        # One chunk: a search takes its k rows from here, and a take over one chunk per
        # SSTable cost 0.35 ms of a 5 ms search (reads.md).
        rows = pa.concat_tables(exact, promote_options="permissive").cast(self.state.schema).combine_chunks() if exact else self.state.schema.empty_table()
        dim = self.state.schema.field(col).type.list_size
        delta = DeltaVectors(every, rows, as_matrix(rows.column(col), dim), indexed, vector_index_name(snap.dataset, col) is not None,
                             snap.base_version)
        if len(self._deltas) >= DELTAS_KEPT:
            self._deltas.clear()
        self._deltas[key] = delta
        return delta


class VectorPlanner:
    """Chooses how a vector search reads the base, from what the reader measured: the index's
    latency (its last searches, averaged) against exact scoring's: its cost per vector cell
    times the base's cells, plus the read of the base's vectors a new base version takes,
    shared by the searches a version has seen on average (a base that compaction moves on
    every second, searched now and then, pays that read on nearly every search). An
    unmeasured plan is tried once, so both get measured; a base without a vector index is
    always scored exactly when it fits (Lance's flat search does the same work, reading the
    vectors again each time). ``ReadConfig.vector_plan`` forces one.

    Invariant: the choice changes which rows are candidates, never the answer's rule: both
    plans return the base's nearest live rows that no newer level supersedes (exact scoring
    with recall 1, the index up to its recall)."""

    #: Weight of the newest measurement in the running averages.
    ALPHA = 0.2
    #: After this many searches by one plan the other is tried once again: its last
    #: measurement may have been a cold start, or the base has grown since.
    EXPLORE_EVERY = 64
    #: Each plan is measured this many times before the averages decide (a first search pays
    #: cold caches: the index's, the masks of what supersedes base rows).
    WARM_UP = 3
    #: Plans whose expected costs are within this factor are close enough to be tried again.
    CLOSE = 2.0

    def __init__(self, config: ReadConfig) -> None:
        self.config = config
        #: seconds per search through the index, and per vector cell (row x dimension) exactly
        self.index_seconds: float | None = None
        self.exact_seconds_per_cell: float | None = None
        self.chosen: dict[str, int] = {"exact": 0, "index": 0}
        self.samples: dict[str, int] = {"exact": 0, "index": 0}
        self._since_other = 0
        #: seconds to read a base version's vectors, and searches per base version (averaged)
        self.build_seconds: float | None = None
        self.searches_per_version: float | None = None
        self._version: int | None = None
        self._searches = 0

    def choose(self, cells: int, exact_ok: bool, indexed: bool, built: bool = False) -> str:
        """The plan of a search of ``cells`` vector cells (``exact_ok``: the base fits the
        exact plan; ``indexed``: it has a vector index; ``built``: its vectors are read)."""
        forced = self.config.vector_plan
        if forced != "auto":
            plan = "exact" if forced == "exact" and exact_ok else "index"
        elif not exact_ok:
            plan = "index"
        elif not indexed:
            plan = "exact"
        elif self.samples["index"] < self.WARM_UP:
            plan = "index"
        elif self.samples["exact"] < self.WARM_UP:
            plan = "exact"
        else:
            exact, index = self.exact_seconds(cells, built), self.index_seconds
            plan = "exact" if exact < index else "index"
            self._since_other += 1
            # Only a close call is tried again: a plan measured several times slower stays so
            # (trying it would cost the search that many times: exact scoring of a large base).
            if self._since_other > self.EXPLORE_EVERY and max(exact, index) < self.CLOSE * min(exact, index):
                plan, self._since_other = ("index" if plan == "exact" else "exact"), 0
        self.chosen[plan] += 1
        return plan

    def exact_seconds(self, cells: int, built: bool = False) -> float:
        """What an exact search of ``cells`` is expected to cost: with the base version's
        vectors not read yet, its share of that read (among the searches a version has seen)."""
        per_search = cells * (self.exact_seconds_per_cell or 0.0)
        if built or self.build_seconds is None:
            return per_search
        return per_search + self.build_seconds / max(1.0, self.searches_per_version or 1.0)

    def searched(self, version: int) -> None:
        """A search of the base at ``version`` begins (counts searches per version)."""
        if version != self._version:
            if self._version is not None:
                old = self.searches_per_version
                n = float(self._searches)
                self.searches_per_version = n if old is None else (1 - self.ALPHA) * old + self.ALPHA * n
            self._version, self._searches = version, 0
        self._searches += 1

    def built(self, seconds: float) -> None:
        """The base's vectors were read for a new version in ``seconds``."""
        old = self.build_seconds
        self.build_seconds = seconds if old is None else (1 - self.ALPHA) * old + self.ALPHA * seconds

    def record(self, plan: str, cells: int, seconds: float) -> None:
        self.samples[plan] += 1
        if self.samples[plan] == 1:  # cold: the index's first load, the masks' first build
            return
        if plan == "index":
            self.index_seconds = seconds if self.index_seconds is None else (1 - self.ALPHA) * self.index_seconds + self.ALPHA * seconds
        elif cells:
            per = seconds / cells
            old = self.exact_seconds_per_cell
            self.exact_seconds_per_cell = per if old is None else (1 - self.ALPHA) * old + self.ALPHA * per


@dataclass
class BaseVectors:
    """A base version's vectors as one matrix (in the base's row order, as ``take`` counts
    positions), with the rows' keys, for exact scoring; the masks of what supersedes rows are
    kept per level object (a snapshot's SSTables, a WAL tail) and per filter."""

    version: int
    column: str
    keys: pa.Table
    matrix: np.ndarray
    rows: int
    _norms: np.ndarray | None = None
    _keep: dict[int, tuple[Any, np.ndarray]] = field(default_factory=dict)
    _where: dict[str, np.ndarray] = field(default_factory=dict)

    def distances(self, query: np.ndarray, metric: str) -> np.ndarray:
        """As :func:`distances`, the rows' squared norms kept for the version (l2, cosine)."""
        if self._norms is None:
            self._norms = np.einsum("ij,ij->i", self.matrix, self.matrix)
        q = query.astype(np.float32)
        if metric == "l2":
            return np.maximum(self._norms - 2 * matvec(self.matrix, q) + float(q @ q), 0.0)
        if metric == "cosine":
            with np.errstate(invalid="ignore", divide="ignore"):
                return 1.0 - matvec(self.matrix, q) / (np.sqrt(self._norms) * float(np.linalg.norm(q)))
        return distances(self.matrix, query, metric)

    def keep_mask(self, level: "DeltaVectors | TailVectors") -> np.ndarray:
        """The rows whose key ``level`` does not hold, once per level object."""
        hit = self._keep.get(id(level))
        if hit is not None and hit[0] is level:
            return hit[1]
        mask = level.keys.keep_mask(self.keys)
        if len(self._keep) >= DELTAS_KEPT:
            self._keep.clear()
        self._keep[id(level)] = (level, mask)
        return mask

    def where_mask(self, ds: lance.LanceDataset, where: str, key: str) -> np.ndarray:
        """The rows matching ``where`` (Lance evaluates it on the base, giving their keys),
        once per filter."""
        mask = self._where.get(where)
        if mask is None:
            matched = ds.to_table(columns=[key], filter=where).column(key)
            mask = pc.is_in(self.keys.column(key), value_set=matched.combine_chunks()).to_numpy(zero_copy_only=False)
            if len(self._where) >= MASKS_KEPT:
                self._where.clear()
            self._where[where] = mask
        return mask


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
    indexed: list[tuple[str, list[KeySet]]]
    #: whether the snapshot's base has a vector index on the column
    base_indexed: bool
    base_version: int | None = None
    #: the rows scored through a projection first (large ones, ``VectorSearch._shortlisted``)
    shortlisted: Shortlisted | None = None
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
        return np.maximum(self._norms - 2 * matvec(self.matrix, q) + float(q @ q), 0.0)

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
            if len(self._masks) >= MASKS_KEPT:
                self._masks.clear()
            self._masks[where] = mask
        return mask


@dataclass
class TailVectors:
    """A strong reader's WAL tail as a vector search sees it: its keys (which supersede every
    other level), its live rows with their vectors as one matrix, and which of the snapshot's
    exact SSTable rows (``delta``'s) it leaves unshadowed."""

    tail: pa.Table
    delta: DeltaVectors
    keys: ShadowKeys
    rows: pa.Table
    matrix: np.ndarray
    unshadowed: np.ndarray

    def distances(self, query: np.ndarray, metric: str) -> np.ndarray:
        return distances(self.matrix, query, metric)

    def where_rows(self, where: str | None) -> np.ndarray | None:
        """The positions of the live rows matching ``where`` (None: all)."""
        if not where:
            return None
        marked = self.rows.append_column("__memwal_row", pa.array(np.arange(self.rows.num_rows, dtype=np.int64)))
        return np.sort(filter_rows(marked, where).column("__memwal_row").to_numpy())


def tail_keys(tail: pa.Table, primary_key: list[str], schema: pa.Schema) -> ShadowKeys:
    """The WAL tail's keys, which supersede every other level."""
    keys = ShadowKeys(primary_key, schema)
    keys.add_rows(tail)
    return keys


def _key_values(rows: pa.Table, primary_key: list[str]) -> list[Any]:
    """The keys of ``rows`` in :meth:`KeySet.find`'s form."""
    cols = [rows.column(c).to_pylist() for c in primary_key]
    return cols[0] if len(cols) == 1 else list(zip(*cols))
