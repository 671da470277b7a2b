"""Adaptive micro-batches: large while a backlog waits, back to the steady size once caught up.

A micro-batch through Spark has a fixed cost of a few hundred milliseconds (planning, Python
tasks, the exchange; docs/bench-log/ingest.md, "Ingest profile, axes and backlog catch-up") on top of a per-row cost, so a backlog drains
fastest in large micro-batches, while steady state wants small ones for freshness.
:class:`AdaptiveSizing` is the policy the Kafka source asks before every micro-batch
(its ``memwal.readLimitPolicy`` option names :meth:`AdaptiveSizing.from_json`): given the
previous bound and the records waiting it returns a :class:`SizeDecision`, the bound and
why. The source reports the decision with the batch's latest offsets (key
:data:`PROGRESS_KEY`, not a possible Kafka topic name), so the driver reads the decision
that was taken, not a recomputation: :func:`decision_of`.

Invariants: the bound is always within ``[steady_rows, max(steady_rows, min(max_rows,
max_bytes // record_bytes))]``; it only grows while the backlog exceeds the steady size,
by ``growth`` per micro-batch, and it returns to ``steady_rows`` as soon as the backlog
fits in one steady micro-batch. The policy depends only on its two arguments; the previous
bound is the source's memory and starts over (None) with the query. Exactly-once does not
depend on it: a micro-batch replayed after a restart reuses the offsets in Spark's offset
log and is not sized again.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Mapping

#: Key of the decision in the source's reported latest offsets (a colon is not allowed in a
#: Kafka topic name, so it can never be mistaken for a topic).
PROGRESS_KEY = "memwal:readLimit"

#: Reasons (the first word of :attr:`SizeDecision.reason`).
STEADY = "steady"
GROW = "grow"
ROW_BOUND = "row-bound"
BYTE_BOUND = "byte-bound"


@dataclass(frozen=True)
class SizeDecision:
    """The record bound of one micro-batch and why it was chosen."""

    limit: int
    #: Records waiting when the batch was planned (within the run's target for availableNow).
    backlog: int
    #: One of :data:`STEADY`, :data:`GROW`, :data:`ROW_BOUND`, :data:`BYTE_BOUND`.
    kind: str
    reason: str

    @property
    def rows(self) -> int:
        """Records the micro-batch takes."""
        return min(self.limit, self.backlog)


@dataclass(frozen=True)
class AdaptiveSizing:
    """Micro-batch bounds for ``memwal ingest``: ``steady_rows`` when caught up, growing by
    ``growth`` per micro-batch while a backlog waits, up to ``max_rows`` and ``max_bytes``
    (converted to records with the ``record_bytes`` estimate of one Kafka record)."""

    FACTORY = "memwal.streaming.adaptive:AdaptiveSizing.from_json"

    steady_rows: int = 10_000
    max_rows: int = 400_000
    max_bytes: int = 512 << 20
    record_bytes: int = 1024
    #: 8, not 2: a micro-batch's fixed cost makes the small ones of a gentle ramp the slow part
    #: of a catch-up. A 1M-record catch-up (docs/bench-log/ingest.md, "The catch-up again") ran at 68-70k rows/s with 8,
    #: 66k with 4 and 59-60k with 2. The bound never takes more than the backlog anyway.
    growth: float = 8.0

    def __post_init__(self) -> None:
        if min(self.steady_rows, self.max_rows, self.max_bytes, self.record_bytes) < 1 or self.growth < 1:
            raise ValueError("adaptive micro-batch bounds must be positive and growth at least 1")

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "AdaptiveSizing":
        return cls(**json.loads(text))

    @property
    def ceiling(self) -> int:
        """The largest bound: the row bound or the byte bound, whichever is smaller."""
        return max(self.steady_rows, min(self.max_rows, self.max_bytes // self.record_bytes))

    def decide(self, previous: int | None, backlog: int) -> SizeDecision:
        """The bound of the next micro-batch after one bounded by ``previous`` (None: the
        query's first), with ``backlog`` records waiting."""
        if backlog <= self.steady_rows:
            return SizeDecision(self.steady_rows, backlog, STEADY, f"steady: backlog {backlog} fits in {self.steady_rows}")
        grown = max(self.steady_rows, int((previous or self.steady_rows) * self.growth))
        by_bytes = self.max_bytes // self.record_bytes
        if grown >= self.ceiling:
            if by_bytes < self.max_rows and by_bytes >= self.steady_rows:
                return SizeDecision(self.ceiling, backlog, BYTE_BOUND,
                                    f"byte-bound: backlog {backlog}, {self.max_bytes} bytes at ~{self.record_bytes} per record")
            return SizeDecision(self.ceiling, backlog, ROW_BOUND, f"row-bound: backlog {backlog}, at most {self.ceiling} rows")
        return SizeDecision(grown, backlog, GROW, f"grow: backlog {backlog} > {self.steady_rows}, bound x{self.growth:g} to {grown}")

    def __call__(self, previous: int | None, backlog: int) -> dict[str, Any]:
        """The source's policy contract: a JSON-able dict with at least ``limit``."""
        return asdict(self.decide(previous, backlog))


def decision_of(latest_offset: str | Mapping[str, Any] | None) -> SizeDecision | None:
    """The decision a micro-batch's progress carries (``progress.sources[i].latestOffset``),
    None when the source sized it with a fixed bound."""
    if not latest_offset:
        return None
    try:
        doc = json.loads(latest_offset) if isinstance(latest_offset, str) else latest_offset
    except ValueError:  # not a document (seen while the broker restarted): no decision to read
        return None
    d = doc.get(PROGRESS_KEY) if isinstance(doc, Mapping) else None
    if not d:
        return None
    return SizeDecision(limit=int(d["limit"]), backlog=int(d["backlog"]), kind=str(d["kind"]), reason=str(d["reason"]))


def _offset_total(offsets: str | Mapping[str, Any] | None) -> int | None:
    """The sum of a Kafka offsets document's positions (``{"topic": {"0": n, ...}}``)."""
    if not offsets:  # a query's first batch has no start ('' or None)
        return None
    try:
        doc = json.loads(offsets) if isinstance(offsets, str) else offsets
    except ValueError:
        return None
    if not isinstance(doc, Mapping):
        return None
    return sum(int(v) for parts in doc.values() if isinstance(parts, Mapping) for v in parts.values())


def bound_decision(sizing: AdaptiveSizing, end_offset: Any, latest_offset: Any, rows: int) -> SizeDecision:
    """The decision behind a micro-batch of a source that takes one fixed bound for the whole
    query (Spark's Kafka source, bounded by ``sizing.ceiling``): the backlog is what lay
    between the batch's start (its end less its rows) and the topic's latest offsets when it
    was planned; the bound held records back (row-bound) when that is more than the batch took.
    A row-bound decision's limit is what the batch took: Spark splits the bound over the
    partitions and rounds each share down, so it may take a few records less."""
    end, latest = _offset_total(end_offset), _offset_total(latest_offset)
    backlog = max(rows, latest - end + rows) if end is not None and latest is not None else rows
    bound = sizing.ceiling
    if backlog > rows:
        return SizeDecision(rows, backlog, ROW_BOUND, f"row-bound: backlog {backlog}, at most {bound} rows (the source's fixed bound)")
    return SizeDecision(bound, backlog, STEADY, f"steady: backlog {backlog} fits in the source's fixed bound {bound}")
