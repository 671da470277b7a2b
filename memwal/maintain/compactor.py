"""The compactor (the seed spec's *merger*): folds SSTables into the base table.

Per shard, SSTables whose generation is above the shard's compacted generation are
compacted in ascending generation order, starting right after the compacted generation:

* a generation whose keys end in tombstones is compacted on its own, in two passes: a
  **delete pass** for its tombstoned keys, then an **upsert pass** for its live rows that
  carries ``mark_sstables_as_compacted`` (when it has no live rows, the delete pass
  carries the marker). Only the final data-changing pass carries it: a marker on an
  earlier pass would claim rows were copied in that never were;
* consecutive generations are compacted together, newest row per key across them, for as
  long as every key's newest row stays live: such a run is one upsert with the marker,
  one atomic commit instead of one per generation.

Why this is safe (every claim below is exercised by tests/test_compactor.py):

* **Crash between passes**: the delete pass committed without a marker, so the rerun
  starts from the same compacted generation and repeats it (deleting an absent key is a
  no-op), then commits the upsert with the marker. Readers in between read the same
  SSTables on top of the base, so they see no difference.
* **Crash after the commit**: the marker is in the same commit as the data; the rerun
  starts after it.
* **Two compactors on one shard**: a marker commit at or below the recorded generation
  fails (Lance's stale-compaction error), and Lance re-runs an upsert that conflicts with
  a concurrent one, so atomic single-pass commits settle on the newest data whatever the
  order. The non-final delete pass is where a race could hurt: re-executed by key against
  a newer base, it could delete a row that another compactor re-inserted from a later
  generation; and a concurrent, *shorter* run committed between a compactor's two passes
  could re-insert a key the first pass had deleted. Hence (1) the delete pass runs with
  Lance retries off, after checking that the shard's compacted generation has not moved,
  so a rebased delete only removes the exact rows it read, never newer ones; and (2) only
  single-generation runs have two passes: every compactor starting from the same compacted
  generation plans that same single generation, so the slower one's marker is stale, and
  a multi-generation run that overlaps it contains every tombstoned key's later live row.

Several shards' single-pass runs are committed together, as one upsert carrying every
shard's marker (:meth:`Compactor.compact_shards`). The base commit has a fixed cost that
grows with the table (on an 18.9M-row base, 0.27 s for 20k rows against 0.48 s for 100k),
and a steady stream makes about one run per shard per cycle: one commit per cycle instead
of one per shard keeps that cost from multiplying. It is the same as committing the runs
one after the other, because shards own disjoint keys (rows are routed by key; a joint
plan whose keys repeat is committed shard by shard instead) and Lance refuses the whole
commit when any one marker is stale, so every run lands or none does.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Sequence

import lance
import lance.mem_wal
import pyarrow as pa
import pyarrow.compute as pc

from memwal.core import paths
from memwal.core.errors import ConcurrencyError, StaleCompactionError, TableDamagedError
from memwal.core.failpoints import failpoint
from memwal.core.lance_errors import classify, is_commit_conflict, is_stale_compaction, is_store_unavailable, repeat_unavailable
from memwal.core.lsm import newest_across
from memwal.core.manifest import SsTable
from memwal.core.schema import TOMBSTONE, as_evolved, stored_schema
from memwal.core.state import TableState

log = logging.getLogger(__name__)

#: What a shard whose files are damaged raises while it is read or compacted (ArrowInvalid is
#: a ValueError; Lance's IO errors are OSError or RuntimeError). Races are ConcurrencyErrors.
DAMAGE_ERRORS = (TableDamagedError, OSError, ValueError, RuntimeError)


@dataclass(frozen=True)
class CompactionPlan:
    """A run of consecutive generations of one shard, read and reduced, ready to commit."""

    shard_id: str
    #: the shard's compacted generation when the plan was made; the run starts right after it
    compacted: int
    generations: tuple[int, ...]
    #: primary keys whose newest row in the run is a tombstone
    dead: pa.Table
    #: newest live row of every other key in the run
    live: pa.Table

    @property
    def last_generation(self) -> int:
        return self.generations[-1]


@dataclass(frozen=True)
class CompactionResult:
    """One committed compaction of a run of generations of one shard."""

    shard_id: str
    generations: tuple[int, ...]
    rows_upserted: int
    keys_deleted: int
    base_version: int
    seconds: float


@dataclass
class CompactionStats:
    """What a compactor did so far (for logs, metrics and ``memwal status``)."""

    commits: int = 0
    generations: int = 0
    rows_upserted: int = 0
    keys_deleted: int = 0
    lost_races: int = 0
    seconds: float = 0.0
    results: list[CompactionResult] = field(default_factory=list)

    def add(self, r: CompactionResult) -> None:
        # The runs of one joint commit share its base version and count once.
        if not self.results or self.results[-1].base_version != r.base_version:
            self.commits += 1
        self.generations += len(r.generations)
        self.rows_upserted += r.rows_upserted
        self.keys_deleted += r.keys_deleted
        self.seconds += r.seconds
        self.results.append(r)

    @property
    def rows_per_second(self) -> float:
        return (self.rows_upserted + self.keys_deleted) / self.seconds if self.seconds else 0.0


class Compactor:
    """Compacts a table's shards. Several compactors may run at once, in any processes."""

    def __init__(
        self,
        state: TableState,
        *,
        max_generations_per_commit: int = 8,
        max_rows_per_commit: int = 2_000_000,
        max_attempts: int = 20,
    ) -> None:
        self.state = state
        self.max_generations_per_commit = max(1, max_generations_per_commit)
        self.max_rows_per_commit = max_rows_per_commit
        self.max_attempts = max_attempts
        self.stats = CompactionStats()

    # -- planning --------------------------------------------------------------------------------

    def pending(self, shard_id: str, dataset: lance.LanceDataset | None = None) -> tuple[int, list[SsTable]]:
        """(compacted generation, uncompacted SSTables in generation order) of a shard."""
        ds = dataset or self.state.dataset()
        index = self.state.manifests.mem_wal_index(ds.version)
        compacted = index.compacted_generation(shard_id) if index else 0
        m = self.state.manifests.read_shard(shard_id)
        todo = sorted((s for s in (m.sstables if m else ()) if s.generation > compacted), key=lambda s: s.generation)
        return compacted, todo

    def _run(self, compacted: int, todo: list[SsTable]) -> list[SsTable]:
        """The longest prefix of ``todo`` that continues at ``compacted + 1`` without gaps and fits the limits."""
        run: list[SsTable] = []
        rows = 0
        expected = compacted + 1
        for s in todo:
            if s.generation != expected or len(run) >= self.max_generations_per_commit:
                break
            if run and rows + s.physical_rows > self.max_rows_per_commit:
                break
            run.append(s)
            rows += s.physical_rows
            expected += 1
        return run

    # -- compaction ------------------------------------------------------------------------------

    def _read(self, shard_id: str, s: SsTable, schema: pa.Schema) -> pa.Table:
        """The SSTable's rows as ``schema`` (the base's columns now, ``_tombstone`` included): one
        written before a column was added has it null, and one dropped since is left out, so the
        upsert replaces a key's whole row as the write did."""
        # opened through the handle's cache: views refreshed next in the same process read these SSTables again
        return as_evolved(self.state.sstable_dataset(paths.sstable_path(self.state.uri, shard_id, s.path)).to_table(), schema)

    def _marker(self, shard_id: str, generation: int) -> list[lance.mem_wal.CompactedSsTable]:
        return [lance.mem_wal.CompactedSsTable(shard_id, generation)]

    def plan(
        self,
        shard_id: str,
        upto: int | None = None,
        pending: tuple[int, list[SsTable]] | None = None,
        dataset: lance.LanceDataset | None = None,
    ) -> "CompactionPlan | None":
        """Read the next run of generations of ``shard_id`` (none above ``upto``, if given) and
        what it changes; None if none.

        ``pending``: the shard's (compacted generation, uncompacted SSTables) if the caller
        has them (:meth:`pending`); else they are read, from ``dataset`` if given.

        The run grows past its first generation only while the newest row of every key in
        it stays live: such a run commits in one atomic pass. A generation whose keys end
        in tombstones is compacted on its own, in two passes.
        """
        base = dataset if dataset is not None else self.state.dataset()
        compacted, todo = pending if pending is not None else self.pending(shard_id, base)
        if upto is not None:
            todo = [s for s in todo if s.generation <= upto]
        candidates = self._run(compacted, todo)
        if not candidates:
            if todo:
                log.warning(
                    "shard %s: next SSTable is generation %d but %d is compacted; waiting for the gap",
                    shard_id, todo[0].generation, compacted,
                )
            return None
        # The base's columns now, not this handle's: a maintenance process outlives schema changes.
        schema = stored_schema(base.schema)
        data = self._read(shard_id, candidates[0], schema)
        used = 1
        if not pc.any(data.column(TOMBSTONE)).as_py():
            for s in candidates[1:]:
                merged = newest_across([data, self._read(shard_id, s, schema)], self.state.primary_key)
                if pc.any(merged.column(TOMBSTONE)).as_py():
                    break
                data, used = merged, used + 1
        dead_mask = data.column(TOMBSTONE)
        return CompactionPlan(
            shard_id=shard_id,
            compacted=compacted,
            generations=tuple(s.generation for s in candidates[:used]),
            dead=data.filter(dead_mask).select(list(self.state.primary_key)),
            live=data.filter(pc.invert(dead_mask)).drop_columns([TOMBSTONE]),
        )

    def delete_pass(self, plan: "CompactionPlan") -> None:
        """Delete the run's tombstoned keys from the base (carrying the marker if nothing follows)."""
        if plan.dead.num_rows:
            self._delete_pass(plan, marker=None if plan.live.num_rows else plan.last_generation)

    def upsert_pass(self, plan: "CompactionPlan") -> None:
        """Upsert the run's live rows with the compaction marker (unless the delete pass carried it)."""
        if plan.dead.num_rows and not plan.live.num_rows:
            return
        self._upsert(plan.live, [plan])

    def _upsert(self, rows: pa.Table, plans: Sequence["CompactionPlan"]) -> None:
        """One upsert of ``rows`` carrying the marker of every plan's last generation."""
        markers = [m for p in plans for m in self._marker(p.shard_id, p.last_generation)]
        try:
            # Repeated when the store failed the commit: if it landed after all, the repeat's
            # marker is stale (a lost race, handled by the caller), else it commits now.
            repeat_unavailable(
                lambda: self.state.dataset().merge_insert(list(self.state.primary_key)).when_matched_update_all()
                .when_not_matched_insert_all().mark_sstables_as_compacted(markers).execute(rows),
                self.state.storage.retry, "a compaction commit",
            )
        except (OSError, ValueError) as e:
            runs = ", ".join(f"shard {p.shard_id} up to generation {p.last_generation}" for p in plans)
            if is_stale_compaction(e):
                raise StaleCompactionError(f"{runs}: compacted by another compactor") from e
            if self._widened_since(rows):
                # A widening began and ended between this round's plan (rows cast to the base's
                # columns then) and its commit, and Lance refuses the narrow rows. A lost race:
                # the next round plans against the wide columns. Not damage.
                raise StaleCompactionError(f"{runs}: the base's columns were widened meanwhile") from e
            known = classify(e)
            if known is None:
                raise
            raise known from e

    def _widened_since(self, rows: pa.Table) -> bool:
        """Whether a column of ``rows`` has another type in the base now."""
        now = self.state.dataset().schema
        return any(f.name in now.names and not now.field(f.name).type.equals(f.type) for f in rows.schema)

    def commit_joint(self, plans: Sequence["CompactionPlan"]) -> list[CompactionResult]:
        """Single-pass plans of different shards as one commit (see the module docstring).

        Raises :class:`StaleCompactionError` if another compactor committed any of the runs
        first; then none of them is committed.
        """
        assert all(not p.dead.num_rows for p in plans) and len({p.shard_id for p in plans}) == len(plans)
        t0 = time.perf_counter()
        self._upsert(pa.concat_tables([p.live for p in plans]), plans)
        failpoint("compactor.after_commit")
        version = self.state.dataset().version
        seconds = time.perf_counter() - t0
        log.info(
            "compacted %d shards in one commit: %s, %d rows upserted in %.2fs (base v%d)",
            len(plans), ", ".join(f"{p.shard_id} {p.generations[0]}-{p.last_generation}" for p in plans),
            sum(p.live.num_rows for p in plans), seconds, version,
        )
        return [
            CompactionResult(
                shard_id=p.shard_id, generations=p.generations, rows_upserted=p.live.num_rows,
                keys_deleted=0, base_version=version, seconds=seconds / len(plans),
            )
            for p in plans
        ]

    def commit(self, plan: "CompactionPlan") -> CompactionResult:
        """Both passes of a plan. Raises :class:`StaleCompactionError` if another compactor won."""
        t0 = time.perf_counter()
        self.delete_pass(plan)
        if plan.dead.num_rows and plan.live.num_rows:
            failpoint("compactor.between_passes")  # the delete pass committed, the marker did not
        self.upsert_pass(plan)
        failpoint("compactor.after_commit")
        version = self.state.dataset().version
        result = CompactionResult(
            shard_id=plan.shard_id,
            generations=plan.generations,
            rows_upserted=plan.live.num_rows,
            keys_deleted=plan.dead.num_rows,
            base_version=version,
            seconds=time.perf_counter() - t0,
        )
        log.info(
            "compacted shard %s generations %d-%d: %d rows upserted, %d keys deleted in %.2fs (base v%d)",
            plan.shard_id, plan.generations[0], plan.last_generation, plan.live.num_rows, plan.dead.num_rows,
            result.seconds, version,
        )
        return result

    def compact_run(self, shard_id: str) -> CompactionResult | None:
        """Compact the next run of generations of ``shard_id``; None if nothing is pending (or
        the base is paused: :meth:`TableState.base_paused`).

        Raises :class:`StaleCompactionError` if another compactor committed the run first.
        """
        t0 = time.perf_counter()
        plan = self.plan(shard_id)
        if plan is None or self.state.base_paused():
            return None
        result = self.commit(plan)
        return replace(result, seconds=time.perf_counter() - t0)

    def _delete_pass(self, plan: "CompactionPlan", marker: int | None) -> None:
        """Delete the plan's keys, only while the shard's compacted generation is where the plan started."""
        for attempt in range(self.max_attempts):
            ds = self.state.dataset()
            index = self.state.manifests.mem_wal_index(ds.version)
            now = index.compacted_generation(plan.shard_id) if index else 0
            if now != plan.compacted:
                raise StaleCompactionError(
                    f"shard {plan.shard_id}: compacted generation moved from {plan.compacted} to {now}"
                )
            builder = ds.merge_insert(list(self.state.primary_key)).when_matched_delete().conflict_retries(0)
            if marker is not None:
                builder = builder.mark_sstables_as_compacted(self._marker(plan.shard_id, marker))
            try:
                builder.execute(plan.dead)
                return
            except (OSError, ValueError) as e:
                if is_stale_compaction(e):
                    raise StaleCompactionError(
                        f"shard {plan.shard_id}: generation {marker} was compacted by another compactor"
                    ) from e
                if is_store_unavailable(e):
                    # Landed or not, the next attempt reads afresh: a marker that landed is seen
                    # there (a stale plan), a delete that landed is deleted again (idempotent).
                    if attempt == self.max_attempts - 1:
                        known = classify(e)
                        raise (known or e) from e
                elif not is_commit_conflict(e):
                    raise
                time.sleep(min(0.05 * 2**attempt, 1.0))
        raise StaleCompactionError(
            f"shard {plan.shard_id}: delete pass kept conflicting after {self.max_attempts} attempts"
        )

    def compact_shard(self, shard_id: str, max_commits: int | None = None) -> list[CompactionResult]:
        """Compact every pending generation of a shard (losing races gracefully)."""
        results = []
        lost_in_a_row = 0
        while max_commits is None or len(results) < max_commits:
            try:
                r = self.compact_run(shard_id)
            except StaleCompactionError as e:
                # Another compactor got there first: reload and continue after its commit.
                self.stats.lost_races += 1
                lost_in_a_row += 1
                if lost_in_a_row >= self.max_attempts:
                    raise
                log.info("%s; reloading", e)
                self.state.manifests.clear_cache()
                continue
            lost_in_a_row = 0
            if r is None:
                break
            self.stats.add(r)
            results.append(r)
        return results

    def compact_shards(
        self,
        shard_ids: Sequence[str],
        on_damage: Callable[[str, Exception], None] | None = None,
        upto: Mapping[str, int] | None = None,
        pending: Mapping[str, tuple[int, list[SsTable]]] | None = None,
    ) -> list[CompactionResult]:
        """Compact every pending generation of these shards, in rounds: each round plans the
        next run of each shard (until the runs hold ``max_rows_per_commit`` rows, so memory
        does not grow with the shard count), commits the single-pass runs together and the
        others one by one. A shard whose files cannot be
        read goes to ``on_damage`` (if given; else the error is raised) and the others go on.
        While the base is paused (:meth:`TableState.base_paused`: a column is being widened)
        no round commits: what is left is compacted by a later call.

        With ``upto`` (shard id -> generation) no generation above a shard's bound is
        compacted: a fold takes what was pending when it was decided, not what writers flush
        while it commits (one more commit, which costs what the base's span costs).

        ``pending`` (shard id -> :meth:`pending`): what the caller found pending, used for
        each shard's first plan instead of reading it again; later rounds read it, once per
        round for all shards (a round commits nothing until every shard is planned)."""
        results: list[CompactionResult] = []
        first = dict(pending or {})
        pending = list(shard_ids)
        lost_in_a_row = 0
        while pending:
            plans: list[CompactionPlan] = []
            rows = 0
            later: list[str] = []  # past this round's row budget: planned next round, first
            ds = self.state.dataset()  # once a round: every plan reads its columns, most its pending runs
            for i, shard_id in enumerate(pending):
                if rows >= self.max_rows_per_commit:
                    later = pending[i:]
                    break
                try:
                    known = first.pop(shard_id, None)
                    plan = self.plan(shard_id, upto.get(shard_id) if upto is not None else None, known, ds)
                except ConcurrencyError:
                    raise
                except DAMAGE_ERRORS as e:
                    if on_damage is None:
                        raise
                    on_damage(shard_id, e)
                    continue
                if plan is not None:
                    plans.append(plan)
                    rows += plan.live.num_rows + plan.dead.num_rows
            if not plans:
                break
            paused = self.state.base_paused()  # once a round, right before it commits
            if paused:  # a widening's cast and swap must see no other commit (memwal.maintain.evolve)
                log.info("compaction of %s waits: %s", self.state.uri, paused)
                break
            done, lost, damaged = self._commit_round(plans, on_damage)
            results += done
            for r in done:
                self.stats.add(r)
            lost_in_a_row = 0 if done else lost_in_a_row + bool(lost)
            if lost:
                self.stats.lost_races += lost
                self.state.manifests.clear_cache()
                if lost_in_a_row >= self.max_attempts:
                    raise StaleCompactionError(f"lost {lost_in_a_row} compaction rounds in a row to other compactors")
            # A shard found damaged was reported; it leaves the rounds.
            pending = later + [p.shard_id for p in plans if p.shard_id not in damaged]
        return results

    def _joinable(self, plans: list["CompactionPlan"]) -> list["CompactionPlan"]:
        """The single-pass plans to commit together: in order, up to the row limit, keys distinct."""
        joint: list[CompactionPlan] = []
        rows = 0
        for p in plans:
            if p.dead.num_rows or (joint and rows + p.live.num_rows > self.max_rows_per_commit):
                continue
            joint.append(p)
            rows += p.live.num_rows
        if len(joint) < 2:
            return []
        keys = pa.concat_tables([p.live.select(list(self.state.primary_key)) for p in joint])
        if keys.group_by(list(self.state.primary_key)).aggregate([]).num_rows != keys.num_rows:
            log.warning("shards %s share keys; compacting them one by one", ", ".join(p.shard_id for p in joint))
            return []
        return joint

    def _commit_round(
        self, plans: list["CompactionPlan"], on_damage: Callable[[str, Exception], None] | None
    ) -> tuple[list[CompactionResult], int, set[str]]:
        """Commit one round's plans: (results, races lost, shards found damaged)."""
        done: list[CompactionResult] = []
        lost = 0
        damaged: set[str] = set()
        joint = self._joinable(plans)
        if joint:
            try:
                done += self.commit_joint(joint)
            except StaleCompactionError as e:
                log.info("%s; reloading", e)
                return done, 1, damaged
            except DAMAGE_ERRORS:
                joint = []  # committed one by one below, so the damage is named by shard
        joined = {p.shard_id for p in joint}
        for plan in plans:
            if plan.shard_id in joined:
                continue
            try:
                done.append(self.commit(plan))
            except StaleCompactionError as e:
                log.info("%s; reloading", e)
                lost += 1
            except ConcurrencyError:
                raise
            except DAMAGE_ERRORS as e:
                if on_damage is None:
                    raise
                on_damage(plan.shard_id, e)
                damaged.add(plan.shard_id)
        return done, lost, damaged

    def run_once(self) -> list[CompactionResult]:
        """Compact every shard's pending generations."""
        return self.compact_shards(self.state.manifests.list_shards())
