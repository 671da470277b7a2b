"""The aggregate algebra of aggregate views: mergeable per-group states.

Each aggregate of a view keeps a *state* per group, stored in hidden view columns beside
the user's result column; a refresh never rereads a group's rows to update it:

* :meth:`Aggregate.add` folds in the partial state of rows that appeared;
* :meth:`Aggregate.retract` takes out the partial state of rows that disappeared (the old
  version of an updated row, a deleted row), or answers None when it cannot do so
  exactly (the row removed from a ``min``/``max`` group may have been its extreme): the
  group is then recomputed from the base table;
* :meth:`Aggregate.finish` turns states into the user's column.

Invariant: for every group, the stored state equals the partial state of the group's
rows at the base version the view reflects; so ``finish`` of it equals the aggregate
computed from scratch. It holds because partial states are computed by the same SQL on a
full refresh and on a change (:func:`partial_states`), and add/retract are exact for
counts and sums (floating-point sums carry a Neumaier compensation term, so adding and
subtracting refresh after refresh stays as exact as summing from scratch).

The state column names (``__c_``, ``__s_``, ``__k_``, ``__m_`` + alias, and
:data:`COUNT`) are the view's on-disk format.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Any, Generic, Mapping, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from memwal.views.definition import AggregateItem, ViewDefinition
from memwal.views.evaluate import run_sql
from memwal.views.layout import COUNT, GROUP_KEY

S = TypeVar("S")


# -- states -------------------------------------------------------------------------------


@dataclass(frozen=True)
class CountState:
    count: int = 0


@dataclass(frozen=True)
class SumState:
    """A sum (``None`` while no value was summed) with its compensation term, and the
    number of non-null values summed (a sum of none is NULL, not 0)."""

    total: int | float | None = None
    compensation: float = 0.0
    count: int = 0


@dataclass(frozen=True)
class ExtremeState:
    value: Any = None


def _neumaier(total: float, comp: float, x: float) -> tuple[float, float]:
    """Add ``x`` to a compensated sum (``total`` + ``comp``)."""
    t = total + x
    comp += (total - t) + x if abs(total) >= abs(x) else (x - t) + total
    return t, comp


# -- aggregates ---------------------------------------------------------------------------


class Aggregate(ABC, Generic[S]):
    """One ``func(expr) AS alias`` of a view, and the algebra of its state."""

    def __init__(self, item: AggregateItem) -> None:
        self.item = item

    @property
    def alias(self) -> str:
        return self.item.alias

    @abstractmethod
    def partial_sql(self) -> list[str]:
        """SELECT items computing the state of a group of ``src`` rows."""

    @abstractmethod
    def read(self, row: Mapping[str, Any]) -> S:
        """The state held in a row of state columns."""

    @abstractmethod
    def columns(self, state: S) -> dict[str, Any]:
        """The state as state columns."""

    @abstractmethod
    def add(self, state: S, part: S) -> S:
        """The state of a group after rows with partial state ``part`` joined it."""

    @abstractmethod
    def retract(self, state: S, part: S) -> S | None:
        """The state after rows with partial state ``part`` left it; None if that cannot
        be known from the states alone."""

    @abstractmethod
    def finish(self, states: pa.Table) -> pa.ChunkedArray | pa.Array:
        """The user's column from a table of state columns."""


class Count(Aggregate[CountState]):
    def partial_sql(self) -> list[str]:
        return [f"count({self.item.expr}) AS __c_{self.alias}"]

    def read(self, row: Mapping[str, Any]) -> CountState:
        return CountState(row.get(f"__c_{self.alias}") or 0)

    def columns(self, state: CountState) -> dict[str, Any]:
        return {f"__c_{self.alias}": state.count}

    def add(self, state: CountState, part: CountState) -> CountState:
        return CountState(state.count + part.count)

    def retract(self, state: CountState, part: CountState) -> CountState:
        return CountState(state.count - part.count)

    def finish(self, states: pa.Table) -> pa.ChunkedArray:
        return states.column(f"__c_{self.alias}")


class Sum(Aggregate[SumState]):
    """``sum`` and, with ``mean``, ``avg`` (the same state, finished differently)."""

    def __init__(self, item: AggregateItem, mean: bool) -> None:
        super().__init__(item)
        self.mean = mean

    def partial_sql(self) -> list[str]:
        e, a = self.item.expr, self.alias
        return [f"sum({e}) AS __s_{a}", f"count({e}) AS __c_{a}", f"CAST(0.0 AS DOUBLE) AS __k_{a}"]

    def read(self, row: Mapping[str, Any]) -> SumState:
        a = self.alias
        return SumState(row.get(f"__s_{a}"), row.get(f"__k_{a}") or 0.0, row.get(f"__c_{a}") or 0)

    def columns(self, state: SumState) -> dict[str, Any]:
        a = self.alias
        return {f"__s_{a}": state.total, f"__c_{a}": state.count, f"__k_{a}": state.compensation}

    def _combine(self, state: SumState, part: SumState, sign: int) -> SumState:
        total, comp = state.total, state.compensation
        if isinstance(part.total, float):
            total, comp = _neumaier(total or 0.0, comp, sign * (part.total + part.compensation))
        elif part.total is not None:
            total = (total or 0) + sign * part.total
        return SumState(total, comp, state.count + sign * part.count)

    def add(self, state: SumState, part: SumState) -> SumState:
        return self._combine(state, part, 1)

    def retract(self, state: SumState, part: SumState) -> SumState:
        return self._combine(state, part, -1)

    def finish(self, states: pa.Table) -> pa.Array | pa.ChunkedArray:
        s, c = states.column(f"__s_{self.alias}"), states.column(f"__c_{self.alias}")
        if pa.types.is_floating(s.type):
            s = pc.add(s, pc.cast(states.column(f"__k_{self.alias}"), s.type))
        if self.mean:
            return pc.if_else(
                pc.greater(c, 0), pc.divide(pc.cast(s, pa.float64()), pc.cast(c, pa.float64())), pa.nulls(len(s), pa.float64())
            )
        return pc.if_else(pc.greater(c, 0), s, pa.nulls(len(s), s.type))


class Extreme(Aggregate[ExtremeState]):
    """``min`` or ``max``: adding is exact; removing the current extreme is not."""

    def __init__(self, item: AggregateItem) -> None:
        super().__init__(item)
        self.lowest = item.func == "min"

    def partial_sql(self) -> list[str]:
        return [f"{self.item.func}({self.item.expr}) AS __m_{self.alias}"]

    def read(self, row: Mapping[str, Any]) -> ExtremeState:
        return ExtremeState(row.get(f"__m_{self.alias}"))

    def columns(self, state: ExtremeState) -> dict[str, Any]:
        return {f"__m_{self.alias}": state.value}

    def _beyond(self, x: Any, bound: Any) -> bool:
        return x < bound if self.lowest else x > bound

    def add(self, state: ExtremeState, part: ExtremeState) -> ExtremeState:
        if part.value is not None and (state.value is None or self._beyond(part.value, state.value)):
            return part
        return state

    def retract(self, state: ExtremeState, part: ExtremeState) -> ExtremeState | None:
        # Rows strictly inside the extreme leave it unchanged; one at (or past) it may
        # have been the extreme, and the next one is not in the state.
        if part.value is None or (state.value is not None and self._beyond(state.value, part.value)):
            return state
        return None

    def finish(self, states: pa.Table) -> pa.ChunkedArray:
        return states.column(f"__m_{self.alias}")


def aggregates_of(defn: ViewDefinition) -> list[Aggregate[Any]]:
    out: list[Aggregate[Any]] = []
    for item in defn.aggregates():
        if item.func == "count":
            out.append(Count(item))
        elif item.func in ("sum", "avg"):
            out.append(Sum(item, mean=item.func == "avg"))
        else:
            out.append(Extreme(item))
    return out


# -- groups ---------------------------------------------------------------------------------


def group_key(values: list[Any]) -> str:
    """The key identifying a group: JSON of its GROUP BY values."""
    return json.dumps(values, default=str)


def group_keys(defn: ViewDefinition, rows: pa.Table) -> pa.Array:
    """:func:`group_key` of every row."""
    cols = [rows.column(g).to_pylist() for g in defn.group_by]
    return pa.array([group_key(list(v)) for v in zip(*cols)], pa.string())


@dataclass(frozen=True)
class GroupState:
    """A group's GROUP BY values, its row count and every aggregate's state."""

    values: dict[str, Any]
    count: int
    states: tuple[Any, ...]

    @classmethod
    def read(cls, defn: ViewDefinition, aggs: list[Aggregate[Any]], row: Mapping[str, Any]) -> "GroupState":
        return cls({g: row[g] for g in defn.group_by}, row.get(COUNT) or 0, tuple(a.read(row) for a in aggs))

    @classmethod
    def empty(cls, defn: ViewDefinition, aggs: list[Aggregate[Any]], values: Mapping[str, Any]) -> "GroupState":
        return cls.read(defn, aggs, {g: values[g] for g in defn.group_by})

    def row(self, aggs: list[Aggregate[Any]]) -> dict[str, Any]:
        out = {**self.values, COUNT: self.count}
        for a, s in zip(aggs, self.states):
            out.update(a.columns(s))
        return out


def partial_states(defn: ViewDefinition, rows: pa.Table) -> pa.Table:
    """Per group of ``rows`` (base rows), its GROUP BY values, row count and the partial
    state of every aggregate, as state columns."""
    items = [f"{defn.group_expr(g)} AS {g}" for g in defn.group_by]
    items.append(f"count(*) AS {COUNT}")
    for a in aggregates_of(defn):
        items.extend(a.partial_sql())
    groups = ", ".join(defn.group_expr(g) for g in defn.group_by)
    return run_sql(rows, f"SELECT {', '.join(items)} FROM src{defn.where_clause()} GROUP BY {groups}")


def finish(defn: ViewDefinition, states: pa.Table) -> pa.Table:
    """View rows from a table of states: the GROUP BY columns and aggregates the user
    selected, then the state columns, then the group key."""
    cols: dict[str, Any] = {g: states.column(g) for g in defn.group_by}
    for a in aggregates_of(defn):
        cols[a.alias] = a.finish(states)
    out = pa.table(cols)
    for name in states.schema.names:
        if name.startswith("__") and name != GROUP_KEY:
            out = out.append_column(name, states.column(name))
    return out.append_column(GROUP_KEY, group_keys(defn, out))


@dataclass
class GroupChanges:
    """Groups touched by a change, merged from their stored states."""

    groups: dict[str, GroupState]
    #: groups whose state cannot be adjusted (see :meth:`Aggregate.retract`)
    recompute: set[str]


def merge(
    defn: ViewDefinition, stored: pa.Table, added: pa.Table | None, removed: pa.Table | None
) -> GroupChanges:
    """Stored group states (view rows) adjusted by the partial states of rows that were
    added and of rows that were removed (both from :func:`partial_states`). Additions are
    applied first, so a removal is judged against the state that includes them."""
    aggs = aggregates_of(defn)
    stored_rows = dict(zip(stored.column(GROUP_KEY).to_pylist(), stored.to_pylist()))
    groups: dict[str, GroupState] = {}
    recompute: set[str] = set()
    for adding, parts in ((True, added), (False, removed)):
        if parts is None:
            continue
        for key, row in zip(group_keys(defn, parts).to_pylist(), parts.to_pylist()):
            cur = groups.get(key)
            if cur is None:
                base = stored_rows.get(key)
                cur = GroupState.read(defn, aggs, base) if base else GroupState.empty(defn, aggs, row)
            part = GroupState.read(defn, aggs, row)
            states = []
            for a, s, p in zip(aggs, cur.states, part.states):
                if adding:
                    states.append(a.add(s, p))
                    continue
                after = a.retract(s, p)
                if after is None:
                    recompute.add(key)
                    after = s
                states.append(after)
            sign = 1 if adding else -1
            groups[key] = replace(cur, count=cur.count + sign * part.count, states=tuple(states))
    return GroupChanges(groups, recompute)


def state_rows(defn: ViewDefinition, groups: list[GroupState]) -> list[dict[str, Any]]:
    aggs = aggregates_of(defn)
    return [g.row(aggs) for g in groups]
