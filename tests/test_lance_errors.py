"""memwal.core.lance_errors against the real errors of the pinned pylance, each provoked for real.

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

from memwal.core import lance_errors
from memwal.maintain.compactor import Compactor
from memwal.core.errors import CommitConflictError, FencedError, StaleCompactionError
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


# -- failures of the storage itself ---------------------------------------------------------------

CHECKS_STORAGE = {"store_unavailable": lance_errors.is_store_unavailable, "no_room": lance_errors.is_no_room}

#: Run in a child: writes fail with EFBIG past a 256 KB file size limit (RLIMIT_FSIZE; SIGXFSZ
#: ignored, so the write returns the error instead of killing the process). Prints what a plain
#: dataset write and a MemWAL put raised. No privilege needed, unlike a full tmpfs.
_NO_ROOM_CHILD = """
import json, resource, signal, sys
import pyarrow as pa, lance
from memwal.table import Table
from helpers import PEOPLE
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
big = pa.table({"id": list(range(20000)), "name": [("x%07d" % i) * 40 for i in range(20000)], "score": [0.5] * 20000}, schema=PEOPLE)
t = Table.create(sys.argv[1] + "/t", PEOPLE, ["id"], "unsharded")
resource.setrlimit(resource.RLIMIT_FSIZE, (256_000, 256_000))
out = {}
for name, fn in (("dataset", lambda: lance.write_dataset(big, sys.argv[1] + "/plain")),
                 ("memwal put", lambda: t.write(big))):
    try:
        fn()
        out[name] = None
    except BaseException as e:
        out[name] = [type(e).__name__, str(e), getattr(e, "errno", None)]
print(json.dumps(out))
"""


def test_a_write_with_no_room_is_storage_full(tmp_path):
    import json
    import os
    import subprocess
    import sys

    from memwal.core.errors import StorageFullError

    here = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, os.path.dirname(here)])}
    p = subprocess.run([sys.executable, "-c", _NO_ROOM_CHILD, str(tmp_path)], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    kind, text, _code = got["dataset"]
    exc = OSError(text) if kind == "OSError" else RuntimeError(text)
    assert lance_errors.is_no_room(exc) and not lance_errors.is_store_unavailable(exc), text
    assert isinstance(lance_errors.classify(exc), StorageFullError)
    assert_clean(str(lance_errors.classify(exc)))
    # through the writer pool: memwal's error (Lance words it "Writer fenced (persistence failure)")
    kind, text, code = got["memwal put"]
    assert (kind, code) == ("StorageFullError", 27), (kind, text)  # EFBIG: over the file size limit


def test_a_store_that_keeps_failing_is_unavailable(s3_server):
    from faultproxy import Fault, rule, start_proxy

    from memwal.core.errors import StorageUnavailableError

    uri = s3_server.fresh_uri("plain")
    opts = {**s3_server.storage_options(), "client_max_retries": "1"}
    lance.write_dataset(people(range(10)), uri, storage_options=opts)
    with start_proxy(s3_server.endpoint) as proxy:
        proxied = {**opts, "aws_endpoint": proxy.endpoint}
        for fault in (Fault.slow_down(), Fault.internal_error(), Fault.reset()):
            with proxy.faults(rule(fault, "PUT")):
                exc = raised(lambda: lance.write_dataset(people([11]), uri, mode="append", storage_options=proxied))
            assert {n for n, check in CHECKS_STORAGE.items() if check(exc)} == {"store_unavailable"}, str(exc)
            assert_only(exc, None)  # nor fenced, nor a conflict
            memwal_error = lance_errors.classify(exc)
            assert isinstance(memwal_error, StorageUnavailableError)
            assert_clean(str(memwal_error))
            assert "<?xml" not in str(memwal_error)
        with proxy.faults(rule(Fault("status", 403, "AccessDenied"), "GET")):
            exc = raised(lambda: lance.dataset(uri, storage_options=proxied).to_table())
        assert lance_errors.classify(exc) is None  # a 4xx is no outage: left as it is
