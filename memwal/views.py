"""Materialized views over a memwal table, refreshed incrementally from its change feed.

A view is a query over the base table: ``select`` expressions and a ``where`` predicate in
the DataFusion SQL dialect, Python UDF columns evaluated on Arrow batches, an optional
deterministic shuffle, or ``group_by`` with ``count``/``sum``/``min``/``max``/``avg``. It
is stored as a plain Lance table under ``{table}/_memwal/views/{name}``.

**Refresh** reads Lance's change feed between the base version the view reflects and the
target version (``delta()``: inserted, updated and deleted rows by stable row id, which
survive compaction), so its cost follows the change, not the table:

* row views are keyed by the source row's stable id (``__source_row_id``): changed and
  deleted rows' view rows are removed, changed and inserted rows are computed anew;
* aggregate views adjust each affected group by the new rows minus the old ones (read from
  the previous base version by row id); ``min``/``max`` groups that lost a row are
  recomputed from the base table, as are groups whose sums cannot be adjusted.

Every refresh is **one atomic commit** of the view table: removed rows (deletion vectors)
and new rows (fragments of at most ``max_rows_per_fragment`` rows) together, with the
refresh record (base version and compacted generations reflected, time, view version) in
the commit's transaction properties. So a view is never half-applied, and its refresh
history is its commit history. Refreshes of one view are serialized by a lease; UDF
results are checkpointed per chunk, so a refresh killed midway and rerun recomputes only
the chunks that had not finished; a UDF whose version or code changed is recomputed for
every row.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import inspect
import json
import logging
import os
import re
import socket
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import datafusion
import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal import paths
from memwal.errors import MemwalError
from memwal.failpoints import failpoint
from memwal.readers.keys import sql_literal

log = logging.getLogger(__name__)

ROW_ID = "__source_row_id"
GROUP_KEY = "__memwal_group"
COUNT = "__memwal_count"
CONFIG_KEY = "memwal.view"
RECORD_KEY = "memwal.refresh"
CHECKPOINT_DIR = "_memwal_checkpoints"
LEASE = "_memwal_refresh.lease"

_AGG = re.compile(r"^\s*(count|sum|min|max|avg)\s*\(\s*(.*?)\s*\)\s+as\s+([A-Za-z_][A-Za-z0-9_]*)\s*$", re.I | re.S)
_ALIAS = re.compile(r"^(.*?)\s+as\s+([A-Za-z_][A-Za-z0-9_]*)\s*$", re.I | re.S)


class ViewError(MemwalError):
    """A view cannot be created, refreshed or read as asked."""


class ViewBusyError(ViewError):
    """Another refresh of the view is running (its lease is held)."""


# ---------------------------------------------------------------------------------------
# Definition
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class UdfColumn:
    """A view column computed by a Python function on Arrow batches.

    ``function`` is ``"module:attribute"``; it takes a ``pyarrow.RecordBatch`` of the
    ``inputs`` columns (outputs of ``select``) and returns an array of ``output_type``.
    The explicit ``version`` and a checksum of the function's code identify its results:
    a change of either recomputes the column for every row.
    """

    name: str
    function: str
    inputs: tuple[str, ...]
    output_type: str
    version: str = "1"

    def load(self) -> Callable[[pa.RecordBatch], pa.Array]:
        module, _, attr = self.function.partition(":")
        if not attr:
            raise ViewError(f"UDF {self.name}: function must be 'module:attribute', got {self.function!r}")
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
        return obj

    def checksum(self) -> str:
        fn = self.load()
        try:
            code = inspect.getsource(fn)
        except (OSError, TypeError):
            code = getattr(getattr(fn, "__code__", None), "co_code", b"").hex()
        return hashlib.sha256(code.encode()).hexdigest()[:16]

    def arrow_type(self) -> pa.DataType:
        return parse_type(self.output_type)

    def identity(self) -> str:
        """What results depend on: the explicit version and the code."""
        return f"{self.version}:{self.checksum()}"


def parse_type(text: str) -> pa.DataType:
    """An Arrow type from its name (``int64``, ``float32``, ``string``, ``list<float32>[4]``...)."""
    text = text.strip()
    m = re.fullmatch(r"list<(.+)>\[(\d+)\]", text)
    if m:
        return pa.list_(parse_type(m.group(1)), int(m.group(2)))
    m = re.fullmatch(r"list<(.+)>", text)
    if m:
        return pa.list_(parse_type(m.group(1)))
    aliases = {"string": pa.string(), "utf8": pa.string(), "float": pa.float32(), "double": pa.float64(), "bool": pa.bool_()}
    if text in aliases:
        return aliases[text]
    try:
        return pa.type_for_alias(text)
    except ValueError:
        raise ViewError(f"unknown type {text!r}") from None


@dataclass(frozen=True)
class ViewDefinition:
    """What a view computes. See the module docstring."""

    name: str
    source: str
    select: tuple[str, ...] = ()
    where: str | None = None
    group_by: tuple[str, ...] = ()
    udfs: tuple[UdfColumn, ...] = ()
    shuffle_seed: int | None = None

    @property
    def aggregate(self) -> bool:
        return bool(self.group_by)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ViewDefinition":
        d = json.loads(text)
        d["select"] = tuple(d.get("select", ()))
        d["group_by"] = tuple(d.get("group_by", ()))
        d["udfs"] = tuple(UdfColumn(**{**u, "inputs": tuple(u["inputs"])}) for u in d.get("udfs", ()))
        return cls(**d)

    def columns_used(self, names: Sequence[str]) -> list[str]:
        """The base columns (of ``names``) the view reads: every one it names in its SQL or
        its UDF inputs, or all of them for ``SELECT *``. Reading only these keeps a refresh
        from pulling vector columns it never uses."""
        if not self.select or any(re.fullmatch(r"\s*(\w+\.)?\*\s*", item) for item in self.select):
            return list(names)
        text = " ".join([*self.select, self.where or "", *self.group_by])
        words = {w.lower() for w in re.findall(r'[A-Za-z_][A-Za-z0-9_]*|"[^"]+"', text)}
        words |= {w.strip('"').lower() for w in words}
        used = {c for u in self.udfs for c in u.inputs}
        return [n for n in names if n.lower() in words or n in used]

    def aggregates(self) -> list[tuple[str, str, str]]:
        """(function, expression, alias) of every aggregate in ``select``."""
        out = []
        for item in self.select:
            m = _AGG.match(item)
            if m:
                out.append((m.group(1).lower(), m.group(2), m.group(3)))
        return out


# ---------------------------------------------------------------------------------------
# Evaluating a definition on Arrow rows (DataFusion, the dialect of Lance's filters)
# ---------------------------------------------------------------------------------------


def _sql(rows: pa.Table, query: str) -> pa.Table:
    ctx = datafusion.SessionContext()
    ctx.register_record_batches("src", [rows.to_batches()] if rows.num_rows else [[pa.RecordBatch.from_pylist([], schema=rows.schema)]])
    try:
        return ctx.sql(query).to_arrow_table()
    except Exception as e:  # datafusion's own exception types
        raise ViewError(f"view query failed: {e}\n  query: {query}") from None


def _where(defn: ViewDefinition) -> str:
    return f" WHERE {defn.where}" if defn.where else ""


def project_rows(defn: ViewDefinition, rows: pa.Table) -> pa.Table:
    """Row view: ``select`` and ``where`` over base rows carrying ``_rowid``."""
    select = ", ".join([f"_rowid AS {ROW_ID}", *defn.select]) if defn.select else f"_rowid AS {ROW_ID}, *"
    out = _sql(rows, f"SELECT {select} FROM src{_where(defn)}")
    if not defn.select:
        out = out.drop_columns(["_rowid"]) if "_rowid" in out.schema.names else out
    return out


def group_expr(defn: ViewDefinition, column: str) -> str:
    """The SQL expression of a GROUP BY column: its ``select`` item's (``EXPR AS column``),
    or the base column itself."""
    for item in defn.select:
        m = _ALIAS.match(item)
        if m and m.group(2) == column and not _AGG.match(item):
            return m.group(1).strip()
    return column


def partial_aggregates(defn: ViewDefinition, rows: pa.Table) -> pa.Table:
    """Aggregate view: per group, the mergeable partial state of every aggregate."""
    items = [f"{group_expr(defn, g)} AS {g}" for g in defn.group_by]
    items.append(f"count(*) AS {COUNT}")
    for func, expr, alias in defn.aggregates():
        if func in ("sum", "avg"):
            items.append(f"sum({expr}) AS __s_{alias}")
            items.append(f"count({expr}) AS __c_{alias}")
            # compensation term of a floating-point sum (Neumaier): adding and subtracting
            # partial sums refresh after refresh stays as exact as summing from scratch
            items.append(f"CAST(0.0 AS DOUBLE) AS __k_{alias}")
        elif func == "count":
            items.append(f"count({expr}) AS __c_{alias}")
        else:
            items.append(f"{func}({expr}) AS __m_{alias}")
    groups = ", ".join(group_expr(defn, g) for g in defn.group_by)
    return _sql(rows, f"SELECT {', '.join(items)} FROM src{_where(defn)} GROUP BY {groups}")


def finish_aggregates(defn: ViewDefinition, state: pa.Table) -> pa.Table:
    """View rows from partial states: the user's columns, then the state columns."""
    cols: dict[str, Any] = {}
    for g in defn.group_by:
        cols[g] = state.column(g)
    for func, _, alias in defn.aggregates():
        if func == "count":
            cols[alias] = state.column(f"__c_{alias}")
        elif func == "sum":
            s, c = _compensated(state, alias), state.column(f"__c_{alias}")
            cols[alias] = pc.if_else(pc.greater(c, 0), s, pa.nulls(len(s), s.type))
        elif func == "avg":
            s, c = _compensated(state, alias), state.column(f"__c_{alias}")
            cols[alias] = pc.if_else(pc.greater(c, 0), pc.divide(pc.cast(s, pa.float64()), pc.cast(c, pa.float64())), pa.nulls(len(s), pa.float64()))
        else:
            cols[alias] = state.column(f"__m_{alias}")
    out = pa.table(cols)
    for name in state.schema.names:
        if name.startswith("__"):
            out = out.append_column(name, state.column(name))
    return out


def _compensated(state: pa.Table, alias: str) -> pa.ChunkedArray:
    s = state.column(f"__s_{alias}")
    if pa.types.is_floating(s.type):
        return pc.add(s, pc.cast(state.column(f"__k_{alias}"), s.type))
    return s


def _neumaier(total: float, comp: float, x: float) -> tuple[float, float]:
    """Add ``x`` to a compensated sum (``total`` + ``comp``)."""
    t = total + x
    comp += (total - t) + x if abs(total) >= abs(x) else (x - t) + total
    return t, comp


def group_keys(defn: ViewDefinition, rows: pa.Table) -> pa.Array:
    """A string key per row identifying its group (JSON of the group values)."""
    cols = [rows.column(g).to_pylist() for g in defn.group_by]
    return pa.array([json.dumps(list(v), default=str) for v in zip(*cols)], pa.string())


# ---------------------------------------------------------------------------------------
# Refresh records and the view
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RefreshRecord:
    """What one refresh reflects; stored in the view commit's transaction properties."""

    base_version: int
    compacted: dict[str, int]
    refreshed_at: float
    view_version: int
    mode: str  # "full" or "incremental"
    rows_changed: int
    udf_versions: dict[str, str]
    udf_calls: int = 0
    seconds: float = 0.0


@dataclass
class Freshness:
    """How far a view is behind its table."""

    base_version_reflected: int | None
    base_version_latest: int
    versions_behind: int
    seconds_behind: float | None
    #: data in the table's MemWAL not yet compacted into the base (invisible to the view)
    uncompacted_sstables: int
    uncompacted_rows: int


def views_root(table_uri: str) -> str:
    return paths.views_dir(paths.normalize_uri(table_uri))


def view_uri(table_uri: str, name: str) -> str:
    return paths.view_meta_dir(paths.normalize_uri(table_uri), name)


def list_views(table_uri: str) -> list[str]:
    root = views_root(table_uri)
    try:
        return sorted(n for n in os.listdir(root) if os.path.isdir(os.path.join(root, n, "_versions")))
    except FileNotFoundError:
        return []


@dataclass
class UdfStats:
    calls: int = 0
    rows: int = 0
    reused_chunks: int = 0


class View:
    """A materialized view. Create with :meth:`create`, open with :meth:`open`."""

    #: UDF inputs are evaluated and checkpointed in chunks of this many rows.
    CHUNK_ROWS = 10_000
    #: A refresh lease is taken over after this long without renewal.
    LEASE_SECONDS = 600.0

    def __init__(self, table_uri: str, definition: ViewDefinition) -> None:
        self.table_uri = paths.normalize_uri(table_uri)
        self.definition = definition
        self.uri = view_uri(self.table_uri, definition.name)
        self.udf_stats = UdfStats()

    # -- lifecycle ------------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        table_uri: str,
        name: str,
        *,
        select: Sequence[str] = (),
        where: str | None = None,
        group_by: Sequence[str] = (),
        udfs: Sequence[UdfColumn] = (),
        shuffle_seed: int | None = None,
        refresh: bool = True,
        max_rows_per_fragment: int = 1_000_000,
    ) -> "View":
        """Define a view on the table at ``table_uri`` (and run its first, full refresh)."""
        from memwal.state import TableState

        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", name):
            raise ViewError(f"view name {name!r}: use letters, digits, '_', '.', '-'")
        table = TableState.load(table_uri)
        if not table.dataset().has_stable_row_ids:
            raise ViewError("views need stable row ids on the base table (memwal tables have them)")
        defn = ViewDefinition(name, table.uri, tuple(select), where, tuple(group_by), tuple(udfs), shuffle_seed)
        _check_definition(defn)
        view = cls(table.uri, defn)
        if os.path.exists(os.path.join(view.uri, "_versions")):
            raise ViewError(f"view {name!r} already exists on {table.uri}; drop it first")
        sample = view._compute_rows(table.dataset(), table.dataset().to_table(with_row_id=True, limit=0), udf_stats=None)
        ds = lance.write_dataset(sample.schema.empty_table(), view.uri, max_rows_per_file=max_rows_per_fragment)
        ds.update_config({CONFIG_KEY: defn.to_json()})
        log.info("created view %s on %s", name, table.uri)
        if refresh:
            view.refresh(max_rows_per_fragment=max_rows_per_fragment)
        return view

    @classmethod
    def open(cls, table_uri: str, name: str) -> "View":
        uri = view_uri(table_uri, name)
        try:
            ds = lance.dataset(uri)
        except (FileNotFoundError, ValueError, OSError):
            raise ViewError(f"no view {name!r} on {paths.normalize_uri(table_uri)}") from None
        text = ds.config().get(CONFIG_KEY)
        if not text:
            raise ViewError(f"{uri} is not a memwal view")
        return cls(table_uri, ViewDefinition.from_json(text))

    def drop(self) -> None:
        import shutil

        shutil.rmtree(self.uri, ignore_errors=True)
        log.info("dropped view %s", self.definition.name)

    def dataset(self, version: int | None = None) -> lance.LanceDataset:
        """The view as a plain Lance dataset."""
        return lance.dataset(self.uri, version=version)

    def to_table(self, columns: Sequence[str] | None = None, hidden: bool = False) -> pa.Table:
        """The view's rows (internal ``__`` columns left out unless ``hidden``)."""
        t = self.dataset().to_table(columns=list(columns) if columns else None)
        return t if hidden else t.select([c for c in t.schema.names if not c.startswith("__")])

    # -- history and freshness ------------------------------------------------------------------

    def history(self) -> list[RefreshRecord]:
        """Every refresh, oldest first (from the view's commit history)."""
        ds = self.dataset()
        out = []
        for v in ds.versions():
            txn = ds.read_transaction(v["version"])
            props = (txn.transaction_properties or {}) if txn is not None else {}
            if RECORD_KEY in props:
                out.append(RefreshRecord(**json.loads(props[RECORD_KEY])))
        return out

    def last_refresh(self) -> RefreshRecord | None:
        ds = self.dataset()
        for v in reversed(ds.versions()):
            txn = ds.read_transaction(v["version"])
            props = (txn.transaction_properties or {}) if txn is not None else {}
            if RECORD_KEY in props:
                return RefreshRecord(**json.loads(props[RECORD_KEY]))
        return None

    def freshness(self) -> Freshness:
        """How far the view is behind the base table and the table's uncompacted MemWAL data."""
        from memwal.state import TableState

        table = TableState.load(self.table_uri)
        snap = table.snapshot()
        last = self.last_refresh()
        latest = snap.base_version
        seconds = None
        if last is not None:
            newer = [v for v in snap.dataset.versions() if v["version"] > last.base_version]
            if newer:
                ts = newer[0]["timestamp"]
                seconds = time.time() - (ts.timestamp() if hasattr(ts, "timestamp") else float(ts))
            else:
                seconds = 0.0
        return Freshness(
            base_version_reflected=last.base_version if last else None,
            base_version_latest=latest,
            versions_behind=latest - last.base_version if last else latest,
            seconds_behind=seconds,
            uncompacted_sstables=snap.num_live_sstables,
            uncompacted_rows=sum(t.physical_rows for s in snap.shards for t in s.live_sstables),
        )

    # -- computing rows ---------------------------------------------------------------------------

    def _udf_results(self, rows: pa.Table, refresh_key: str, udf_stats: UdfStats | None) -> pa.Table:
        """``rows`` with every UDF column appended, chunk by chunk, reusing checkpoints."""
        defn = self.definition
        if not defn.udfs or rows.num_rows == 0:
            for u in defn.udfs:
                rows = rows.append_column(u.name, pa.nulls(rows.num_rows, u.arrow_type()))
            return rows
        for u in defn.udfs:
            fn = u.load()
            ident = u.identity()
            parts = []
            for start in range(0, rows.num_rows, self.CHUNK_ROWS):
                chunk = rows.slice(start, self.CHUNK_ROWS)
                key = hashlib.sha256(
                    f"{refresh_key}|{u.name}|{ident}|{start}|{chunk.num_rows}".encode()
                ).hexdigest()[:24]
                path = os.path.join(self.uri, CHECKPOINT_DIR, f"{key}.arrow")
                if os.path.exists(path):
                    with pa.ipc.open_stream(open(path, "rb").read()) as r:
                        parts.append(r.read_all().column(0))
                    if udf_stats is not None:
                        udf_stats.reused_chunks += 1
                    continue
                batch = chunk.select(list(u.inputs)).combine_chunks().to_batches()
                batch = batch[0] if batch else pa.RecordBatch.from_pylist([], schema=chunk.select(list(u.inputs)).schema)
                out = fn(batch)
                result = out if isinstance(out, (pa.Array, pa.ChunkedArray)) else pa.array(out, type=u.arrow_type())
                result = result.cast(u.arrow_type())
                if len(result) != chunk.num_rows:
                    raise ViewError(f"UDF {u.name} returned {len(result)} values for {chunk.num_rows} rows")
                if udf_stats is not None:
                    udf_stats.calls += 1
                    udf_stats.rows += chunk.num_rows
                _write_checkpoint(path, result)
                failpoint("view.udf_chunk_done")
                parts.append(result)
            column = pa.chunked_array([p for p in parts], type=u.arrow_type())
            rows = rows.append_column(u.name, column)
        return rows

    def _compute_rows(self, ds: lance.LanceDataset, base_rows: pa.Table, udf_stats: UdfStats | None, refresh_key: str = "") -> pa.Table:
        """Row view: view rows of ``base_rows`` (which carry ``_rowid``)."""
        defn = self.definition
        if defn.aggregate:
            return self._with_group_keys(finish_aggregates(defn, partial_aggregates(defn, base_rows)))
        rows = project_rows(defn, base_rows)
        rows = rows.sort_by([(ROW_ID, "ascending")])
        return self._udf_results(rows, refresh_key, udf_stats)

    def _with_group_keys(self, rows: pa.Table) -> pa.Table:
        return rows.append_column(GROUP_KEY, group_keys(self.definition, rows))

    def _shuffled(self, rows: pa.Table | None) -> pa.Table | None:
        seed = self.definition.shuffle_seed
        if seed is None or rows is None or rows.num_rows == 0 or ROW_ID not in rows.schema.names:
            return rows
        from memwal.transforms import murmur3_int64

        order = np.argsort(murmur3_int64(rows.column(ROW_ID).to_numpy().astype(np.int64), seed=seed), kind="stable")
        return rows.take(pa.array(order))

    # -- refresh -----------------------------------------------------------------------------------

    def refresh(
        self,
        src_version: int | None = None,
        *,
        max_rows_per_fragment: int = 1_000_000,
        spark: Any = None,
        spark_threshold_rows: int = 100_000,
    ) -> RefreshRecord | None:
        """Bring the view to base version ``src_version`` (latest when None); returns the
        record committed, or None when the view already reflects that version.

        With ``spark``, UDF columns of changes larger than ``spark_threshold_rows`` rows are
        computed on Spark executors.
        """
        from memwal.state import TableState

        t0 = time.perf_counter()
        table = TableState.load(self.table_uri)
        with _Lease(os.path.join(self.uri, LEASE), self.LEASE_SECONDS):
            base = table.dataset(src_version)
            last = self.last_refresh()
            if last is not None and last.base_version == base.version and self._udfs_current(last):
                return None
            if last is not None and last.base_version > base.version:
                raise ViewError(
                    f"view {self.definition.name} reflects base version {last.base_version}; "
                    f"refreshing back to {base.version} is not supported (recreate the view)"
                )
            self.udf_stats = UdfStats()
            view_ds = self.dataset()
            full = last is None or not self._udfs_current(last) or not _has_version(table, last.base_version)
            refresh_key = f"{last.base_version if last else 'none'}->{base.version}|{'full' if full else 'inc'}"
            if spark is not None:
                self._spark = (spark, spark_threshold_rows)
            if full:
                remove, add, changed = self._full(base, view_ds, refresh_key)
            elif self.definition.aggregate:
                remove, add, changed = self._incremental_aggregate(table, last.base_version, base, view_ds)
            else:
                remove, add, changed = self._incremental_rows(table, last.base_version, base, view_ds, refresh_key)
            failpoint("view.before_commit")
            index = table.manifests.mem_wal_index(base.version)
            record = RefreshRecord(
                base_version=base.version,
                compacted=dict(index.compacted) if index else {},
                refreshed_at=time.time(),
                view_version=view_ds.version + 1,
                mode="full" if full else "incremental",
                rows_changed=changed,
                udf_versions={u.name: u.identity() for u in self.definition.udfs},
                udf_calls=self.udf_stats.calls,
                seconds=time.perf_counter() - t0,
            )
            self._commit(view_ds, remove, self._shuffled(add), record, max_rows_per_fragment, overwrite=full)
            _clear_checkpoints(self.uri)
            self._index_key()
        log.info(
            "refreshed view %s to base v%d (%s, %d rows changed, %d UDF calls) in %.2fs",
            self.definition.name, base.version, record.mode, changed, self.udf_stats.calls, time.perf_counter() - t0,
        )
        return record

    #: unindexed view rows tolerated before the key index is brought up to date
    INDEX_SLACK_ROWS = 50_000

    def _index_key(self) -> None:
        """Keep a BTREE on the view's key column (source row id, or group key) so the
        next refresh finds the rows it replaces in time proportional to the change, not to
        the view. Small refreshes leave a few unindexed rows; they are folded in once they
        add up to ``INDEX_SLACK_ROWS``."""
        ds = self.dataset()
        column = GROUP_KEY if self.definition.aggregate else ROW_ID
        names = [i["name"] for i in ds.list_indices() if column in i["fields"]]
        if not names:
            if ds.count_rows():
                ds.create_scalar_index(column, "BTREE", name=f"{column}_idx")
        elif ds.stats.index_stats(names[0]).get("num_unindexed_rows", 0) > self.INDEX_SLACK_ROWS:
            ds.optimize.optimize_indices(index_names=names)

    def _udfs_current(self, last: RefreshRecord) -> bool:
        return all(last.udf_versions.get(u.name) == u.identity() for u in self.definition.udfs)

    def _full(self, base: lance.LanceDataset, view_ds: lance.LanceDataset, refresh_key: str):
        rows = base.to_table(columns=self.definition.columns_used(base.schema.names), with_row_id=True)
        add = self._compute(base, rows, refresh_key)
        return None, add, add.num_rows

    def _compute(self, base: lance.LanceDataset, rows: pa.Table, refresh_key: str) -> pa.Table:
        spark = getattr(self, "_spark", None)
        if spark is not None and self.definition.udfs and not self.definition.aggregate and rows.num_rows >= spark[1]:
            return self._compute_on_spark(spark[0], rows, refresh_key)
        return self._compute_rows(base, rows, self.udf_stats, refresh_key)

    def _compute_on_spark(self, spark: Any, rows: pa.Table, refresh_key: str) -> pa.Table:
        """Row view with UDF columns evaluated by Spark executors (mapInArrow)."""
        projected = project_rows(self.definition, rows).sort_by([(ROW_ID, "ascending")])
        from pyspark.sql.pandas.types import from_arrow_schema

        out_schema = projected.schema
        for u in self.definition.udfs:
            out_schema = out_schema.append(pa.field(u.name, u.arrow_type()))
        udfs = self.definition.udfs

        def evaluate(batches):
            for b in batches:
                t = pa.Table.from_batches([b])
                for u in udfs:
                    fn = u.load()
                    out = fn(t.select(list(u.inputs)).combine_chunks().to_batches()[0])
                    col = out if isinstance(out, (pa.Array, pa.ChunkedArray)) else pa.array(out, type=u.arrow_type())
                    t = t.append_column(u.name, col.cast(u.arrow_type()))
                yield from t.to_batches()

        df = spark.createDataFrame(projected.to_pandas()) if projected.num_rows else None
        if df is None:
            return out_schema.empty_table()
        result = df.mapInArrow(evaluate, from_arrow_schema(out_schema)).toArrow()
        self.udf_stats.calls += max(1, projected.num_rows // self.CHUNK_ROWS)
        self.udf_stats.rows += projected.num_rows
        return result.cast(out_schema).sort_by([(ROW_ID, "ascending")])

    def _incremental_rows(self, table, from_version: int, base: lance.LanceDataset, view_ds, refresh_key: str):
        delta = base.delta(begin_version=from_version, end_version=base.version)
        inserted = delta.get_inserted_rows().read_all()
        updated = delta.get_updated_rows().read_all()
        deleted = delta.get_deleted_row_ids().read_all()
        changed = pa.concat_tables([_base_columns(inserted, base), _base_columns(updated, base)])
        remove_ids = pa.concat_arrays(
            [updated.column("_rowid").combine_chunks().cast(pa.uint64()), deleted.column("_rowid").combine_chunks().cast(pa.uint64())]
        ) if (updated.num_rows or deleted.num_rows) else pa.array([], pa.uint64())
        add = self._compute(base, changed, refresh_key) if changed.num_rows else None
        return (ROW_ID, remove_ids), add, changed.num_rows + deleted.num_rows

    def _incremental_aggregate(self, table, from_version: int, base: lance.LanceDataset, view_ds):
        defn = self.definition
        delta = base.delta(begin_version=from_version, end_version=base.version)
        inserted = _base_columns(delta.get_inserted_rows().read_all(), base)
        updated = _base_columns(delta.get_updated_rows().read_all(), base)
        deleted = delta.get_deleted_row_ids().read_all()
        old_ids = pa.concat_arrays(
            [updated.column("_rowid").combine_chunks().cast(pa.uint64()), deleted.column("_rowid").combine_chunks().cast(pa.uint64())]
        ) if (updated.num_rows or deleted.num_rows) else pa.array([], pa.uint64())
        prev = table.dataset(from_version)
        old = prev._take_rows(old_ids.to_pylist(), columns=defn.columns_used(prev.schema.names), with_row_id=True) if len(old_ids) else None
        new = pa.concat_tables([inserted, updated])
        parts_new = partial_aggregates(defn, new) if new.num_rows else None
        parts_old = partial_aggregates(defn, old) if old is not None and old.num_rows else None
        touched = set()
        for p in (parts_new, parts_old):
            if p is not None:
                touched.update(group_keys(defn, p).to_pylist())
        if not touched:
            return None, None, 0
        current = view_ds.to_table(filter=f"{GROUP_KEY} IN ({', '.join(sql_literal(k) for k in touched)})")
        state = {k: row for k, row in zip(current.column(GROUP_KEY).to_pylist(), current.to_pylist())}
        recompute: set[str] = set()
        merged: dict[str, dict] = {}
        for sign, parts in ((1, parts_new), (-1, parts_old)):
            if parts is None:
                continue
            for key, row in zip(group_keys(defn, parts).to_pylist(), parts.to_pylist()):
                cur = merged.setdefault(key, dict(state.get(key) or {g: row[g] for g in defn.group_by}))
                cur[COUNT] = (cur.get(COUNT) or 0) + sign * row[COUNT]
                for func, _, alias in defn.aggregates():
                    if func in ("sum", "avg", "count"):
                        if func != "count":
                            s = row.get(f"__s_{alias}")
                            if isinstance(s, float):
                                cur[f"__s_{alias}"], cur[f"__k_{alias}"] = _neumaier(
                                    cur.get(f"__s_{alias}") or 0.0, cur.get(f"__k_{alias}") or 0.0, sign * (s + (row.get(f"__k_{alias}") or 0.0))
                                )
                            elif s is not None:
                                cur[f"__s_{alias}"] = (cur.get(f"__s_{alias}") or 0) + sign * s
                        cur[f"__c_{alias}"] = (cur.get(f"__c_{alias}") or 0) + sign * (row.get(f"__c_{alias}") or 0)
                    else:
                        m = row.get(f"__m_{alias}")
                        current = cur.get(f"__m_{alias}")
                        if sign > 0:
                            if m is not None and (current is None or (m < current if func == "min" else m > current)):
                                cur[f"__m_{alias}"] = m
                        elif m is not None and (current is None or not (m > current if func == "min" else m < current)):
                            recompute.add(key)  # the removed row may have been the extreme
        if recompute:
            predicate = " OR ".join(
                "(" + " AND ".join(f"({group_expr(defn, g)}) IS NOT DISTINCT FROM {sql_literal(v)}" for g, v in zip(defn.group_by, json.loads(k))) + ")"
                for k in recompute
            )
            if all(group_expr(defn, g) == g for g in defn.group_by):
                where = f"({defn.where}) AND ({predicate})" if defn.where else predicate
                fresh = base.to_table(columns=defn.columns_used(base.schema.names), with_row_id=True, filter=where)
            else:
                # a computed group key cannot be pushed into Lance's filter: select in memory
                fresh = _sql(
                    base.to_table(columns=defn.columns_used(base.schema.names), with_row_id=True, filter=defn.where),
                    f"SELECT * FROM src WHERE {predicate}",
                )
            exact = partial_aggregates(defn, fresh) if fresh.num_rows else None
            exact_rows = {k: r for k, r in zip(group_keys(defn, exact).to_pylist(), exact.to_pylist())} if exact is not None else {}
            for key in recompute:
                if key in exact_rows:
                    merged[key] = exact_rows[key]
                else:
                    merged[key] = {**merged.get(key, {}), COUNT: 0}
        alive = [r for r in merged.values() if (r.get(COUNT) or 0) > 0]
        schema = view_ds.schema
        if alive:
            state_table = pa.Table.from_pylist(
                [{k: v for k, v in r.items() if k != GROUP_KEY} for r in alive],
                schema=pa.schema([f for f in schema if f.name != GROUP_KEY]),
            )
            add = self._with_group_keys(finish_aggregates(defn, state_table)).cast(schema)
        else:
            add = None
        return (GROUP_KEY, pa.array(sorted(touched), pa.string())), add, len(new) + (len(old) if old is not None else 0)

    # -- the one commit --------------------------------------------------------------------------

    def _commit(self, view_ds, remove, add: pa.Table | None, record: RefreshRecord, max_rows_per_fragment: int, overwrite: bool) -> None:
        from lance import LanceOperation
        from lance.dataset import Transaction
        from lance.fragment import write_fragments

        schema = view_ds.schema
        new_fragments = []
        if add is not None and add.num_rows:
            new_fragments = write_fragments(add.cast(schema), self.uri, max_rows_per_file=max_rows_per_fragment, schema=schema)
        if overwrite:
            op = LanceOperation.Overwrite(schema, new_fragments)
        else:
            updated, removed = [], []
            if remove is not None and len(remove[1]):
                column, keys = remove
                hits = view_ds.to_table(
                    columns=[column], filter=f"{column} IN ({', '.join(sql_literal(k) for k in keys.to_pylist())})", with_row_address=True
                )
                addrs = hits.column("_rowaddr").to_numpy()
                for frag_id in np.unique(addrs >> 32):
                    offsets = (addrs[(addrs >> 32) == frag_id] & 0xFFFFFFFF).tolist()
                    meta = view_ds.get_fragment(int(frag_id)).delete_rows(offsets)
                    (updated.append(meta) if meta is not None else removed.append(int(frag_id)))
            op = LanceOperation.Update(removed_fragment_ids=removed, updated_fragments=updated, new_fragments=new_fragments)
        txn = Transaction(read_version=view_ds.version, operation=op, transaction_properties={RECORD_KEY: json.dumps(asdict(record))})
        latest = lance.dataset(self.uri).version
        if latest != view_ds.version:
            raise ViewBusyError(f"view {self.definition.name} changed while refreshing (v{view_ds.version} -> v{latest}); rerun the refresh")
        lance.LanceDataset.commit(self.uri, txn, read_version=view_ds.version, max_retries=0)


# ---------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------


def _base_columns(rows: pa.Table, base: lance.LanceDataset) -> pa.Table:
    keep = [c for c in rows.schema.names if c in base.schema.names or c == "_rowid"]
    return rows.select(keep)


def _has_version(table, version: int) -> bool:
    return any(v["version"] == version for v in table.dataset().versions())


def _write_checkpoint(path: str, result: pa.Array | pa.ChunkedArray) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    t = pa.table({"v": result})
    with pa.ipc.new_stream(tmp, t.schema) as w:
        w.write_table(t)
    os.replace(tmp, path)


def _clear_checkpoints(view_uri: str) -> None:
    import shutil

    shutil.rmtree(os.path.join(view_uri, CHECKPOINT_DIR), ignore_errors=True)


def _check_definition(defn: ViewDefinition) -> None:
    if defn.group_by:
        aggs = defn.aggregates()
        plain = [s for s in defn.select if not _AGG.match(s)]
        for item in plain:
            m = _ALIAS.match(item)
            col = (m.group(2) if m else item).strip()
            if col not in defn.group_by:
                raise ViewError(f"view {defn.name}: {item!r} is neither an aggregate nor a GROUP BY column")
        if not aggs:
            raise ViewError(f"view {defn.name}: GROUP BY without aggregates")
        if defn.udfs:
            raise ViewError(f"view {defn.name}: UDF columns are not supported on aggregate views")
        if defn.shuffle_seed is not None:
            raise ViewError(f"view {defn.name}: shuffle applies to row views only")
    for u in defn.udfs:
        u.load()  # fail at definition time if the function cannot be imported


class _Lease:
    """Serializes refreshes of one view: a file created with O_EXCL holding host, pid and time.

    A lease older than ``seconds`` (its holder died or hangs) is taken over, as is one held
    by a process of this host that no longer exists.
    """

    def __init__(self, path: str, seconds: float) -> None:
        self.path = path
        self.seconds = seconds
        self.held = False

    def __enter__(self) -> "_Lease":
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                with os.fdopen(fd, "w") as f:
                    json.dump({"host": socket.gethostname(), "pid": os.getpid(), "at": time.time()}, f)
                self.held = True
                return self
            except FileExistsError:
                if not self._stale():
                    raise ViewBusyError(f"another refresh holds {self.path}; wait for it, or remove the file if its process is gone") from None
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)
        raise ViewBusyError(f"could not take the refresh lease {self.path}")

    def _stale(self) -> bool:
        try:
            info = json.loads(open(self.path).read())
        except (OSError, ValueError):
            return True
        if time.time() - info.get("at", 0) > self.seconds:
            return True
        if info.get("host") == socket.gethostname():
            try:
                os.kill(int(info["pid"]), 0)
            except ProcessLookupError:
                return True
            except PermissionError:
                return False
        return False

    def __exit__(self, *exc: object) -> None:
        if self.held:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
