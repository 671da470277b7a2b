"""Upgrading a table made by the previous memwal version: a base without stable row ids.

Tables made before 2026-11-24 have a base dataset with Lance's stable row ids, which makes
point lookups and manifests grow with update history (docs/architecture.md). Lance cannot
drop the flag in place (an overwrite keeps it), and the table's URI is the base dataset's
root, which also holds ``_mem_wal/`` (shards, WALs, SSTables) and ``_memwal/`` (views,
holds, metrics). So the upgrade is an offline copy and swap, in steps a durable marker
(``_memwal/upgrade/<stamp>/upgrade.json``) records:

1. *quiesce*: refuse if a writer lease or a view's refresh lease is live; claim every shard
   (a higher epoch fences any idle writer) and flush it; compact until nothing is pending;
   catch the base indexes up.
2. *build* (phase ``building``): stream the base's current version into a new dataset
   without stable row ids at ``_memwal/upgrade/<stamp>/new``, with the table's config,
   its configured indexes and a MemWAL index whose compacted generations are the old
   index's (one empty ``merge_insert`` carrying every shard's marker) and whose index
   catch-up covers them; read back and checked (rows, compacted generations, catch-up).
3. *swap* (phases ``built`` -> ``swapping`` -> ``swapped``): move the old base's
   ``_versions``, ``data``, ``_indices``, ``_deletions``, ``_transactions`` to
   ``_memwal/upgrade/<stamp>/old/`` and the new dataset's into their place. ``_mem_wal/``
   and ``_memwal/`` stay.
4. *views*: every view is dropped and recreated from its recorded definition (a full
   refresh). All of them, not only those keyed on ``__source_row_id``: the new base's
   version numbers start again at 1, and a view refuses to refresh "back" to a version
   below the one it reflects. Recreated views are keyed on the primary key.
5. *purge* (:func:`purge_upgrades`, ``memwal upgrade --purge``): the moved-aside base is
   kept until an explicit purge older than a grace period, so an upgrade can be undone by
   hand (move ``old/*`` back) until then.

Invariants, and why they hold:

- Until the first move of step 3 the table is exactly as it was plus a stray directory: the
  build writes only under ``_memwal/upgrade/<stamp>/``. A rerun that finds a marker in
  ``building`` removes that directory and starts over; one in ``built`` goes on to the swap
  only if the base is still at the version the copy was made from (else it starts over).
- The swap is resumable from the file system alone: a name is moved aside only while
  ``old/<name>`` does not exist yet (so a name found at the root once ``old/<name>`` exists
  is the new one), and moved in only while ``new/<name>`` exists. Every move is a rename
  on one local file system, so each is atomic; a rerun finishes whichever half is left.
- The new base's MemWAL index carries the same compacted generation per shard as the old
  one, so a writer's WAL replay and a reader's "SSTables above the compacted generation"
  rule see the same data before and after; nothing is pending to compact (step 1), so no
  SSTable's rows are lost between the copy and the swap.
- View definitions are written into the marker before any view is dropped, so a crash
  between dropping and recreating a view is repaired by the rerun.

Local file systems only: on an object store the swap would be a copy then a delete per
object, with no atomic step; :func:`upgrade` refuses there.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from typing import Any, Mapping

import lance
import pyarrow as pa

from memwal.core import paths
from memwal.maintain.compactor import Compactor
from memwal.core.errors import ConcurrencyError, InvalidArgumentError, TableDamagedError
from memwal.core.failpoints import failpoint
from memwal.core.indexes import IndexMaintainer, base_indexes, covered_generation
from memwal.core.io import FileIO, file_io_for
from memwal.core.manifest import ManifestStore, MemWalIndex
from memwal.core.metadata import TableMetadata
from memwal.core.progress import ProgressCallback, notify
from memwal.core.sharding import lance_init_kwargs
from memwal.core.state import TableState, resolve_storage, table_exists
from memwal.core.storage import StorageConfig
from memwal.views import ROW_ID, View, ViewBusyError, ViewDefinition, list_views, view_uri
from memwal.views.layout import LEASE_DIR
from memwal.views.lease import Lease
from memwal.write.pool import ShardWriterPool

log = logging.getLogger(__name__)

#: Where upgrades keep their marker, the new base while it is built and the old base after.
UPGRADE_DIR = "_memwal/upgrade"
MARKER = "upgrade.json"
#: The base dataset's own directories: what the swap moves (``_mem_wal``, ``_memwal`` stay).
BASE_DIRS = ("_versions", "data", "_indices", "_deletions", "_transactions")
#: How long a moved-aside base is kept before ``--purge`` removes it (default).
PURGE_GRACE_SECONDS = 7 * 24 * 3600.0

PHASES = ("building", "built", "swapping", "swapped", "done")


class UpgradeBlockedError(ConcurrencyError):
    """Something is live on the table (a writer, a view refresh): stop it, then upgrade."""


@dataclass(frozen=True)
class UpgradePlan:
    """What :func:`upgrade` would do to one table, decided from what is on disk; changes nothing."""

    uri: str
    #: True: nothing to do (no stable row ids, no view on ``__source_row_id``, nothing unfinished).
    current: bool
    stable_row_ids: bool
    base_version: int | None
    base_rows: int | None
    shards: tuple[str, ...]
    views: tuple[str, ...]
    #: Views keyed on the stable row id (fed by Lance's ``delta()``).
    row_id_views: tuple[str, ...]
    #: An interrupted upgrade this run would resume: its stamp and phase.
    resume_stamp: str | None = None
    resume_phase: str | None = None

    def steps(self) -> list[str]:
        """What would happen, in order, one line each."""
        if self.current:
            return ["nothing: the base has no stable row ids and no view is keyed on the row id"]
        out = []
        if self.resume_stamp is not None:
            out.append(f"resume the upgrade {self.resume_stamp} interrupted in phase {self.resume_phase}")
            if self.resume_phase in ("swapping", "swapped"):
                out.append("finish the swap, then recreate every view from its recorded definition")
                return out
        out += [
            f"refuse if a writer or view refresh is live; claim and flush {len(self.shards)} shard(s); compact until "
            "nothing is pending; catch the base indexes up",
            f"copy base version {self.base_version} ({self.base_rows} rows) into a new dataset without stable row ids "
            f"under {UPGRADE_DIR}/<time>/new, with the configured indexes and the same compacted generations",
            f"move the old base's {', '.join(BASE_DIRS)} to {UPGRADE_DIR}/<time>/old and the new one's into place",
            f"drop and recreate {len(self.views)} view(s) ({len(self.row_id_views)} keyed on the row id)",
            f"keep the old base until `memwal upgrade --purge` after {PURGE_GRACE_SECONDS / 86400:.0f} days",
        ]
        return out

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "steps": self.steps()})


@dataclass(frozen=True)
class UpgradeReport:
    """What one :func:`upgrade` did."""

    uri: str
    #: "noop", "dry-run", "upgraded", or "purged".
    outcome: str
    plan: UpgradePlan | None = None
    stamp: str | None = None
    #: Where the old base now is (until purged).
    moved_aside: str | None = None
    base_version_before: int | None = None
    base_version_after: int | None = None
    rows: int | None = None
    views_recreated: tuple[str, ...] = ()
    purged: tuple[str, ...] = ()
    seconds: float = 0.0

    def to_json(self) -> str:
        d = asdict(self)
        d["plan"] = json.loads(self.plan.to_json()) if self.plan is not None else None
        return json.dumps(d)


# -- the marker --------------------------------------------------------------------------------


def _upgrade_root(uri: str) -> str:
    return paths.join(uri, UPGRADE_DIR)


def _stamp_dir(uri: str, stamp: str) -> str:
    return paths.join(_upgrade_root(uri), stamp)


def _read_marker(io: FileIO, uri: str, stamp: str) -> dict[str, Any] | None:
    try:
        return json.loads(io.read(paths.join(_stamp_dir(uri, stamp), MARKER)))
    except FileNotFoundError:
        return None


def _write_marker(io: FileIO, uri: str, stamp: str, marker: dict[str, Any], phase: str) -> dict[str, Any]:
    """Record ``phase`` durably (write to a temporary name, fsync, rename: never half a marker)."""
    marker = {**marker, "phase": phase, "at": time.time()}
    target = paths.join(_stamp_dir(uri, stamp), MARKER)
    tmp = target + ".tmp"
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(tmp, "w") as f:
        f.write(json.dumps(marker))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, target)
    _fsync_dir(os.path.dirname(target))
    return marker


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unfinished(io: FileIO, uri: str) -> tuple[str, dict[str, Any]] | None:
    """The newest upgrade whose marker is not ``done``, if any."""
    for stamp in sorted(io.list_dir(_upgrade_root(uri)), reverse=True):
        marker = _read_marker(io, uri, stamp)
        if marker is not None and marker.get("phase") != "done":
            return stamp, marker
    return None


# -- planning ----------------------------------------------------------------------------------


def _check_local(uri: str) -> None:
    if "://" in uri:
        raise InvalidArgumentError(
            f"upgrade works on local tables only ({uri} is on an object store, where the swap has no atomic "
            "step); copy the table to a local disk, upgrade it and copy it back"
        )


def plan_upgrade(uri: str, storage_options: "Mapping[str, str] | StorageConfig | None" = None) -> UpgradePlan:
    """What :func:`upgrade` would do to the table at ``uri``; reads only."""
    uri = paths.normalize_uri(uri)
    io = file_io_for(uri, resolve_storage(storage_options))
    pending = _unfinished(io, uri)
    if pending is not None and pending[1]["phase"] in ("swapping", "swapped"):
        # Mid-swap the base may not open; the marker says everything needed.
        m = pending[1]
        return UpgradePlan(uri, False, True, m.get("base_version"), m.get("rows"), (), tuple(m["views"]), (),
                           pending[0], m["phase"])
    state = TableState.load(uri, storage_options)
    ds = state.dataset()
    views = tuple(list_views(state))
    row_id_views = tuple(v for v in views if ROW_ID in View.open(state, v).dataset().schema.names)
    stable = bool(ds.has_stable_row_ids)
    return UpgradePlan(
        uri=uri,
        current=not stable and not row_id_views and pending is None,
        stable_row_ids=stable,
        base_version=ds.version,
        base_rows=ds.count_rows(),
        shards=tuple(state.manifests.list_shards()),
        views=views,
        row_id_views=row_id_views,
        resume_stamp=pending[0] if pending else None,
        resume_phase=pending[1]["phase"] if pending else None,
    )


# -- step 1: quiesce ---------------------------------------------------------------------------


def _quiesce(state: TableState, views: tuple[str, ...]) -> None:
    """Fence and flush every shard, compact everything, catch the indexes up; refuse
    (:class:`UpgradeBlockedError`) if a writer or a view refresh is live."""
    pool = ShardWriterPool(state)
    now = time.time()
    shards = state.manifests.list_shards()
    for sid in shards:
        held = pool.lease(sid)
        if held is not None and held.owner != pool.owner and held.live(now):
            raise UpgradeBlockedError(
                f"shard {sid} has a live writer ({held.owner}); stop the table's writers and maintenance, then upgrade"
            )
    for name in views:
        try:
            with Lease(state.io, paths.join(View.open(state, name).uri, LEASE_DIR), 60.0, f"view {name}"):
                pass
        except ViewBusyError as e:
            raise UpgradeBlockedError(f"view {name} is being refreshed; stop maintenance, then upgrade") from e
    for sid in shards:
        pool.claim_and_flush(sid)  # a higher epoch: any idle writer elsewhere is fenced
    compactor = Compactor(state)
    while compactor.run_once():
        pass
    for sid in shards:
        _, todo = compactor.pending(sid)
        if todo:
            raise TableDamagedError(
                f"shard {sid}: SSTable generation {todo[0].generation} cannot be compacted (a gap); "
                "run `memwal check` and `memwal repair` first"
            )
    IndexMaintainer(state).catch_up()


# -- step 2: build -----------------------------------------------------------------------------


def _build(state: TableState, new_uri: str, old: lance.LanceDataset, old_index: MemWalIndex | None,
           progress: ProgressCallback | None = None, rows: int | None = None) -> lance.LanceDataset:
    """The old base's version ``old`` as a new dataset without stable row ids, with the same
    config, the configured indexes and a MemWAL index with the same compacted generations."""
    opts = state.storage_options

    def counted() -> Any:
        copied = 0
        for batch in old.scanner(batch_size=8192).to_batches():
            copied += batch.num_rows
            notify(progress, "copying the base", copied, rows)
            yield batch

    lance.write_dataset(
        pa.RecordBatchReader.from_batches(old.schema, counted()), new_uri, schema=old.schema, storage_options=opts,
        data_storage_version=old.data_storage_version,
    )
    ds = lance.dataset(new_uri, storage_options=opts)
    ds.update_config(dict(old.config()))
    ds = lance.dataset(new_uri, storage_options=opts)
    meta = TableMetadata.from_config(ds.config())
    assert meta is not None  # copied from a memwal table just above
    new_state = TableState.from_dataset(new_uri, ds, meta, state.io, state.storage)
    IndexMaintainer(new_state).ensure_indexes()  # before the MemWAL starts, as Table.create does
    ds = lance.dataset(new_uri, storage_options=opts)
    ds.initialize_mem_wal(**lance_init_kwargs(state.spec), **meta.writer.lance_kwargs())
    marks = [lance.mem_wal.CompactedSsTable(sid, gen) for sid, gen in sorted((old_index.compacted if old_index else {}).items()) if gen > 0]
    if marks:
        # An empty upsert: a commit whose only effect is the markers.
        ds = lance.dataset(new_uri, storage_options=opts)
        ds.merge_insert(list(state.primary_key)).when_matched_update_all().when_not_matched_insert_all() \
            .mark_sstables_as_compacted(marks).execute(old.schema.empty_table())
        failpoint("upgrade.mid_build")
        # Every fragment is indexed already; this commit records the index catch-up.
        lance.dataset(new_uri, storage_options=opts).optimize.optimize_indices()
    return lance.dataset(new_uri, storage_options=opts)


def _verify(new: lance.LanceDataset, old: lance.LanceDataset, old_index: MemWalIndex | None, io: FileIO, new_uri: str) -> None:
    """Read the new base back: no stable row ids, the same rows count, the same compacted
    generations, every index caught up to them. Raises TableDamagedError otherwise."""
    index = ManifestStore(new_uri, io).mem_wal_index(new.version)
    want = {s: g for s, g in (old_index.compacted if old_index else {}).items() if g > 0}
    problems = []
    if new.has_stable_row_ids:
        problems.append("it has stable row ids")
    if new.count_rows() != old.count_rows():
        problems.append(f"{new.count_rows()} rows, not {old.count_rows()}")
    if index is None:
        problems.append("no MemWAL index")
    else:
        got = {s: g for s, g in index.compacted.items() if g > 0}
        if got != want:
            problems.append(f"compacted generations {got}, not {want}")
        for name in base_indexes(new):
            behind = [s for s, g in want.items() if covered_generation(new, index, name, s) < g]
            if behind:
                problems.append(f"index {name} not caught up for shard(s) {behind}")
    if problems:
        raise TableDamagedError(f"the upgraded base at {new_uri} is wrong: {'; '.join(problems)}; the table is unchanged")


# -- step 3: swap ------------------------------------------------------------------------------


def _swap(uri: str, stamp: str) -> None:
    """Move the old base's directories aside and the new one's in; resumable (module docstring)."""
    root = _stamp_dir(uri, stamp)
    old_dir, new_dir = paths.join(root, "old"), paths.join(root, "new")
    os.makedirs(old_dir, exist_ok=True)
    for name in BASE_DIRS:
        here, aside = paths.join(uri, name), paths.join(old_dir, name)
        if os.path.exists(here) and not os.path.exists(aside):
            os.rename(here, aside)
            failpoint("upgrade.mid_swap")
    _fsync_dir(uri)
    _fsync_dir(old_dir)
    for name in BASE_DIRS:
        src = paths.join(new_dir, name)
        if os.path.exists(src):
            os.rename(src, paths.join(uri, name))
    _fsync_dir(uri)


# -- step 4: views -----------------------------------------------------------------------------


def _recreate_views(state: TableState, definitions: Mapping[str, str]) -> tuple[str, ...]:
    """Drop (if present) and recreate each view from its recorded definition, in full."""
    done = []
    for name, text in sorted(definitions.items()):
        d = ViewDefinition.from_json(text)
        state.io.remove_tree(view_uri(state.uri, name))  # what View.drop does; absent after a crash is fine
        failpoint("upgrade.view_dropped")
        View.create(state, name, select=d.select, where=d.where, group_by=d.group_by, udfs=d.udfs, shuffle_seed=d.shuffle_seed)
        done.append(name)
    return tuple(done)


# -- the whole upgrade -------------------------------------------------------------------------


def upgrade(
    uri: str, *, dry_run: bool = False, storage_options: "Mapping[str, str] | StorageConfig | None" = None,
    progress: ProgressCallback | None = None,
) -> UpgradeReport:
    """Move the table at ``uri`` to the current layout (see the module docstring); resume an
    interrupted upgrade; a no-op on a current table. Stop writers and maintenance first.
    ``progress`` hears of the rows copied."""
    t0 = time.perf_counter()
    uri = paths.normalize_uri(uri)
    _check_local(uri)
    storage = resolve_storage(storage_options)
    plan = plan_upgrade(uri, storage)
    if plan.current:
        return UpgradeReport(uri, "noop", plan, seconds=time.perf_counter() - t0)
    if dry_run:
        return UpgradeReport(uri, "dry-run", plan, seconds=time.perf_counter() - t0)
    io = file_io_for(uri, storage)
    pending = _unfinished(io, uri)
    if pending is not None:
        stamp, marker = pending
        if marker["phase"] == "built" and table_exists(uri, io):
            ds = TableState.load(uri, storage).dataset()
            if ds.version != marker["base_version"]:
                log.info("the base moved on since upgrade %s copied it; starting over", stamp)
                marker = None
        elif marker["phase"] == "building":
            marker = None
        if marker is None:
            io.remove_tree(_stamp_dir(uri, stamp))
            return upgrade(uri, storage_options=storage, progress=progress)
    else:
        state = TableState.load(uri, storage)
        views = tuple(list_views(state))
        _quiesce(state, views)
        old = state.dataset()
        old_index = state.manifests.mem_wal_index(old.version)
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"-{os.getpid()}"
        marker = _write_marker(io, uri, stamp, {
            "base_version": old.version,
            "rows": old.count_rows(),
            "views": {v: View.open(state, v).definition.to_json() for v in views},
        }, "building")
        new_uri = paths.join(_stamp_dir(uri, stamp), "new")
        new = _build(state, new_uri, old, old_index, progress, marker["rows"])
        _verify(new, old, old_index, io, new_uri)
        marker = _write_marker(io, uri, stamp, marker, "built")
    failpoint("upgrade.before_swap")
    if marker["phase"] == "built":
        now_version = TableState.load(uri, storage).dataset().version
        if now_version != marker["base_version"]:
            # Something committed to the old base after the copy (maintenance was not stopped):
            # swapping would lose that commit. The table is unchanged; a rerun starts over.
            raise UpgradeBlockedError(
                f"the base moved from v{marker['base_version']} to v{now_version} while it was copied; stop "
                "maintenance and writers, then rerun `memwal upgrade`"
            )
    if marker["phase"] in ("built", "swapping"):
        marker = _write_marker(io, uri, stamp, marker, "swapping")
        _swap(uri, stamp)
        marker = _write_marker(io, uri, stamp, marker, "swapped")
    failpoint("upgrade.before_views")
    state = TableState.load(uri, storage)
    recreated = _recreate_views(state, marker["views"])
    marker = _write_marker(io, uri, stamp, marker, "done")
    after = state.dataset()
    log.info("upgraded %s: base v%d -> v%d without stable row ids; old base kept in %s",
             uri, marker["base_version"], after.version, paths.join(_stamp_dir(uri, stamp), "old"))
    return UpgradeReport(
        uri, "upgraded", plan, stamp=stamp, moved_aside=paths.join(_stamp_dir(uri, stamp), "old"),
        base_version_before=marker["base_version"], base_version_after=after.version, rows=after.count_rows(),
        views_recreated=recreated, seconds=time.perf_counter() - t0,
    )


def purge_upgrades(
    uri: str, *, grace_seconds: float = PURGE_GRACE_SECONDS, dry_run: bool = False,
    storage_options: "Mapping[str, str] | StorageConfig | None" = None,
) -> UpgradeReport:
    """Remove the moved-aside bases of upgrades finished more than ``grace_seconds`` ago
    (an unfinished upgrade is never touched: its rerun needs it)."""
    t0 = time.perf_counter()
    uri = paths.normalize_uri(uri)
    io = file_io_for(uri, resolve_storage(storage_options))
    now = time.time()
    purged = []
    for stamp in sorted(io.list_dir(_upgrade_root(uri))):
        marker = _read_marker(io, uri, stamp)
        if marker is None or marker.get("phase") != "done" or now - marker["at"] < grace_seconds:
            continue
        if not dry_run:
            io.remove_tree(_stamp_dir(uri, stamp))
        purged.append(stamp)
    return UpgradeReport(uri, "dry-run" if dry_run else "purged", purged=tuple(purged), seconds=time.perf_counter() - t0)
