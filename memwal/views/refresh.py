"""One refresh of a view: the change to apply, computed from what compaction folded into
the base table, and the single commit that applies it.

**Change.** The SSTables compaction folded between the base version the view reflects and
the target (:mod:`memwal.views.changes`: changed primary keys, and their rows at the
target) are all a refresh reads, so its cost follows the change, not the table:

* row views are keyed by the source row's primary key (:data:`SOURCE_KEY`): the changed
  keys' view rows are removed, and computed anew from the keys' rows at the target;
* aggregate views adjust each affected group by the new rows minus the old ones (the
  changed keys' rows read by key from the previous base version, see
  :mod:`memwal.views.aggregates`); groups whose state cannot be adjusted are recomputed
  from the base table.

Views made before that (their rows keyed by stable row id, :data:`ROW_ID`) keep reading
Lance's change feed (``delta()``), which needs the base's stable row ids.

A full refresh (first one, a UDF whose identity changed, or a reflected base version that
no longer exists) computes the view from the whole base table instead.

**Commit.** Removed rows (deletion vectors) and new rows (fragments of at most
``max_rows_per_fragment`` rows) are one Lance commit of the view, with the refresh record
in its transaction properties, made only on top of the view version the change was
computed against. So a view is never half-applied, and two refreshes can never both apply
their changes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

import lance
import numpy as np
import pyarrow as pa

from memwal.core import lance_errors
from memwal.core.sqltext import in_filter, sql_literal
from memwal.core.state import TableState
from memwal.core.storage import RetryPolicy
from memwal.views import aggregates, changes
from memwal.views.definition import ViewDefinition
from memwal.views.errors import ViewBusyError
from memwal.views.evaluate import project_rows, run_sql
from memwal.views.history import RefreshRecord
from memwal.views.layout import GROUP_KEY, ROW_ID, SOURCE_KEY
from memwal.views.lease import Lease
from memwal.views.udf import UdfRunner, UdfStats


@dataclass(frozen=True)
class Change:
    """What a refresh commits: view rows to remove (``(key column, keys)``), view rows to
    add, and how many base rows the change covered."""

    remove: tuple[str, pa.Array] | None
    add: pa.Table | None
    rows_changed: int


@dataclass(frozen=True)
class Computer:
    """Computes view rows from base rows (carrying ``_rowid``) for one refresh."""

    defn: ViewDefinition
    runner: UdfRunner
    stats: UdfStats | None = None
    #: (SparkSession, minimum base rows) to run UDF columns on Spark executors
    spark: tuple[Any, int] | None = None

    def rows(self, base_rows: pa.Table) -> pa.Table:
        defn = self.defn
        if defn.aggregate:
            return aggregates.finish(defn, aggregates.partial_states(defn, base_rows))
        projected = project_rows(defn, base_rows)
        if self.spark is not None and defn.udfs and base_rows.num_rows >= self.spark[1]:
            return self.runner.run_on_spark(self.spark[0], projected, self.stats)
        return self.runner.run(projected, self.stats)


def _base_columns(rows: pa.Table, base: lance.LanceDataset) -> pa.Table:
    keep = [c for c in rows.schema.names if c in base.schema.names or c == "_rowid"]
    return rows.select(keep)


def _row_ids(*tables: pa.Table) -> pa.Array:
    ids = [t.column("_rowid").combine_chunks().cast(pa.uint64()) for t in tables if t.num_rows]
    return pa.concat_arrays(ids) if ids else pa.array([], pa.uint64())


@dataclass(frozen=True)
class Delta:
    """The base table's change between two versions: rows now present that are new or
    changed (base columns and ``_rowid``), and the ids of rows whose old version is gone
    (updated or deleted)."""

    changed: pa.Table
    gone_ids: pa.Array
    deleted: int

    @classmethod
    def read(cls, base: lance.LanceDataset, from_version: int) -> "Delta":
        delta = base.delta(begin_version=from_version, end_version=base.version)
        inserted = _base_columns(delta.get_inserted_rows().read_all(), base)
        updated = _base_columns(delta.get_updated_rows().read_all(), base)
        deleted = delta.get_deleted_row_ids().read_all()
        return cls(pa.concat_tables([inserted, updated]), _row_ids(updated, deleted), deleted.num_rows)


def full_change(compute: Computer, base: lance.LanceDataset, primary_key: Sequence[str] | None = None) -> Change:
    """The whole view; keyed by ``primary_key`` (None: by stable row id)."""
    columns = compute.defn.columns_used(base.schema.names)
    if primary_key is None:
        rows = base.to_table(columns=columns, with_row_id=True)
    else:
        rows = changes.with_source_key(base.to_table(columns=list(dict.fromkeys([*primary_key, *columns]))), primary_key)
    add = compute.rows(rows)
    return Change(None, add, add.num_rows)


def key_row_change(compute: Computer, state: TableState, base: lance.LanceDataset, consumed: dict[str, int]) -> Change | None:
    """Row view keyed by primary key: the keys changed since the view consumed ``consumed``
    (per shard, the generation), their rows replaced; None if the change log is gone."""
    pk = list(state.primary_key)
    d = changes.read_changes(state, consumed, base, compute.defn.columns_used(base.schema.names))
    if d is None:
        return None
    add = compute.rows(changes.with_source_key(d.rows, pk)) if d.rows.num_rows else None
    return Change((SOURCE_KEY, changes.source_keys(d.keys, pk)), add, d.keys.num_rows)


def key_group_change(
    defn: ViewDefinition, state: TableState, base: lance.LanceDataset, from_version: int, view: lance.LanceDataset
) -> Change | None:
    """Aggregate view: groups adjusted by the changed keys' rows now minus their rows at
    ``from_version`` (read by key); None if the change log is gone."""
    pk = list(state.primary_key)
    prev = state.dataset(from_version)
    columns = defn.columns_used(base.schema.names)
    d = changes.read_changes(state, changes.folded_through(state, from_version), base, columns)
    if d is None:
        return None
    old = changes.rows_by_key(prev, d.keys, columns, pk) if d.keys.num_rows else None
    return _group_delta(defn, base, view, d.rows, old, d.keys.num_rows)


def row_change(compute: Computer, base: lance.LanceDataset, from_version: int) -> Change:
    d = Delta.read(base, from_version)
    add = compute.rows(d.changed) if d.changed.num_rows else None
    return Change((ROW_ID, d.gone_ids), add, d.changed.num_rows + d.deleted)


def group_change(
    defn: ViewDefinition, state: TableState, base: lance.LanceDataset, from_version: int, view: lance.LanceDataset
) -> Change:
    d = Delta.read(base, from_version)
    prev = state.dataset(from_version)
    old = (
        prev._take_rows(d.gone_ids.to_pylist(), columns=defn.columns_used(prev.schema.names), with_row_id=True)
        if len(d.gone_ids) else None
    )
    return _group_delta(defn, base, view, d.changed, old, d.changed.num_rows + (len(old) if old is not None else 0))


def _group_delta(
    defn: ViewDefinition, base: lance.LanceDataset, view: lance.LanceDataset, new: pa.Table, old: pa.Table | None,
    rows_changed: int,
) -> Change:
    """The touched groups of an aggregate view, adjusted by rows that appeared (``new``) and
    rows that disappeared (``old``)."""
    added = aggregates.partial_states(defn, new) if new.num_rows else None
    removed = aggregates.partial_states(defn, old) if old is not None and old.num_rows else None
    touched: set[str] = set()
    for p in (added, removed):
        if p is not None:
            touched.update(aggregates.group_keys(defn, p).to_pylist())
    if not touched:
        return Change(None, None, 0)
    stored = view.to_table(filter=in_filter(GROUP_KEY, pa.array(sorted(touched), pa.string()), pa.string()))
    merged = aggregates.merge(defn, stored, added, removed)
    groups = dict(merged.groups)
    if merged.recompute:
        exact = _recompute_groups(defn, base, {key: groups[key].values for key in merged.recompute})
        for key in merged.recompute:
            groups[key] = exact.get(key) or aggregates.GroupState(groups[key].values, 0, groups[key].states)
    alive = [g for g in groups.values() if g.count > 0]
    add = None
    if alive:
        schema = view.schema
        states = pa.Table.from_pylist(
            aggregates.state_rows(defn, alive), schema=pa.schema([f for f in schema if f.name != GROUP_KEY])
        )
        add = aggregates.finish(defn, states).cast(schema)
    return Change((GROUP_KEY, pa.array(sorted(touched), pa.string())), add, rows_changed)


def _recompute_groups(defn: ViewDefinition, base: lance.LanceDataset, keys: dict[str, dict[str, Any]]) -> dict[str, aggregates.GroupState]:
    """The exact states of groups ``keys`` (group key -> its GROUP BY values, typed), from
    their rows in the base table."""
    # Typed values, not the JSON of the group key (a date or a decimal there is a string,
    # which Lance will not compare with a date or decimal column). Every comparison in
    # parentheses of its own: Lance's filter parser binds `x IS NOT DISTINCT FROM 'A' AND
    # y ...` as `x IS NOT DISTINCT FROM ('A' AND y ...)`.
    predicate = " OR ".join(
        "(" + " AND ".join(f"(({defn.group_expr(g)}) IS NOT DISTINCT FROM {sql_literal(values[g])})" for g in defn.group_by) + ")"
        for values in keys.values()
    )
    columns = defn.columns_used(base.schema.names)
    # Only memwal's own, typed predicate goes into Lance's filter; the user's WHERE is
    # DataFusion SQL and runs there, as in the view's own query (Lance's filter parser
    # will not compare `price >= 10.00` with a decimal column).
    if all(defn.group_expr(g) == g for g in defn.group_by):
        fresh = base.to_table(columns=columns, with_row_id=True, filter=predicate)
        if defn.where:
            fresh = run_sql(fresh, f"SELECT * FROM src WHERE {defn.where}")
    else:
        # a computed group key cannot be pushed into Lance's filter: select in memory
        where = f"({defn.where}) AND ({predicate})" if defn.where else predicate
        # batch by batch, so only the groups' rows are ever held
        scanner = base.scanner(columns=columns, with_row_id=True)
        parts = [run_sql(pa.Table.from_batches([b]), f"SELECT * FROM src WHERE {where}") for b in scanner.to_batches()]
        fresh = pa.concat_tables(parts) if parts else scanner.projected_schema.empty_table()
    if not fresh.num_rows:
        return {}
    exact = aggregates.partial_states(defn, fresh)
    aggs = aggregates.aggregates_of(defn)
    return {
        k: aggregates.GroupState.read(defn, aggs, r)
        for k, r in zip(aggregates.group_keys(defn, exact).to_pylist(), exact.to_pylist())
    }


def commit(
    uri: str,
    view: lance.LanceDataset,
    change: Change,
    record: RefreshRecord,
    *,
    max_rows_per_fragment: int,
    overwrite: bool,
    lease: Lease,
    name: str,
    storage_options: dict[str, str] | None = None,
) -> None:
    """Apply ``change`` to the view as one commit on top of ``view`` (the version it was
    computed against). ViewBusyError if anything else committed to the view since, or the
    lease was taken over."""
    from lance import LanceOperation
    from lance.dataset import Transaction
    from lance.fragment import write_fragments

    schema = view.schema
    new_fragments = []
    if change.add is not None and change.add.num_rows:
        new_fragments = write_fragments(
            change.add.cast(schema), uri, max_rows_per_file=max_rows_per_fragment, schema=schema,
            storage_options=storage_options,
        )
    if overwrite:
        op = LanceOperation.Overwrite(schema, new_fragments)
    else:
        updated, removed = [], []
        if change.remove is not None and len(change.remove[1]):
            column, keys = change.remove
            # row addresses only: the key's BTREE answers them without reading the rows
            hits = view.to_table(columns=[], filter=in_filter(column, keys, schema.field(column).type), with_row_address=True)
            addrs = hits.column("_rowaddr").to_numpy()
            for frag_id in np.unique(addrs >> 32):
                offsets = (addrs[(addrs >> 32) == frag_id] & 0xFFFFFFFF).tolist()
                meta = view.get_fragment(int(frag_id)).delete_rows(offsets)
                (updated.append(meta) if meta is not None else removed.append(int(frag_id)))
        op = LanceOperation.Update(removed_fragment_ids=removed, updated_fragments=updated, new_fragments=new_fragments)
    txn = Transaction(read_version=view.version, operation=op, transaction_properties=record.to_properties())
    lease.check()
    latest = lance.dataset(uri, storage_options=storage_options).version
    if latest != view.version:
        raise ViewBusyError(f"view {name} changed while refreshing (v{view.version} -> v{latest}); rerun the refresh")
    policy = RetryPolicy.from_options(storage_options or {})
    for attempt in range(policy.operation_retries + 1):
        try:
            lance.LanceDataset.commit(uri, txn, read_version=view.version, max_retries=0, storage_options=storage_options)
            return
        except (OSError, RuntimeError, ValueError) as e:  # Lance's untyped errors, classified below
            unknown = lance_errors.is_store_unavailable(e)  # the commit may or may not have landed
            if not (unknown or lance_errors.is_commit_conflict(e)):
                raise
            latest = lance.dataset(uri, storage_options=storage_options)
            if unknown and latest.version == view.version + 1 and _carries(latest, record):
                return  # it landed; only the answer was lost
            # Nothing landed: the store failed the manifest PUT, or answered S3's 409
            # ConditionalRequestConflict, which Lance takes for "that version exists".
            if latest.version != view.version:
                raise ViewBusyError(f"view {name} changed while refreshing (a concurrent commit); rerun the refresh") from None
            if attempt == policy.operation_retries:
                if unknown:
                    raise
                raise ViewBusyError(f"view {name}: its commit kept conflicting with nothing; rerun the refresh") from None
            time.sleep(policy.backoff(attempt + 1))


def _carries(view: lance.LanceDataset, record: RefreshRecord) -> bool:
    """Whether the view's latest commit is the refresh ``record`` (its transaction properties)."""
    txn = view.read_transaction(view.version)
    return txn is not None and dict(txn.transaction_properties or {}) == record.to_properties()


def index_key(view: lance.LanceDataset, column: str, slack_rows: int) -> None:
    """Keep a BTREE on the view's key column (source row id, or group key) so the next
    refresh finds the rows it replaces in time proportional to the change, not to the
    view. Small refreshes leave a few unindexed rows; they are folded in once they add up
    to ``slack_rows``."""
    field_id = view.lance_schema.field(column).id()
    names = [d.name for d in view.describe_indices() if field_id in d.fields]
    if not names:
        if view.count_rows():
            view.create_scalar_index(column, "BTREE", name=f"{column}_idx")
    elif view.stats.index_stats(names[0]).get("num_unindexed_rows", 0) > slack_rows:
        view.optimize.optimize_indices(index_names=names)
