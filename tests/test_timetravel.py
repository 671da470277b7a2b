"""Time travel across the LSM: a reader ``as_of`` a base version or a moment reads the base
and the SSTables of that time, while GC keeps them; past that, a clear error naming the
oldest state it keeps (the GC boundary)."""

from __future__ import annotations

import datetime as dt
import time

import pyarrow as pa
import pytest

from memwal import IndexConfig, Table, readers
from memwal.maintain.compactor import Compactor
from memwal.core.errors import StateNotRetainedError
from memwal.maintain.gc import GarbageCollector, GcConfig
from memwal.readers import timetravel

SCHEMA = pa.schema([("id", pa.int64()), ("tag", pa.string())])
#: No base index: GC then waits for no index catch-up before collecting an SSTable.
NO_INDEX = IndexConfig(primary_key_btree=False)
PAUSE = 0.05  # between events, so their times (file modification times, commit times) are apart


def rows(ids, tag: str) -> pa.Table:
    return pa.table({"id": pa.array(list(ids), pa.int64()), "tag": [f"{tag}-{i}" for i in ids]}, schema=SCHEMA)


def history(uri: str, generations: int = 4) -> list[tuple[float, int, dict[int, str]]]:
    """A table through ``generations`` steps. Step g writes and deletes some keys and flushes
    (an SSTable), then the moment ``T_g`` is taken (the step's rows only in that SSTable),
    then it is compacted. Returns (T_g, the base version live at T_g, the model at T_g)."""
    model: dict[int, str] = {}
    states = []
    with Table.create(uri, SCHEMA, ["id"], "bucket(id, 2)", indexes=NO_INDEX) as t:
        compactor = Compactor(t.state)
        for g in range(generations):
            batch = rows(range(g * 5, g * 5 + 8), f"g{g}")
            t.write(batch)
            t.delete({"id": [g * 5]})
            t.flush()
            model.update({r["id"]: r["tag"] for r in batch.to_pylist()})
            model.pop(g * 5)
            time.sleep(PAUSE)
            states.append((time.time(), t.state.dataset().version, dict(model)))
            time.sleep(PAUSE)
            compactor.state.manifests.clear_cache()
            compactor.run_once()
            time.sleep(PAUSE)
    return states


def as_dict(reader) -> dict[int, str]:
    return {r["id"]: r["tag"] for r in reader.scan().to_pylist()}


def test_a_reader_as_of_a_moment_reads_that_moments_base_and_sstables(table_uri):
    states = history(table_uri)
    for at, version, model in states:
        for as_of in (at, dt.datetime.fromtimestamp(at, dt.timezone.utc), dt.datetime.fromtimestamp(at, dt.timezone.utc).replace(tzinfo=None)):
            past = readers.open(table_uri, as_of=as_of)
            assert past.past.base_version == version
            assert past.snapshot.num_live_sstables > 0  # that moment's rows were in SSTables
            assert as_dict(past) == model
            assert past.count() == len(model)
            assert {k: (past.get(k) or {}).get("tag") for k in range(25)} == {k: model.get(k) for k in range(25)}
    assert as_dict(readers.open(table_uri)) == states[-1][2]  # and now: all compacted since
    assert readers.open(table_uri).snapshot.num_live_sstables == 0


def test_a_reader_as_of_a_base_version_reads_the_table_when_it_was_committed(table_uri):
    states = history(table_uri, generations=3)
    # The version live at T_1 was committed by the compaction of step 0: then step 1's SSTable
    # was not flushed yet, so the table was step 0's rows, all in the base.
    _, version, _ = states[1]
    assert as_dict(readers.open(table_uri, as_of=version)) == states[0][2]
    assert as_dict(readers.open(table_uri, version=version)) == states[0][2]  # the older name
    assert readers.open(table_uri, as_of=version).snapshot.num_live_sstables == 0


def test_time_travel_refuses_what_never_was_and_strong_reads(table_uri):
    states = history(table_uri, generations=1)
    latest = readers.open(table_uri).snapshot.base_version
    with pytest.raises(StateNotRetainedError):
        readers.open(table_uri, as_of=latest + 5)
    with pytest.raises(StateNotRetainedError):
        readers.open(table_uri, as_of=states[0][0] - 3600)  # before the table existed
    with pytest.raises(StateNotRetainedError):
        readers.open(table_uri, as_of="yesterday")
    with pytest.raises(ValueError):
        readers.open(table_uri, as_of=states[0][0], consistency="strong")


def test_gc_keeps_the_states_of_its_time_travel_retention_and_names_the_oldest_after_it(table_uri):
    """The GC boundary: SSTables compacted within ``time_travel_seconds`` stay, so every state
    since is readable; the SSTables of older states go, and reading one raises an error
    naming the oldest state kept, which reads."""
    states = history(table_uri)
    gc_default = GarbageCollector(Table.open(table_uri).state, GcConfig(reader_grace_seconds=0, drain_interval_seconds=0))
    gc_default.run_once()  # the default retention (an hour) keeps every state here
    for at, _, model in states:
        assert as_dict(readers.open(table_uri, as_of=at)) == model

    # A retention reaching back to between step 1's compaction and T_2: steps 0 and 1's
    # SSTables were compacted before it and go; step 2's was compacted after it and stays.
    boundary = states[2][0] - PAUSE / 2
    config = GcConfig(reader_grace_seconds=0, drain_interval_seconds=0, time_travel_seconds=time.time() - boundary)
    removed = [g for r in GarbageCollector(Table.open(table_uri).state, config).run_once() for g in r.sstables_removed]
    assert removed  # the boundary collected something
    for at, _, model in states[2:]:
        assert as_dict(readers.open(table_uri, as_of=at)) == model
    for at, _, _ in states[:2]:
        with pytest.raises(StateNotRetainedError):
            readers.open(table_uri, as_of=at).scan()
    oldest = timetravel.oldest_readable(Table.open(table_uri).state)
    assert oldest is not None and states[1][0] < oldest[1] <= states[2][0]
    assert as_dict(readers.open(table_uri, as_of=oldest[0])) is not None
    assert as_dict(readers.open(table_uri)) == states[-1][2]  # the present is untouched


def test_gc_never_keeps_sstables_longer_than_the_base_versions_of_their_time():
    """A state needs its base version and manifests too: the SSTable retention is capped by them."""
    gc = GarbageCollector.__new__(GarbageCollector)
    for travel, base, manifests, grace, expected in ((3600, 3600, 3600, 300, 3600), (7200, 600, 3600, 300, 600),
                                                     (3600, 0, 0, 0, 0), (3600, 3600, 60, 300, 300), (0, 3600, 3600, 300, 300)):
        gc.config = GcConfig(time_travel_seconds=travel, base_version_retention_seconds=base,
                             manifest_retention_seconds=manifests, reader_grace_seconds=grace)
        assert gc.sstable_retention_seconds == expected
