"""The change a view refresh reads: the change feed (:mod:`memwal.readers.feed`) between two base versions.

The compactor folds each shard's SSTables into the base in generation order, and records
the highest generation folded in the same commit (``compacted_sstables`` of the base
version). So between base versions ``A`` (what the view reflects) and ``B`` (the target),
exactly the generations ``compacted_A[shard] + 1 .. compacted_B[shard]`` were folded, and
those SSTables, newest row per key (:func:`memwal.readers.feed.net_changes`: the feed without
before-images, which a view does not need), are the change: live rows are the keys' rows at ``B``,
tombstones are keys absent at ``B``. This needs no stable row ids and no ``delta()``: views
are keyed on the primary key (:data:`~memwal.views.layout.SOURCE_KEY`).

One commit does not follow the rule: the compactor's two-pass compaction of a generation
with tombstones and live rows commits its delete pass *without* the marker (see
:mod:`memwal.maintain.compactor`). Its tombstoned keys may therefore already be gone at a version
whose marker still says ``compacted_B``: they are added to the changed keys and their rows
at ``B`` are read by key, so the change stays exact whichever side of the delete pass
``B`` falls on.

The SSTables must still exist: each view records what it consumed in a hold
(:mod:`memwal.core.holds`) that GC respects. If one is missing anyway (a view created while GC
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

from memwal.readers import feed
from memwal.core.errors import ChangesCollectedError
from memwal.readers.feed import rows_by_key
from memwal.core.lsm import without_keys
from memwal.core.schema import TOMBSTONE
from memwal.core.state import TableState
from memwal.views.layout import SOURCE_KEY


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


@dataclass(frozen=True)
class KeyChange:
    """What changed between two base versions, by primary key."""

    #: every changed key once (primary-key columns); a key may be listed that did not change
    keys: pa.Table
    #: the rows at the target version of the changed keys still present there
    rows: pa.Table
    #: SSTables read
    sstables: int


def folded_through(state: TableState, version: int) -> dict[str, int]:
    """Per shard, the highest generation folded into base version ``version``."""
    return feed.folded(state, version)


def read_changes(
    state: TableState, start: dict[str, int], after: lance.LanceDataset, columns: Sequence[str]
) -> KeyChange | None:
    """The change from the base version that had folded ``start`` (per shard, the highest
    generation; a view's refresh record keeps it, so that version itself need not exist any
    more) to ``after``, with ``columns`` of the rows at ``after``; None if an SSTable it
    needs is gone."""
    pk = list(state.primary_key)
    cols = list(dict.fromkeys([*pk, *(c for c in columns if c in after.schema.names)]))
    try:
        per_shard, following = feed.net_changes(state, start, feed.folded(state, after.version), cols)
        # the next generation's delete pass may have committed at or before ``after`` without the marker
        heads = [feed.read_sstable(state, shard_id, s, pk) for shard_id, s in following.items()]
    except ChangesCollectedError:
        return None
    read = sum(len(range(start.get(s, 0) + 1, g + 1)) for s, g in feed.folded(state, after.version).items()) + len(heads)
    unsure = [h.filter(h.column(TOMBSTONE)).select(pk) for h in heads]
    folded = list(per_shard.values())
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
