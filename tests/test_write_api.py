"""The one write API (memwal.write.api) against a model: batches prepared in several messages,
committed, some replayed after a "crash", some empty.

A batch is a list of records (upserts and deletes over a few composite keys with decimal and
date values, and records that cannot be written); it is prepared as several messages, as the
tasks of one micro-batch prepare it (each message a contiguous slice of the records: a task
reads a partition in order), and committed. A batch may be "replayed": prepared and committed
again, as Spark runs a micro-batch again after a crash, and a crash may also have cut its
first run after some of its messages were prepared and before the commit. The table must end
as the records applied one by one (later wins per key), every dead letter recorded once, and
the reports must count what came in.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from helpers import examples

from memwal import Table, readers
from memwal.core.state import TableState
from memwal.write.api import TableWrite, WriteBatch, WriteReport
from memwal.write.dead_letters import dead_letter_uri, read_dead_letters
from memwal.write.messages import DEAD_SCHEMA, ERROR, KEY, KPART, OFFSET, ORDER, RAW, TOPIC
from memwal.write.worker import WORKER, WorkerShards

SCHEMA = pa.schema(
    [
        pa.field("region", pa.string()),
        pa.field("id", pa.int64()),
        pa.field("amount", pa.decimal128(12, 2)),
        pa.field("day", pa.date32()),
        pa.field("note", pa.string()),
    ]
)
KEY_COLUMNS = ["region", "id"]

record = st.fixed_dictionaries(
    {
        "region": st.sampled_from(["eu", "us", "ασία"]),
        "id": st.integers(0, 5),
        "delete": st.booleans(),
        "bad": st.integers(0, 9).map(lambda x: x == 0),  # one in ten cannot be written
        "amount": st.decimals(min_value=-10**6, max_value=10**6, places=2, allow_nan=False, allow_infinity=False),
        "day": st.dates(min_value=dt.date(1900, 1, 1), max_value=dt.date(2100, 1, 1)),
        "note": st.text(max_size=30),
    }
)
batch = st.lists(record, max_size=25)
run = st.fixed_dictionaries({"records": batch, "messages": st.integers(1, 3), "replay": st.booleans(), "cut": st.booleans()})


def prepare(write: TableWrite, state: TableState, records: list[dict], batch_id: int, messages: int) -> list:
    """``records`` prepared as ``messages`` contiguous slices (the tasks of one micro-batch)."""
    bounds = np.linspace(0, len(records), messages + 1).astype(int)
    out = []
    for part in range(messages):
        mine = list(enumerate(records))[bounds[part]:bounds[part + 1]]
        good = [(i, r) for i, r in mine if not r["bad"]]
        rows = pa.Table.from_pylist([{c: r[c] for c in SCHEMA.names} for _, r in good], schema=SCHEMA)
        order = np.array([batch_id * 1000 + i for i, _ in good], np.int64)
        deletes = np.array([r["delete"] for _, r in good], bool)
        shard_records = WORKER.table(state.uri).writer.route(rows.cast(state.write_schema), deletes=deletes, order=order)
        bad = [(i, r) for i, r in mine if r["bad"]]
        dead = pa.Table.from_pylist(
            [{ORDER: batch_id * 1000 + i, ERROR: "not valid", TOPIC: "t", KPART: 0, OFFSET: batch_id * 1000 + i, KEY: None,
              RAW: b"{bad"} for i, _ in bad], schema=DEAD_SCHEMA)
        out.append(write.prepare(WriteBatch(shard_records, dead), label=f"batch-{batch_id}"))
    return out


@settings(max_examples=examples(25, least=10), deadline=None)
@given(st.lists(run, min_size=1, max_size=6))
def test_prepared_and_committed_batches_equal_the_records_applied_in_order(tmp_path_factory, runs):
    uri = str(tmp_path_factory.mktemp("api") / "t")
    Table.create(uri, SCHEMA, KEY_COLUMNS, "bucket(id, 2)").close()
    state = TableState.load(uri)
    write = TableWrite(state, shards=WorkerShards(uri))
    model: dict[tuple, dict] = {}
    dead: set[str] = set()
    try:
        for batch_id, r in enumerate(runs):
            records = r["records"]
            if r["cut"]:  # a first run that died after preparing, before its commit
                prepare(write, state, records, batch_id, r["messages"])
            report = write.commit(prepare(write, state, records, batch_id, r["messages"]), batch_id)
            if r["replay"]:  # Spark runs the micro-batch again
                again = write.commit(prepare(write, state, records, batch_id, r["messages"]), batch_id)
                assert again.rows == report.rows and again.dead_letters == report.dead_letters
            assert isinstance(report, WriteReport) and report.batch_id == batch_id
            assert report.rows == len(records)
            assert report.dead_letters == sum(x["bad"] for x in records)
            for i, x in enumerate(records):
                if x["bad"]:
                    dead.add(f"t/0/{batch_id * 1000 + i}")
                    continue
                key = (x["region"], x["id"])
                if x["delete"]:
                    model.pop(key, None)
                else:
                    model[key] = {c: x[c] for c in SCHEMA.names}
    finally:
        WORKER.clear()  # flushes: every reader sees the writes
    got = {(row["region"], row["id"]): row for row in readers.open(uri).scan().to_pylist()}
    assert got == {k: {**v, "amount": Decimal(v["amount"]).quantize(Decimal("0.01"))} for k, v in model.items()}
    letters = read_dead_letters(dead_letter_uri(uri)).column("dlq_id").to_pylist()
    assert sorted(letters) == sorted(dead)  # each once, however often its batch ran


def test_an_empty_write_writes_nothing_and_says_so(tmp_path):
    uri = str(tmp_path / "t")
    table = Table.create(uri, SCHEMA, KEY_COLUMNS, "bucket(id, 2)")
    for empty in (SCHEMA.empty_table(), [], {"region": [], "id": [], "amount": [], "day": [], "note": []}):
        report = table.write(empty)
        assert (report.rows, report.shards, report.upserts, report.writer_opens) == (0, 0, 0, 0)
    assert table.delete({"region": [], "id": []}).rows == 0
    write = TableWrite(table.state, shards=table.writer)
    report = write.commit([write.prepare(WriteBatch())], 0)
    assert (report.rows, report.shards, report.dead_letters) == (0, 0, 0)
    table.close()
    assert readers.open(uri).scan().num_rows == 0
