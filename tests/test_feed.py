"""The change feed (memwal.readers.feed): replaying it reproduces the table, before-images are the
rows as they were, retention holds what a registered consumer has not read, and what GC
collected is a typed error naming the oldest readable position."""

from __future__ import annotations

import datetime as dt
import os
import decimal
from datetime import timedelta

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from memwal import readers, Table
from memwal.readers import feed
from memwal.maintain.compactor import Compactor
from memwal.core.errors import ChangesCollectedError
from memwal.maintain.gc import GarbageCollector, GcConfig
from memwal.core.indexes import IndexMaintainer

#: an order line: a composite key, a decimal, a date, a wide string
SCHEMA = pa.schema(
    [
        ("order_id", pa.int64()),
        ("line", pa.int32()),
        ("price", pa.decimal128(12, 2)),
        ("ship_date", pa.date32()),
        ("comment", pa.string()),
    ]
)
PK = ("order_id", "line")
NOW = GcConfig(
    reader_grace_seconds=0, manifest_retention_seconds=0, base_version_retention_seconds=0, drain_interval_seconds=0,
    time_travel_seconds=0, min_sstables_to_drain=1,
)


def order_row(order_id: int, line: int, v: int) -> dict:
    return {
        "order_id": order_id,
        "line": line,
        "price": decimal.Decimal(v * 37 % 100_000) / 100,
        "ship_date": dt.date(2026, 1, 1) + dt.timedelta(days=v % 300),
        "comment": f"v{v} " + "carefully final deposits " * (v % 4),
    }


def create(uri: str) -> Table:
    return Table.create(uri, SCHEMA, list(PK), "bucket(order_id, 2)")


def key_of(row: dict) -> tuple:
    return tuple(row[c] for c in PK)


def table_rows(t: Table) -> dict[tuple, dict]:
    with t.reader() as r:
        return {key_of(row): row for row in r.scan().to_pylist()}


def apply(mirror: dict[tuple, dict], rows: pa.Table) -> None:
    """Apply change rows to a model of the consumer's copy, checking every before-image."""
    for row in rows.to_pylist():
        kind = row.pop(feed.CHANGE_TYPE)
        for c in (feed.SHARD, feed.GENERATION, feed.COMMIT_TIME):
            row.pop(c)
        k = key_of(row)
        if kind == feed.INSERT:
            assert k not in mirror, f"insert of a present key {k}"
            mirror[k] = row
        elif kind == feed.UPDATE_PREIMAGE:
            assert mirror.get(k) == row, f"preimage of {k}"
        elif kind == feed.UPDATE_POSTIMAGE:
            assert k in mirror, f"update of an absent key {k}"
            mirror[k] = row
        else:
            assert kind == feed.DELETE
            assert k in mirror, f"delete of an absent key {k}"
            if any(v is not None for c, v in row.items() if c not in PK):
                assert mirror[k] == row, f"delete's row of {k}"
            del mirror[k]


def replay(target: Table, rows: pa.Table) -> None:
    """Apply change rows to a second table (what format('memwal') does with feed rows)."""
    from memwal.core.lsm import newest_per_key

    if not rows.num_rows:
        return
    net = rows.filter(pa.compute.not_equal(rows.column(feed.CHANGE_TYPE), feed.UPDATE_PREIMAGE))
    net = newest_per_key(net, PK)
    dead = pa.compute.equal(net.column(feed.CHANGE_TYPE), feed.DELETE)
    upserts = net.filter(pa.compute.invert(dead)).select(SCHEMA.names)
    deletes = net.filter(dead).select(list(PK))
    if upserts.num_rows:
        target.write(upserts)
    if deletes.num_rows:
        target.delete(deletes)


class FeedReplay(RuleBasedStateMachine):
    """Random upserts, deletes, flushes, compactions and GC (with version cleanup) on one
    table; a registered consumer reads the feed now and then and replays it into a second.
    Every before-image must match the consumer's copy, and in the end the copy, the second
    table and the first must be the same."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    @initialize()
    def setup(self) -> None:
        import tempfile

        self.dir = tempfile.mkdtemp(prefix="memwal-feed-")
        self.t = create(f"{self.dir}/a")
        self.copy = create(f"{self.dir}/b")
        self.model: dict[tuple, dict] = {}
        self.mirror: dict[tuple, dict] = {}
        self.consumer = feed.Consumer(self.t.state, "replay")
        self.position = self.consumer.commit(feed.start_at(self.t.state, self.t.dataset().version))

    @rule(keys=st.lists(st.tuples(st.integers(0, 11), st.integers(1, 2)), min_size=1, max_size=6), v=st.integers(0, 10**6))
    def upsert(self, keys: list, v: int) -> None:
        rows = {k: order_row(k[0], k[1], v + i) for i, k in enumerate(keys)}
        self.t.write(pa.Table.from_pylist(list(rows.values()), schema=SCHEMA))
        self.model.update(rows)

    @rule(keys=st.lists(st.tuples(st.integers(0, 11), st.integers(1, 2)), min_size=1, max_size=4))
    def delete(self, keys: list) -> None:
        self.t.delete(pa.Table.from_pylist([{"order_id": k[0], "line": k[1]} for k in keys], schema=pa.schema([SCHEMA.field(c) for c in PK])))
        for k in keys:
            self.model.pop(k, None)

    @rule()
    def flush(self) -> None:
        self.t.flush()

    @rule()
    def compact(self) -> None:
        Compactor(self.t.state).run_once()

    @rule()
    def collect(self) -> None:
        IndexMaintainer(self.t.state).catch_up()
        GarbageCollector(self.t.state, NOW).run_once()
        self.t.dataset().cleanup_old_versions(older_than=timedelta(0), error_if_tagged_old_versions=False)

    @rule()
    def maintain(self) -> None:
        """What a maintenance cycle does after a flush: fold, then collect."""
        self.flush()
        self.compact()
        self.collect()

    @rule()
    def consume(self) -> None:
        reader = feed.FeedReader(self.t.state, self.position)
        end = feed.head(self.t.state)
        rows = reader.read(end)
        apply(self.mirror, rows)
        replay(self.copy, rows)
        self.position = self.consumer.commit(reader.end_position(end))

    def teardown(self) -> None:
        if not hasattr(self, "t"):
            return
        self.t.flush()
        self.consume()
        assert self.mirror == self.model
        self.copy.flush()
        assert table_rows(self.copy) == self.model == table_rows(self.t)
        self.t.close()
        self.copy.close()
        import shutil

        shutil.rmtree(self.dir, ignore_errors=True)


TestFeedReplay = FeedReplay.TestCase
TestFeedReplay.settings = settings(
    max_examples=int(os.environ.get("FEED_EXAMPLES", "10")), stateful_step_count=12, deadline=None, suppress_health_check=list(HealthCheck)
)


def test_feed_rows_and_their_types(table_uri):
    t = create(table_uri)
    v0 = t.dataset().version
    t.write(pa.Table.from_pylist([order_row(1, 1, 1), order_row(2, 1, 2)], schema=SCHEMA))
    t.flush()
    t.write(pa.Table.from_pylist([order_row(1, 1, 3)], schema=SCHEMA))
    t.delete(pa.Table.from_pylist([{"order_id": 2, "line": 1}]).cast(pa.schema([SCHEMA.field(c) for c in PK])))
    t.write(pa.Table.from_pylist([order_row(3, 1, 4)], schema=SCHEMA))
    t.delete(pa.Table.from_pylist([{"order_id": 3, "line": 1}]).cast(pa.schema([SCHEMA.field(c) for c in PK])))
    t.flush()
    Compactor(t.state).run_once()
    with t.reader() as r:
        got = r.changes(since=v0)
    assert got.schema.names == [*SCHEMA.names, *feed.FEED_COLUMNS]
    kinds = sorted((row["order_id"], row[feed.CHANGE_TYPE], row["comment"]) for row in got.to_pylist())
    assert kinds == [
        (1, "insert", "v1 carefully final deposits "),
        (1, "update_postimage", "v3 carefully final deposits carefully final deposits carefully final deposits "),
        (1, "update_preimage", "v1 carefully final deposits "),
        (2, "delete", "v2 carefully final deposits carefully final deposits "),
        (2, "insert", "v2 carefully final deposits carefully final deposits "),
    ]  # key 3, inserted and deleted within one generation, nets to nothing
    # the same changes after compaction folded them, and up to a base version only
    assert r.state  # the reader's state stays usable after close
    after = readers.open(table_uri).changes(since=v0, until=t.dataset().version)
    assert sorted(after.to_pylist(), key=str) == sorted(got.to_pylist(), key=str)


def test_collected_changes_raise_naming_the_oldest_position(table_uri):
    t = create(table_uri)
    v0 = t.dataset().version
    for v in range(3):
        t.write(pa.Table.from_pylist([order_row(v, 1, v)], schema=SCHEMA))
        t.flush()
        Compactor(t.state).run_once()
    IndexMaintainer(t.state).catch_up()
    GarbageCollector(t.state, NOW).run_once()
    with pytest.raises(ChangesCollectedError) as e:
        readers.open(table_uri).changes(since=v0)
    oldest = e.value.oldest
    assert isinstance(oldest, feed.Position) and oldest.base_version > v0
    assert readers.open(table_uri).changes(since=oldest.base_version).num_rows == 0


def test_a_registered_consumer_holds_its_changes_until_retention_ends(table_uri):
    t = create(table_uri)
    consumer = feed.Consumer(t.state, "downstream")
    consumer.commit(feed.start_at(t.state, t.dataset().version))
    for v in range(3):
        t.write(pa.Table.from_pylist([order_row(v, 1, v)], schema=SCHEMA))
        t.flush()
        Compactor(t.state).run_once()
    IndexMaintainer(t.state).catch_up()
    GarbageCollector(t.state, NOW).run_once()
    t.dataset().cleanup_old_versions(older_than=timedelta(0), error_if_tagged_old_versions=False)
    rows = feed.FeedReader(t.state, consumer.position()).read(feed.head(t.state))
    assert sorted(rows.column("order_id").to_pylist()) == [0, 1, 2]
    # a consumer that stops committing is released after the retention
    GarbageCollector(t.state, GcConfig(**{**NOW.__dict__, "feed_retention_seconds": 0})).run_once()
    assert feed.consumers(t.state) == []
    t.dataset().cleanup_old_versions(older_than=timedelta(0), error_if_tagged_old_versions=False)
    with pytest.raises(ChangesCollectedError):
        feed.FeedReader(t.state, feed.Position.from_json({"base_version": 3, "consumed": {}})).read(feed.head(t.state))


def test_a_position_taken_between_the_two_passes_of_a_compaction_keeps_its_deletes(table_uri):
    """The delete pass of a generation with tombstones and live rows commits without the
    marker: a position anchored there must still see the deleted keys' rows as they were."""
    t = create(table_uri)
    keys = pa.schema([SCHEMA.field(c) for c in PK])
    t.write(pa.Table.from_pylist([order_row(i, 1, i) for i in range(20)], schema=SCHEMA))
    t.flush()
    Compactor(t.state).run_once()
    t.delete(pa.Table.from_pylist([{"order_id": i, "line": 1} for i in range(5)], schema=keys))
    t.write(pa.Table.from_pylist([order_row(i, 1, 100 + i) for i in range(5, 10)], schema=SCHEMA))
    t.flush()
    c = Compactor(t.state)
    plans = [p for p in (c.plan(s) for s in t.manifests.list_shards()) if p is not None]
    assert any(p.dead.num_rows and p.live.num_rows for p in plans)
    for p in plans:
        c.delete_pass(p)
    between = t.dataset().version
    start = feed.start_at(t.state, between)
    assert start.base_version < between  # anchored before the delete pass
    for p in plans:
        c.upsert_pass(p)
    got = feed.FeedReader(t.state, start).read(feed.head(t.state))
    deletes = got.filter(pa.compute.equal(got.column(feed.CHANGE_TYPE), feed.DELETE))
    # a shard whose generation held only tombstones folded it in one commit, before the position
    two_pass = [p for p in plans if p.dead.num_rows and p.live.num_rows]
    expected = sorted(k for p in two_pass for k in p.dead.column("order_id").to_pylist())
    assert sorted(deletes.column("order_id").to_pylist()) == expected
    assert deletes.column("comment").to_pylist() == [order_row(i, 1, i)["comment"] for i in deletes.column("order_id").to_pylist()]
    updated = sorted(k for p in two_pass for k in p.live.column("order_id").to_pylist())
    pre = got.filter(pa.compute.equal(got.column(feed.CHANGE_TYPE), feed.UPDATE_PREIMAGE))
    assert sorted(pre.column("order_id").to_pylist()) == updated


def test_the_command_line_prints_changes_resumes_and_commits_a_consumer(table_uri, capsys):
    import json

    from memwal import cli

    t = create(table_uri)
    v0 = t.dataset().version
    t.write(pa.Table.from_pylist([order_row(1, 1, 1), order_row(2, 1, 2)], schema=SCHEMA))
    t.flush()
    assert cli.main(["changes", table_uri, "--since", str(v0), "--json", "--consumer", "audit"]) == 0
    out = capsys.readouterr()
    rows = [json.loads(line) for line in out.out.splitlines()]
    assert sorted((r["order_id"], r[feed.CHANGE_TYPE]) for r in rows) == [(1, "insert"), (2, "insert")]
    position = out.err.split("next position: ", 1)[1].strip()
    t.write(pa.Table.from_pylist([order_row(1, 1, 5)], schema=SCHEMA))
    t.flush()
    # the consumer resumes where it committed; a printed position resumes the same
    assert cli.main(["changes", table_uri, "--consumer", "audit", "--json"]) == 0
    by_consumer = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert cli.main(["changes", table_uri, "--since", position, "--json"]) == 0
    by_position = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r[feed.CHANGE_TYPE] for r in by_consumer] == ["update_preimage", "update_postimage"]
    assert by_position == by_consumer
    assert cli.main(["changes", table_uri, "--consumer", "audit"]) == 0
    assert "(0 rows)" in capsys.readouterr().out
    assert cli.main(["changes", table_uri]) == 2  # neither --since nor a committed consumer
    capsys.readouterr()
