"""BM25 with corpus statistics over the *live* table (the spec's GlobalBM25).

Every LSM level indexes its own documents: the base table, each SSTable, the unflushed
WAL tail. Scoring each level with its own statistics would make scores incomparable (a
term rare in a small SSTable looks more significant than in the base). Here the document
count, average length and document frequencies are those of the live rows only: a
document superseded by a newer version or deleted counts nowhere.

Tokenization matches the inverted index memwal builds on the base table
(``memwal.core.indexes.FTS_PARAMS``: Lance's ``simple`` tokenizer, lower-cased, no stemming or
stop words): maximal runs of letters and digits, at most 40 characters long.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence

from memwal.core.indexes import FTS_MAX_TOKEN_LEN as MAX_TOKEN_LEN

K1 = 1.2
B = 0.75
_TOKEN = re.compile(r"[^\W_]+", re.UNICODE)


def tokenize(text: str | None) -> list[str]:
    if not text:
        return []
    return [t for t in _TOKEN.findall(text.lower()) if len(t) <= MAX_TOKEN_LEN]


@dataclass
class CorpusStats:
    """Document count, total length and per-term document frequency of a set of documents."""

    docs: int = 0
    length: int = 0
    df: Counter | None = None

    def __post_init__(self) -> None:
        if self.df is None:
            self.df = Counter()

    def add(self, tokens: Sequence[str], sign: int = 1) -> None:
        """Count one document in (sign 1) or out (sign -1)."""
        self.docs += sign
        self.length += sign * len(tokens)
        for t in set(tokens):
            self.df[t] += sign

    @classmethod
    def of(cls, texts: Iterable[str | None]) -> "CorpusStats":
        s = cls()
        for text in texts:
            s.add(tokenize(text))
        return s

    @property
    def avgdl(self) -> float:
        return self.length / self.docs if self.docs else 0.0

    def idf(self, term: str) -> float:
        df = self.df.get(term, 0)
        return math.log(1 + (self.docs - df + 0.5) / (df + 0.5))


def score(query_terms: Sequence[str], tokens: Sequence[str], stats: CorpusStats) -> float:
    """BM25 of one document (its tokens) for the query, with the given corpus statistics."""
    if not tokens:
        return 0.0
    tf = Counter(tokens)
    dl = len(tokens)
    avgdl = stats.avgdl or 1.0
    total = 0.0
    for t in set(query_terms):
        f = tf.get(t, 0)
        if f:
            total += stats.idf(t) * f * (K1 + 1) / (f + K1 * (1 - B + B * dl / avgdl))
    return total
