"""Snapshots leave compacted SSTables out; passing them would resurrect stale rows."""

from __future__ import annotations

import lance
import lance.mem_wal
import pyarrow as pa
from helpers import PEOPLE, compact_by_hand

from memwal import Table, readers


def rows(*pairs):
    return pa.table({"id": [p[0] for p in pairs], "name": [p[1] for p in pairs], "score": [None] * len(pairs)}, schema=PEOPLE)


def test_compacted_sstables_are_left_out_and_would_be_stale(table_uri):
    t = Table.create(table_uri, PEOPLE, ["id"], "bucket(id, 2)")
    # Three generations in every shard that gets keys 1..4.
    t.write(rows((1, "g1"), (2, "g1"), (3, "g1"), (4, "g1")))
    t.flush()
    t.write(rows((1, "g2"), (2, "g2")))
    t.flush()
    t.write(rows((1, "g3")))
    t.flush()

    # Compact generation 1 of every shard by hand, then change keys 3 and 4 in the base table
    # directly (as a later compaction or a backfill would).
    for sid in t.manifests.list_shards():
        compact_by_hand(table_uri, sid, t.manifests.read_shard(sid).sstables[0])
    lance.dataset(table_uri).update({"name": "'base-new'"}, "id >= 3")

    snap = t.snapshot()
    assert snap.num_live_sstables < sum(len(s.manifest.sstables) for s in snap.shards)
    assert all(g.generation > 1 for s in snap.shards for g in s.live_sstables)

    def names(shard_snapshots):
        out = lance.mem_wal.LsmScanner.from_snapshots(snap.dataset, shard_snapshots).to_table()
        return dict(zip(out["id"].to_pylist(), out["name"].to_pylist()))

    expected = {1: "g3", 2: "g2", 3: "base-new", 4: "base-new"}
    assert names(snap.lance_snapshots()) == expected

    # The hazard: hand Lance every SSTable the manifests list, compacted ones included.
    everything = []
    for s in snap.shards:
        ls = lance.mem_wal.ShardSnapshot(s.shard_id).with_current_generation(s.manifest.current_generation)
        for g in s.manifest.sstables:
            ls = ls.with_sstable(g.generation, g.path)
        everything.append(ls)
    stale = names(everything)
    assert stale[3] == "g1" and stale[4] == "g1"  # compacted rows shadow the newer base values

    # memwal's reader, scan and point lookup alike, sees the new values.
    r = readers.open(table_uri)
    assert {row["id"]: row["name"] for row in r.scan().to_pylist()} == expected
    assert r.get(4)["name"] == "base-new" and r.get(1)["name"] == "g3"


def test_snapshot_restricted_to_shards(table_uri):
    with Table.create(table_uri, PEOPLE, ["id"], "bucket(id, 4)") as t:
        t.write(rows(*[(i, "x") for i in range(20)]))
    t = Table.open(table_uri)
    one = t.shard_of_key({"id": 0})
    snap = t.snapshot(shard_ids=[one])
    assert [s.shard_id for s in snap.shards] == [one]
    assert len(snap.lance_snapshots()) == 1


def test_base_opens_share_lances_caches_and_still_see_every_version(table_uri):
    """Every base open of one table handle shares one Lance session (warm index and file
    metadata caches across versions); the caches hold immutable files, so each open still
    reads the version it names."""
    t = Table.create(table_uri, PEOPLE, ["id"], "unsharded")
    state = t.state
    first = state.dataset()
    t.write(rows((1, "a"), (2, "b")))
    t.flush()
    t.maintenance().run_cycle()  # compacts into a new base version (and indexes it)
    latest = state.dataset()
    assert latest.session().is_same_as(first.session())
    assert latest.version > first.version
    assert first.count_rows() == 0
    assert latest.to_table(filter="id = 2").column("name").to_pylist() == ["b"]
    t.write(rows((2, "c")))
    t.flush()
    t.maintenance().run_cycle()
    assert state.dataset().to_table(filter="id = 2").column("name").to_pylist() == ["c"]
    assert state.dataset(latest.version).to_table(filter="id = 2").column("name").to_pylist() == ["b"]
    assert state.lance_caches.size_bytes() > 0
    assert state.lance_caches.renewals == 0


def test_caches_past_their_bound_are_renewed_whole_and_reads_stay_right(table_uri):
    """Once the session holds more than its bound, the next open starts a new one (so replaced
    index segments are dropped, not left to crowd out live ones); reads through the old and the
    new session agree."""
    t = Table.create(table_uri, PEOPLE, ["id"], "unsharded")
    t.write(rows(*[(i, f"n{i}") for i in range(100)]))
    t.flush()
    t.maintenance().run_cycle()
    caches = t.state.lance_caches
    caches.renew_bytes = 1  # anything cached passes it
    caches.check_seconds = 0  # measured on every open
    before = t.state.dataset()
    assert before.to_table(filter="id = 7").column("name").to_pylist() == ["n7"]
    assert caches.size_bytes() > 1
    renewed = caches.renewals
    after = t.state.dataset()
    assert not after.session().is_same_as(before.session())
    assert caches.renewals == renewed + 1
    assert after.to_table(filter="id = 7").column("name").to_pylist() == ["n7"]
    assert before.to_table(filter="id = 8").column("name").to_pylist() == ["n8"]
    assert readers.Reader(t.state, consistency="strong").get(9)["name"] == "n9"

