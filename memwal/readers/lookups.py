"""Point lookups across the LSM levels: the live row of one key, and the live rows of many.

A key's newest version is in the shard's unflushed WAL tail (strong readers), else in the
newest live SSTable whose key set holds it (:class:`~memwal.readers.sstables.LiveKeySets`),
else in the base table, read through its primary-key index (:mod:`memwal.readers.points`).
Many keys are looked up the same way all at once. Which snapshot and WAL tail a lookup
reads is the reader's choice; this module reads what it is given.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal.core.lsm import without_keys
from memwal.readers.keys import keys_predicate, quote_ident, sql_literal
from memwal.readers.merge import int_key as merge_int_key
from memwal.readers.config import ReadConfig
from memwal.readers.points import BaseKeyMap, BaseLookup, base_point_read, point_lookup
from memwal.readers.sstables import KeySet, LiveKeySets, MergedKeys, SSTableCache, lookup_key
from memwal.core.schema import TOMBSTONE
from memwal.core.snapshot import Snapshot
from memwal.core.state import TableState

#: Up to this many keys, get_many runs point lookups (bloom filters, short-circuit per key);
#: above it one lookup of all keys at once (:meth:`PointLookups.many`) is cheaper.
POINT_LOOKUP_BATCH = 32


class PointLookups:
    """A reader's point lookups, with what they keep between calls: the base version's
    scanner options, and the last lookup's base predicate (which a background refresh
    replays on a new base version, :meth:`warm`)."""

    def __init__(self, state: TableState, cache: SSTableCache, live_keys: LiveKeySets, config: ReadConfig | None = None) -> None:
        self.state = state
        self.cache = cache
        self.live_keys = live_keys
        self.config = config or ReadConfig()
        #: the base version's key map (:class:`BaseKeyMap`), once it has had enough lookups
        self._key_map: BaseKeyMap | None = None
        #: (base dataset, point lookups of it that read the base)
        self._base_reads: tuple[Any, int] = (None, 0)
        pk = state.primary_key
        key_type = state.schema.field(pk[0]).type
        #: a single signed integer key (or an unsigned one of at most 32 bits): mapped to row ids
        self._mappable = len(pk) == 1 and (pa.types.is_signed_integer(key_type) or
                                          (pa.types.is_unsigned_integer(key_type) and key_type.bit_width <= 32))
        #: the last point lookup's base predicate, replayed on each new base version by the
        #: background refresh so the first lookup on it finds its index pages loaded
        self.warm_predicate: str | None = None
        self._base_lookups: BaseLookup | None = None
        #: the live SSTables' rows concatenated, for the last snapshot and column list asked
        #: (see :meth:`_delta_rows`)
        self._delta: tuple[tuple, tuple[pa.Table, dict[str, int]]] | None = None

    def one(self, key: dict[str, Any], shard_id: str, out_schema: pa.Schema, snap: Snapshot, tail: pa.Table | None) -> pa.Table:
        """The live row of ``key`` (typed, in shard ``shard_id``) in ``tail`` and ``snap``,
        columns ``out_schema``'s; no row if the key is absent or deleted."""
        if tail is not None:
            hit = tail.filter(_key_mask(tail, key))
            if hit.num_rows:  # the unflushed WAL holds the newest version of this key
                if hit.column(TOMBSTONE)[0].as_py():
                    return out_schema.empty_table()
                return hit.select(out_schema.names)
        pk = self.state.primary_key
        found = self.live_keys.find(snap, shard_id, lookup_key(key, pk))
        if found is not None:
            path, tombstone, position = found
            if tombstone:  # the newest version is a delete
                return out_schema.empty_table()
            return self.cache.take(path, [position], out_schema.names)
        # No SSTable holds the key: the base table's row, if any: from its key map, or
        # through its primary-key index.
        key_map = self._base_key_map(snap) if self._mappable else None
        if key_map is not None:
            row = key_map.read(snap.dataset, key[pk[0]], out_schema.names)
            return out_schema.empty_table() if row is None else row
        predicate = " AND ".join(f"{quote_ident(c)} = {sql_literal(key[c])}" for c in pk)
        self.warm_predicate = predicate
        return base_point_read(self._base_lookup(snap), out_schema.names, predicate)

    def _base_key_map(self, snap: Snapshot, keys: int = 1) -> BaseKeyMap | None:
        """``snap``'s base version's key map, built once the version has had
        ``ReadConfig.lookup_key_map_after`` keys looked up in the base (a version read a few
        times, or by a reader that only scans, never pays its read) and when its rows fit
        ``lookup_key_map_max_rows``."""
        version = snap.base_version
        kept = self._key_map  # once: another thread may replace it meanwhile
        if kept is not None and kept.version == version:
            return kept
        seen, before = self._base_reads
        before = before if seen == version else 0
        self._base_reads = (version, before + keys)
        cfg = self.config
        if not before < cfg.lookup_key_map_after <= before + keys or cfg.lookup_key_map_max_rows <= 0:
            return None  # built once, by the lookup that reaches the count
        if snap.dataset.count_rows() > cfg.lookup_key_map_max_rows:
            return None
        self._key_map = kept = BaseKeyMap(snap.dataset, self.state.primary_key[0])
        return kept

    def many(self, keys: pa.Table, out_schema: pa.Schema, snap: Snapshot, tail: pa.Table | None) -> pa.Table:
        """The live rows of ``keys`` (the key columns, typed, each key once) in ``snap`` and
        ``tail``, columns ``out_schema``'s; absent keys left out, in no particular order.

        Each key is looked up where its newest version is, as a point lookup does, but for all
        keys at once: the WAL tail by a semi-join, then every live SSTable newest first by its
        key set (one vectorised search per SSTable for an integer key), read by position (from
        the SSTable's rows in the cache once lookups of many keys come back to it, else one
        ``take`` per SSTable: :meth:`SSTableCache.take_many`), then the base for the rest with one filter. Reading the
        SSTables whole and merging them (as a scan does) cost more than the lookups for a
        thousand keys, and a SQL list of a thousand literals more than the read
        (docs/bench-log/reads.md, "Lookups of many keys").
        """
        pk = list(self.state.primary_key)
        names = out_schema.names
        parts: list[pa.Table] = []
        if tail is not None:
            mine = _semi_join(tail, keys, pk)
            if mine.num_rows:
                keys = without_keys(keys, mine, pk)  # the WAL tail holds their newest version
                parts.append(mine.filter(pc.invert(mine.column(TOMBSTONE))).select(names))
        todo = _KeysToFind(keys, pk)
        delta = self._delta_rows(snap, names, warm=True) if todo.ints is not None else None
        for shard in snap.shards:
            merged = self.live_keys.merged(snap, shard.shard_id) if todo.ints is not None else None
            if merged is not None:  # one search of all the shard's SSTables' keys at once
                listed, keys_of = merged
                for level, positions in todo.find_merged(keys_of).items():
                    path, key_set = listed[level]
                    if delta is not None:  # from the SSTables' rows, concatenated once
                        table, offsets = delta
                        parts.append(table.take(pa.array(offsets[path] + np.asarray(positions, np.int64), pa.int64())))
                    else:
                        parts.append(self.cache.take_many(path, positions, names, len(key_set)))
                continue
            for path, key_set in self.live_keys.newest(snap, shard.shard_id):
                if todo.done:
                    break
                positions = todo.find(key_set)
                if positions:
                    parts.append(self.cache.take_many(path, positions, names, len(key_set)))
        rest = todo.remaining()
        key_map = self._base_key_map(snap, rest.num_rows) if self._mappable and rest.num_rows else None
        if key_map is not None:
            ids = key_map.row_ids_of(rest.column(0).to_numpy().astype(np.int64))
            parts.append(snap.dataset._take_rows(ids.tolist(), columns=names) if len(ids) else out_schema.empty_table())
        elif rest.num_rows:
            if len(pk) == 1:
                where = pc.field(pk[0]).isin(rest.column(0).combine_chunks())
                base = snap.dataset.to_table(columns=names, filter=where)
            else:
                base = snap.dataset.to_table(columns=names, filter=keys_predicate(rest))
            parts.append(base)
        if not parts:
            return out_schema.empty_table()
        return pa.concat_tables([p if p.schema.equals(out_schema) else p.cast(out_schema) for p in parts])

    def _delta_rows(self, snap: Snapshot, names: list[str], warm: bool = False) -> tuple[pa.Table, dict[str, int]] | None:
        """The snapshot's live SSTables' rows (``names``) as one table, with where each
        SSTable's begin, once every one of them is in the cache (lookups of many keys put them
        there, :meth:`SSTableCache.take_many`); built once per snapshot and column list. With
        ``warm``, SSTables small enough to be read whole (:meth:`SSTableCache.cache_small`) are
        read into the cache first: a lookup of many keys then reads each new SSTable once."""
        ident = (snap.base_version, tuple((s.shard_id, s.manifest.version, s.compacted_generation, s.read_after) for s in snap.shards),
                 tuple(names))
        kept = self._delta  # once: another thread may replace it meanwhile
        if kept is not None and kept[0] == ident:
            return kept[1]
        listed = [(path, ks) for shard in snap.shards for path, ks in self.live_keys.newest(snap, shard.shard_id)]
        paths_ = [path for path, _ in listed]
        if warm:
            for path, ks in listed:
                self.cache.cache_small(path, names, len(ks))
        if not paths_ or not all(self.cache.holds_rows(path, names) for path in paths_):
            return None
        schema = pa.schema([self.state.write_schema.field(c) for c in names])
        parts = [self.cache.rows(path, names).select(names).cast(schema) for path in paths_]
        starts = np.concatenate([[0], np.cumsum([p.num_rows for p in parts])[:-1]]).astype(np.int64)
        built = (pa.concat_tables(parts).combine_chunks(), {path: int(at) for path, at in zip(paths_, starts)})
        self._delta = (ident, built)
        return built

    def warm(self, snap: Snapshot, current: Snapshot | None) -> None:
        """Load what the next lookups on ``snap`` would load first, before it replaces
        ``current``: the key sets of SSTables not seen yet and, on a new base version, its
        deletion files and index pages (through the last lookup's predicate). Nothing for a
        reader that has made no lookup of the base (it only scans, say)."""
        predicate = self.warm_predicate
        if predicate is None:
            return
        for shard in snap.shards:
            self.live_keys.newest(snap, shard.shard_id)
        if current is None or snap.base_version != current.base_version:
            # Not base_point_read: asked for live rows only, Lance builds the deletion mask
            # of every fragment, which loads each fragment's deletion file of the new version
            # (every compaction commit rewrites those of the fragments its updates touch).
            snap.dataset.to_table(columns=list(self.state.primary_key), filter=predicate)
            kept = self._key_map
            if kept is not None and kept.version != snap.base_version and snap.dataset.count_rows() <= self.config.lookup_key_map_max_rows:
                # the previous version's lookups built one: so will this one's, here and not
                # in a lookup
                self._key_map = BaseKeyMap(snap.dataset, self.state.primary_key[0])

    def _base_lookup(self, snap: Snapshot) -> BaseLookup:
        """Point reads of ``snap``'s base version, their scanner options built once."""
        lookup = self._base_lookups
        if lookup is None or lookup.dataset is not snap.dataset:
            lookup = self._base_lookups = point_lookup(snap.dataset)
        return lookup


class _KeysToFind:
    """Keys being looked up in SSTables newest first: which are still unresolved, and the
    positions of those an SSTable holds (tombstones resolve a key without a row)."""

    def __init__(self, keys: pa.Table, primary_key: list[str]) -> None:
        self.keys = keys
        self.primary_key = primary_key
        ints = merge_int_key(keys, primary_key)
        self.ints = ints
        self.open = np.ones(keys.num_rows, dtype=bool)
        self.values: list[Any] | None = None if ints is not None else [lookup_key(k, primary_key) for k in keys.to_pylist()]

    @property
    def done(self) -> bool:
        return not self.open.any()

    def find(self, key_set: KeySet) -> list[int]:
        """Resolve the open keys ``key_set`` holds; the positions of those it holds as rows."""
        found: list[int] = []
        if self.ints is not None and key_set.ints is not None:
            assert key_set.tombstones is not None and key_set.positions is not None
            at = np.flatnonzero(self.open)
            if not len(key_set.ints) or not len(at):
                return found
            i = np.searchsorted(key_set.ints, self.ints[at], side="right") - 1
            hit = (i >= 0) & (key_set.ints[np.maximum(i, 0)] == self.ints[at])
            self.open[at[hit]] = False
            rows = i[hit][~key_set.tombstones[i[hit]]]
            return np.unique(key_set.positions[rows]).tolist()  # a key asked twice is one row
        values = self.values if self.values is not None else [lookup_key(k, self.primary_key) for k in self.keys.to_pylist()]
        self.values = values
        for j in np.flatnonzero(self.open):
            hit = key_set.find(values[j])
            if hit is not None:
                self.open[j] = False
                if not hit[0]:
                    found.append(hit[1])
        return sorted(set(found))

    def find_merged(self, merged: MergedKeys) -> dict[int, list[int]]:
        """Resolve every open key a shard's merged key set holds; per SSTable (its level in
        it, newest first), the positions of those it holds as rows."""
        assert self.ints is not None
        at = np.flatnonzero(self.open)
        if not len(merged.ints) or not len(at):
            return {}
        i = np.minimum(np.searchsorted(merged.ints, self.ints[at]), len(merged.ints) - 1)
        hit = merged.ints[i] == self.ints[at]
        self.open[at[hit]] = False
        rows = i[hit][~merged.tombstones[i[hit]]]
        out: dict[int, list[int]] = {}
        for level, pos in zip(merged.levels[rows].tolist(), merged.positions[rows].tolist()):
            out.setdefault(level, []).append(pos)
        return {level: sorted(set(p)) for level, p in out.items()}  # a key asked twice is one row

    def remaining(self) -> pa.Table:
        """The keys no SSTable held."""
        return self.keys if self.open.all() else self.keys.filter(pa.array(self.open))


def _semi_join(rows: pa.Table, keys: pa.Table, pk: list[str]) -> pa.Table:
    """``rows`` whose primary key appears in ``keys`` (on the key columns only: Arrow's joins
    cannot carry every column type)."""
    if rows.num_rows == 0 or keys.num_rows == 0:
        return rows.slice(0, 0)
    if len(pk) == 1:
        return rows.filter(pc.is_in(rows.column(pk[0]), value_set=keys.column(pk[0]).combine_chunks()))
    probe = rows.select(pk).append_column("__memwal_row", pa.array(np.arange(rows.num_rows, dtype=np.int64)))
    hit = probe.join(keys.select(pk), keys=pk, join_type="left semi").column("__memwal_row")
    return rows.take(pc.take(hit, pc.sort_indices(hit)))


def _key_mask(rows: pa.Table, key: dict[str, Any]) -> pa.ChunkedArray:
    mask = None
    for col, value in key.items():
        m = pc.equal(rows.column(col), pa.scalar(value, rows.schema.field(col).type))
        mask = m if mask is None else pc.and_(mask, m)
    return mask
