"""The byte-bounded LRU behind memwal's caches of immutable files."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from memwal.core.cache import ByteLRU


def test_evicts_least_recently_used_until_within_bytes():
    c: ByteLRU[str, str] = ByteLRU(100)
    c.put("a", "A", 40)
    c.put("b", "B", 40)
    assert c.get("a") == "A"  # a is now the most recent
    c.put("c", "C", 40)  # 120 > 100: b goes, not a
    assert c.get("b") is None and c.get("a") == "A" and c.get("c") == "C"
    assert c.bytes_held == 80


def test_keeps_the_newest_entry_even_when_it_alone_exceeds_the_bound():
    c: ByteLRU[str, str] = ByteLRU(10)
    c.put("small", "s", 5)
    assert c.get_or_load("big", lambda: "B", lambda v: 50) == "B"
    assert c.get("big") == "B" and c.get("small") is None and len(c) == 1


def test_discard_where_and_clear_keep_the_byte_count_right():
    c: ByteLRU[tuple[str, int], int] = ByteLRU(1000)
    for i in range(5):
        c.put(("s", i), i, 10)
    c.discard_where(lambda k: k[1] <= 2)
    assert c.bytes_held == 20 and len(c) == 2
    c.clear()
    assert c.bytes_held == 0 and len(c) == 0


@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 60)), max_size=60), st.integers(1, 200))
def test_bound_holds_against_a_model(ops, bound):
    c: ByteLRU[int, int] = ByteLRU(bound)
    model: dict[int, int] = {}
    for key, size in ops:
        c.put(key, key, size)
        model[key] = size
        held = {k: model[k] for k in model if k in c}
        assert c.bytes_held == sum(held.values())
        assert c.bytes_held <= bound or len(c) == 1
        assert c.get(key) == key  # what was just put is always there
