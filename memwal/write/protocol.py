"""The write path: what one shard's records of a batch become, and the protocol that writes them.

Every writer of a memwal table goes through here: ``Table.write``/``delete`` (one Python
process), the Spark sink's write task (in the Python worker, or in the executor's writer
process) and any later writer (a Spark data source's write task). Callers adapt their input
to :class:`ShardRecords`, one shard's records of a batch: routed where they write
(:meth:`TableWriter.route`: ``Table``, a data source's task) or upstream (the sink's prepare
stage); what the records mean and how they reach the shard's writer is decided here, once:

1. **Order within a batch**: by the sequence field when there is one (Paimon's
   ``sequence.field``), ties by arrival order (Kafka partition and offset; row order for a
   Python write). Later records win.
2. **Full mode**: the newest record per key is written, a delete as a delete.
   **Partial mode**: records fold per key (:func:`memwal.core.partial.fold`) and merge over the
   stored row of the keys that need it (:func:`memwal.core.partial.resolve`).
3. **Drop stale** (with a sequence field): a record older than its key's stored version (the
   live row's sequence, or the sequence of its recorded delete, :mod:`memwal.write.deleted`) is
   dropped, before folding, so a late record sets no column. An equal sequence is kept: a
   replayed batch writes the same rows again.
4. **The protocol**: a plan that read stored data (drop stale, partial merges) is decided as
   the shard's owner: claim the shard, then read and decide, then write with fenced retries
   off; fenced in between, decide again (up to :data:`DECIDE_ATTEMPTS` times). A plan that
   read nothing (full upserts, deletes) is written with one fenced retry.

Why (4) is what holds. A writer learns it was fenced only when it writes: its WAL append
collides with the fence sentinel the newer claim wrote. A read made after this writer's claim
sees every write acknowledged before it (acknowledged writes are in the WAL, and a strong read
reads the WAL tail), and every later write comes from a writer that claimed after this one and
so fences it: either this writer's write lands before any other claim, and nothing it did not
see was written in between, or it fails and is decided again from a read that sees the other
write. A decision written through a new claim after a fence would instead overwrite what the
other writer stored meanwhile with values read before it: a lost update, a deleted key back
(tests/test_write_race.py forces that interleaving between two processes). Plans that read
nothing need no such care: writing the newest record of each key again after a fence is
what last-write-wins makes idempotent. Within one process :class:`TableWriter` writes one
batch per shard at a time, so two threads sharing a writer never interleave a decision.

Plan apart from execute: :meth:`TableWriter.plan` makes a :class:`ShardPlan` (keys to delete,
full rows to upsert) from records and the stored data it reads; :meth:`TableWriter.execute`
writes a plan; :meth:`TableWriter.write_shard` runs the protocol around both and returns a
:class:`ShardWriteResult`, the typed record a caller reports (the sink's summary row; a data
source's commit message).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal.core.errors import FencedError, InvalidArgumentError, SchemaMismatchError
from memwal.core.failpoints import failpoint
from memwal.core.lsm import last_per_key, newest_per_key
from memwal.core.partial import PRESENT, fold, resolve
from memwal.core.routing import RoutedBatch, route
from memwal.core.schema import key_schema
from memwal.core.sharding import ShardValues
from memwal.core.state import TableState
from memwal.write.messages import FULL, ShardWriteResult, WriteMode
from memwal.write.pool import ShardWriterPool

log = logging.getLogger(__name__)

#: A shard write decided from stored data is decided again at most this often when another
#: claim fences the writer in between (more means another process keeps claiming the shard).
DECIDE_ATTEMPTS = 3

#: Shards of one batch are written in parallel threads, at most this many (each durable write
#: waits for its shard's WAL flush tick; Lance releases the GIL while it waits).
MAX_SHARD_THREADS = 8


def writer_id() -> str:
    """This process, as :attr:`ShardWriteResult.writer` names it (asked each time: a forked
    process has its own pid)."""
    return f"{socket.gethostname()}:{os.getpid()}"


_ORDER = "__memwal_write_order"
_DELETE = "__memwal_write_delete"

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class ShardRecords:
    """One shard's records of one batch, as the caller routed them.

    ``rows`` are conformed to the table's write schema (for a batch of deletes only, the key
    columns are enough). ``deletes``: a delete flag per row (None: every row is an upsert).
    ``order``: each row's arrival position, ascending = later (None: row order). ``present``:
    for partial records, the columns each one carries (:func:`memwal.core.partial.presence_type`).
    """

    shard_id: str
    values: ShardValues
    rows: pa.Table
    deletes: np.ndarray | None = None
    order: np.ndarray | None = None
    present: pa.StructArray | pa.ChunkedArray | None = None

    @classmethod
    def all_deletes(cls, shard_id: str, values: ShardValues, keys: pa.Table) -> "ShardRecords":
        return cls(shard_id, values, keys, np.ones(keys.num_rows, bool))


@dataclass(frozen=True)
class ShardPlan:
    """What one shard's records come to: keys to delete and full rows to upsert."""

    shard_id: str
    values: ShardValues
    #: Key columns, and the sequence field when there is one (its delete's sequence).
    deletes: pa.Table
    #: Rows in the table's write schema.
    upserts: pa.Table
    records: int
    stale_dropped: int = 0


@dataclass
class StoredSequences:
    """The stored sequence of keys of one shard, as far as this process knows: key tuple ->
    sequence of its newest version (a delete's too), None for a key with no live row.

    Invariant: an entry is the sequence of the key's newest stored version. It holds because
    only this process's writer writes the shard while the writer stays open (a writer that
    another one claimed is fenced, and reopening it counts as an open), and every write of the
    write path records what it wrote here. So the cache belongs to one writer generation (the
    shard's open count, :attr:`opens`): when the writer was (re)opened, what happened in
    between is unknown and the cache starts empty. Keys it does not know are read from the
    table, this shard only, once.
    """

    #: Keep at most this many keys; beyond that the cache starts over (memory stays bounded).
    MAX_KEYS = 1_000_000

    opens: int = -1
    known: dict[tuple[Any, ...], Any] = field(default_factory=dict)
    #: Key tuple -> newest delete sequence of keys deleted in the shard (read once per writer
    #: generation, then kept up to date here; :mod:`memwal.write.deleted`).
    deleted: dict[tuple[Any, ...], Any] | None = None

    def restart(self, opens: int) -> None:
        self.opens = opens
        self.known.clear()
        self.deleted = None

    def remember(self, keys: Sequence[tuple[Any, ...]], sequences: Sequence[Any]) -> None:
        if len(self.known) + len(keys) > self.MAX_KEYS:
            self.known.clear()
        self.known.update(zip(keys, sequences))


@dataclass
class _Shard:
    """This process's state of one shard: one batch at a time, its stored sequences, its reader."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    sequences: StoredSequences = field(default_factory=StoredSequences)
    #: A strong reader of this shard (its WAL-tail cache is per shard); new per writer generation.
    reader: Any = None


def key_tuples(rows: pa.Table, pk: Sequence[str]) -> list[tuple[Any, ...]]:
    return list(zip(*(rows.column(c).to_pylist() for c in pk)))


def in_parallel(fn: Callable[[T], R], items: Sequence[T], executor: ThreadPoolExecutor | None = None) -> list[R]:
    """``fn`` over ``items`` (one per shard) in threads, results in order; the first error raised."""
    if not items:
        return []
    if len(items) == 1:
        return [fn(items[0])]
    if executor is not None:
        return [f.result() for f in [executor.submit(fn, x) for x in items]]
    with ThreadPoolExecutor(max_workers=min(MAX_SHARD_THREADS, len(items)), thread_name_prefix="memwal-write") as pool:
        return [f.result() for f in [pool.submit(fn, x) for x in items]]


def relabel(rows: pa.Table, schema: pa.Schema, shard_id: str) -> pa.Table:
    """``rows`` with ``schema`` itself (zero copy: the exact field metadata Lance expects, the
    primary key), after checking they have its columns, types and nullability."""
    if not rows.schema.equals(schema):
        raise SchemaMismatchError(
            f"rows for shard {shard_id} have schema {rows.schema.to_string(show_schema_metadata=False)}, "
            f"not the writers' {schema.to_string(show_schema_metadata=False)}"
        )
    return pa.Table.from_arrays(rows.columns, schema=schema)


class TableWriter:
    """One process's write path into one table: its shard writers (a
    :class:`~memwal.write.pool.ShardWriterPool`) and what it knows of the stored data, per shard.

    Thread-safe: shards are written in parallel, one batch per shard at a time.
    """

    def __init__(self, state: TableState, writers: ShardWriterPool | None = None) -> None:
        self.state = state
        self.writers = writers or ShardWriterPool(state)
        self._shards: dict[str, _Shard] = {}
        self._guard = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None

    def route(
        self,
        rows: pa.Table,
        *,
        deletes: np.ndarray | None = None,
        order: np.ndarray | None = None,
        present: pa.StructArray | pa.ChunkedArray | None = None,
    ) -> list[ShardRecords]:
        """``rows`` (conformed to the write schema; the key columns are enough for deletes
        only) split by shard, each row with its delete flag, arrival order and presence: the
        records :meth:`write` takes. For callers that route in the process that writes (``Table``,
        a data source's write task); the Spark sink routes in its prepare stage instead."""
        extra = {name: col for name, col in ((_DELETE, deletes), (_ORDER, order), (PRESENT, present)) if col is not None}
        data = rows
        for name, col in extra.items():
            data = data.append_column(name, col if isinstance(col, (pa.Array, pa.ChunkedArray)) else pa.array(col))
        out = []
        for b in route(data, self.state.spec.shard_value_arrays(rows), self.state.resolver):
            part = b.rows.drop_columns(list(extra)) if extra else b.rows
            out.append(ShardRecords(
                b.shard_id,
                b.values,
                part,
                deletes=np.asarray(b.rows.column(_DELETE).to_numpy(zero_copy_only=False), bool) if deletes is not None else None,
                order=b.rows.column(_ORDER).to_numpy() if order is not None else None,
                present=b.rows.column(PRESENT) if present is not None else None,
            ))
        return out

    def _shard(self, shard_id: str) -> _Shard:
        with self._guard:
            return self._shards.setdefault(shard_id, _Shard())

    # -- the protocol -------------------------------------------------------------------------

    def write(self, batches: Sequence[ShardRecords], mode: WriteMode = FULL, *, label: str = "") -> list[ShardWriteResult]:
        """:meth:`write_shard` for every shard of a batch, in parallel; results in order. A
        batch names each shard once (its records of one shard in arrival order are one
        :class:`ShardRecords`): two of one shard would be written in no defined order."""
        ids = [b.shard_id for b in batches]
        if len(set(ids)) != len(ids):
            raise InvalidArgumentError(f"a batch names shard(s) {sorted({i for i in ids if ids.count(i) > 1})} more than once")
        if len(batches) > 1 and self._executor is None:
            with self._guard:
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(max_workers=MAX_SHARD_THREADS, thread_name_prefix="memwal-write")
        return in_parallel(lambda b: self.write_shard(b, mode, label=label), list(batches), self._executor)

    def write_shard(self, records: ShardRecords, mode: WriteMode = FULL, *, label: str = "") -> ShardWriteResult:
        """Write one shard's records: durable (in the shard's WAL) on return.

        ``label`` names the batch in failpoints (``write.decided.<label>``: decided, not yet
        written), for tests that interleave writers.
        """
        t0 = time.perf_counter()
        shard_id = records.shard_id
        stats = self.writers.shard_stats(shard_id)
        with self._shard(shard_id).lock:
            before = stats.snapshot()
            decided = mode.reads_stored
            attempts = DECIDE_ATTEMPTS if decided else 1
            for attempt in range(1, attempts + 1):
                if decided:
                    self.writers.claim(shard_id, records.values)
                plan = self.plan(records, mode)
                failpoint(f"write.decided.{label}")
                try:
                    self.execute(plan, retry_fenced=not decided)
                    failpoint(f"write.wrote.{label}")  # crash tests: some shards of a batch written, not all
                except FencedError:
                    if attempt == attempts:
                        raise
                    log.info("shard %s: fenced after deciding what to write; deciding again", shard_id)
                    continue
                break
            if mode.drop_stale:
                self._record_sequences(plan, str(mode.sequence_field))
            # Resident writers: a write into a shard whose seal was due sealed its MemTable
            # with the writer open (ShardWriterPool.put); a shard that does not seal that way
            # (durability "fsync") is flushed by closing its writer once its seal is overdue.
            if self.writers.seal_overdue(shard_id):
                self.writers.flush([shard_id])
        return ShardWriteResult(
            shard_id=shard_id,
            records=plan.records,
            upserts=plan.upserts.num_rows,
            deletes=plan.deletes.num_rows,
            stale_dropped=plan.stale_dropped,
            decisions=attempt,
            fenced_retries=stats.fenced_retries - before["fenced_retries"],
            writer_opens=stats.opens - before["opens"],
            stall_seconds=stats.stall_seconds - before["stall_seconds"],
            backpressure_waits=int(stats.slowdowns + stats.stalls - before["slowdowns"] - before["stalls"]),
            seals=int(stats.seals - before["seals"]),
            flushes=int(stats.flushes - before["flushes"]),
            seconds=time.perf_counter() - t0,
            writer=writer_id(),
        )

    def execute(self, plan: ShardPlan, *, retry_fenced: bool = True) -> None:
        """Write a plan: its deletes, then its upserts (one row per key, so the order between
        the two does not matter). ``retry_fenced=False`` for plans decided from stored data."""
        pk = list(self.state.primary_key)
        if plan.deletes.num_rows:
            keys = relabel(plan.deletes.select(pk), key_schema(self.state.write_schema, pk), plan.shard_id)
            self.writers.write(RoutedBatch(plan.shard_id, plan.values, keys, deletes=True), retry_fenced=retry_fenced)
        if plan.upserts.num_rows:
            rows = relabel(plan.upserts, self.state.write_schema, plan.shard_id)
            self.writers.write(RoutedBatch(plan.shard_id, plan.values, rows), retry_fenced=retry_fenced)

    # -- planning -------------------------------------------------------------------------------

    def plan(self, records: ShardRecords, mode: WriteMode = FULL) -> ShardPlan:
        """What ``records`` come to under ``mode``, reading the stored data it needs (strongly:
        the caller owns the shard's writer, see the module docstring)."""
        pk = list(self.state.primary_key)
        seq = mode.sequence_field
        n = records.rows.num_rows
        deletes = np.zeros(n, bool) if records.deletes is None else np.asarray(records.deletes, bool)
        if mode.merge == "full" and seq is None and records.order is None and (deletes.all() or not deletes.any()):
            # One kind of record, in the caller's order: Lance keeps each key's last row (a
            # later row of a put, a later put), which is the newest record per key.
            return self._as_given(records, deletes, n)
        if mode.merge == "full":
            return self._plan_full(records, mode, deletes)
        rows = records.rows.append_column(_DELETE, pa.array(deletes, pa.bool_()))
        if records.present is not None:
            rows = rows.append_column(PRESENT, records.present)
        if records.order is not None or seq is not None:
            order = np.arange(n, dtype=np.int64) if records.order is None else np.asarray(records.order, np.int64)
            rows = rows.append_column(_ORDER, pa.array(order, pa.int64()))
            # Arrow's sort is stable: equal keys keep their arrival order.
            rows = rows.sort_by(([(seq, "ascending")] if seq else []) + [(_ORDER, "ascending")]).drop_columns([_ORDER])
        stale = 0
        if mode.merge == "partial":
            if mode.drop_stale:  # per record, before folding: a stale record must not set any column
                rows, stale = self._drop_stale(records.shard_id, rows, str(seq))
            present = rows.column(PRESENT)
            data = rows.select(self.state.write_schema.names)
            folded = fold(data, present, rows.column(_DELETE), pk)
            need = folded.needs_stored
            stored = self.stored_rows(records.shard_id, folded.rows.filter(pa.array(need)).select(pk)) if need.any() else None
            _, ups = resolve(folded, stored, pk)
            # The deleted keys (their last record is a delete), with that delete's sequence.
            last = newest_per_key(rows.select(pk + ([seq] if seq else []) + [_DELETE]), pk)
            dels = last.filter(last.column(_DELETE)).drop_columns([_DELETE])
        return ShardPlan(records.shard_id, records.values, dels, ups, n, stale)

    def _plan_full(self, records: ShardRecords, mode: WriteMode, deletes: np.ndarray) -> ShardPlan:
        """Full upserts and deletes: each key's newest record (by sequence, then arrival),
        found from the key and order columns alone, then the rows taken once: a batch's rows
        (vectors, wide strings) are copied once, not once per step."""
        pk = list(self.state.primary_key)
        seq = mode.sequence_field
        rows = records.rows
        n = rows.num_rows
        narrow = rows.select(pk + ([seq] if seq is not None and seq not in pk else []))
        order = None if records.order is None else np.asarray(records.order, np.int64)
        if seq is not None or (order is not None and bool(np.any(order[1:] < order[:-1]))):
            by = pa.table({**({"s": narrow.column(seq)} if seq is not None else {}),
                           "o": pa.array(np.arange(n, dtype=np.int64) if order is None else order, pa.int64())})
            # Arrow's sort is stable: equal sequences keep their arrival order.
            positions = np.asarray(pc.sort_indices(by, sort_keys=([("s", "ascending")] if seq is not None else []) + [("o", "ascending")]))
            chosen = positions[last_per_key(narrow.take(pa.array(positions)), pk)]
        else:
            chosen = last_per_key(narrow, pk)
        stale = 0
        if mode.drop_stale:
            newest = narrow.take(pa.array(chosen)).append_column(_DELETE, pa.array(deletes[chosen], pa.bool_())).append_column(
                _ORDER, pa.array(chosen, pa.int64()))
            newest, stale = self._drop_stale(records.shard_id, newest, str(seq))
            chosen = np.asarray(newest.column(_ORDER).to_numpy(), np.int64)
        gone = deletes[chosen]
        if len(chosen) == n and not gone.any():  # every record is its key's newest, all upserts
            ups = rows.select(self.state.write_schema.names)
        else:
            ups = rows.select(self.state.write_schema.names).take(pa.array(chosen[~gone]))
        dels = rows.select(pk + ([seq] if seq is not None else [])).take(pa.array(chosen[gone]))
        return ShardPlan(records.shard_id, records.values, dels, ups, n, stale)

    def _as_given(self, records: ShardRecords, deletes: np.ndarray, n: int) -> ShardPlan:
        pk = list(self.state.primary_key)
        if n and deletes.all():
            return ShardPlan(records.shard_id, records.values, records.rows.select(pk), self.state.write_schema.empty_table(), n)
        empty = key_schema(self.state.write_schema, pk).empty_table()
        return ShardPlan(records.shard_id, records.values, empty, records.rows.select(self.state.write_schema.names), n)

    # -- stored data -----------------------------------------------------------------------------

    def _reader(self, shard_id: str) -> Any:
        """The shard's strong reader (new when the shard's writer was reopened)."""
        from memwal.readers.reader import Reader  # on use: a process that only appends need not load it

        shard = self._shard(shard_id)
        self._sequences(shard_id)  # starts the shard over if its writer was reopened
        if shard.reader is None:
            shard.reader = Reader(self.state, consistency="strong")
        return shard.reader

    def _sequences(self, shard_id: str, check_owner: bool = False) -> StoredSequences:
        """The shard's stored sequences, started over if its writer was (re)opened since.

        ``check_owner`` (before deciding from them): also start over if the shard's writer
        lease names another pool. Another writer that wrote the shard since fenced this
        process's writer, but this process finds out only at its next write, after the
        decision: the lease, written by every claim, tells it before."""
        shard = self._shard(shard_id)
        opens = self.writers.shard_stats(shard_id).opens
        if shard.sequences.opens != opens or (check_owner and not self._owns(shard_id)):
            shard.sequences.restart(opens)
            shard.reader = None  # its snapshot may predate another writer's writes
        return shard.sequences

    def _owns(self, shard_id: str) -> bool:
        held = self.writers.lease(shard_id)
        return held is not None and held.owner == self.writers.owner

    def stored_rows(self, shard_id: str, keys: pa.Table) -> pa.Table:
        """The live rows of ``keys`` in ``shard_id`` (strongly consistent), for partial merges."""
        return self._reader(shard_id).rows_of_keys(keys, shard_id)

    def stored_sequences(self, shard_id: str, keys: pa.Table, sequence_field: str) -> pa.Table:
        """Key columns and ``sequence_field`` of the live rows of ``keys`` in ``shard_id``
        (strongly consistent: the shard's unflushed WAL included)."""
        from memwal.readers.keys import keys_predicate

        pk = list(self.state.primary_key)
        return self._reader(shard_id).scan(columns=pk + [sequence_field], where=keys_predicate(keys.select(pk)))

    def _drop_stale(self, shard_id: str, rows: pa.Table, seq: str) -> tuple[pa.Table, int]:
        """``rows`` without those older than their key's stored version, and how many went.

        Stored sequences come from what this process wrote to the shard (:class:`StoredSequences`);
        only keys it does not know are read from the table, in this shard, and from the deletes
        recorded beside it (:mod:`memwal.write.deleted`): the newer of the live row and the last
        delete counts."""
        from memwal.write.deleted import deleted_sequences_uri, read_deletes

        pk = list(self.state.primary_key)
        cache = self._sequences(shard_id, check_owner=True)
        if cache.deleted is None:
            cache.deleted = read_deletes(deleted_sequences_uri(self.state.uri), shard_id, pk, seq, self.state.storage)
        keys = key_tuples(rows, pk)
        stored = {k: cache.known[k] for k in keys if k in cache.known}
        missing = sorted({i for i, k in enumerate(keys) if k not in stored})
        if missing:
            found = self.stored_sequences(shard_id, rows.take(pa.array(missing, pa.int64())).select(pk), seq)
            looked_up = dict(zip(key_tuples(found, pk), found.column(seq).to_pylist()))
            for i in missing:
                live, gone = looked_up.get(keys[i]), cache.deleted.get(keys[i])
                stored[keys[i]] = live if gone is None else gone if live is None else max(live, gone)
        keep = [i for i, (k, s) in enumerate(zip(keys, rows.column(seq).to_pylist())) if stored[k] is None or s >= stored[k]]
        if len(keep) == rows.num_rows:
            return rows, 0
        return rows.take(pa.array(keep, pa.int64())), rows.num_rows - len(keep)

    def _record_sequences(self, plan: ShardPlan, seq: str) -> None:
        """After a write that dropped stale records: record its deletes' sequences beside the
        table, and remember what it wrote. If it (re)opened the shard's writer, the cache has
        started over and knows only what was just written."""
        from memwal.write.deleted import deleted_sequences_uri, record_deletes

        pk = list(self.state.primary_key)
        dels, ups = plan.deletes, plan.upserts
        if dels.num_rows:
            record_deletes(deleted_sequences_uri(self.state.uri), dels.select(pk + [seq]), plan.shard_id, self.state.storage)
        cache = self._sequences(plan.shard_id)
        # A delete's sequence too: a replay older than the delete is stale like one older than an
        # upsert. The table keeps no row for it; the deletes recorded beside the table carry it
        # over to the next writer generation.
        cache.remember(key_tuples(dels, pk), dels.column(seq).to_pylist())
        if cache.deleted is not None:
            cache.deleted.update(zip(key_tuples(dels, pk), dels.column(seq).to_pylist()))
        cache.remember(key_tuples(ups, pk), ups.column(seq).to_pylist())

    # -- lifecycle -----------------------------------------------------------------------------------

    def flush(self, shard_ids: list[str] | None = None) -> None:
        """Flush the open writers' MemTables (all, or of ``shard_ids``) to SSTables."""
        self.writers.flush(shard_ids)

    def flush_overdue(self) -> list[str]:
        """Flush the open shards whose timed seal is overdue and that no write holds now (a
        running write seals or flushes its shard itself); returns them."""
        flushed = []
        for shard_id in self.writers.open_shards:
            if not self.writers.seal_overdue(shard_id):
                continue
            lock = self._shard(shard_id).lock
            if lock.acquire(blocking=False):
                try:
                    self.writers.flush([shard_id], reopen_fenced=False)
                    flushed.append(shard_id)
                finally:
                    lock.release()
        return flushed

    def close(self, *, reopen_fenced: bool = True) -> None:
        """Flush and release every writer (``reopen_fenced``: see :meth:`ShardWriterPool.flush`)."""
        try:
            self.writers.flush(reopen_fenced=reopen_fenced)
        finally:
            if self._executor is not None:
                self._executor.shutdown()
                self._executor = None
