"""memwal.lance_errors against the real errors of the pinned pylance, each provoked for real.

If a Lance upgrade rewords one of these errors, the test that provokes it fails here, not a
retry loop somewhere deep in the writer or the compactor.
"""

from __future__ import annotations

import threading

import lance
import lance.mem_wal
import pyarrow as pa
import pytest
from helpers import PEOPLE, people

from memwal import lance_errors
from memwal.compactor import Compactor
from memwal.errors import CommitConflictError, FencedError, StaleCompactionError
from memwal.table import Table

CHECKS = {
    "fenced": lance_errors.is_fenced,
    "claim_race": lance_errors.is_claim_race,
    "stale_compaction": lance_errors.is_stale_compaction,
    "commit_conflict": lance_errors.is_commit_conflict,
}


def raised(fn) -> BaseException:
    with pytest.raises(BaseException) as info:
        fn()
    return info.value


def assert_only(exc: BaseException, kind: str | None) -> None:
    """``exc`` is classified as ``kind`` by its predicate and by no other."""
    assert {name for name, check in CHECKS.items() if check(exc)} == ({kind} if kind else set()), str(exc)


def assert_clean(message: str) -> None:
    assert "/home/runner" not in message and ".rs:" not in message, message


def one_shard_table(uri: str) -> tuple[Table, str]:
    t = Table.create(uri, PEOPLE, ["id"], "unsharded", initial_data=people(range(10)))
    t.write(people(range(5), "a"))
    t.flush()
    return t, t.state.manifests.list_shards()[0]


def test_fenced_writer(table_uri):
    t, shard = one_shard_table(table_uri)
    first = lance.dataset(table_uri).mem_wal_writer(shard)
    second = lance.dataset(table_uri).mem_wal_writer(shard)  # claims a higher epoch
    try:
        for exc in (raised(lambda: first.put(people([1], "x"))), raised(first.close)):
            assert_only(exc, "fenced")
            memwal_error = lance_errors.classify(exc)
            assert isinstance(memwal_error, FencedError)
            assert_clean(str(memwal_error))
    finally:
        second.close()
        t.close()


def test_claim_race(table_uri):
    t, shard = one_shard_table(table_uri)
    t.close()
    errors: list[BaseException] = []
    for _ in range(20):
        barrier = threading.Barrier(6)

        def claim(barrier: threading.Barrier = barrier) -> None:
            ds = lance.dataset(table_uri)
            barrier.wait()
            try:
                ds.mem_wal_writer(shard)
            except Exception as e:  # noqa: BLE001 - collected and classified below
                errors.append(e)

        threads = [threading.Thread(target=claim) for _ in range(6)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        if any(lance_errors.is_claim_race(x) for x in errors):
            break
    assert any(lance_errors.is_claim_race(x) for x in errors), "six simultaneous claims never raced"
    for exc in errors:
        # A racing open either loses the manifest commit (a claim race, whose message nests Lance's
        # "Retryable commit conflict": still a claim race only) or wins it and is then fenced by a
        # later claim while it replays: both are one writer losing the shard to another.
        kind = "claim_race" if lance_errors.is_claim_race(exc) else "fenced"
        assert_only(exc, kind)
        assert isinstance(lance_errors.classify(exc), FencedError)


def test_stale_compaction(table_uri):
    t, shard = one_shard_table(table_uri)
    t.close()
    Compactor(t.state).run_once()  # records generation 1 as compacted
    ds = lance.dataset(table_uri)
    marker = [lance.mem_wal.CompactedSsTable(shard, 1)]
    exc = raised(
        lambda: ds.merge_insert("id")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .mark_sstables_as_compacted(marker)
        .execute(people([1], "late"))
    )
    assert_only(exc, "stale_compaction")
    memwal_error = lance_errors.classify(exc)
    assert isinstance(memwal_error, StaleCompactionError)
    assert_clean(str(memwal_error))
    assert "generation 1" in str(memwal_error)


def test_commit_conflict_without_retries(tmp_path):
    uri = str(tmp_path / "plain")
    lance.write_dataset(people(range(10)), uri)
    first, second = lance.dataset(uri), lance.dataset(uri)  # both at the same version
    first.merge_insert("id").when_matched_update_all().execute(people([1, 2], "first"))
    exc = raised(
        lambda: second.merge_insert("id").when_matched_update_all().conflict_retries(0).execute(people([1, 2], "second"))
    )
    assert_only(exc, "commit_conflict")
    memwal_error = lance_errors.classify(exc)
    assert isinstance(memwal_error, CommitConflictError)
    assert_clean(str(memwal_error))


def test_incompatible_transaction_is_not_a_retryable_conflict(tmp_path):
    """An update racing an overwrite: Lance rejects it as incompatible (its message's build
    path names conflict_resolver.rs, which a bare "conflict" match took for a conflict)."""
    uri = str(tmp_path / "plain")
    lance.write_dataset(people(range(10)), uri)
    stale = lance.dataset(uri)
    lance.write_dataset(people(range(10), "new"), uri, mode="overwrite")
    exc = raised(
        lambda: stale.merge_insert("id").when_matched_update_all().conflict_retries(0).execute(people([3], "late"))
    )
    assert "conflict" in str(exc).lower()
    assert_only(exc, None)
    assert lance_errors.classify(exc) is None
    assert_clean(lance_errors.lance_message(exc))


def test_only_lance_exception_types_are_classified():
    """The same words in an exception Lance never raises (e.g. a KeyError) mean nothing."""
    exc = KeyError("Too many concurrent writers. Attempted 0 retries.")
    assert_only(exc, None)
    assert lance_errors.classify(exc) is None
    assert lance_errors.classify(pa.ArrowInvalid("bad")) is None
