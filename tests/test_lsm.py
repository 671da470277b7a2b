"""LSM merge helpers: newest row per key, anti-join on keys."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from memwal.core.lsm import newest_across, newest_per_key, without_keys

VEC = pa.list_(pa.float32(), 2)


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3), st.integers(-(2**63), 2**63 - 1)), max_size=40))
def test_newest_per_key_is_the_last_occurrence(rows):
    t = pa.table({"a": [r[0] for r in rows], "b": [r[1] for r in rows], "v": [r[2] for r in rows]})
    expected = {}
    for a, b, v in rows:
        expected.pop((a, b), None)
        expected[(a, b)] = v  # re-inserting keeps the order of last occurrences
    got = newest_per_key(t, ["a", "b"]).to_pylist()
    assert [((r["a"], r["b"]), r["v"]) for r in got] == list(expected.items())


def test_newest_across_tables_prefers_later_tables():
    old = pa.table({"k": [1, 2], "v": ["o1", "o2"]})
    new = pa.table({"k": [2, 3], "v": ["n2", "n3"]})
    assert sorted(newest_across([old, new], ["k"]).to_pylist(), key=lambda r: r["k"]) == [
        {"k": 1, "v": "o1"}, {"k": 2, "v": "n2"}, {"k": 3, "v": "n3"}
    ]


@given(
    st.lists(st.tuples(st.integers(0, 4), st.integers(0, 2)), max_size=20),
    st.lists(st.tuples(st.integers(0, 4), st.integers(0, 2)), max_size=10),
)
def test_without_keys_single_and_composite(rows, drop):
    t = pa.table({"a": [r[0] for r in rows], "b": [r[1] for r in rows], "vec": pa.array([[1.0, 2.0]] * len(rows), VEC)})
    keys = pa.table({"a": pa.array([d[0] for d in drop], pa.int64()), "b": pa.array([d[1] for d in drop], pa.int64())})
    got = without_keys(t, keys, ["a", "b"]).to_pylist()
    assert [(r["a"], r["b"]) for r in got] == [r for r in rows if r not in set(drop)]
    got1 = without_keys(t, keys, ["a"]).to_pylist()
    assert [r["a"] for r in got1] == [r[0] for r in rows if r[0] not in {d[0] for d in drop}]


_KEYS = st.one_of(
    st.lists(st.integers(-20, 20), max_size=60),  # dense: the scan's bitmap path
    st.lists(st.integers(-(2**62), 2**62), max_size=60),  # sparse: Arrow's hash-set path
)


@given(_KEYS, _KEYS, st.sampled_from([pa.int64(), pa.int8(), pa.uint64(), pa.string()]))
def test_scan_merge_matches_the_general_lsm_merge(delta_keys, base_keys, key_type):
    """memwal.readers.merge (NumPy paths for integer keys) keeps exactly the rows, in the
    order, that the general helpers keep, whatever the key's type."""
    from memwal.readers import merge

    def keys(values: list[int]) -> pa.Array:
        if key_type == pa.string():
            return pa.array([str(v) for v in values])
        lo, hi = (-128, 127) if key_type == pa.int8() else (0, 2**62) if key_type == pa.uint64() else (-(2**63), 2**63 - 1)
        return pa.array([min(max(v, lo), hi) for v in values], key_type)

    delta = pa.table({"k": keys(delta_keys), "v": list(range(len(delta_keys)))})
    assert merge.newest(delta, ["k"]).equals(newest_per_key(delta, ["k"]))
    base = newest_per_key(pa.table({"k": keys(base_keys), "v": list(range(len(base_keys)))}), ["k"])
    drop = merge.BatchKeyDrop.of(delta, ["k"])
    if drop is not None:
        kept = pa.Table.from_batches([drop.drop(b) for b in base.to_batches(max_chunksize=7)], base.schema)
        assert kept.equals(without_keys(base, delta, ["k"]))
