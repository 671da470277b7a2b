"""Writer leases: maintenance leaves a live (merely idle) writer's shard alone, flushes the
writes of a writer whose lease expired, and a fenced writer can name who claimed its shard."""

from __future__ import annotations

import threading
import time

from helpers import PEOPLE, people

from memwal import Table, readers
from memwal.core.failpoints import DIR_ENV as FAILPOINT_DIR_ENV
from memwal.core.failpoints import ENV as FAILPOINTS_ENV
from memwal.maintain.maintenance import Maintenance, MaintenanceConfig
from memwal.write.pool import _keeps_claiming
from memwal.write.lease import WriterLease

ONLY_STRANDED = MaintenanceConfig(flush_stranded_after_seconds=0, compact=False, indexes=False, gc=False, views=False)


def test_an_idle_live_writer_is_not_fenced(table_uri):
    Table.create(table_uri, PEOPLE, ["id"], "unsharded").close()
    writer = Table.open(table_uri)
    writer.write(people([1]))  # acknowledged, unflushed; then the writer idles
    (shard,) = writer.manifests.list_shards()
    maintenance = Maintenance(Table.open(table_uri).state, ONLY_STRANDED)
    assert maintenance.run_cycle().stranded_shards_flushed == 0  # the lease is live: not stranded
    writer.write(people([2]))
    writer.close()
    assert writer.writers.stats.fenced_retries == 0
    assert writer.writers.stats.opens == 1
    assert sorted(r["id"] for r in readers.open(table_uri).scan().to_pylist()) == [1, 2]
    # closing ended the lease; the record still names its last owner
    held = maintenance.writers.lease(shard)
    assert held is not None and not held.live() and held.owner == writer.writers.owner


def test_an_expired_lease_is_a_stranded_writer(table_uri):
    Table.create(table_uri, PEOPLE, ["id"], "unsharded").close()
    writer = Table.open(table_uri)
    writer.writers.lease_seconds = 0.2  # as if its process died and stopped renewing
    writer.write(people([1]))
    (shard,) = writer.manifests.list_shards()
    time.sleep(0.3)
    maintenance = Maintenance(Table.open(table_uri).state, ONLY_STRANDED)
    assert maintenance.run_cycle().stranded_shards_flushed == 1
    assert [r["id"] for r in readers.open(table_uri).scan().to_pylist()] == [1]
    # the writer it fenced reopens on its next write; the lease record names who claimed last
    assert writer.writers._claimer(shard) == maintenance.writers.owner
    writer.write(people([2]))
    writer.close()
    assert writer.writers.stats.fenced_retries == 1
    assert sorted(r["id"] for r in readers.open(table_uri).scan().to_pylist()) == [1, 2]


def test_flush_stranded_without_skipping_flushes_live_writers_too(table_uri):
    Table.create(table_uri, PEOPLE, ["id"], "unsharded").close()
    writer = Table.open(table_uri)
    writer.write(people([1]))
    (shard,) = writer.manifests.list_shards()
    assert Table.open(table_uri).flush_stranded(0) == [shard]  # a stopped ingest query flushes everything
    assert [r["id"] for r in readers.open(table_uri).scan().to_pylist()] == [1]
    writer.close()


def test_a_fenced_error_names_the_claimer():
    message = str(_keeps_claiming("s1", "flush", "host:42:abcd"))
    assert "host:42:abcd" in message and "s1" in message
    assert WriterLease.from_json(b"garbage") is None
    lease = WriterLease("o", time.time() + 10)
    assert WriterLease.from_json(lease.to_json()) == lease and lease.live()


def test_a_shard_claimed_during_a_stranded_flush_is_left_to_its_new_writer(table_uri, tmp_path, monkeypatch):
    """A stopped query flushes what its tasks left while a last task may still claim a shard
    (seen in the Debezium restart test): the flush that gets fenced leaves the shard to the
    writer that claimed it, which replayed the same entries, instead of failing the stop."""
    Table.create(table_uri, PEOPLE, ["id"], "unsharded").close()
    first = Table.open(table_uri)
    first.write(people([1]))  # acknowledged, unflushed
    (shard,) = first.manifests.list_shards()
    points = tmp_path / "points"
    points.mkdir()
    monkeypatch.setenv(FAILPOINTS_ENV, "writer.claimed_for_flush=wait")
    monkeypatch.setenv(FAILPOINT_DIR_ENV, str(points))
    flusher, outcome = Table.open(table_uri), {}

    def stop_flush() -> None:
        try:
            outcome["flushed"] = flusher.flush_stranded(0)
        except BaseException as e:  # handed to the test thread
            outcome["error"] = e

    thread = threading.Thread(target=stop_flush)
    thread.start()
    reached = points / "writer.claimed_for_flush"
    deadline = time.monotonic() + 120
    while not reached.exists():
        assert thread.is_alive() and time.monotonic() < deadline, outcome
        time.sleep(0.05)
    monkeypatch.delenv(FAILPOINTS_ENV)
    late = Table.open(table_uri)
    late.write(people([2]))  # claims the shard after the flusher did: the flusher is fenced
    reached.unlink()
    thread.join(120)
    assert "error" not in outcome, outcome
    assert outcome["flushed"] == []
    late.close()
    flusher.close()
    first.close()
    assert sorted(r["id"] for r in readers.open(table_uri).scan().to_pylist()) == [1, 2]
    assert shard in late.manifests.list_shards()
