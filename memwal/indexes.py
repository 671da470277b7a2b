"""Base table indexes: creating the configured ones and catching them up after compaction.

Compaction appends and rewrites base fragments that no index covers yet. Until an index is
brought up to date, its queries scan the uncovered fragments (or, with the indexed read
plan, use the SSTables' own indexes). ``optimize_indices`` adds the new fragments to every
index without retraining (a vector index keeps its codebook, which MemTables share), and
Lance records the compacted generations the indexes now cover in ``index_catchup``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import lance

from memwal.manifest import MEM_WAL_INDEX_NAME, MemWalIndex

if TYPE_CHECKING:
    from memwal.state import TableState

log = logging.getLogger(__name__)

#: IVF_PQ needs rows to train on; below this the vector index is not created yet.
MIN_ROWS_FOR_VECTOR_INDEX = 5_000

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
    return f"{column}_ivf_pq"


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

    def __init__(self, state: "TableState") -> None:
        self.state = state
        self.seconds = 0.0

    def ensure_indexes(self) -> list[str]:
        """Create configured indexes that do not exist yet; returns the names created."""
        cfg = self.state.metadata.indexes
        ds = self.state.dataset()
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
            rows = ds.count_rows()
            if rows >= MIN_ROWS_FOR_VECTOR_INDEX:
                dim = ds.schema.field(cfg.vector_column).type.list_size
                partitions = max(1, min(256, rows // 4096))
                ds.create_index(
                    cfg.vector_column,
                    "IVF_PQ",
                    name=vector_index_name(cfg.vector_column),
                    metric=cfg.vector_metric,
                    num_partitions=partitions,
                    num_sub_vectors=_sub_vectors(dim),
                )
                created.append(vector_index_name(cfg.vector_column))
        for name in created:
            log.info("created base index %s on %s", name, self.state.uri)
        return created

    def catch_up(self) -> bool:
        """Bring every base index up to the compacted data; True if anything was done."""
        ds = self.state.dataset()
        lag = index_lag(ds, self.state.manifests.mem_wal_index(ds.version))
        if not any(lg.total for lg in lag) and not _has_unindexed_rows(ds):
            return False
        t0 = time.perf_counter()
        ds.optimize.optimize_indices()
        self.seconds += time.perf_counter() - t0
        log.info("caught up base indexes of %s in %.2fs", self.state.uri, time.perf_counter() - t0)
        return True


def _sub_vectors(dim: int) -> int:
    """The largest PQ sub-vector count <= 16 that divides the dimension."""
    for n in (16, 8, 4, 2, 1):
        if dim % n == 0:
            return n
    return 1


def _has_unindexed_rows(ds: lance.LanceDataset) -> bool:
    return any(ds.stats.index_stats(name).get("num_unindexed_rows", 0) > 0 for name in base_indexes(ds))
