"""Full-text search over every LSM level with global BM25 statistics.

Lance 14.0.2 searches the LSM levels' text only in Rust; this is memwal's own plan:

1. the *delta* (:meth:`memwal.readers.sstables.SSTableCache.delta`): the newest version of every key
   written since the base version, tombstones included;
2. corpus statistics of the live rows: the base table's (computed once per base version)
   minus the base documents the delta shadows, plus the delta's live documents;
3. candidates: base documents containing a query term (from the base's inverted index
   when there is one, else by scanning) that the delta does not shadow, and the delta's
   live documents containing a term; ``where`` filters both;
4. every candidate scored with the live statistics, best ``k`` returned.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import lance
import pyarrow as pa
import pyarrow.compute as pc

from memwal.core.lsm import without_keys
from memwal.readers.bm25 import CorpusStats, score, tokenize
from memwal.readers.keys import keys_predicate
from memwal.readers.sql import filter_rows
from memwal.core.schema import TOMBSTONE
from memwal.core.snapshot import Snapshot

if TYPE_CHECKING:
    from memwal.readers.sstables import SSTableCache
    from memwal.core.state import TableState

SCORE = "_score"

class BaseTextStats:
    """Corpus statistics of one reader's base table, per column, for the newest base version
    asked for. A base version never changes, so its statistics are computed once; an older
    version's are dropped when a newer one is asked for (a reader only moves forward, and
    time travel pins one version)."""

    def __init__(self) -> None:
        self._version: int | None = None
        self._stats: dict[str, CorpusStats] = {}

    def get(self, ds: lance.LanceDataset, column: str) -> CorpusStats:
        if ds.version != self._version:
            self._version, self._stats = ds.version, {}
        stats = self._stats.get(column)
        if stats is None:
            stats = CorpusStats()
            for batch in ds.to_batches(columns=[column]):
                for text in batch.column(0).to_pylist():
                    stats.add(tokenize(text))
            self._stats[column] = stats
        return stats


def _matches(texts: pa.ChunkedArray, terms: set[str]) -> pa.Array:
    return pa.array([bool(terms.intersection(tokenize(t))) for t in texts.to_pylist()])


def search(
    state: TableState,
    cache: SSTableCache,
    base_stats: BaseTextStats,
    snap: Snapshot,
    tail: pa.Table | None,
    query: str,
    k: int,
    column: str,
    where: str | None,
    out: list[str],
) -> pa.Table:
    table = state
    pk = list(table.primary_key)
    columns = table.schema.names
    out_schema = pa.schema([table.schema.field(c) for c in out] + [pa.field(SCORE, pa.float64())])
    terms = tokenize(query)
    if not terms or k <= 0:
        return out_schema.empty_table()
    term_set = set(terms)
    ds = snap.dataset

    # Live corpus statistics.
    stats = base_stats.get(ds, column)
    stats = CorpusStats(stats.docs, stats.length, stats.df.copy())
    newer = cache.delta(snap, tail, columns, pk)
    if newer is not None and newer.num_rows:
        shadowed = ds.to_table(columns=[*pk, column], filter=keys_predicate(newer.select(pk)))
        for text in shadowed.column(column).to_pylist():
            stats.add(tokenize(text), sign=-1)
        live_new = newer.filter(pc.invert(newer.column(TOMBSTONE))).drop_columns([TOMBSTONE])
        for text in live_new.column(column).to_pylist():
            stats.add(tokenize(text))
    else:
        live_new = None

    # Candidates from the base table, minus what the delta shadows.
    want = list(dict.fromkeys([*pk, column, *out]))
    if _has_fts_index(ds, column):
        base = ds.to_table(
            columns=want,
            full_text_query=" ".join(sorted(term_set)),
            filter=where,
            prefilter=where is not None,
            limit=max(1, ds.count_rows()),
        ).select(want)
    else:
        base = ds.to_table(columns=want, filter=where)
        base = base.filter(_matches(base.column(column), term_set))
    candidates = [without_keys(base, newer, pk) if newer is not None else base]
    if live_new is not None and live_new.num_rows:
        fresh = filter_rows(live_new, where).select(want)
        candidates.append(fresh.filter(_matches(fresh.column(column), term_set)).cast(candidates[0].schema))
    rows = pa.concat_tables(candidates)
    if rows.num_rows == 0:
        return out_schema.empty_table()
    scores = [score(terms, tokenize(t), stats) for t in rows.column(column).to_pylist()]
    rows = rows.append_column(SCORE, pa.array(scores, pa.float64()))
    return rows.sort_by([(SCORE, "descending")]).slice(0, k).select([*out, SCORE])


def _has_fts_index(ds: lance.LanceDataset, column: str) -> bool:
    field_id = ds.lance_schema.field(column).id()
    return any(field_id in d.fields and "InvertedIndexDetails" in d.type_url for d in ds.describe_indices())
