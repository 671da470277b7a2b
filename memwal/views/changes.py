"""The change a view refresh reads, from the SSTables compaction folded into the base table.

The compactor folds each shard's SSTables into the base in generation order, and records
the highest generation folded in the same commit (``compacted_sstables`` of the base
version). So between base versions ``A`` (what the view reflects) and ``B`` (the target),
exactly the generations ``compacted_A[shard] + 1 .. compacted_B[shard]`` were folded, and
those SSTables, newest row per key, are the change: live rows are the keys' rows at ``B``,
tombstones are keys absent at ``B``. This needs no stable row ids and no ``delta()``: views
are keyed on the primary key (:data:`~memwal.views.layout.SOURCE_KEY`).

One commit does not follow the rule: the compactor's two-pass compaction of a generation
with tombstones and live rows commits its delete pass *without* the marker (see
:mod:`memwal.compactor`). Its tombstoned keys may therefore already be gone at a version
whose marker still says ``compacted_B``: they are added to the changed keys and their rows
at ``B`` are read by key, so the change stays exact whichever side of the delete pass
``B`` falls on.

The SSTables must still exist: each view records what it consumed in a hold
(:mod:`memwal.holds`) that GC respects. If one is missing anyway (a view created while GC
was collecting, a hold removed by hand), :func:`read_changes` answers None and the refresh
is a full one: slower, never wrong.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

import lance
import pyarrow as pa
import pyarrow.compute as pc

from memwal import paths
from memwal.lsm import newest_across, newest_per_key, without_keys
from memwal.manifest import SsTable
from memwal.schema import TOMBSTONE
from memwal.sqltext import sql_literal
from memwal.state import TableState
from memwal.views.layout import SOURCE_KEY

#: keys per ``IN (...)`` filter when reading rows by key
KEYS_PER_FILTER = 5_000


def source_keys(rows: pa.Table, primary_key: Sequence[str]) -> pa.Array:
    """The view key of every row: its primary key as text (a single column cast to string,
    several as a JSON list). The same function keys full and incremental refreshes."""
    pk = list(primary_key)
    if len(pk) == 1:
        return pc.cast(rows.column(pk[0]), pa.string()).combine_chunks()
    cols = [rows.column(c).to_pylist() for c in pk]
    return pa.array([json.dumps(list(v), default=str) for v in zip(*cols)], pa.string())


def with_source_key(rows: pa.Table, primary_key: Sequence[str]) -> pa.Table:
    return rows.append_column(SOURCE_KEY, source_keys(rows, primary_key))


def rows_by_key(ds: lance.LanceDataset, keys: pa.Table, columns: Sequence[str], primary_key: Sequence[str]) -> pa.Table:
    """The rows of ``ds`` whose primary key is in ``keys`` (through the key's BTREE when there is one)."""
    pk = list(primary_key)
    cols = list(dict.fromkeys([*pk, *columns]))
    parts = []
    for start in range(0, keys.num_rows, KEYS_PER_FILTER):
        chunk = keys.slice(start, KEYS_PER_FILTER)
        if len(pk) == 1:
            where = f"{pk[0]} IN ({', '.join(sql_literal(v) for v in chunk.column(pk[0]).to_pylist())})"
        else:
            where = " OR ".join(
                "(" + " AND ".join(f"{c} = {sql_literal(v)}" for c, v in zip(pk, row)) + ")"
                for row in zip(*(chunk.column(c).to_pylist() for c in pk))
            )
        parts.append(ds.to_table(columns=cols, filter=where))
    if not parts:
        return ds.schema.empty_table().select(cols)
    return pa.concat_tables(parts)


@dataclass(frozen=True)
class KeyChange:
    """What changed between two base versions, by primary key."""

    #: every changed key once (primary-key columns); a key may be listed that did not change
    keys: pa.Table
    #: the rows at the target version of the changed keys still present there
    rows: pa.Table
    #: SSTables read
    sstables: int


def _folded(state: TableState, version: int) -> dict[str, int]:
    index = state.manifests.mem_wal_index(version)
    return dict(index.compacted) if index else {}


def folded_through(state: TableState, version: int) -> dict[str, int]:
    """Per shard, the highest generation folded into base version ``version``."""
    return _folded(state, version)


def read_changes(
    state: TableState, start: dict[str, int], after: lance.LanceDataset, columns: Sequence[str]
) -> KeyChange | None:
    """The change from the base version that had folded ``start`` (per shard, the highest
    generation; a view's refresh record keeps it, so that version itself need not exist any
    more) to ``after``, with ``columns`` of the rows at ``after``; None if an SSTable it
    needs is gone."""
    pk = list(state.primary_key)
    cols = list(dict.fromkeys([*pk, *(c for c in columns if c in after.schema.names)]))
    state.manifests.clear_cache()  # an SSTable flushed since a cached read may be the next generation
    end = _folded(state, after.version)
    folded: list[pa.Table] = []
    unsure: list[pa.Table] = []
    read = 0
    for shard_id in sorted(set(start) | set(end) | set(state.manifests.list_shards())):
        a, b = start.get(shard_id, 0), end.get(shard_id, 0)
        if b < a:
            return None
        m = state.manifests.read_shard(shard_id)
        by_gen = {s.generation: s for s in (m.sstables if m else ())}
        if any(g not in by_gen for g in range(a + 1, b + 1)):
            return None
        tables = [_read(state, shard_id, by_gen[g], cols) for g in range(a + 1, b + 1)]
        read += len(tables)
        if tables:
            folded.append(newest_across(tables, pk))
        pending = by_gen.get(b + 1)
        if pending is not None:
            # its delete pass may have committed at or before ``after`` without the marker
            head = newest_per_key(_read(state, shard_id, pending, pk), pk)
            read += 1
            unsure.append(head.filter(head.column(TOMBSTONE)).select(pk))
    empty = after.schema.empty_table().select(cols)
    changed = pa.concat_tables(folded) if folded else empty.append_column(TOMBSTONE, pa.array([], pa.bool_()))
    doubtful = pa.concat_tables(unsure) if unsure else empty.select(pk)
    live = changed.filter(pc.invert(changed.column(TOMBSTONE))).drop_columns([TOMBSTONE])
    live = without_keys(live, doubtful, pk)
    present = rows_by_key(after, doubtful, cols, pk) if doubtful.num_rows else empty
    keys = pa.concat_tables([changed.select(pk), doubtful])
    if keys.num_rows:
        keys = keys.group_by(pk, use_threads=False).aggregate([])
    return KeyChange(keys, pa.concat_tables([live.cast(empty.schema), present.cast(empty.schema)]), read)


def _read(state: TableState, shard_id: str, s: SsTable, columns: Sequence[str]) -> pa.Table:
    ds = state.lance_dataset(paths.sstable_path(state.uri, shard_id, s.path))
    return ds.to_table(columns=[*columns, TOMBSTONE])
