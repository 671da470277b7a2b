"""The Table API: create/open, the routed write path, fencing, schema and key errors."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import time

import lance
import pyarrow as pa
import pytest
from helpers import PEOPLE, people

from memwal import (
    FencedError,
    InvalidValueError,
    PrimaryKeyError,
    SchemaMismatchError,
    ShardingSpecError,
    ShardRoutingError,
    Table,
    TableExistsError,
    TableNotFoundError,
    UnknownColumnError,
    WriterConfig,
    readers,
)
from memwal.core import paths
from memwal.write.pool import ShardWriterPool


def live(uri: str) -> dict:
    return {r["id"]: r for r in readers.open(uri).scan().to_pylist()}


def test_create_open_write_delete_read(table_uri):
    t = Table.create(table_uri, PEOPLE, ["id"], "bucket(id, 4)")
    t.write(people(range(100)))
    t.write(people([5, 6], tag="new"))
    t.delete({"id": [7, 8, 1000]})  # deleting an absent key is a no-op
    t.close()
    rows = live(table_uri)
    assert len(rows) == 98
    assert rows[5]["name"] == "new5" and rows[9]["name"] == "v9"
    assert 7 not in rows and 8 not in rows

    again = Table.open(table_uri)
    assert again.primary_key == ("id",)
    assert again.spec.render() == "bucket(id, 4)"
    assert again.metadata.table_uuid == t.metadata.table_uuid
    assert len(again.manifests.list_shards()) == 4


def test_last_write_wins_within_one_write(table_uri):
    with Table.create(table_uri, PEOPLE, ["id"], "bucket(id, 3)") as t:
        t.write(pa.concat_tables([people([1, 2], "a"), people([1], "b"), people([2], "c"), people([1], "d")]))
    rows = live(table_uri)
    assert rows[1]["name"] == "d1" and rows[2]["name"] == "c2"


def test_composite_key(table_uri):
    schema = pa.schema([("region", pa.string()), ("id", pa.int32()), ("v", pa.int64())])
    with Table.create(table_uri, schema, ["region", "id"], "identity(region)") as t:
        t.write({"region": ["eu", "us", "eu"], "id": [1, 1, 2], "v": [10, 20, 30]})
        t.write({"region": ["eu"], "id": [1], "v": [11]})
        t.delete({"region": ["us"], "id": [1]})
    r = readers.open(table_uri)
    assert r.get(("eu", 1)) == {"region": "eu", "id": 1, "v": 11}
    assert r.get({"region": "eu", "id": 2})["v"] == 30
    assert r.get(("us", 1)) is None
    assert len(Table.open(table_uri).manifests.list_shards()) == 2


def test_large_write_is_split_at_max_memtable_rows(table_uri):
    t = Table.create(table_uri, PEOPLE, ["id"], "unsharded", writer=WriterConfig(max_memtable_rows=100))
    t.write(people(range(1050)))  # one Lance put may not exceed a MemTable
    assert t.writers.stats.puts == 11
    t.close()
    status = Table.open(table_uri).status()
    assert status.shards[0].sstables  # MemTables filled up and flushed along the way
    assert len(live(table_uri)) == 1050


def test_timed_seals_seal_writes_of_a_few_rows_with_the_writer_open(table_uri):
    """A due seal is made by the next write however few rows it has (fewer than the batches the
    MemTable still lacks): its last row is repeated, which no reader sees and the flush drops."""
    t = Table.create(table_uri, PEOPLE, ["id"], "unsharded")
    t.writers.seal_interval_seconds = interval = 0.2
    t.write(people([0]))  # opens the writer: its seal is due an interval later
    writes = [people([1]), pa.concat_tables([people([2], "a"), people([1], "b"), people([2], "c")]), people([3]), people([3], "d")]
    for w in writes:
        time.sleep(interval)
        t.write(w)
    assert (t.writers.stats.opens, t.writers.stats.seals, t.writers.stats.flushes) == (1, 4, 0)
    (shard,) = t.writers.open_shards
    manifests = Table.open(table_uri).manifests
    deadline = time.monotonic() + 60
    while len(manifests.read_shard(shard).sstables) < 4:  # Lance flushes sealed MemTables in the background
        assert time.monotonic() < deadline, "sealed MemTables were not flushed"
        time.sleep(0.05)
        manifests.clear_cache()
    ssts = sorted(manifests.read_shard(shard).sstables, key=lambda s: s.generation)
    kept = [lance.dataset(paths.sstable_path(table_uri, shard, s.path)).to_table(columns=["id", "name"]).to_pylist() for s in ssts]
    assert [sorted((r["id"], r["name"]) for r in rows) for rows in kept] == [
        [(0, "v0"), (1, "v1")], [(1, "b1"), (2, "c2")], [(3, "v3")], [(3, "d3")]]
    assert {i: r["name"] for i, r in live(table_uri).items()} == {0: "v0", 1: "b1", 2: "c2", 3: "d3"}  # eventual: SSTables only
    t.close()


def test_writer_is_cached_per_shard(table_uri):
    with Table.create(table_uri, PEOPLE, ["id"], "bucket(id, 2)") as t:
        for i in range(5):
            t.write(people(range(i * 10, i * 10 + 10)))
        assert t.writers.stats.opens == 2


def test_fenced_writer_reopens_and_retries(table_uri):
    t = Table.create(table_uri, PEOPLE, ["id"], "unsharded")
    t.write(people([1]))
    (shard,) = t.writers.open_shards
    rival = lance.dataset(table_uri).mem_wal_writer(shard)  # a newer writer claims the shard
    t.write(people([2]))  # fenced, reopened, retried
    assert t.writers.stats.fenced_retries == 1
    with pytest.raises(OSError, match="Writer fenced"):
        rival.put(people([3]))  # the reopen claimed the shard back: the rival is fenced now
    t.close()
    assert sorted(live(table_uri)) == [1, 2]  # row 1, acknowledged before the fence, survives


class RivalAfterReopen(ShardWriterPool):
    """A pool whose reopen is immediately followed by a rival claim: the retry is fenced too."""

    rivals: list

    def _open(self, shard_id):
        w = super()._open(shard_id)
        if self.stats.opens > 1:
            self.rivals.append(lance.dataset(self.state.uri).mem_wal_writer(shard_id))
        return w


def test_fenced_twice_raises_fenced_error(table_uri):
    t = Table.create(table_uri, PEOPLE, ["id"], "unsharded")
    t.writers = RivalAfterReopen(t.state)
    t.writers.rivals = []
    t.write(people([1]))
    (shard,) = t.writers.open_shards
    t.writers.rivals.append(lance.dataset(table_uri).mem_wal_writer(shard))
    with pytest.raises(FencedError, match="fenced twice"):
        t.write(people([2]))
    t.writers.rivals[-1].close()  # the newest claim owns the shard and flushes row 1
    assert 1 in live(table_uri)


# -- schema and key errors ---------------------------------------------------------------------


def test_schema_mismatch_names_the_column(table_uri):
    t = Table.create(table_uri, PEOPLE, ["id"], "unsharded")
    with pytest.raises(SchemaMismatchError, match="'score'"):
        t.write({"id": [1], "name": ["a"], "score": ["not a number"]})
    with pytest.raises(SchemaMismatchError, match="'colour'"):
        t.write({"id": [1], "name": ["a"], "score": [1.0], "colour": ["red"]})
    with pytest.raises(SchemaMismatchError, match="'id'"):
        t.write({"name": ["a"]})
    with pytest.raises(SchemaMismatchError, match="primary key column 'id' has 1 null"):
        t.write({"id": [1, None], "name": ["a", "b"], "score": [1.0, 2.0]})
    with pytest.raises(SchemaMismatchError, match="'id'"):
        t.write(pa.table({"id": pa.array([1.5])}))  # a float key would be truncated: refused
    # lossless widening and missing nullable columns are fine
    t.write(pa.table({"id": pa.array([1], pa.int32()), "name": ["a"]}))
    t.close()
    assert live(table_uri)[1] == {"id": 1, "name": "a", "score": None}
    assert readers.open(table_uri).get(1) == {"id": 1, "name": "a", "score": None}  # unsharded lookup


def test_create_errors(table_uri):
    with pytest.raises(PrimaryKeyError, match="needs a primary key"):
        Table.create(table_uri, PEOPLE, [], "unsharded")
    with pytest.raises(UnknownColumnError, match="'nope'"):
        Table.create(table_uri, PEOPLE, ["nope"], "unsharded")
    with pytest.raises(PrimaryKeyError, match="'score' has type double"):
        Table.create(table_uri, PEOPLE, ["score"], "unsharded")
    with pytest.raises(UnknownColumnError, match="names column 'region'"):
        Table.create(table_uri, PEOPLE, ["id"], "identity(region)")
    with pytest.raises(ShardingSpecError, match="not part of the primary key"):
        Table.create(table_uri, PEOPLE, ["id"], "identity(name)")
    with pytest.raises(ShardingSpecError, match="reserved"):
        Table.create(table_uri, PEOPLE.append(pa.field("_x", pa.int32())), ["id"], "unsharded")
    Table.create(table_uri, PEOPLE, ["id"], "unsharded")
    with pytest.raises(TableExistsError):
        Table.create(table_uri, PEOPLE, ["id"], "unsharded")


def test_open_errors(tmp_path):
    with pytest.raises(TableNotFoundError, match="no table"):
        Table.open(str(tmp_path / "missing"))
    plain = str(tmp_path / "plain")
    lance.write_dataset(people([1]), plain)
    with pytest.raises(TableNotFoundError, match="not a memwal table"):
        Table.open(plain)


def test_write_shard_refuses_misrouted_rows(table_uri):
    t = Table.create(table_uri, PEOPLE, ["id"], "bucket(id, 4)")
    rows = people(range(20))
    values = t.spec.shard_value_arrays(rows)[0].to_pylist()
    own = t.shard_id_of((values[0],))
    mine = rows.filter(pa.array([v == values[0] for v in values]))
    t.write_shard(own, (values[0],), mine)
    with pytest.raises(ShardRoutingError, match=f"not to shard {own}"):
        t.write_shard(own, (values[0],), rows)
    t.close()
    assert sorted(live(table_uri)) == sorted(mine.column("id").to_pylist())


def test_delete_accepts_full_rows_and_ignores_other_columns(table_uri):
    with Table.create(table_uri, PEOPLE, ["id"], "bucket(id, 2)") as t:
        t.write(people(range(10)))
        t.delete(people([3, 4]))
    assert sorted(live(table_uri)) == [0, 1, 2, 5, 6, 7, 8, 9]


# -- routing is the same in every process ------------------------------------------------------------


def test_every_process_routes_identically(table_uri):
    t = Table.create(table_uri, PEOPLE, ["id"], "bucket(id, 8)")
    here = [t.shard_of_key({"id": i}) for i in range(50)]
    code = (
        "import sys; from memwal import Table; t = Table.open(sys.argv[1]); "
        "print(','.join(t.shard_of_key({'id': i}) for i in range(50)))"
    )
    out = subprocess.run([sys.executable, "-c", code, table_uri], capture_output=True, text=True, check=True)
    assert out.stdout.strip().split(",") == here
    assert len(set(here)) == 8


# -- memwal-only transforms on manual shards -----------------------------------------------------------


@pytest.mark.parametrize(
    "spec,expected_shards",
    [
        ("hour(ts)", 3),
        ("day(ts)", 2),
        ("month(ts)", 1),
        ("year(ts)", 1),
        ("truncate(id, 10)", 3),
        ("truncate(ts, 10)", 2),
        ("multi_bucket(id, ts, 4)", None),
        ("bucket(id, 2), hour(ts)", None),
    ],
)
def test_memwal_only_transforms_on_manual_shards(table_uri, spec, expected_shards):
    # Lance cannot key a table on timestamps, so time-sharded tables key on ISO strings.
    schema = pa.schema([("ts", pa.string()), ("id", pa.int64()), ("v", pa.string())])
    base = dt.datetime(2026, 1, 1, 22)
    rows = [{"ts": (base + dt.timedelta(hours=i % 3)).isoformat(), "id": i, "v": f"x{i}"} for i in range(30)]
    with Table.create(table_uri, schema, ["ts", "id"], spec) as t:
        assert not t.spec.lance_native
        t.write(pa.Table.from_pylist(rows, schema=schema))
    t = Table.open(table_uri)
    status = t.status()
    if expected_shards is not None:
        assert status.num_shards == expected_shards
    # Lance treats them as manual shards; memwal's shard values are recorded in the manifest.
    for s in status.shards:
        m = t.manifests.read_shard(s.shard_id)
        assert m.shard_spec_id == 0
        assert t.shard_id_of(tuple(t.shard_values(m).values())) == s.shard_id
    got = {r["id"]: r["v"] for r in readers.open(table_uri).scan().to_pylist()}
    assert got == {r["id"]: r["v"] for r in rows}
    assert lance.dataset(table_uri).mem_wal_index_details()["sharding_specs"] == []


def test_unparseable_time_key_is_refused_with_the_value(table_uri):
    schema = pa.schema([("day", pa.string()), ("id", pa.int64())])
    with Table.create(table_uri, schema, ["day", "id"], "day(day)") as t:
        with pytest.raises(InvalidValueError, match="yesterday"):
            t.write({"day": ["2026-01-01", "yesterday"], "id": [1, 2]})
