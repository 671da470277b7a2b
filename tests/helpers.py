"""Test helpers shared by several test modules."""

from __future__ import annotations

import lance
import lance.mem_wal
import pyarrow as pa
import pyarrow.compute as pc

from memwal import paths
from memwal.manifest import SsTable

PEOPLE = pa.schema(
    [
        pa.field("id", pa.int64()),
        pa.field("name", pa.string()),
        pa.field("score", pa.float64()),
    ]
)


def people(ids, tag: str = "v") -> pa.Table:
    """Rows of the PEOPLE schema whose values derive from id and tag."""
    ids = list(ids)
    return pa.table(
        {"id": ids, "name": [f"{tag}{i}" for i in ids], "score": [float(i) / 2 for i in ids]},
        schema=PEOPLE,
    )


def compact_by_hand(uri: str, shard_id: str, sst: SsTable) -> None:
    """What the notes describe, without memwal's compactor: tombstones delete, rows upsert,
    the final pass carries the compaction marker."""
    data = lance.dataset(paths.sstable_path(uri, shard_id, sst.path)).to_table()
    dead = data.filter(data["_tombstone"]).select(["id"])
    rows = data.filter(pc.invert(data["_tombstone"])).drop(["_tombstone"])
    ds = lance.dataset(uri)
    if dead.num_rows:
        ds.merge_insert("id").when_matched_delete().execute(dead)
        ds = lance.dataset(uri)
    marker = [lance.mem_wal.CompactedSsTable(shard_id, sst.generation)]
    ds.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().mark_sstables_as_compacted(
        marker
    ).execute(rows)
