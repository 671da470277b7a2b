"""The write path (memwal.write.protocol) against a simple model: records applied one by one.

A batch of records for one shard (upserts and deletes, full or partial, with a sequence
field and an arrival order, stale records dropped against what is stored) must leave the
table exactly as applying its records one at a time, in (sequence, arrival) order, to a dict
would, skipping each record older than its key's stored version. The stored versions come
from earlier batches written the same way: live rows, and deletes whose sequences are
recorded beside the table. The batch is written by the writer that wrote them (it remembers
their sequences) or by a new one (it reads them back).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from memwal import Table, readers
from memwal.core.partial import presence_of_dicts, presence_type
from memwal.core.routing import route
from memwal.core.schema import conform
from memwal.core.state import TableState
from memwal.write.protocol import ShardRecords, TableWriter, WriteMode

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64()),
        pa.field("name", pa.string()),
        pa.field("amount", pa.decimal128(10, 2)),
        pa.field("pos", pa.int64()),
    ]
)
VALUES = ("name", "amount")

record = st.fixed_dictionaries(
    {
        "id": st.integers(0, 4),
        "delete": st.booleans(),
        "pos": st.integers(0, 6),
        # the value columns a partial record carries (full records carry all of them)
        "carries": st.lists(st.sampled_from(VALUES), unique=True),
        "name": st.one_of(st.none(), st.text(alphabet="xyzé", max_size=12)),
        "amount": st.one_of(st.none(), st.decimals(min_value=-999, max_value=999, places=2, allow_nan=False, allow_infinity=False)),
    }
)


def shard_records(state: TableState, records: list[dict], partial: bool) -> ShardRecords:
    """``records`` (in arrival order) as the one shard's records of a batch."""
    dicts = [
        {"id": r["id"], "pos": r["pos"], **({} if r["delete"] else {c: r[c] for c in (r["carries"] if partial else VALUES)})}
        for r in records
    ]
    rows = conform(pa.Table.from_pylist(dicts, schema=SCHEMA), state.write_schema)
    (routed,) = route(rows, state.spec.shard_value_arrays(rows), state.resolver)
    ptype = presence_type(state.write_schema, state.primary_key)
    return ShardRecords(
        routed.shard_id,
        routed.values,
        routed.rows,
        deletes=np.array([r["delete"] for r in records]),
        order=np.arange(len(records)) * 7 + 3,  # arrival positions need not be dense
        present=presence_of_dicts(dicts, ptype) if partial else None,
    )


def apply(model: dict[int, dict], versions: dict[int, int], records: list[dict], partial: bool) -> int:
    """The model: apply ``records`` in (sequence, arrival) order, dropping those older than the
    key's stored version (``versions``, as of before the batch). Returns how many were dropped:
    records, or in full mode keys (only a key's newest record is written, so only it is checked)."""
    stale_records: list[int] = []
    batch_versions = dict(versions)
    for r in sorted(records, key=lambda r: r["pos"]):  # sorted() is stable: arrival order breaks ties
        k = r["id"]
        if k in versions and r["pos"] < versions[k]:
            stale_records.append(k)
            continue
        batch_versions[k] = r["pos"]
        if r["delete"]:
            model.pop(k, None)
            continue
        carried = r["carries"] if partial else VALUES
        row = model.get(k) or {"id": k, **{c: None for c in VALUES}}
        model[k] = {**row, **{c: r[c] for c in carried}, "pos": r["pos"]}
    newest = {r["id"]: r["pos"] for r in sorted(records, key=lambda r: r["pos"])}
    stale = len(stale_records) if partial else sum(1 for k, pos in newest.items() if k in versions and pos < versions[k])
    versions.clear()
    versions.update(batch_versions)
    return stale


def normal(row: dict[str, Any]) -> dict[str, Any]:
    amount = row["amount"]
    return {**row, "amount": None if amount is None else Decimal(amount).quantize(Decimal("0.01"))}


@settings(max_examples=25)
@given(
    batches=st.lists(st.lists(record, min_size=1, max_size=8), min_size=1, max_size=3),
    partial=st.booleans(),
    same_writer=st.booleans(),
)
def test_batches_leave_the_table_as_their_records_applied_one_by_one(tmp_path_factory, batches, partial, same_writer):
    uri = str(tmp_path_factory.mktemp("wp") / "t")
    Table.create(uri, SCHEMA, ["id"], "unsharded").close()
    mode = WriteMode(merge="partial" if partial else "full", sequence_field="pos", drop_stale=True)
    model: dict[int, dict] = {}
    versions: dict[int, int] = {}
    writer = TableWriter(TableState.load(uri))
    try:
        for i, batch in enumerate(batches):
            if not same_writer and i:
                writer.close()  # a new writer knows nothing: it reads sequences back (rows, recorded deletes)
                writer = TableWriter(TableState.load(uri))
            result = writer.write_shard(shard_records(writer.state, batch, partial), mode)
            expected_stale = apply(model, versions, batch, partial)
            assert result.stale_dropped == expected_stale
            assert result.records == len(batch)
    finally:
        writer.close()
    with readers.open(uri, consistency="strong") as reader:
        got = {r["id"]: normal(r) for r in reader.scan().to_pylist()}
    assert got == {k: normal(v) for k, v in model.items()}


def test_a_partial_delete_with_a_sequence_is_recorded_for_later_writers(tmp_path):
    """``--merge partial --drop-stale`` with a delete: the delete's sequence is recorded beside
    the table like a full delete's (before the write path, the sink's write task failed on it:
    the folded deletes had lost the sequence column)."""
    from memwal.write.deleted import deleted_sequences_uri, read_deletes

    uri = str(tmp_path / "t")
    Table.create(uri, SCHEMA, ["id"], "unsharded").close()
    mode = WriteMode(merge="partial", sequence_field="pos", drop_stale=True)
    first = {"id": 1, "delete": False, "pos": 10, "carries": ["name"], "name": "a", "amount": None}
    delete = {"id": 1, "delete": True, "pos": 20, "carries": [], "name": None, "amount": None}
    late = {"id": 1, "delete": False, "pos": 15, "carries": ["amount"], "name": None, "amount": Decimal("1.50")}
    with Table.open(uri) as t:
        t.writer.write_shard(shard_records(t.state, [first], True), mode)
        result = t.writer.write_shard(shard_records(t.state, [delete], True), mode)
        assert (result.deletes, result.upserts) == (1, 0)
        (shard,) = t.manifests.list_shards()
    assert read_deletes(deleted_sequences_uri(uri), shard, ["id"], "pos", None) == {(1,): 20}
    with Table.open(uri) as t:  # a new writer: it knows the delete only from the record beside the table
        assert t.writer.write_shard(shard_records(t.state, [late], True), mode).stale_dropped == 1
    assert readers.open(uri, consistency="strong").get(1) is None
