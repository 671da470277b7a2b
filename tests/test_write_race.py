"""Racing writers: a write decided from what is stored must not lose another writer's update.

A partial write reads the key's stored row, merges the columns it carries over it and writes
the merged row. If another writer (a second process, a task retried elsewhere) writes the key
between that read and that write, the merged row carries the old values of every column the
partial record did not set, and the other writer's update is lost, unless the protocol tells
the first writer to decide again.

The interleaving is forced, not hoped for: writer A (a ``Table`` in a thread of this process)
stops at the failpoint ``write.decided.table``, after it has decided what to write and before
it writes; writer B (a ``Table`` in another process, which has no failpoint armed) then writes
the same key to completion; then A goes on. Whatever A and B did, the table must end as if
they had run one after the other, B first: B's write was acknowledged before A's.

Before the write path's one protocol (memwal.write.protocol), ``Table``'s partial write read the
stored row before it claimed the shard and wrote its decision through a new claim when
fenced: this test failed on it at once (B inserts ``name='a'``; A's partial ``{balance: None}``,
decided from "not stored", wrote ``name=None``).
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import threading
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memwal import Table, readers
from memwal.core.failpoints import DIR_ENV, ENV

SCHEMA = pa.schema(
    [
        pa.field("tenant", pa.string()),
        pa.field("id", pa.int64()),
        pa.field("name", pa.string()),
        pa.field("balance", pa.decimal128(12, 2)),
        pa.field("since", pa.date32()),
    ]
)
KEY = ("tenant", "id")
VALUES = ("name", "balance", "since")
POINT = "write.decided.table"

names = st.one_of(st.none(), st.text(alphabet="abcdefgh éü", min_size=1, max_size=40))
balances = st.one_of(st.none(), st.decimals(min_value=-10**6, max_value=10**6, places=2, allow_nan=False, allow_infinity=False))
dates = st.one_of(st.none(), st.dates(min_value=datetime.date(1990, 1, 1), max_value=datetime.date(2030, 12, 31)))
COLUMN = {"name": names, "balance": balances, "since": dates}


@st.composite
def columns(draw, min_size: int = 1) -> dict[str, Any]:
    """Some value columns (a partial record), each with a value or an explicit null."""
    chosen = draw(st.lists(st.sampled_from(VALUES), min_size=min_size, max_size=len(VALUES), unique=True))
    return {c: draw(COLUMN[c]) for c in chosen}


full_rows = st.fixed_dictionaries(COLUMN)
b_ops = st.one_of(
    st.tuples(st.just("partial"), columns()),
    st.tuples(st.just("full"), full_rows),
    st.tuples(st.just("delete"), st.just({})),
)


def apply(row: dict | None, op: str, cols: dict[str, Any], key: dict[str, Any]) -> dict | None:
    """The model: one write applied to a key's row (None: no row)."""
    if op == "delete":
        return None
    if op == "full" or row is None:
        return {**key, **{c: cols.get(c) for c in VALUES}}
    return {**row, **cols}


# -- writer B, in a process of its own ---------------------------------------------------------


def _writer_b(uri: str, conn) -> None:
    """Serve writes of a ``Table`` held open across requests (so B's writer is fenced by A's
    claims too, as a long-lived second writer would be)."""
    table = Table.open(uri)
    try:
        while True:
            request = conn.recv()
            if request is None:
                return
            op, record = request
            try:
                if op == "partial":
                    table.write([record], merge="partial")
                elif op == "full":
                    table.write([record])
                else:
                    table.delete([record])
                conn.send(None)
            except Exception as e:  # noqa: BLE001 - the test raises it in its own process
                conn.send(f"{type(e).__name__}: {e}")
    finally:
        table.close()


class WriterB:
    def __init__(self, uri: str) -> None:
        ctx = mp.get_context("spawn")  # a fresh interpreter: no failpoint armed, its own Lance
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_writer_b, args=(uri, child), daemon=True)
        self.process.start()

    def write(self, op: str, record: dict) -> None:
        self.conn.send((op, record))
        if not self.conn.poll(300):
            raise AssertionError("writer B did not answer within 300 s")
        error = self.conn.recv()
        assert error is None, f"writer B failed: {error}"

    def close(self) -> None:
        self.conn.send(None)
        self.process.join(60)


@pytest.mark.slow
def test_a_partial_write_racing_another_writer_loses_no_update(tmp_path, monkeypatch):
    uri = str(tmp_path / "t")
    Table.create(uri, SCHEMA, list(KEY), "bucket(id, 2)").close()
    b = WriterB(uri)  # started before the failpoint is armed: its environment has none
    a = Table.open(uri)
    points = tmp_path / "points"
    points.mkdir()
    marker = points / POINT
    reader = readers.open(uri, consistency="strong")
    ids = iter(range(1_000_000))

    @settings(max_examples=12)
    @given(initial=st.one_of(st.none(), full_rows), b_op=b_ops, a_cols=columns())
    def race(initial: dict | None, b_op: tuple[str, dict], a_cols: dict[str, Any]) -> None:
        key = {"tenant": "acme-éü", "id": next(ids)}
        if initial is not None:
            a.write([{**key, **initial}])
        op, cols = b_op
        monkeypatch.setenv(ENV, f"{POINT}=wait")
        monkeypatch.setenv(DIR_ENV, str(points))
        errors: list[BaseException] = []

        def write_a() -> None:
            try:
                a.write([{**key, **a_cols}], merge="partial")
            except BaseException as e:  # noqa: BLE001 - raised below, in the test's thread
                errors.append(e)

        thread = threading.Thread(target=write_a)
        thread.start()
        try:
            while not marker.exists():  # A has decided what to write, and waits
                assert thread.is_alive(), errors
                thread.join(0.01)
            b.write(op, {**key, **cols} if op != "delete" else key)
        finally:
            monkeypatch.delenv(ENV)
            while thread.is_alive():  # let A go on (past the point again, if it decides anew)
                marker.unlink(missing_ok=True)
                thread.join(0.01)
            marker.unlink(missing_ok=True)
        assert not errors, errors
        expected = apply(apply(initial and {**key, **initial}, op, cols, key), "partial", a_cols, key)
        got = reader.get(key)
        if expected is not None:
            expected = {**expected, "balance": None if expected["balance"] is None else Decimal(expected["balance"]).quantize(Decimal("0.01"))}
        assert got == expected, f"initial {initial}, B {op} {cols}, A partial {a_cols}"

    try:
        race()
    finally:
        b.close()
        a.close()
        reader.close()
        os.environ.pop(ENV, None)
