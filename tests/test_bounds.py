"""Bounds by construction: writers' back-pressure when compaction falls behind, and the
maintenance service keeping the base within its bounds (fragments, manifest, versions, disk).

No timing is asserted: a stall is observed as an outcome (an error, a blocked write that
completes once maintenance ran), never by how long it took.
"""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import PEOPLE, people
from memwal import Bounds, readers, Table, WriterConfig, WriteStalledError
from memwal.core import paths
from memwal.maintain.bounds import FoldSchedule, compaction_order, fragment_target
from memwal.core.errors import ConcurrencyError, InvalidArgumentError
from memwal.maintain.gc import GcConfig
from memwal.maintain.maintenance import Maintenance, MaintenanceConfig
from memwal.core.metadata import TableMetadata
from memwal.maintain.metrics import MaintenanceMetrics
from memwal.cli.render import render_status
from memwal.core.state import TableState
from memwal.maintain.status import table_status

#: Small bounds: writes slow down from 2 uncompacted SSTables in a shard and stop at 3.
SMALL = Bounds(
    max_sstables=1,
    slowdown_sstables=2,
    stop_sstables=3,
    stall_timeout_seconds=0.3,
    max_slowdown_seconds=0.01,
    recheck_seconds=0.02,
)


def _maintenance(state: TableState, bounds: Bounds | None = None, **config) -> Maintenance:
    """A maintenance service with no stranded-write flushing and no reader grace (a test
    holds no snapshot across it)."""
    return Maintenance(
        state,
        MaintenanceConfig(
            flush_stranded_after_seconds=None,
            views=False,
            bounds=bounds,
            gc_config=GcConfig(reader_grace_seconds=0.0),
            **config,
        ),
    )


def _flushes(table: Table, n: int, start: int = 0) -> None:
    """``n`` writes of 5 rows, each flushed: one SSTable each (one shard)."""
    for i in range(n):
        table.write(people(range(start + 5 * i, start + 5 * i + 5), tag=f"f{i}"))
        table.flush()


def _stalling_table(table_uri: str, bounds: Bounds = SMALL) -> Table:
    return Table.create(table_uri, PEOPLE, ["id"], "unsharded", bounds=bounds, writer=WriterConfig(max_memtable_rows=1000))


def test_bounds_are_checked_and_persisted_with_the_table(table_uri):
    with pytest.raises(InvalidArgumentError):
        Bounds(slowdown_sstables=10, stop_sstables=5)
    with pytest.raises(InvalidArgumentError):
        Bounds(max_base_versions=0)
    _stalling_table(table_uri)
    assert TableState.load(table_uri).metadata.bounds == SMALL
    # A table created before bounds existed reads with the defaults.
    meta = TableState.load(table_uri).metadata
    doc = meta.to_json().replace('"bounds": ', '"unused": ')
    assert TableMetadata.from_json(doc).bounds == Bounds()


def test_writes_into_a_shard_stall_at_the_stop_bound_without_maintenance(table_uri):
    table = _stalling_table(table_uri)
    _flushes(table, 3)  # 3 uncompacted SSTables: the stop bound
    shard = table.state.manifests.list_shards()[0]
    with pytest.raises(WriteStalledError) as err:
        table.write(people([1000], tag="late"))
    assert isinstance(err.value, ConcurrencyError)  # retryable: the CLI exits with 4
    stats = table.writers.shard_stats(shard)
    assert stats.stalls == 1
    assert stats.slowdowns >= 1  # the third flush's write was delayed, not stopped
    table.writers.flush()
    strong = readers.open(table_uri, consistency="strong")
    assert strong.get(1000) is None  # the stalled write was not applied
    assert strong.count() == 15


def test_status_shows_a_stalled_shard_and_maintenance_releases_it(table_uri):
    table = _stalling_table(table_uri, Bounds(max_sstables=1, slowdown_sstables=2, stop_sstables=3,
                                              stall_timeout_seconds=600.0, max_slowdown_seconds=0.0,
                                              recheck_seconds=0.02))
    _flushes(table, 3)
    status = table_status(TableState.load(table_uri))
    assert [s.stalled for s in status.shards] == [True]
    assert [s.pending_sstables for s in status.shards] == [3]
    assert "STALLED" in render_status(status)

    errors: list[BaseException] = []

    def late_write() -> None:
        try:
            table.write(people([1000], tag="late"))
        except BaseException as e:  # noqa: BLE001 - reported to the test thread
            errors.append(e)

    writer = threading.Thread(target=late_write)
    writer.start()
    shard = table.state.manifests.list_shards()[0]
    while shard not in table.writers.stalled_shards:  # the write is waiting now
        assert writer.is_alive() and not errors
        time.sleep(0.01)
    # The write waits for compaction; one maintenance cycle compacts the shard first (it is
    # the one over its bound) and the write goes through.
    report = _maintenance(table.state).run_cycle()
    writer.join(timeout=120)
    assert not writer.is_alive() and errors == []
    assert report.generations_compacted == 3
    assert table.writers.shard_stats(shard).stalls == 1
    table.flush()
    assert readers.open(table_uri).get(1000)["name"] == "late1000"
    status = table_status(TableState.load(table_uri))
    assert [s.stalled for s in status.shards] == [False]
    assert "STALLED" not in render_status(status)


def test_a_table_with_unbounded_bounds_never_stalls(table_uri):
    """More SSTables wait in the shard than the default stop bound allows, and no maintenance
    runs: every write still goes through, none slowed or stalled."""
    table = _stalling_table(table_uri, Bounds.unbounded())
    assert TableState.load(table_uri).metadata.bounds == Bounds.unbounded()
    waiting = Bounds().stop_sstables + 1
    _flushes(table, waiting)
    table.write(people([10_000], tag="late"))
    shard = table.state.manifests.list_shards()[0]
    stats = table.writers.shard_stats(shard)
    assert (stats.slowdowns, stats.stalls) == (0, 0)
    status = table_status(TableState.load(table_uri))
    assert [(s.pending_sstables, s.slowed, s.stalled) for s in status.shards] == [(waiting, False, False)]
    table.flush()
    strong = readers.open(table_uri, consistency="strong")
    assert strong.get(10_000)["name"] == "late10000"
    assert strong.count() == 5 * waiting + 1


def test_compaction_takes_the_shards_over_their_bound_first():
    b = Bounds(max_sstables=4, slowdown_sstables=8, stop_sstables=9)
    assert compaction_order({"a": 2, "b": 9, "c": 5, "d": 0}, b) == ["b", "c", "a", "d"]


def test_maintenance_merges_base_fragments_over_their_bound(table_uri):
    table = Table.create(table_uri, PEOPLE, ["id"], "unsharded", initial_data=people(range(1000, 1010)))
    _flushes(table, 5)
    bounds = Bounds(max_base_fragments=3)
    # One commit per generation: each adds a base fragment. The small-fragment rule of
    # MaintenanceConfig is kept out of the way so the bound alone triggers the merge.
    m = _maintenance(table.state, bounds, max_generations_per_commit=1, max_small_fragments=10**6)
    report = m.run_cycle()
    assert report.compaction_commits == 5
    assert report.base_fragments_compacted > 0
    assert report.base_fragments <= 3
    assert "base_fragments" not in report.bounds_exceeded
    assert len(table.state.dataset().get_fragments()) <= 3
    assert readers.open(table_uri).count() == 35


@given(
    live_rows=st.integers(0, 10**12),
    target=st.integers(1, 10**7),
    max_full=st.integers(1, 1000),
)
def test_the_fragment_target_doubles_just_enough_for_the_full_fragments_to_hold_the_base(live_rows, target, max_full):
    t = fragment_target(live_rows, target, max_full)
    doublings = (t // target).bit_length() - 1
    assert t == target << doublings  # the configured target, doubled
    assert live_rows <= t * max_full  # max_full fragments of t rows hold the base ...
    assert t == target or live_rows > (t // 2) * max_full  # ... and half of t would not


def test_the_fragment_bound_holds_as_the_table_outgrows_its_fragment_size(table_uri):
    """Fragments compacted to a fixed size grow in number with the table, past any bound (the
    soak's base: 18 full fragments at 19M rows, and a bound of 64 that compaction could not
    have enforced past 64M). Here each fold adds a fragment that is already full at the
    configured size; the bound of 6 still holds at every size, because the fragment target
    doubles as the table grows, and every row stays readable."""
    table = Table.create(table_uri, PEOPLE, ["id"], "unsharded", initial_data=people(range(1000, 1005)))
    m = _maintenance(
        table.state,
        Bounds(max_base_fragments=6),
        max_generations_per_commit=1,  # one fragment per flushed generation
        target_rows_per_fragment=5,
        small_fragment_rows=5,  # so no fragment here counts as small
    )
    assert m.base_files.max_full_fragments == 3  # half the bound, under the config's 16
    for round_ in range(6):
        _flushes(table, 4, start=20 * round_)
        for _ in range(10):  # cycles until nothing is left to merge
            report = m.run_cycle()
            if not report.base_fragments_compacted:
                break
        rows = [f.metadata.num_rows for f in table.state.dataset().get_fragments()]
        assert len(rows) <= 3, (round_, rows)  # max_full_fragments; none is small here
        assert report.base_fragments <= 6 and "base_fragments" not in report.bounds_exceeded, (round_, rows)
    assert m.base_files.fragment_target([f.metadata for f in table.state.dataset().get_fragments()]) > 5  # it did have to double
    r = readers.open(table_uri)
    assert r.count() == 125
    assert r.get(0)["name"] == "f00" and r.get(119)["name"] == "f3119" and r.get(1004)["name"] is not None


def test_maintenance_removes_base_versions_over_their_bound(table_uri):
    table = Table.create(table_uri, PEOPLE, ["id"], "unsharded", initial_data=people(range(1000, 1010)))
    _flushes(table, 4)
    # GC's time-based retention alone would keep every version for an hour.
    m = _maintenance(table.state, Bounds(max_base_versions=2), max_generations_per_commit=1)
    report = m.run_cycle()
    assert report.base_versions_removed > 0
    assert report.base_versions <= 3  # the newest and 2 more
    assert len(table.state.dataset().versions()) <= 3
    assert "base_versions" not in report.bounds_exceeded
    r = readers.open(table_uri)
    assert r.count() == 30 and r.get(0)["name"] == "f00"


def test_manifest_size_and_disk_are_measured_and_reported(table_uri, monkeypatch):
    import memwal.maintain.basefiles

    table = Table.create(table_uri, PEOPLE, ["id"], "unsharded", initial_data=people(range(1000, 1010)))
    _flushes(table, 2)
    # A table this small is under the disk ratio's floor: its fixed files are most of it.
    small = _maintenance(table.state, Bounds(max_disk_ratio=1.0)).run_cycle()
    assert small.disk_bytes is not None and small.disk_bytes > small.live_bytes and "disk" not in small.bounds_exceeded
    monkeypatch.setattr(memwal.maintain.basefiles, "DISK_RATIO_FLOOR_BYTES", 0)  # as a large table would be
    # A manifest bound of 1 byte cannot be met: it is reported (after compact_files ran).
    # A disk bound of 1x the live data cannot be met either: versions go down to the newest.
    m = _maintenance(table.state, Bounds(max_manifest_bytes=1, max_disk_ratio=1.0), max_generations_per_commit=1)
    report = m.run_cycle()
    assert report.base_manifest_bytes > 0 and report.live_bytes > 0
    assert report.disk_bytes is not None and report.disk_bytes > report.live_bytes
    assert {"manifest_bytes", "disk"} <= set(report.bounds_exceeded)
    assert report.base_versions == 1
    text = render_status(table_status(TableState.load(table_uri)))
    assert "over its bounds after the cycle: " in text
    assert readers.open(table_uri).count() == 20


def test_the_fold_schedule_says_when_to_fold():
    s = FoldSchedule(fraction=0.1, max_wait_seconds=30.0, at_sstables=4)
    assert s.due(0, 1000, 0, 0.0) is None  # nothing pending
    assert s.due(99, 1000, 3, 29.0) is None  # under every trigger: wait
    assert s.due(100, 1000, 1, 0.0) is not None  # the rows reached the share of the base
    assert s.due(1, 1000, 4, 0.0) is not None  # a shard reached its SSTables
    assert s.due(1, 1000, 1, 30.0) is not None  # an SSTable waited long enough
    assert s.due(5, 0, 1, 0.0) is not None  # an empty base: every cycle
    assert FoldSchedule(fraction=0).due(1, 10**9, 1, 0.0) is not None
    for bad in ({"fraction": -0.1}, {"max_wait_seconds": -1.0}, {"at_sstables": 0}):
        with pytest.raises(InvalidArgumentError):
            FoldSchedule(**bad)


@given(
    rows=st.integers(0, 10**7),
    base=st.integers(0, 10**9),
    most=st.integers(0, 100),
    wait=st.floats(0, 1000),
    fraction=st.floats(0, 1),
    max_wait=st.floats(0, 1000),
    at=st.integers(1, 100),
)
def test_the_fold_schedule_waits_only_below_all_of_its_bounds(rows, base, most, wait, fraction, max_wait, at):
    reason = FoldSchedule(fraction=fraction, max_wait_seconds=max_wait, at_sstables=at).due(rows, base, most, wait)
    if reason is None:
        assert (rows == 0 and most == 0) or (most < at and wait < max_wait and rows < fraction * base)
    else:
        assert rows > 0 or most > 0


def test_the_service_folds_when_its_schedule_says_so_and_readers_see_the_rows_meanwhile(table_uri):
    table = Table.create(table_uri, PEOPLE, ["id"], "unsharded", initial_data=people(range(1000)))
    _flushes(table, 2, start=1000)  # 10 rows pending, 1% of the base
    m = _maintenance(
        table.state, interval_seconds=0.0, fold=FoldSchedule(fraction=0.05, max_wait_seconds=3600.0, at_sstables=3)
    )
    m.run_forever(cycles=1)
    r = m.last_report
    assert (r.compaction_commits, r.fold_reason, sum(r.pending_sstables.values())) == (0, None, 2)
    assert r.fold_deferred_rows == 10
    assert readers.open(table_uri).get(1007)["name"] == "f11007"
    _flushes(table, 1, start=2000)  # a third SSTable: the schedule's bound
    m.run_forever(cycles=1)
    r = m.last_report
    assert (r.compaction_commits, r.generations_compacted, sum(r.pending_sstables.values())) == (1, 3, 0)
    published = MaintenanceMetrics.from_json(m.state.io.read(paths.maintenance_metrics(table_uri)).decode())
    assert r.fold_reason is not None and published.last_cycle.fold_reason == r.fold_reason
    assert table.state.dataset().count_rows() == 1015


def test_the_service_folds_what_waited_too_long_and_a_cycle_run_by_hand_folds_everything(table_uri):
    table = Table.create(table_uri, PEOPLE, ["id"], "unsharded", initial_data=people(range(1000)))
    _flushes(table, 1, start=1000)
    m = _maintenance(
        table.state, interval_seconds=0.0, fold=FoldSchedule(fraction=1.0, max_wait_seconds=0.2, at_sstables=32)
    )
    m.run_forever(cycles=1)  # first seen now: it has not waited yet
    assert m.last_report.compaction_commits == 0
    time.sleep(0.3)
    m.run_forever(cycles=1)
    assert m.last_report.generations_compacted == 1
    _flushes(table, 1, start=2000)
    assert m.run_cycle().generations_compacted == 1  # by hand: no schedule
    # A schedule whose SSTable bound is above the table's is held to the table's.
    _flushes(table, 1, start=3000)
    held = _maintenance(table.state, Bounds(max_sstables=1), interval_seconds=0.0, fold=FoldSchedule(fraction=1.0, max_wait_seconds=3600.0))
    held.run_forever(cycles=1)
    assert held.last_report.generations_compacted == 1


def test_base_file_compaction_is_not_blocked_by_a_group_over_its_row_budget(tmp_path):
    """Two old fragments with half their rows deleted form one compaction group larger than the
    cycle's row budget, ahead of small new fragments in fragment order. Lance's own budget
    plans nothing then (the soak's stuck cycles); memwal's compacts the small fragments, and
    the next call the large group alone, keeping every live row."""
    import lance
    import pyarrow as pa

    from memwal.maintain.basefiles import compact_files_within

    def rows(lo: int, n: int) -> pa.Table:
        return pa.table({"id": pa.array(range(lo, lo + n), pa.int64()), "v": [f"r{i}" for i in range(lo, lo + n)]})

    uri = str(tmp_path / "ds")
    lance.write_dataset(rows(0, 1500), uri)
    lance.write_dataset(rows(1500, 1500), uri, mode="append")
    lance.dataset(uri).delete("id % 2 = 0 AND id < 3000")  # 1,500 live rows in the two
    lance.write_dataset(rows(3000, 2000), uri, mode="append")  # full-sized, no deletions: not a candidate, so it splits the groups
    for i in range(6):
        lance.write_dataset(rows(6000 + 50 * i, 50), uri, mode="append")
    expected = lance.dataset(uri).to_table().sort_by("id")
    opts = dict(target_rows_per_fragment=2000, materialize_deletions_threshold=0.3)

    premise = lance.dataset(uri).optimize.compact_files(max_source_rows=1000, **opts)
    assert premise.fragments_removed == 0  # Lance: the 1,500-row group first, so nothing

    ds = lance.dataset(uri)
    assert compact_files_within(ds, max_source_rows=1000, **opts) == (6, 1)
    ds = lance.dataset(uri)
    assert len(ds.get_fragments()) == 4
    assert compact_files_within(ds, max_source_rows=1000, **opts) == (2, 1)  # over budget, but all that is due
    ds = lance.dataset(uri)
    assert len(ds.get_fragments()) == 3 and ds.to_table().sort_by("id").equals(expected)


def test_a_compaction_for_the_full_fragments_leaves_the_small_ones_to_their_rule(tmp_path):
    import lance
    import pyarrow as pa

    from memwal.maintain.basefiles import compact_files_within

    def rows(lo: int, n: int) -> pa.Table:
        return pa.table({"id": pa.array(range(lo, lo + n), pa.int64())})

    uri = str(tmp_path / "ds")
    lance.write_dataset(rows(0, 1000), uri)
    lance.write_dataset(rows(1000, 1000), uri, mode="append")
    lance.write_dataset(rows(2000, 5000), uri, mode="append")  # at the target: splits the groups
    for i in range(6):
        lance.write_dataset(rows(7000 + 50 * i, 50), uri, mode="append")
    opts = dict(target_rows_per_fragment=4000, materialize_deletions_threshold=0.3, max_source_rows=10**6)

    def two_full(group) -> bool:
        return sum(f.num_rows >= 100 for f in group) >= 2

    assert compact_files_within(lance.dataset(uri), take=two_full, **opts) == (2, 1)
    assert sorted(f.metadata.num_rows for f in lance.dataset(uri).get_fragments()) == [50] * 6 + [2000, 5000]
    assert compact_files_within(lance.dataset(uri), take=two_full, **opts) == (0, 0)
    compact_files_within(lance.dataset(uri), **opts)  # without the filter, the small ones merge
    assert min(f.metadata.num_rows for f in lance.dataset(uri).get_fragments()) >= 300
    assert lance.dataset(uri).count_rows() == 7300
