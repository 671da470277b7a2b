"""Base index segments: the tiered catch-up policy (against its invariant) and the real
thing on a Lance base (segments stay few, lookups stay right, small fragments still merge)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import PEOPLE, people
from memwal import Table, WriterConfig, readers
from memwal.maintain.gc import GcConfig
from memwal.core.indexes import SegmentPolicy, index_lag, segment_rows
from memwal.maintain.maintenance import Maintenance, MaintenanceConfig
from memwal.cli.render import render_status
from memwal.core.state import TableState
from memwal.maintain.status import table_status


def _apply(policy: SegmentPolicy, segments: list[int], new_rows: int) -> list[int]:
    """What a catch-up does to an index's segment sizes (newest first)."""
    m = policy.to_merge(segments, new_rows)
    return [new_rows + sum(segments[:m])] + segments[m:]


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 1_000_000),
    st.lists(st.integers(1, 200_000), min_size=1, max_size=300),
    st.sampled_from([1.0, 2.0, 4.0]),
    st.integers(2, 10),
)
def test_segments_grow_geometrically_and_stay_under_the_cap(first, catch_ups, ratio, cap):
    policy = SegmentPolicy(ratio=ratio, max_segments=cap)
    segments = [first]
    rewritten = 0
    for new in catch_ups:
        m = policy.to_merge(segments, new)
        rewritten += new + sum(segments[:m])
        segments = _apply(policy, segments, new)
        assert len(segments) <= cap
        # Each segment is more than `ratio` times the next newer one: so few segments.
        assert all(older > ratio * newer for newer, older in zip(segments, segments[1:]))
    total = first + sum(catch_ups)
    assert sum(segments) == total
    # Merging everything every time would rewrite ~ len(catch_ups) * total / 2 rows.
    smallest = min(catch_ups)
    assert rewritten <= total * (math.log(total / smallest, max(ratio, 2.0)) + 3) + sum(catch_ups)


def test_a_catch_up_adds_a_small_segment_instead_of_rewriting_the_index():
    policy = SegmentPolicy(ratio=2.0, max_segments=8)
    assert policy.to_merge([1_000_000], 10_000) == 0
    assert policy.to_merge([10_000, 1_000_000], 10_000) == 1
    assert policy.to_merge([30_000, 20_000, 1_000_000], 10_000) == 0
    assert policy.to_merge([1] * 8, 1) == 8


def _table_with_maintenance(uri: str, base_ids: range, *, max_small_fragments: int) -> tuple[Table, Maintenance]:
    """An unsharded table of ``base_ids`` and a maintenance service committing one generation
    per compaction (so each flush adds a base fragment), with no reader grace."""
    table = Table.create(uri, PEOPLE, ["id"], "unsharded", initial_data=people(base_ids), writer=WriterConfig(max_memtable_rows=1000))
    m = Maintenance(
        table.state,
        MaintenanceConfig(
            flush_stranded_after_seconds=None, views=False, max_generations_per_commit=1,
            max_small_fragments=max_small_fragments, gc_config=GcConfig(reader_grace_seconds=0.0),
        ),
    )
    return table, m


def test_maintenance_keeps_few_index_segments_and_still_merges_small_fragments(table_uri):
    table, m = _table_with_maintenance(table_uri, range(10_000, 12_000), max_small_fragments=4)
    m.run_cycle()  # creates the primary key's BTREE
    policy = m.indexes.policy
    seen_segments = set()
    for i in range(12):
        # new keys and updates of old ones: each cycle's compaction commit adds a fragment
        table.write(people(range(20 * i, 20 * i + 20), tag=f"n{i}"))
        table.write(people(range(10_000 + 20 * i, 10_000 + 20 * i + 10), tag=f"u{i}"))
        table.flush()
        report = m.run_cycle()
        assert report.compaction_commits == 1
        ds = table.state.dataset()
        segments = segment_rows(ds, "id_idx")
        seen_segments.add(len(segments))
        assert 1 <= len(segments) <= policy.max_segments
        assert all(not lag.total for lag in index_lag(ds, table.state.manifests.mem_wal_index(ds.version)))
        assert ds.stats.index_stats("id_idx")["num_unindexed_rows"] == 0
        assert report.index_segments == {"id_idx": len(segments)}
        # small fragments were merged although different segments covered them
        assert len(ds.get_fragments()) <= 4 + 1
    assert max(seen_segments) > 1  # catch-ups added segments rather than rewriting the index
    text = render_status(table_status(TableState.load(table_uri)))
    assert "index segments: id_idx " in text
    r = readers.open(table_uri)
    assert r.count() == 2000 + 240
    for i in (0, 5, 11):
        k = 20 * i + 3
        assert r.get(k)["name"] == f"n{i}{k}"
        assert r.get(10_000 + k)["name"] == f"u{i}{10_000 + k}"
    assert r.get(11_999)["name"] == "v11999"


def test_joining_segments_leaves_a_large_old_segment_alone(table_uri):
    """Small fragments in the newest segments are joined; one a large old segment covers is not
    (that would rewrite the whole index), unless no row budget is given."""
    table, m = _table_with_maintenance(table_uri, range(10_000, 13_000), max_small_fragments=10**6)
    m.indexes.policy = SegmentPolicy(ratio=0.0, max_segments=100)  # never merge: one delta per catch-up
    m.run_cycle()
    for i in range(3):
        table.write(people(range(20 * i, 20 * i + 20), tag=f"n{i}"))
        table.flush()
        m.run_cycle()
    ds = table.state.dataset()
    segments = segment_rows(ds, "id_idx")
    assert [rows for rows, _ in segments] == [20, 20, 20, 3000]
    every = [f.fragment_id for f in ds.get_fragments()]
    assert m.indexes.join_segments(every, max_rows=100) == 2  # the three deltas, not the base's
    assert [rows for rows, _ in segment_rows(table.state.dataset(), "id_idx")] == [60, 3000]
    assert m.indexes.join_segments(every) == 1
    assert [rows for rows, _ in segment_rows(table.state.dataset(), "id_idx")] == [3060]
    r = readers.open(table_uri)
    assert r.count() == 3060 and r.get(41)["name"] == "n241" and r.get(12_999)["name"] == "v12999"
