"""The LSM read API: point lookups, scans and searches over base table + uncompacted SSTables.

A :class:`Reader` works on a :class:`~memwal.core.snapshot.Snapshot` (a pinned base version
plus the live SSTables of every shard) and refreshes it on demand or every
``refresh_interval_ms``, either in the read that finds it stale or, for a serving process,
on a thread of its own (``refresh_in_background``). Which snapshot (and, for a strong
reader, which WAL tail) a read sees is decided here; each kind of read has a module of its
own that reads what it is given: :mod:`~memwal.readers.lookups` (point lookups),
:mod:`~memwal.readers.stream` (scans), :mod:`~memwal.readers.vector_search` and
:mod:`~memwal.readers.text` (searches), after :mod:`~memwal.readers.plan` has checked the
columns and filter asked for and pruned the shards.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Any, Iterable, Iterator, Literal, Mapping, Sequence

import lance
import numpy as np
import pyarrow as pa

from memwal.readers import feed
from memwal.core.errors import InvalidArgumentError
from memwal.core.lance_errors import memwal_errors
from memwal.readers import sstables, text, timetravel
from memwal.readers.config import ReadConfig
from memwal.readers.keys import keys_table, typed_key
from memwal.readers.lookups import POINT_LOOKUP_BATCH, PointLookups
from memwal.readers.plan import Planner, ReadPlan
from memwal.readers.points import first_row
from memwal.readers.pruning import Pruning
from memwal.readers.splits import ScanPlan, SplitReader, plan_scan
from memwal.readers.vector_search import VectorSearch
from memwal.core.schema import stored_schema
from memwal.core.snapshot import Snapshot, take_snapshot
from memwal.core.state import TableState
from memwal.core.storage import StorageConfig
from memwal.core.wal import WalTailReader

Consistency = Literal["eventual", "strong"]

log = logging.getLogger(__name__)

#: A reader refreshed in the background refreshes in the read itself once its snapshot is this
#: many intervals old (the refresh thread is stuck or failing), so staleness stays bounded.
BACKGROUND_STALE_INTERVALS = 5


class Reader:
    """Reads a memwal table. Obtain one with :func:`memwal.readers.open`."""

    def __init__(
        self,
        state: TableState,
        *,
        consistency: Consistency = "eventual",
        refresh_interval_ms: int | None = 1000,
        version: int | None = None,
        cache_bytes: int = sstables.DEFAULT_CACHE_BYTES,
        refresh_in_background: bool = False,
        config: ReadConfig | None = None,
        as_of: timetravel.AsOf | None = None,
    ) -> None:
        if consistency not in ("eventual", "strong"):
            raise InvalidArgumentError(f"consistency must be 'eventual' or 'strong', got {consistency!r}")
        if version is not None and as_of is not None:
            raise InvalidArgumentError("give as_of or version (its older name), not both")
        as_of = version if as_of is None else as_of
        if as_of is not None and consistency == "strong":
            raise InvalidArgumentError("time travel (as_of=) reads a past state; it cannot be strongly consistent")
        self.state = state
        self.config = config or ReadConfig()
        self.consistency = consistency
        self.refresh_interval_ms = refresh_interval_ms
        #: the past state a time-travel reader reads (resolved now: a bad ``as_of`` fails here)
        self.past = timetravel.resolve(state, as_of) if as_of is not None else None
        if self.past is not None:
            then = state.dataset(self.past.base_version)
            if then.schema.names != state.write_schema.names:
                # The past is read with the columns it had (a column added since did not exist then).
                state = TableState.from_dataset(state.uri, then, state.metadata, state.io, state.storage)
        self._snapshot: Snapshot | None = None
        #: when the current snapshot was started (monotonic): its age, and which of two is newer
        self._taken_at = 0.0
        self._publishing = threading.Lock()
        self._cache_bytes = cache_bytes
        self._bind(state)
        self._refresher: _Refresher | None = None
        if refresh_in_background:
            if consistency != "eventual" or as_of is not None or refresh_interval_ms is None or refresh_interval_ms <= 0:
                raise InvalidArgumentError("refresh_in_background needs an eventual reader of the latest version with a refresh_interval_ms")
            self.refresh()  # the first snapshot in the caller's thread: a bad table fails here
            self._refresher = _Refresher(self, refresh_interval_ms / 1000)

    def _bind(self, state: TableState) -> None:
        """Read ``state``'s table with its columns: everything that depends on them, fresh."""
        self.state = state
        self._wal = WalTailReader(state.uri, state.io, state.manifests, state.primary_key, schema=stored_schema(state.write_schema))
        #: the base table as a strong read last found it (reused while it is the latest version)
        self._strong_base: lance.LanceDataset | None = None
        #: the base dataset whose columns were last compared with this reader's
        self._columns_checked: lance.LanceDataset | None = None
        #: the shards' WAL tails last read, and their concatenation
        self._last_tails: tuple[list[pa.Table], pa.Table] | None = None
        #: immutable SSTable data this reader has read, bounded by ``cache_bytes``
        self.sstables = sstables.SSTableCache(self._cache_bytes, state.storage_options, stored_schema(state.write_schema))
        #: the base table's full-text corpus statistics (BM25), per base version
        self.text_stats = text.BaseTextStats()
        #: each shard's live SSTables with their key sets, per snapshot: lookups walk them
        self._live_keys = sstables.LiveKeySets(self.sstables, state.primary_key)
        self._planner = Planner(state)
        self._points = PointLookups(state, self.sstables, self._live_keys, self.config)
        self._vectors = VectorSearch(state, self.config, self.sstables, self._live_keys)

    def _columns_changed(self, base: lance.LanceDataset) -> bool:
        """Whether the latest base has other columns than this reader reads (a column was
        added or dropped since it opened, :mod:`memwal.maintain.evolve`): then it reloads the table's
        state and reads the new columns."""
        # Once per base dataset opened (a strong reader reuses one until a version is committed):
        # Lance builds the Arrow schema anew at each ask.
        if self.past is not None or base is self._columns_checked:
            return False
        self._columns_checked = base
        if base.schema.names == self.state.write_schema.names:
            return False
        log.info("table %s: columns changed to %s; reading them", self.state.uri, base.schema.names)
        self._bind(TableState.load(self.state.uri, self.state.storage))
        return True

    # -- snapshots ------------------------------------------------------------------------------

    def refresh(self) -> Snapshot:
        """Take a new snapshot now: latest base version and shard manifests."""
        started = time.monotonic()
        if self.past is not None:
            # Time travel: the base version and the SSTables the shards listed then.
            snap = timetravel.past_snapshot(self.state, self.past)
        else:
            snap = self.state.snapshot()
            if self._columns_changed(snap.dataset):
                snap = self.state.snapshot()
        return self._publish(snap, started)

    def _publish(self, snap: Snapshot, started: float) -> Snapshot:
        """Make ``snap`` (started at ``started``) the current snapshot unless one started later
        already is, and return the current one. Invariant: the snapshot a read sees never goes
        back in time, though a background refresh that started before a read's own refresh
        finishes after it."""
        with self._publishing:
            if self._snapshot is None or started >= self._taken_at:
                self._snapshot, self._taken_at = snap, started
            return self._snapshot

    def _refresh_and_warm(self) -> None:
        """The background refresh: take a snapshot, load what the next lookups on it would load
        first (:meth:`PointLookups.warm`: nothing for a reader that only scans), then publish
        it; until then reads use the previous snapshot."""
        started = time.monotonic()
        snap = self.state.snapshot()
        if self._columns_changed(snap.dataset):
            snap = self.state.snapshot()
        self._points.warm(snap, self._snapshot)
        self._publish(snap, started)

    def close(self) -> None:
        """Stop the background refresh, if any, waiting for one in progress (a reader left to
        the garbage collector stops it too, within one interval). The reader still reads,
        refreshing in the read as an inline reader does."""
        if self._refresher is not None:
            self._refresher.stop()
            self._refresher = None

    def __enter__(self) -> "Reader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def snapshot(self) -> Snapshot:
        """The current snapshot, refreshed if older than ``refresh_interval_ms`` (with a
        background refresh: only once it is ``BACKGROUND_STALE_INTERVALS`` intervals old)."""
        if self._snapshot is None:
            return self.refresh()
        if self.past is None and self.refresh_interval_ms is not None:
            age_ms = (time.monotonic() - self._taken_at) * 1000
            stale_ms = self.refresh_interval_ms * (BACKGROUND_STALE_INTERVALS if self._refresher is not None else 1)
            if age_ms >= stale_ms:
                return self.refresh()
        return self._snapshot

    def _view(self, shard_ids: list[str] | None = None) -> tuple[Snapshot, pa.Table | None]:
        """What a read merges: a snapshot and, in strong mode, the shards' unflushed WAL rows.

        Strong reads take a fresh snapshot every time: a strong read must see every write
        acknowledged before it started, wherever it was written.
        """
        if self.consistency == "eventual":
            snap = self.snapshot
            return (snap.restrict(shard_ids) if shard_ids is not None else snap), None
        self._strong_base = self.state.latest_dataset(self._strong_base)
        if self._columns_changed(self._strong_base):
            self._strong_base = self.state.latest_dataset()
        snap = take_snapshot(self._strong_base, self.state.manifests, shard_ids)
        tails = [t for s in snap.shards if (t := self._wal.tail(s.manifest)) is not None]
        if not tails:
            return snap, None
        if len(tails) == 1:
            return snap, tails[0]
        # The shards' tails are the same tables while their entries do not change: so is their
        # concatenation, and what a search builds from it once (vector_search.TailVectors).
        last = self._last_tails
        if last is not None and len(last[0]) == len(tails) and all(a is b for a, b in zip(last[0], tails)):
            return snap, last[1]
        merged = pa.concat_tables(tails, promote_options="permissive")
        self._last_tails = (tails, merged)
        return snap, merged

    def _pruned_view(self, where: str | None) -> tuple[Snapshot, pa.Table | None]:
        """:meth:`_view` of the shards a read filtered by ``where`` must look at."""
        p = self.pruning(where)
        return self._view(sorted(p.shard_ids) if p.shard_ids is not None else None)

    # -- point lookups (memwal.readers.lookups) --------------------------------------------------

    def _lookup(self, key: dict[str, Any], columns: Sequence[str] | None, pinned: Snapshot | None = None) -> pa.Table:
        shard_id = self.state.shard_of_key(key)
        if pinned is not None:
            snap, tail = pinned, None
        elif self.consistency == "eventual":
            snap, tail = self.snapshot, None  # the whole snapshot: restricting it costs more than it saves
        else:
            snap, tail = self._view([shard_id])
        # The columns are the view's: taking it may have found them changed (_columns_changed).
        return self._points.one(key, shard_id, self._planner.output_schema(columns), snap, tail)

    @memwal_errors()
    def get(self, key: Any, columns: Sequence[str] | None = None) -> dict[str, Any] | None:
        """The live row with primary key ``key`` (scalar, tuple or dict), or None.

        A key value that is not of its column's type is a :class:`PrimaryKeyError`, as in
        :meth:`get_many`: :func:`typed_key` types it as :func:`keys_table` does.
        """
        t = self._lookup(typed_key(key, self.state.primary_key, self.state.schema), columns)
        return first_row(t) if t.num_rows else None

    @memwal_errors()
    def get_many(self, keys: Iterable[Any], columns: Sequence[str] | None = None) -> pa.Table:
        """The live rows of ``keys`` (absent keys are left out), as one Arrow table."""
        kt = keys_table(keys, self.state.primary_key, self.state.schema)
        if kt.num_rows == 0:
            return self._planner.output_schema(columns).empty_table()
        if kt.num_rows <= POINT_LOOKUP_BATCH:
            # An eventual reader's lookups share one snapshot, as one scan would: a refresh
            # between two of them must not show one key before a change and the next after it.
            pinned = self.snapshot if self.consistency == "eventual" else None
            parts = [self._lookup(k, columns, pinned) for k in kt.to_pylist()]
            out_schema = self._planner.output_schema(columns)
            parts = [p for p in parts if p.num_rows]
            return pa.concat_tables([p.cast(out_schema) for p in parts]) if parts else out_schema.empty_table()
        snap, tail = self._view()
        return self._points.many(kt, self._planner.output_schema(columns), snap, tail)

    def rows_of_keys(self, keys: pa.Table, shard_id: str | None = None) -> pa.Table:
        """The live rows (every column) of ``keys`` (a table of the key columns, typed as the
        table's), all in ``shard_id`` when given; absent keys are left out.

        A vectorized semi-join on the keys instead of a SQL predicate of literals: partial
        updates read thousands of keys per write, and parsing (then evaluating) one literal
        per key cost more than the read itself (docs/bench-log/partial-updates.md).
        """
        snap, tail = self._view([shard_id] if shard_id is not None else None)
        return self._points.many(keys.select(list(self.state.primary_key)), self.state.schema, snap, tail)

    # -- what a read touches (memwal.readers.plan) -----------------------------------------------

    def check_filter(self, where: str | None) -> None:
        """Raise :class:`InvalidArgumentError` if ``where`` is not one SQL predicate over the
        table's columns (checked once per filter, the same way for every LSM level)."""
        self._planner.check_filter(where)

    def pruning(self, where: str | None) -> Pruning:
        """The shards a read filtered by ``where`` must look at (shard pruning)."""
        return self._planner.pruning(where)

    def plan(self, where: str | None = None) -> ReadPlan:
        """Which shards and SSTables a read with ``where`` would touch."""
        return self._planner.plan(self.snapshot, where)

    # -- scans (memwal.readers.stream) -----------------------------------------------------------

    def _splits(self, snap: Snapshot, tail: pa.Table | None, wanted: Sequence[str], where: str | None,
                rows_per_split: int | None = None) -> SplitReader:
        plan = plan_scan(snap, tail, wanted, where, rows_per_split)
        return SplitReader(plan, snap, self.sstables, self.config, self.state.primary_key, self.state.schema)

    def plan_scan(self, columns: Sequence[str] | None = None, where: str | None = None, rows_per_split: int | None = None) -> ScanPlan:
        """A scan of ``columns`` (the primary key among them) matching ``where``, planned as
        splits (:mod:`memwal.readers.splits`) for engines that read them on several workers
        (``format("memwal")``): the base's fragments grouped up to ``rows_per_split`` rows
        (None: one split). Each split is read with :meth:`split_reader`."""
        snap, tail = self._pruned_view(where)
        wanted = list(dict.fromkeys([*self._planner.output_schema(columns).names, *self.state.primary_key]))
        return plan_scan(snap, tail, wanted, where, rows_per_split)

    def split_reader(self, plan: ScanPlan) -> SplitReader:
        """What reads ``plan``'s splits in this process, through this reader's SSTable cache."""
        return SplitReader(plan, plan.open(self.state), self.sstables, self.config, self.state.primary_key, self.state.schema)

    def _scan_batches(self, columns: Sequence[str] | None, where: str | None, limit: int | None) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise InvalidArgumentError(f"limit must be a non-negative integer, got {limit!r}")
        snap, tail = self._pruned_view(where)
        schema = self._planner.output_schema(columns)  # the view's columns (see _lookup)
        out = schema.names
        wanted = list(dict.fromkeys([*out, *self.state.primary_key]))
        batches = self._splits(snap, tail, wanted, where).scan(limit)
        if wanted == out:
            return schema, batches
        return schema, (b.select(out) for b in batches)

    @memwal_errors()
    def scan(
        self,
        columns: Sequence[str] | None = None,
        where: str | None = None,
        limit: int | None = None,
    ) -> pa.Table:
        """Live rows (newest version per key, deleted keys absent) matching ``where`` (SQL)."""
        schema, batches = self._scan_batches(columns, where, limit)
        return pa.Table.from_batches(list(batches), schema)

    def to_batches(
        self,
        columns: Sequence[str] | None = None,
        where: str | None = None,
        limit: int | None = None,
    ) -> pa.RecordBatchReader:
        """Like :meth:`scan`, as a stream of record batches read as they are consumed: the
        newest SSTables first, then the base, then the WAL tail, never the whole table in
        memory (``ReadConfig.scan_batch_rows`` and ``scan_sstables_ahead`` bound what is
        held). The snapshot is taken when this is called."""
        schema, batches = self._scan_batches(columns, where, limit)
        return pa.RecordBatchReader.from_batches(schema, batches)

    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object:
        """The live rows as an Arrow C stream (the Arrow PyCapsule interface): DuckDB, Polars,
        DataFusion and pyarrow read the fresh view from a reader directly, batch by batch."""
        return self.to_batches().__arrow_c_stream__(requested_schema)

    def to_arrow(self, columns: Sequence[str] | None = None, where: str | None = None) -> pa.RecordBatchReader:
        """The live rows as a :class:`pyarrow.RecordBatchReader`, for other engines
        (``duckdb.sql("SELECT ... FROM r")`` with ``r = reader.to_arrow()``,
        ``polars.from_arrow(...)``, DataFusion's ``from_arrow``); :meth:`to_batches` with a name
        other engines' users look for."""
        return self.to_batches(columns, where)

    @memwal_errors()
    def changes(
        self,
        since: "feed.Position | int | str",
        until: int | None = None,
        columns: Sequence[str] | None = None,
    ) -> pa.Table:
        """The table's change feed (:mod:`memwal.readers.feed`): every change after ``since`` (a base
        version, a :class:`~memwal.readers.feed.Position`, or ``"earliest"``) up to base version
        ``until`` or the last flush, as rows of the table's columns with ``_change_type``
        (insert, update_preimage, update_postimage, delete), ``_shard``, ``_generation`` and
        ``_commit_time``; per shard in generation order, each generation's net change per
        key. Raises :class:`~memwal.core.errors.ChangesCollectedError` for changes GC collected."""
        return pa.Table.from_batches(list(self.change_batches(since, until, columns)), self.change_schema(columns))

    def change_schema(self, columns: Sequence[str] | None = None) -> pa.Schema:
        return feed.FeedReader(self.state, feed.Position(0), columns).schema

    def change_batches(
        self,
        since: "feed.Position | int | str",
        until: int | None = None,
        columns: Sequence[str] | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """:meth:`changes` as record batches, one generation at a time (read as consumed)."""
        start = feed.resolve_start(self.state, since)
        end = feed.end_at(self.state, until)
        for g in feed.FeedReader(self.state, start, columns).generations(end):
            yield from g.rows.to_batches()

    @memwal_errors()
    def count(self, where: str | None = None) -> int:
        """Number of live rows matching ``where``."""
        snap, tail = self._pruned_view(where)
        if tail is None and snap.num_live_sstables == 0:
            return snap.dataset.count_rows(filter=where)
        return sum(b.num_rows for b in self._splits(snap, tail, list(self.state.primary_key), where).scan())

    # -- vector search (memwal.readers.vector_search) --------------------------------------------

    @memwal_errors()
    def search(
        self,
        vector: Sequence[float] | np.ndarray,
        k: int = 10,
        *,
        column: str | None = None,
        where: str | None = None,
        nprobes: int | None = None,
        columns: Sequence[str] | None = None,
        metric: str | None = None,
        overfetch: float | None = None,
        refine_factor: int | None = None,
    ) -> pa.Table:
        """The ``k`` live rows nearest to ``vector``, with their ``_distance`` (nearest first).

        Only the newest version of a row can appear. The base table is searched by Lance
        through its vector index (``nprobes``, ``refine_factor``: ``ReadConfig``'s by default;
        exactly when it has none, and its unindexed fragments exactly either way), asking for
        ``overfetch`` candidates per result so that those an SSTable or the WAL tail supersedes
        can be dropped; the SSTables' newest live rows are scored exactly (large ones through
        their own index), and so is a strong reader's WAL tail. ``where`` filters every level
        before the nearest are chosen. docs/bench-log/reads.md has the measurements behind
        the defaults.
        """
        snap, tail = self._pruned_view(where)
        query = self._vectors.query(vector, k, column, metric, nprobes, refine_factor, overfetch)
        out = list(self._planner.output_schema(columns).names)  # the view's columns (see _lookup)
        return self._vectors.search(query, snap, tail, out, where)

    # -- full-text search (memwal.readers.text) --------------------------------------------------

    @memwal_errors()
    def text_search(
        self,
        query: str,
        k: int = 10,
        *,
        column: str | None = None,
        where: str | None = None,
        columns: Sequence[str] | None = None,
    ) -> pa.Table:
        """The ``k`` live rows best matching ``query`` by BM25, with their ``_score`` (best first).

        Scores use corpus statistics of the live rows across every LSM level (GlobalBM25),
        so rows from the base table, SSTables and the WAL tail are comparable.
        """
        col = column or self.state.metadata.indexes.fts_column
        if col is None:
            raise InvalidArgumentError("name the text column to search (or configure the table's fts_column)")
        # No shard pruning: BM25 statistics are those of the whole live table.
        snap, tail = self._view()
        out = list(columns) if columns else self.state.schema.names
        return text.search(self.state, self.sstables, self.text_stats, snap, tail, query, k, col, where, out)


class _Refresher:
    """Refreshes a reader's snapshot every ``interval`` seconds on a daemon thread.

    It holds the reader only weakly between refreshes, so a reader nobody uses any more is
    collected and its thread ends within one interval; :meth:`Reader.close` ends it, after the
    refresh in progress if any. A failed refresh is logged and retried at the next interval;
    meanwhile reads use the last snapshot, and once it is ``BACKGROUND_STALE_INTERVALS``
    intervals old (counted from when it was started) they refresh themselves.
    """

    def __init__(self, reader: Reader, interval: float) -> None:
        self._reader = weakref.ref(reader)
        self._interval = interval
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"memwal-refresh {reader.state.uri}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(self._interval):
            reader = self._reader()
            if reader is None:
                return
            try:
                reader._refresh_and_warm()
            except Exception as e:  # noqa: BLE001 - the thread must outlive a failed refresh
                log.warning("background refresh of %s failed (retried in %.1f s): %s: %s",
                            reader.state.uri, self._interval, type(e).__name__, str(e).splitlines()[0] if str(e) else "")
            del reader

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not threading.current_thread():
            self._thread.join()


def open(  # noqa: A001 - mirrors lance.dataset / builtin open naming users expect
    uri: str,
    *,
    consistency: Consistency = "eventual",
    refresh_interval_ms: int | None = 1000,
    version: int | None = None,
    refresh_in_background: bool = False,
    config: ReadConfig | None = None,
    as_of: timetravel.AsOf | None = None,
    storage_options: "Mapping[str, str] | StorageConfig | None" = None,
) -> Reader:
    """Open a reader on the memwal table at ``uri``.

    ``consistency="eventual"`` reads the base table and every uncompacted SSTable, with a
    snapshot refreshed every ``refresh_interval_ms`` (None: only on :meth:`Reader.refresh`).
    By default the read that finds the snapshot stale refreshes it and pays for it (opening
    the new base version, reading new SSTables' keys). ``refresh_in_background=True`` does
    that on a thread of the reader's own and swaps the snapshot in when it is ready, so
    lookups do not wait for a refresh (unless the thread falls five intervals behind): for a
    process that serves reads (close it with
    :meth:`Reader.close` or a ``with`` block). ``as_of`` reads the table as it was (time
    travel, base and SSTables): at a base version (an int: when it was committed) or a time
    (a ``datetime``, naive meaning UTC, or Unix seconds), while GC keeps that state
    (``GcConfig.time_travel_seconds``); :class:`~memwal.core.errors.StateNotRetainedError` names
    the oldest readable state otherwise. ``version`` is ``as_of``'s older name for a base version.
    ``storage_options``: as :meth:`memwal.Table.open` takes them (Lance's key names, over the
    ``AWS_*``/``GOOGLE_*``/``AZURE_*`` environment variables).
    """
    return Reader(TableState.load(uri, storage_options), consistency=consistency, refresh_interval_ms=refresh_interval_ms,
                  version=version, refresh_in_background=refresh_in_background, config=config, as_of=as_of)
