"""The sequences of deleted keys, kept beside the table, so dropping stale records
(:class:`~memwal.write.protocol.WriteMode` ``drop_stale``) holds across deletes too.

A delete leaves no row, so the table cannot tell how new a delete was: without this, a change
older than a delete that arrives in a later batch (a Debezium replay, or a key whose changes
come from several partitions consumed unevenly) would bring the row back. The write path
appends ``(key, sequence, shard)`` of every delete it writes with a sequence to a Lance
table beside the target (``{table}_deleted_sequences``), after the delete itself: a crash in
between makes the caller replay the batch (Spark replays the micro-batch), which writes both
again (duplicates are harmless: the newest sequence per key counts).

A writer reads its shard's entries once per writer generation (when its
:class:`~memwal.write.protocol.StoredSequences` start over): while the writer stays open, only it
writes the shard, and it remembers what it writes. The cost is the shard's deleted
keys, read once per writer open, and one append per batch and shard with deletes; the
entries are never removed (a key deleted long ago still needs its delete's sequence for a
replay of an older change, however late it comes).
"""

from __future__ import annotations

import threading
from typing import Any

import lance
import pyarrow as pa
import pyarrow.compute as pc

from memwal.core import paths
from memwal.core.state import resolve_storage
from memwal.core.storage import StorageConfig

SHARD = "__memwal_shard"

#: Serializes the fallback create of :func:`record_deletes` among this process's threads.
_CREATE_LOCK = threading.Lock()


def deleted_sequences_uri(table_uri: str) -> str:
    return paths.deleted_sequences_table(paths.normalize_uri(table_uri))


def ensure_table(uri: str, schema: pa.Schema, key_columns: list[str], sequence: str, storage: StorageConfig | None) -> None:
    """Create the table if it is not there: once, before writers append (the Spark sink's
    driver does it before its tasks run: tasks creating it at the same time could each write
    a first version)."""
    options = resolve_storage(storage).lance_options()
    try:
        lance.dataset(uri, storage_options=options)
        return
    except (FileNotFoundError, ValueError, OSError):
        pass  # not there yet
    fields = [schema.field(c).remove_metadata() for c in key_columns + [sequence]] + [pa.field(SHARD, pa.string())]
    try:
        lance.write_dataset(pa.schema(fields).empty_table(), uri, mode="create", storage_options=options)
    except (OSError, ValueError):
        lance.dataset(uri, storage_options=options)  # another driver created it first


def record_deletes(uri: str, deletes: pa.Table, shard_id: str, storage: StorageConfig | None) -> None:
    """Append ``deletes`` (the key columns and the sequence column) as deletes of ``shard_id``
    (the table exists: :func:`ensure_table`; concurrent appends commit one after the other)."""
    if deletes.num_rows == 0:
        return
    rows = deletes.append_column(SHARD, pa.array([shard_id] * deletes.num_rows, pa.string())).replace_schema_metadata(None)
    pk, seq = deletes.schema.names[:-1], deletes.schema.names[-1]
    # Normally there already (the sink's driver made it). If not, the shard threads of one task
    # must not create it at once: two creates can both commit, and one's rows are lost
    # (about one race in ten on a local disk), so a delete's sequence would be forgotten.
    with _CREATE_LOCK:
        ensure_table(uri, deletes.schema, pk, seq, storage)
    ds = lance.dataset(uri, storage_options=resolve_storage(storage).lance_options())
    lance.write_dataset(rows.cast(ds.schema), ds, mode="append")


def read_deletes(uri: str, shard_id: str, key_columns: list[str], sequence: str, storage: StorageConfig | None) -> dict[tuple[Any, ...], Any]:
    """Key tuple -> the newest recorded delete sequence of every key deleted in ``shard_id``."""
    try:
        ds = lance.dataset(uri, storage_options=resolve_storage(storage).lance_options())
    except (FileNotFoundError, ValueError, OSError):
        return {}  # nothing deleted yet
    t = ds.to_table(columns=key_columns + [sequence], filter=pc.field(SHARD) == shard_id)
    if t.num_rows == 0:
        return {}
    newest = t.group_by(key_columns).aggregate([(sequence, "max")])
    keys = zip(*(newest.column(c).to_pylist() for c in key_columns))
    return dict(zip(keys, newest.column(f"{sequence}_max").to_pylist()))
