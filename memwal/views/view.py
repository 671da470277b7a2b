"""A materialized view: create, open, read, refresh, drop.

A view is a plain Lance table (see :mod:`memwal.views.layout`) computed from a memwal
table's base (compacted) data by a :class:`ViewDefinition`, and brought up to date by
:meth:`View.refresh` (see :mod:`memwal.views.refresh`). Refreshes of one view are
serialized by its lease; UDF results are checkpointed per chunk, so a refresh killed
midway and rerun recomputes only the chunks that had not finished; a UDF whose version or
code changed is recomputed for every row.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Sequence

import lance
import pyarrow as pa

from memwal.core import paths
from memwal.core.failpoints import failpoint
from memwal.core.holds import write_hold
from memwal.core.io import file_io_for
from memwal.core.lance_errors import is_not_found, memwal_errors
from memwal.core.state import TableState
from memwal.views import refresh as refreshing
from memwal.views.changes import with_source_key
from memwal.views.checkpoints import Checkpoints
from memwal.views.definition import UdfColumn, ViewDefinition
from memwal.views.errors import ViewError
from memwal.views.evaluate import shuffled
from memwal.views.history import Freshness, RefreshRecord, last_record, refresh_records
from memwal.views.layout import CONFIG_KEY, GROUP_KEY, LEASE_DIR, ROW_ID, SOURCE_KEY, view_exists, view_names, view_uri
from memwal.views.lease import Lease
from memwal.views.udf import UdfRunner, UdfStats

log = logging.getLogger(__name__)


def _state(table: TableState | str) -> TableState:
    return table if isinstance(table, TableState) else TableState.load(table)


def _has_version(state: TableState, version: int) -> bool:
    """Whether base version ``version`` is still kept: opened, not found in a listing of every
    version (whose cost grows with the table's history)."""
    try:
        state.dataset(version)
        return True
    except (OSError, ValueError) as e:  # Lance's untyped errors
        if is_not_found(e) or "not found" in str(e).lower():
            return False
        raise


def list_views(table: TableState | str) -> list[str]:
    """Names of the views of a table, sorted."""
    if isinstance(table, TableState):
        return view_names(table.io, table.uri)
    uri = paths.normalize_uri(table)
    return view_names(file_io_for(uri), uri)


class View:
    """A materialized view. Create with :meth:`create`, open with :meth:`open`."""

    #: UDF inputs are evaluated and checkpointed in chunks of this many rows.
    CHUNK_ROWS = 10_000
    #: A refresh lease is taken over after this long without renewal.
    LEASE_SECONDS = 600.0
    #: unindexed view rows tolerated before the key index is brought up to date
    INDEX_SLACK_ROWS = 50_000

    def __init__(self, table: TableState | str, definition: ViewDefinition) -> None:
        self.state = _state(table)
        self.table_uri = self.state.uri
        self.definition = definition
        self.uri = view_uri(self.table_uri, definition.name)
        self.udf_stats = UdfStats()
        self._udf_identities: dict[str, str] | None = None

    @property
    def udf_identities(self) -> dict[str, str]:
        """Each UDF's identity (version and code), computed once per opened view: reading a
        UDF's source is a file read, and a refresh asks for it several times."""
        if self._udf_identities is None:
            self._udf_identities = {u.name: u.identity() for u in self.definition.udfs}
        return self._udf_identities

    # -- lifecycle ------------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        table: TableState | str,
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
        """Define a view on ``table`` (a table state, or a table's URI) and run its first,
        full refresh."""
        state = _state(table)
        defn = ViewDefinition(name, state.uri, tuple(select), where, tuple(group_by), tuple(udfs), shuffle_seed)
        base = state.dataset()
        defn.check()
        view = cls(state, defn)
        if view_exists(state.io, view.uri):
            raise ViewError(f"view {name!r} already exists on {state.uri}; drop it first")
        sample = view._computer(None).rows(with_source_key(base.to_table(limit=0), state.primary_key))
        ds = lance.write_dataset(
            sample.schema.empty_table(), view.uri, max_rows_per_file=max_rows_per_fragment,
            storage_options=state.storage_options,
        )
        ds.update_config({CONFIG_KEY: defn.to_json()})
        log.info("created view %s on %s", name, state.uri)
        if refresh:
            view.refresh(max_rows_per_fragment=max_rows_per_fragment)
        return view

    @classmethod
    def open(cls, table: TableState | str, name: str) -> "View":
        """The view ``name`` of ``table`` (a table state, or a table's URI)."""
        state = _state(table)
        uri = view_uri(state.uri, name)
        if not view_exists(state.io, uri):
            raise ViewError(f"no view {name!r} on {state.uri}")
        text = state.lance_dataset(uri).config().get(CONFIG_KEY)
        if not text:
            raise ViewError(f"{uri} is not a memwal view")
        return cls(state, ViewDefinition.from_json(text))

    def drop(self) -> None:
        self.state.io.remove_tree(self.uri)
        log.info("dropped view %s", self.definition.name)

    def dataset(self, version: int | None = None) -> lance.LanceDataset:
        """The view as a plain Lance dataset (with the table handle's Lance caches, so the
        key index a refresh looks its rows up by stays loaded between refreshes)."""
        return self.state.lance_dataset(self.uri, version, warm=True)

    def to_table(self, columns: Sequence[str] | None = None, hidden: bool = False) -> pa.Table:
        """The view's rows (internal ``__`` columns left out unless ``hidden``)."""
        t = self.dataset().to_table(columns=list(columns) if columns else None)
        return t if hidden else t.select([c for c in t.schema.names if not c.startswith("__")])

    # -- history and freshness ------------------------------------------------------------------

    def history(self) -> list[RefreshRecord]:
        """Every refresh, oldest first (from the view's commit history)."""
        return list(refresh_records(self.dataset()))

    def last_refresh(self) -> RefreshRecord | None:
        return last_record(self.dataset())

    def freshness(self, last: RefreshRecord | None = None) -> Freshness:
        """How far the view is behind the base table and the table's uncompacted MemWAL
        data (``last``: the view's last refresh record, if the caller has read it)."""
        snap = self.state.snapshot()
        last = last or self.last_refresh()
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

    # -- refresh -----------------------------------------------------------------------------------

    def _computer(self, refresh_key: str | None, spark: tuple[Any, int] | None = None) -> refreshing.Computer:
        """How this view's rows are computed; ``refresh_key`` None: without checkpoints."""
        checkpoints = Checkpoints(self.state.io, self.uri) if refresh_key is not None else None
        identities = self.udf_identities if refresh_key is not None else None
        runner = UdfRunner(self.definition.udfs, self.CHUNK_ROWS, checkpoints, refresh_key or "", identities)
        return refreshing.Computer(self.definition, runner, self.udf_stats if refresh_key is not None else None, spark)

    def _udfs_current(self, last: RefreshRecord) -> bool:
        return all(last.udf_versions.get(name) == identity for name, identity in self.udf_identities.items())

    @memwal_errors()
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
        t0 = time.perf_counter()
        defn, state = self.definition, self.state
        with Lease(state.io, paths.join(self.uri, LEASE_DIR), self.LEASE_SECONDS, f"view {defn.name}") as lease:
            base = state.dataset(src_version)
            view_ds = self.dataset()
            last = last_record(view_ds)
            udfs_current = last is not None and self._udfs_current(last)
            if last is not None and last.base_version == base.version and udfs_current:
                return None
            if last is not None and last.base_version > base.version:
                raise ViewError(
                    f"view {defn.name} reflects base version {last.base_version}; "
                    f"refreshing back to {base.version} is not supported (recreate the view)"
                )
            self.udf_stats = UdfStats()
            # Views keyed by stable row id (made by earlier versions) keep Lance's delta() feed.
            by_row_id = ROW_ID in view_ds.schema.names
            # A row view keyed on the primary key reads only SSTables (its record says which);
            # the others read the base version they reflect, which may have been cleaned up.
            needs_prev = by_row_id or defn.aggregate
            full = last is None or not udfs_current or (needs_prev and not _has_version(state, last.base_version))
            refresh_key = f"{last.base_version if last else 'none'}->{base.version}|{'full' if full else 'inc'}"
            compute = self._computer(refresh_key, (spark, spark_threshold_rows) if spark is not None else None)
            change = None
            if full:
                pass
            elif by_row_id:
                change = (
                    refreshing.group_change(defn, state, base, last.base_version, view_ds) if defn.aggregate
                    else refreshing.row_change(compute, base, last.base_version)
                )
            elif defn.aggregate:
                change = refreshing.key_group_change(defn, state, base, last.base_version, view_ds)
            else:
                change = refreshing.key_row_change(compute, state, base, dict(last.compacted))
            if change is None:
                if not full:
                    log.warning("view %s: SSTables of its change are gone; refreshing in full", defn.name)
                    full = True
                    refresh_key = f"{last.base_version if last else 'none'}->{base.version}|full"
                    compute = self._computer(refresh_key, (spark, spark_threshold_rows) if spark is not None else None)
                change = refreshing.full_change(compute, base, None if by_row_id else list(state.primary_key))
            if defn.shuffle_seed is not None and change.add is not None:
                change = refreshing.Change(change.remove, shuffled(change.add, defn.shuffle_seed), change.rows_changed)
            failpoint("view.before_commit")
            index = state.manifests.mem_wal_index(base.version)
            record = RefreshRecord(
                base_version=base.version,
                compacted=dict(index.compacted) if index else {},
                refreshed_at=time.time(),
                view_version=view_ds.version + 1,
                mode="full" if full else "incremental",
                rows_changed=change.rows_changed,
                udf_versions=dict(self.udf_identities),
                udf_calls=self.udf_stats.calls,
                seconds=time.perf_counter() - t0,
            )
            refreshing.commit(
                self.uri, view_ds, change, record,
                max_rows_per_fragment=max_rows_per_fragment, overwrite=full, lease=lease, name=defn.name,
                storage_options=state.storage_options,
            )
            if not by_row_id:
                # after the commit: the hold never runs ahead of what the view has consumed
                write_hold(state.io, paths.view_hold(state.uri, defn.name), record.compacted)
            Checkpoints(state.io, self.uri).clear()
            key = GROUP_KEY if defn.aggregate else (ROW_ID if by_row_id else SOURCE_KEY)
            refreshing.index_key(self.dataset(), key, self.INDEX_SLACK_ROWS)
        log.info(
            "refreshed view %s to base v%d (%s, %d rows changed, %d UDF calls) in %.2fs",
            defn.name, base.version, record.mode, change.rows_changed, self.udf_stats.calls, time.perf_counter() - t0,
        )
        return record
