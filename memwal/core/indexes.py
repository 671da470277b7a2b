"""Base table indexes: creating the configured ones and catching them up after compaction.

Compaction appends and rewrites base fragments that no index covers yet. Until an index is
brought up to date, its queries scan the uncovered fragments (or, with the indexed read
plan, use the SSTables' own indexes). ``optimize_indices`` adds the new fragments to every
index without retraining (a vector index keeps its codebook, which MemTables share), and
Lance records the compacted generations the indexes now cover in ``index_catchup``.

An index is kept as a few segments of geometrically growing size (:class:`SegmentPolicy`),
like an LSM's levels: a catch-up writes the new rows as a small delta segment and merges it
with the newest segments only while they are comparable in size. Merging into one segment
every time would rewrite the whole index each cycle (the hour-long soak measured it growing
from 0.33 to 2.45 s as the table grew); a query pays one search per segment instead (~35 us on
a BTREE), and the count stays small. Lance only merges base fragments that the same index
segments cover, so base-file compaction first joins the segments of the fragments it merges
(:meth:`IndexMaintainer.join_segments`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Collection, Sequence

import lance

from memwal.core.lance_errors import repeat_unavailable
from memwal.core.manifest import MEM_WAL_INDEX_NAME, MemWalIndex

if TYPE_CHECKING:
    from memwal.core.state import TableState

log = logging.getLogger(__name__)

#: Below this many rows the vector index is not created: an exact search of 5,000 384-d
#: rows costs about what the index search costs (docs/bench-log/reads.md), and the reader
#: searches a base without a vector index exactly.
MIN_ROWS_FOR_VECTOR_INDEX = 5_000
#: The vector index memwal builds: IVF_HNSW_SQ, a graph per IVF partition over 8-bit scalar
#: quantized vectors. Measured on 384-d all-MiniLM-L6-v2 text embeddings (16.5k and 51.8k
#: rows, docs/bench-log/reads.md), with 20 partitions probed and a refine factor of 4:
#: recall@10 0.998, against 0.81 and 0.97 for IVF_PQ with 16 and 48 sub-vectors (which
#: also took 5-10x longer to build).
VECTOR_INDEX_TYPE = "IVF_HNSW_SQ"
#: Rows per IVF partition. Recall on those embeddings fell with the share of partitions
#: probed (0.94 at 20 of 100), while the graphs keep a partition's search cheap: few, large
#: partitions, so that ``ReadConfig.vector_nprobes`` (20) probes every one up to 5M rows.
VECTOR_ROWS_PER_PARTITION = 250_000

#: Tokenizer of the inverted (full-text) index: Lance's "simple" tokenizer, lower-cased, no
#: stemming or stop words. memwal.readers.bm25 tokenizes the same way, so the statistics
#: it aggregates across LSM levels count the same terms as the index.
FTS_MAX_TOKEN_LEN = 40
FTS_PARAMS = {
    "base_tokenizer": "simple",
    "lower_case": True,
    "stem": False,
    "remove_stop_words": False,
    "ascii_folding": False,
    "max_token_length": FTS_MAX_TOKEN_LEN,
    "with_position": False,
}


def vector_index_name(column: str) -> str:
    """The name memwal gives the vector index on ``column`` (tables made before IVF_HNSW_SQ
    have an IVF_PQ index under the same name; the reader finds either by its column)."""
    return f"{column}_ivf_pq"


def vector_index_params(rows: int) -> dict[str, object] | None:
    """How to build the vector index of a base of ``rows`` rows (``create_index`` keyword
    arguments), or None while an exact search is as cheap."""
    if rows < MIN_ROWS_FOR_VECTOR_INDEX:
        return None
    return {"index_type": VECTOR_INDEX_TYPE, "num_partitions": max(1, -(-rows // VECTOR_ROWS_PER_PARTITION))}


def has_vector_index(ds: lance.LanceDataset, column: str) -> bool:
    """Whether the dataset has a vector index on ``column``, whatever its name."""
    field_id = ds.lance_schema.field(column).id()
    return any(field_id in d.fields and "VectorIndexDetails" in d.type_url for d in ds.describe_indices())


def fts_index_name(column: str) -> str:
    return f"{column}_fts"


@dataclass(frozen=True)
class IndexLag:
    """How far one base index is behind compaction, per shard (in generations)."""

    index: str
    lag: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.lag.values())


@dataclass(frozen=True)
class SegmentPolicy:
    """How many of an index's newest segments a catch-up merges with its new rows.

    Invariant: walking from the newest segment back, a segment is merged only while it holds
    at most ``ratio`` times the rows merged so far (new rows included), or while keeping it
    would leave more than ``max_segments``. So segments grow geometrically from newest to
    oldest, their count stays near log(rows / rows per catch-up) and never above
    ``max_segments``, and a row is rewritten a logarithmic number of times over its life,
    instead of once per catch-up.
    """

    ratio: float = 2.0
    max_segments: int = 8

    def to_merge(self, newest_first: Sequence[int], new_rows: int) -> int:
        """The number of newest segments (row counts ``newest_first``) to merge with ``new_rows``."""
        merged, m = new_rows, 0
        for rows in newest_first:
            if rows <= self.ratio * merged or len(newest_first) - m + 1 > self.max_segments:
                merged += rows
                m += 1
            else:
                break
        return m


def fragment_rows(ds: lance.LanceDataset) -> dict[int, int]:
    """Fragment id -> physical rows, for every fragment of ``ds``."""
    return {f.fragment_id: f.metadata.physical_rows for f in ds.get_fragments()}


def segment_rows(ds: lance.LanceDataset, name: str, rows: dict[int, int] | None = None) -> list[tuple[int, frozenset[int]]]:
    """Index ``name``'s segments, newest first: (rows of the fragments it covers, their ids).
    ``rows``: :func:`fragment_rows` of ``ds``, when the caller already has them."""
    rows = fragment_rows(ds) if rows is None else rows
    desc = next((d for d in ds.describe_indices() if d.name == name), None)
    if desc is None:
        return []
    # Lance lists segments oldest first, and merges "the newest n" in that order.
    return [
        (sum(rows.get(i, 0) for i in seg.fragment_ids), frozenset(seg.fragment_ids))
        for seg in reversed(desc.segments)
    ]


def index_segments(ds: lance.LanceDataset) -> dict[str, int]:
    """Base index name -> how many segments it has."""
    return {d.name: len(d.segments) for d in ds.describe_indices() if d.name != MEM_WAL_INDEX_NAME}


def base_indexes(ds: lance.LanceDataset) -> list[str]:
    """Names of the base table's user indexes (the MemWAL system index left out)."""
    return sorted({d.name for d in ds.describe_indices() if d.name != MEM_WAL_INDEX_NAME})


def covered_generation(ds: lance.LanceDataset, index: MemWalIndex, name: str, shard_id: str) -> int:
    """The highest generation of ``shard_id`` whose compacted rows base index ``name`` covers
    in ``ds`` (the base at the version ``index`` was read from).

    That is what Lance recorded in ``index_catchup`` -- or the compacted generation itself
    when the base has no fragments: with no rows there is nothing left unindexed, and Lance's
    ``optimize_indices`` then commits nothing, so it never records the catch-up. A shard whose
    compacted rows were all deleted would otherwise lag for as long as the base stays empty,
    and GC would keep its SSTables and their WAL entries all that time.
    """
    if not ds.get_fragments():
        return index.compacted_generation(shard_id)
    return index.index_catchup.get(name, {}).get(shard_id, 0)


def index_lag(ds: lance.LanceDataset, index: MemWalIndex | None) -> list[IndexLag]:
    """Per base index and shard: compacted generation minus the generation the index covers."""
    if index is None:
        return []
    out = []
    for name in base_indexes(ds):
        lag = {
            sid: gen - covered
            for sid, gen in index.compacted.items()
            if gen > (covered := covered_generation(ds, index, name, sid))
        }
        out.append(IndexLag(name, lag))
    return out


class IndexMaintainer:
    """Creates the table's configured indexes and keeps them caught up."""

    def __init__(self, state: "TableState", policy: SegmentPolicy | None = None) -> None:
        self.state = state
        self.policy = policy or SegmentPolicy()
        self.seconds = 0.0

    def ensure_indexes(self, ds: lance.LanceDataset | None = None) -> list[str]:
        """Create configured indexes that do not exist yet; returns the names created.
        ``ds``: the latest base, if the caller has it open."""
        cfg = self.state.metadata.indexes
        ds = ds or self.state.dataset()
        have = set(base_indexes(ds))
        created = []
        pk = self.state.primary_key
        if cfg.primary_key_btree and len(pk) == 1 and f"{pk[0]}_idx" not in have:
            ds.create_scalar_index(pk[0], "BTREE", name=f"{pk[0]}_idx")
            created.append(f"{pk[0]}_idx")
        if cfg.fts_column and fts_index_name(cfg.fts_column) not in have:
            ds = self.state.dataset()
            ds.create_scalar_index(cfg.fts_column, "INVERTED", name=fts_index_name(cfg.fts_column), **FTS_PARAMS)
            created.append(fts_index_name(cfg.fts_column))
        if cfg.vector_column and vector_index_name(cfg.vector_column) not in have:
            ds = self.state.dataset()
            params = vector_index_params(ds.count_rows())
            if params is not None and not has_vector_index(ds, cfg.vector_column):
                ds.create_index(cfg.vector_column, name=vector_index_name(cfg.vector_column), metric=cfg.vector_metric, **params)
                created.append(vector_index_name(cfg.vector_column))
        for name in created:
            log.info("created base index %s on %s", name, self.state.uri)
        return created

    def catch_up(self, ds: lance.LanceDataset | None = None) -> bool:
        """Bring every base index up to the compacted data; True if anything was done.
        ``ds``: the latest base, if the caller has it open."""
        ds = ds or self.state.dataset()
        lag = index_lag(ds, self.state.manifests.mem_wal_index(ds.version))
        if not any(lg.total for lg in lag) and not _has_unindexed_rows(ds):
            return False
        t0 = time.perf_counter()
        merged = {}
        for name in base_indexes(ds):
            rows = fragment_rows(ds)
            segments = segment_rows(ds, name, rows)
            covered = set().union(*(ids for _, ids in segments))
            new_rows = sum(n for fid, n in rows.items() if fid not in covered)
            merged[name] = self.policy.to_merge([rows for rows, _ in segments], new_rows)
            # A catch-up that failed on the store is done again: one that landed only leaves
            # a repeat with nothing new to index.
            repeat_unavailable(
                lambda n=name, m=merged[name]: self.state.dataset().optimize.optimize_indices(index_names=[n], num_indices_to_merge=m),
                self.state.storage.retry, f"the catch-up of index {name}",
            )
            ds = self.state.dataset()
        self.seconds += time.perf_counter() - t0
        log.info("caught up base indexes of %s in %.2fs (segments merged: %s)", self.state.uri,
                 time.perf_counter() - t0, merged)
        return True

    def join_segments(self, fragment_ids: Collection[int], max_rows: int | None = None) -> int:
        """Merge each index's newest segments so that one covers the ``fragment_ids`` they
        hold (Lance compacts together only fragments with the same index segments); returns
        the number of segments merged away.

        With ``max_rows``, the join stops before a segment that would take the rows it merges
        over that many: small fragments an old, large segment covers (a remainder of an
        earlier compaction) stay where they are rather than costing a rewrite of the index.
        """
        ds = self.state.dataset()
        wanted = set(fragment_ids)
        joined = 0
        for name in base_indexes(ds):
            segments = segment_rows(ds, name)
            holding = [i for i, (_, ids) in enumerate(segments) if ids & wanted]
            m, rows = 0, 0
            for i in range(holding[-1] + 1 if holding else 0):
                if max_rows is not None and rows + segments[i][0] > max_rows:
                    break
                rows += segments[i][0]
                if i in holding:
                    m = i + 1
            if len([i for i in holding if i < m]) < 2:
                continue
            t0 = time.perf_counter()
            ds.optimize.optimize_indices(index_names=[name], num_indices_to_merge=m)
            ds = self.state.dataset()
            self.seconds += time.perf_counter() - t0
            joined += m - 1
            log.info("joined %d segments of index %s (%d rows) for base-file compaction in %.2fs", m, name,
                     sum(r for r, _ in segments[:m]), time.perf_counter() - t0)
        return joined


def _has_unindexed_rows(ds: lance.LanceDataset) -> bool:
    return any(ds.stats.index_stats(name).get("num_unindexed_rows", 0) > 0 for name in base_indexes(ds))
