"""What readers keep of immutable SSTables: open datasets, key sets, which indexes they have.

An SSTable never changes once its shard manifest lists it, so all of this is cached (and
bounded, and clearable). The key set is memwal's own point-lookup index over the live
SSTables: a lookup asks the newest SSTable that holds the key, or the base table when
none does, instead of probing every SSTable newest-first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Sequence

import lance
import pyarrow as pa

from memwal import paths
from memwal.lsm import newest_per_key
from memwal.schema import TOMBSTONE

if TYPE_CHECKING:
    from memwal.snapshot import Snapshot

_MAX_ENTRIES = 4096
_lock = threading.Lock()
_datasets: OrderedDict[str, lance.LanceDataset] = OrderedDict()
_keys: OrderedDict[str, dict[Any, bool]] = OrderedDict()
_tables: OrderedDict[str, pa.Table] = OrderedDict()


def _remember(cache: OrderedDict, key: str, value: Any) -> Any:
    with _lock:
        cache[key] = value
        cache.move_to_end(key)
        while len(cache) > _MAX_ENTRIES:
            cache.popitem(last=False)
    return value


def clear() -> None:
    with _lock:
        _datasets.clear()
        _keys.clear()
        _tables.clear()


def dataset(path: str) -> lance.LanceDataset:
    """The SSTable at ``path`` as an open Lance dataset."""
    with _lock:
        ds = _datasets.get(path)
    return ds if ds is not None else _remember(_datasets, path, lance.dataset(path))


def keys(path: str, primary_key: Sequence[str]) -> dict[Any, bool]:
    """Every key of the SSTable (a scalar, or a tuple for composite keys) -> is it a tombstone.

    The SSTable's deletion vector has already kept only the newest row of each key.
    """
    with _lock:
        k = _keys.get(path)
    if k is not None:
        return k
    t = dataset(path).to_table(columns=[*primary_key, TOMBSTONE])
    cols = [t.column(c).to_pylist() for c in primary_key]
    ids = cols[0] if len(cols) == 1 else list(zip(*cols))
    return _remember(_keys, path, dict(zip(ids, t.column(TOMBSTONE).to_pylist())))


def lookup_key(key: dict[str, Any], primary_key: Sequence[str]) -> Any:
    """A key mapping in the form :func:`keys` uses."""
    return key[primary_key[0]] if len(primary_key) == 1 else tuple(key[c] for c in primary_key)


def has_index(path: str, field_name: str, kind: str) -> bool:
    """Whether the SSTable has an index of ``kind`` (a details type name) on a column."""
    ds = dataset(path)
    field_id = ds.lance_schema.field(field_name).id()
    return any(field_id in d.fields and kind in d.type_url for d in ds.describe_indices())


def schema_of(path: str) -> pa.Schema:
    return dataset(path).schema


def rows(path: str) -> pa.Table:
    """Every row of the SSTable (``_tombstone`` included), as stored."""
    with _lock:
        t = _tables.get(path)
    return t if t is not None else _remember(_tables, path, dataset(path).to_table())


def delta(snap: "Snapshot", tail: pa.Table | None, columns: Sequence[str], primary_key: Sequence[str]) -> pa.Table | None:
    """The newest version of every key written after the snapshot's base version: its live
    SSTables (oldest first, per shard) and the WAL tail, tombstones included; None if none."""
    parts = []
    for shard in snap.shards:
        for sst in shard.live_sstables:
            parts.append(rows(paths.sstable_path(snap.dataset.uri, shard.shard_id, sst.path)).select([*columns, TOMBSTONE]))
    if tail is not None:
        parts.append(tail.select([*columns, TOMBSTONE]))
    if not parts:
        return None
    return newest_per_key(pa.concat_tables(parts, promote_options="permissive"), primary_key)
