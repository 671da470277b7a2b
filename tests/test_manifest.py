"""The manifest store reads what Lance wrote: shard manifests, hints, the MemWAL index."""

from __future__ import annotations

import json
import os
import shutil
import uuid

import lance
import pyarrow as pa
from helpers import PEOPLE, CountingIO, compact_by_hand, people
from hypothesis import given
from hypothesis import strategies as st

from memwal import Table
from memwal.core import paths
from memwal.core.io import LocalFileIO
from memwal.core.manifest import ManifestStore, ShardManifest, decode_index_section


@given(st.integers(0, 2**64 - 1))
def test_bitrev64_round_trip(n):
    name = paths.bitrev64(n)
    assert len(name) == 64 and paths.parse_bitrev64(name + ".arrow") == n


def test_bitrev64_matches_lance_example():
    # From Lance's spec: position 5 is 1010...0
    assert paths.bitrev64(5) == "101" + "0" * 61


def test_shard_manifests_written_by_lance(table_uri):
    t = Table.create(table_uri, PEOPLE, ["id"], "bucket(id, 4)")
    for gen in range(3):
        t.write(people(range(gen * 40, gen * 40 + 40)))
        t.flush()
    store = ManifestStore(table_uri, LocalFileIO())
    shards = store.list_shards()
    assert sorted(shards) == sorted(os.listdir(paths.mem_wal_root(table_uri)))
    assert len(shards) == 4
    for sid in shards:
        m = store.read_shard(sid)
        assert m.shard_id == sid
        # each flush closed the writer, so each write reopened (claimed) the shard: epoch + 1
        assert m.writer_epoch == 3
        assert [s.generation for s in m.sstables] == [1, 2, 3]
        assert m.current_generation == 4
        on_disk = sorted(d for d in os.listdir(paths.shard_dir(table_uri, sid)) if "_gen_" in d)
        assert sorted(s.path for s in m.sstables) == on_disk
        assert all(s.physical_rows > 0 for s in m.sstables)
        # shard values recorded by memwal survive Lance's later versions
        assert m.shard_spec_id == 1
        assert t.shard_id_of(tuple(t.shard_values(m).values())) == sid
        # WAL positions: every WAL entry is covered by a flush
        wal = sorted(paths.parse_bitrev64(n) for n in os.listdir(paths.wal_dir(table_uri, sid)))
        assert m.replay_after_wal_entry_position == wal[-1]
        assert store.retained_versions(sid) == list(range(1, m.version + 1))


def test_latest_version_probes_past_a_stale_hint(table_uri):
    t = Table.create(table_uri, PEOPLE, ["id"], "unsharded")
    t.write(people([1]))
    t.flush()
    (sid,) = t.manifests.list_shards()
    hint = paths.shard_version_hint_path(table_uri, sid)
    latest = json.loads(open(hint).read())["version"]
    with open(hint, "w") as f:
        f.write(json.dumps({"version": 1}))
    store = ManifestStore(table_uri, LocalFileIO())
    assert store.latest_version(sid) == latest
    os.unlink(hint)
    assert store.latest_version(sid) == latest


def test_list_shards_does_not_list_retained_manifest_versions(table_uri):
    """Every snapshot lists the shards; a shard's manifest directory holds every retained
    version (thousands an hour), so an established shard is known by its hint, unlisted."""
    t = Table.create(table_uri, PEOPLE, ["id"], "bucket(id, 2)")
    for gen in range(3):
        t.write(people(range(gen * 20, gen * 20 + 20)))
        t.flush()
    root = paths.mem_wal_root(table_uri)
    established = sorted(os.listdir(root))
    assert len(established) == 2
    # a directory without a manifest (a crashed create: only a temp file) is not a shard
    empty = str(uuid.uuid4())
    os.makedirs(paths.shard_manifest_dir(table_uri, empty))
    open(os.path.join(paths.shard_manifest_dir(table_uri, empty), "x.tmp"), "w").close()
    # a shard that lost its hint is still one (found by listing its manifests)
    os.unlink(paths.shard_version_hint_path(table_uri, established[1]))
    io = CountingIO()
    store = ManifestStore(table_uri, io)
    assert sorted(store.list_shards()) == established
    assert paths.shard_manifest_dir(table_uri, established[0]) not in io.listed
    io.listed.clear()
    assert sorted(store.list_shards()) == established
    # known shards are not checked again; only the directory without a manifest is
    assert io.listed == [root, paths.shard_manifest_dir(table_uri, empty)]
    # a shard created later is seen by the same store (a copy: list_shards reads no manifest)
    shutil.copytree(paths.shard_dir(table_uri, established[0]), paths.shard_dir(table_uri, str(uuid.uuid4())))
    assert len(store.list_shards()) == 3


def test_write_shard_if_absent_is_put_if_not_exists(tmp_path):
    store = ManifestStore(str(tmp_path), LocalFileIO())
    sid = str(uuid.uuid4())
    m = ShardManifest(shard_id=sid, version=1, shard_spec_id=0, field_entries={"f": b"\x01\x00\x00\x00"})
    assert store.write_shard_if_absent(m)
    assert not store.write_shard_if_absent(ShardManifest(shard_id=sid, version=1))
    assert store.read_shard(sid) == m
    assert store.list_shards() == [sid]


def test_mem_wal_index_from_the_base_manifest(table_uri):
    t = Table.create(table_uri, PEOPLE, ["id"], "bucket(id, 2)")
    t.write(people(range(50)))
    t.flush()
    t.write(people(range(25), tag="w"))
    t.delete({"id": [1, 2, 3]})
    t.flush()
    store = ManifestStore(table_uri, LocalFileIO())
    ds = lance.dataset(table_uri)
    index = store.mem_wal_index(ds.version)
    assert [dict(s) for s in index.sharding_specs] == ds.mem_wal_index_details()["sharding_specs"]
    assert index.compacted == {}
    shards = sorted(store.list_shards())
    compacted = {}
    for sid in shards:
        first = store.read_shard(sid).sstables[0]
        compact_by_hand(table_uri, sid, first)
        compacted[sid] = first.generation
    ds = lance.dataset(table_uri)
    index = store.mem_wal_index(ds.version)
    assert dict(index.compacted) == compacted
    # Lance records index catch-up when an index covers every fragment after compaction.
    ds.optimize.optimize_indices()
    ds = lance.dataset(table_uri)
    index = store.mem_wal_index(ds.version)
    assert dict(index.index_catchup["id_idx"]) == compacted
    # the index section is found through the manifest footer, and it lists both indexes
    raw = open(paths.base_manifest_path(table_uri, ds.version), "rb").read()
    assert {i.name for i in decode_index_section(raw)} == {"__lance_mem_wal", "id_idx"}


def test_field_entries_decode_for_string_shards(table_uri):
    schema = pa.schema([("region", pa.string()), ("id", pa.int64())])
    with Table.create(table_uri, schema, ["region", "id"], "identity(region)") as t:
        t.write({"region": ["eu", "us", "ap"], "id": [1, 2, 3]})
    t = Table.open(table_uri)
    values = sorted(t.shard_values(t.manifests.read_shard(s))["bucket"] for s in t.manifests.list_shards())
    assert values == ["ap", "eu", "us"]
