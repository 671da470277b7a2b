"""Hypothesis stateful test of the whole LSM lifecycle against a dict.

Random interleavings, over two shards, of: upserts and deletes by two writers (which
fence each other), flushes, writer crashes, compactions by two competing compactors whose
passes interleave step by step, compactor crashes between passes, index catch-up and GC.
After every step a strongly consistent reader (base + SSTables + unflushed WAL) must equal
the model: every acknowledged write, and nothing else.
"""

from __future__ import annotations

import shutil
import tempfile

import pyarrow as pa
from hypothesis import settings
from hypothesis import strategies as st
from helpers import examples
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from memwal import StaleCompactionError, Table, WriterConfig, readers
from memwal.maintain.compactor import Compactor
from memwal.core.metadata import Bounds
from memwal.core.state import TableState
from memwal.write.pool import ShardWriterPool
from memwal.maintain.gc import GarbageCollector, GcConfig
from memwal.core.indexes import IndexMaintainer

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])
KEYS = st.lists(st.integers(0, 12), min_size=1, max_size=6)  # few keys: histories collide
WRITER = st.sampled_from([0, 1])
COMPACTOR = st.sampled_from([0, 1])
GC_NOW = GcConfig(
    reader_grace_seconds=0, manifest_retention_seconds=0, manifest_versions_kept=2, base_version_retention_seconds=0,
    drain_interval_seconds=0,
)


class LsmMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="memwal-stateful-")
        self.uri = f"{self.dir}/t"
        # MemTables never fill up by themselves here: flushes happen when the test says so. The
        # machine may flush far more often than it compacts: no write stall (tests/test_bounds.py).
        Table.create(self.uri, SCHEMA, ["id"], "bucket(id, 2)", writer=WriterConfig(max_memtable_rows=100_000), bounds=Bounds.unbounded()).close()
        self.writers = [Table.open(self.uri), Table.open(self.uri)]
        self.crashed: list[Table] = []  # kept referenced: a crashed writer does nothing more
        self.compactors = [
            Compactor(TableState.load(self.uri), max_generations_per_commit=1),
            Compactor(TableState.load(self.uri), max_generations_per_commit=4),
        ]
        self.plans: list = [None, None]
        self.joint_plans: list = [None, None]  # per compactor: single-pass plans of both shards
        self.gc = GarbageCollector(TableState.load(self.uri), GC_NOW)
        self.indexes = IndexMaintainer(TableState.load(self.uri))
        self.reader = readers.open(self.uri, consistency="strong")
        self.model: dict[int, str] = {}
        self.counter = 0

    # -- writers --------------------------------------------------------------------------------

    @rule(w=WRITER, keys=KEYS)
    def upsert(self, w, keys):
        self.counter += 1
        values = [f"{k}@{self.counter}" for k in keys]
        self.writers[w].write(pa.table({"id": pa.array(keys, pa.int64()), "v": values}))
        self.model.update(zip(keys, values))  # later duplicates in one write win, like a dict

    @rule(w=WRITER, keys=KEYS)
    def delete(self, w, keys):
        self.writers[w].delete({"id": pa.array(keys, pa.int64())})
        for k in keys:
            self.model.pop(k, None)

    @rule(w=WRITER, keys=KEYS, dead=KEYS)
    def churn(self, w, keys, dead):
        """Two generations in a row: upserts, then deletes mixed with fresh upserts."""
        self.upsert(w, keys)
        self.flush(w)
        self.delete(w, dead)
        self.upsert(w, [k + 20 for k in keys])
        self.flush(w)

    @rule(w=WRITER)
    def flush(self, w):
        self.writers[w].flush()

    @rule(w=WRITER)
    def crash_writer(self, w):
        # No close, no flush: acknowledged writes are only in the WAL now.
        self.crashed.append(self.writers[w])
        self.writers[w] = Table.open(self.uri)

    # -- compactors -----------------------------------------------------------------------------

    @rule(c=COMPACTOR, bucket=st.integers(0, 1))
    def plan(self, c, bucket):
        table = self.compactors[c].state
        shard = table.shard_id_of((bucket,))  # by bucket, not by (random) shard UUID: replayable
        if shard in table.manifests.list_shards():
            table.manifests.clear_cache()
            self.plans[c] = self.compactors[c].plan(shard)

    @precondition(lambda self: any(p is not None for p in self.plans))
    @rule(c=COMPACTOR)
    def delete_pass(self, c):
        if self.plans[c] is not None:
            try:
                self.compactors[c].delete_pass(self.plans[c])
            except StaleCompactionError:
                self.plans[c] = None

    @precondition(lambda self: any(p is not None for p in self.plans))
    @rule(c=COMPACTOR)
    def upsert_pass(self, c):
        plan, self.plans[c] = self.plans[c], None
        if plan is not None:
            try:
                self.compactors[c].delete_pass(plan)  # a no-op unless it has tombstones
                self.compactors[c].upsert_pass(plan)
            except StaleCompactionError:
                pass

    @rule(
        bucket=st.integers(0, 1),
        # the order of the two compactors' passes: each one's delete pass precedes its upsert
        order=st.sampled_from(["aAbB", "abAB", "abBA", "baAB", "baBA", "bBaA"]),
    )
    def race(self, bucket, order):
        """Both compactors plan the same shard now, then commit their passes interleaved."""
        self.plans = [None, None]
        for c in (0, 1):
            self.plan(c, bucket)
        steps = {"a": (0, "delete"), "A": (0, "upsert"), "b": (1, "delete"), "B": (1, "upsert")}
        for ch in order:
            c, step = steps[ch]
            plan = self.plans[c]
            if plan is None:
                continue
            try:
                if step == "delete":
                    self.compactors[c].delete_pass(plan)
                else:
                    self.compactors[c].upsert_pass(plan)
            except StaleCompactionError:
                self.plans[c] = None
        self.plans = [None, None]

    @rule(c=COMPACTOR)
    def crash_compactor(self, c):
        self.plans[c] = None  # whatever pass it committed stays committed
        self.joint_plans[c] = None

    @rule(c=COMPACTOR)
    def plan_both_shards(self, c):
        """Plans both shards' next runs for one joint commit, which may come after other commits."""
        plans = []
        for bucket in (0, 1):
            self.plan(c, bucket)
            plans.append(self.plans[c])
        self.plans[c] = None
        self.joint_plans[c] = [p for p in plans if p is not None and not p.dead.num_rows] or None

    @precondition(lambda self: any(p is not None for p in self.joint_plans))
    @rule(c=COMPACTOR)
    def commit_both_shards(self, c):
        plans, self.joint_plans[c] = self.joint_plans[c], None
        if plans is not None:
            try:
                self.compactors[c].commit_joint(plans)
            except StaleCompactionError:
                pass  # a run of either shard was compacted meanwhile: nothing of this commit lands

    @rule(c=COMPACTOR)
    def compact_everything(self, c):
        self.compactors[c].state.manifests.clear_cache()
        self.compactors[c].run_once()

    # -- indexes and GC -------------------------------------------------------------------------

    @rule()
    def catch_up_indexes(self):
        self.indexes.catch_up()

    @rule()
    def flush_stranded(self):
        ShardWriterPool(self.gc.state).flush_stranded()

    @rule()
    def collect_garbage(self):
        self.gc.state.manifests.clear_cache()
        self.gc.run_once()

    # -- the check ------------------------------------------------------------------------------

    @invariant()
    def reads_equal_the_model(self):
        rows = self.reader.scan().to_pylist()
        assert {r["id"]: r["v"] for r in rows} == self.model
        assert len(rows) == len(self.model)
        for k in (0, 5, 11):
            got = self.reader.get(k)
            assert (got["v"] if got else None) == self.model.get(k)

    def teardown(self) -> None:
        try:
            for w in self.writers:
                w.close()
            Table.open(self.uri).flush_stranded()  # what crashed writers left in the WAL
            eventual = readers.open(self.uri)  # everything flushed: eventual reads agree too
            assert {r["id"]: r["v"] for r in eventual.scan().to_pylist()} == self.model
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


LsmMachine.TestCase.settings = settings(max_examples=examples(60), stateful_step_count=50, deadline=None)
TestLsm = LsmMachine.TestCase
