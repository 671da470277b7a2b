"""Durability "fsync": a write is acknowledged only after its WAL entries and the WAL directory
are fsynced (through ``FileIO.sync``), a flush syncs its SSTable and manifest, "os" syncs nothing
and object stores need nothing. Real Lance tables; the FileIO is memwal's own seam, counted."""

from __future__ import annotations

import dataclasses
import os
import shutil

import pyarrow as pa
import pytest
from helpers import PEOPLE, CountingIO, people

from memwal import readers, Table, WriterConfig
from memwal.core import paths
from memwal.cli import main
from memwal.core.errors import InvalidArgumentError
from memwal.core.io import LocalFileIO, ObjectStoreFileIO
from memwal.core.wal import wal_positions
from memwal.write.pool import ShardWriterPool


def pool(uri: str, durability: str | None = None) -> tuple[ShardWriterPool, CountingIO, str]:
    """A writer pool on the table's one shard (created) whose FileIO counts syncs."""
    t = Table.open(uri)
    io = CountingIO()
    p = ShardWriterPool(dataclasses.replace(t.state, io=io), durability=durability)
    _, (batch,) = t._route(people([0]), False)
    p.ensure_shard(batch.shard_id, batch.values)
    return p, io, batch.shard_id


def test_fsync_syncs_each_writes_wal_entries_and_directory_before_returning(table_uri):
    Table.create(table_uri, PEOPLE, ["id"], "unsharded", writer=WriterConfig(durability="fsync")).close()
    p, io, shard = pool(table_uri)
    assert p.fsync
    wal_dir = paths.wal_dir(table_uri, shard)
    for i in range(3):
        before = set(wal_positions(io, table_uri, shard))
        p.put(shard, people([i]).cast(p.state.write_schema))
        new = set(wal_positions(io, table_uri, shard)) - before
        assert new, "a durable put writes a WAL entry"
        assert {paths.wal_entry_path(table_uri, shard, n) for n in new} <= set(io.synced)
        assert io.dirs[-1] == wal_dir
    p.delete(shard, pa.table({"id": pa.array([1], pa.int64())}))
    assert set(io.synced) == {paths.wal_entry_path(table_uri, shard, n) for n in wal_positions(io, table_uri, shard)}
    io.synced.clear()
    p.flush()
    m = p.state.manifests.read_shard(shard)
    assert paths.shard_manifest_path(table_uri, shard, m.version) in io.synced
    sstable = paths.sstable_path(table_uri, shard, m.sstables[-1].path)
    assert any(s.startswith(sstable + "/") for s in io.synced)
    rows = readers.open(table_uri, consistency="strong").scan().to_pylist()
    assert sorted(r["id"] for r in rows) == [0, 2]


def test_os_durability_syncs_nothing_and_a_pool_can_override_the_table(table_uri):
    Table.create(table_uri, PEOPLE, ["id"], "unsharded").close()
    p, io, shard = pool(table_uri)
    assert not p.fsync
    p.put(shard, people([1]).cast(p.state.write_schema))
    p.flush()
    assert io.synced == [] and io.dirs == []
    p, io, shard = pool(table_uri, durability="fsync")
    p.put(shard, people([2]).cast(p.state.write_schema))
    assert io.synced and io.dirs
    p.flush()


def test_object_stores_need_no_sync(table_uri):
    Table.create(table_uri, PEOPLE, ["id"], "unsharded", writer=WriterConfig(durability="fsync")).close()
    t = Table.open(table_uri)
    on_s3 = ShardWriterPool(dataclasses.replace(t.state, io=ObjectStoreFileIO()))
    assert ObjectStoreFileIO.durable_on_write and not LocalFileIO.durable_on_write
    assert not on_s3.fsync  # a PUT is durable when it returns
    ObjectStoreFileIO().sync(["s3://b/never/read"], "s3://b/never")  # and sync touches nothing


def test_local_sync_skips_removed_files(tmp_path):
    f = tmp_path / "a"
    f.write_bytes(b"x")
    LocalFileIO().sync([str(f), str(tmp_path / "gone")], str(tmp_path))


def test_durability_is_validated_stored_and_not_passed_to_lance(table_uri):
    with pytest.raises(InvalidArgumentError):
        WriterConfig(durability="disk")
    assert "durability" not in WriterConfig(durability="fsync").lance_kwargs()
    Table.create(table_uri, PEOPLE, ["id"], "unsharded", writer=WriterConfig(durability="fsync")).close()
    assert Table.open(table_uri).metadata.writer.durability == "fsync"
    assert WriterConfig.stored({"max_memtable_rows": 10}).durability == "os"  # tables made before it


def test_cli_durability_flags(tmp_path, capsys):
    schema_file = tmp_path / "people.jsonl"
    schema_file.write_text('{"id": 1, "name": "a"}\n')
    uri = str(tmp_path / "t")
    assert main(["init", uri, "--schema-from", str(schema_file), "--primary-key", "id", "--durability", "fsync"]) == 0
    assert Table.open(uri).metadata.writer.durability == "fsync"
    assert main(["put", uri, str(schema_file), "--durability", "os"]) == 0
    with pytest.raises(SystemExit) as e:
        main(["put", uri, str(schema_file), "--durability", "disk"])
    assert e.value.code == 2


def test_a_killed_writers_staging_file_is_no_wal_entry(table_uri):
    """A writer SIGKILLed while writing a WAL entry leaves ``{name}.arrow.tmp.{uuid}#1`` behind (seen
    in bench/crash.py). Taken for an entry, its position counted twice and looked like a gap, which
    refused every strong read and every writer of the shard."""
    Table.create(table_uri, PEOPLE, ["id"], "unsharded").close()
    t = Table.open(table_uri)
    t.write(people([1]))
    t.write(people([2]))
    (shard,) = t.manifests.list_shards()
    last = wal_positions(t.io, table_uri, shard)[-1]
    entry = paths.wal_entry_path(table_uri, shard, last)
    shutil.copy(entry, entry + ".tmp.700c266604fa42c5a98dfb0f7c17b15b#1")
    assert wal_positions(t.io, table_uri, shard)[-1] == last
    rows = readers.open(table_uri, consistency="strong").scan().to_pylist()
    assert sorted(r["id"] for r in rows) == [1, 2]
    t2 = Table.open(table_uri)
    t2.write(people([3]))
    t2.close()
    assert os.path.exists(entry)
