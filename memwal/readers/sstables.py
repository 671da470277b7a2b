"""What readers keep of immutable SSTables: open datasets, key sets, which indexes they have.

An SSTable never changes once its shard manifest lists it, so all of this is cached by an
:class:`SSTableCache` that lives as long as its reader and is bounded by bytes (an estimate
of what each entry holds), least recently used first out. The key set is memwal's own point-lookup index over the live
SSTables: a lookup asks the newest SSTable that holds the key, or the base table when
none does, instead of probing every SSTable newest-first.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import lance
import numpy as np
import pyarrow as pa

from memwal.core import paths
from memwal.core.cache import ByteLRU
from memwal.core.lance_errors import damaged_sstable
from memwal.readers.merge import newest
from memwal.core.schema import TOMBSTONE, as_evolved, needs_evolving, stored_columns, widened_sources

if TYPE_CHECKING:
    from memwal.core.snapshot import Snapshot

#: What an open SSTable dataset handle is counted as (its manifest, schema and file metadata).
DATASET_BYTES = 64 << 10
#: What one entry of a key set is counted as (a Python key object and a dict slot) ...
KEY_ENTRY_BYTES = 100
#: ... and what one entry of an integer key set is (a sorted int64, a bool and an int64 position).
INT_KEY_ENTRY_BYTES = 17
#: At most this many SSTables are read at once by one scan.
READ_THREADS = 8
#: Default bound of one reader's SSTable cache.
DEFAULT_CACHE_BYTES = 256 << 20
#: A lookup of many keys reads an SSTable of at most this many rows whole (and caches it)
#: rather than taking its few rows: reading 2,000 rows costs about what one Lance take does.
READ_WHOLE_ROWS = 8192


def lookup_key(key: dict[str, Any], primary_key: Sequence[str]) -> Any:
    """A key mapping in the form :meth:`SSTableCache.keys` uses."""
    return key[primary_key[0]] if len(primary_key) == 1 else tuple(key[c] for c in primary_key)


@dataclass(frozen=True)
class KeySet:
    """An SSTable's keys, each mapped to whether its newest version there is a tombstone and
    to that row's position among the SSTable's live rows (what ``LanceDataset.take`` takes).

    A single integer key column is held as three NumPy arrays sorted by key, a tenth of a
    dict's memory and built without a Python object per row: loading the key set of a new
    SSTable is the main cost of a reader refresh, and it holds the GIL while it builds.
    Other keys (strings, composite keys as tuples) are held in a dict. Either way, when a key
    occurs twice the later row wins, as in the dict it replaces.
    """

    ints: np.ndarray | None = None
    tombstones: np.ndarray | None = None
    positions: np.ndarray | None = None
    other: dict[Any, tuple[bool, int]] | None = None

    @classmethod
    def of(cls, table: pa.Table, primary_key: Sequence[str]) -> "KeySet":
        """The key set of an SSTable's ``primary_key`` and ``_tombstone`` columns, read in the
        order of its live rows."""
        flags = table.column(TOMBSTONE).to_numpy(zero_copy_only=False).astype(bool)
        key_type = table.schema.field(primary_key[0]).type
        if len(primary_key) == 1 and pa.types.is_integer(key_type) and not pa.types.is_uint64(key_type):
            keys = table.column(primary_key[0]).to_numpy(zero_copy_only=False).astype(np.int64)
            order = np.argsort(keys, kind="stable")  # equal keys keep their row order
            return cls(ints=keys[order], tombstones=flags[order], positions=order.astype(np.int64))
        cols = [table.column(c).to_pylist() for c in primary_key]
        ids = cols[0] if len(cols) == 1 else list(zip(*cols))
        return cls(other=dict(zip(ids, zip(flags.tolist(), range(len(flags))))))

    def find(self, key: Any) -> tuple[bool, int] | None:
        """(is the key's newest version a tombstone, its row's position), or None if absent."""
        if self.other is not None:
            return self.other.get(key)
        assert self.ints is not None and self.tombstones is not None and self.positions is not None
        if not isinstance(key, int) or not -(2**63) <= key < 2**63:
            return None  # no int64 column holds it
        i = int(np.searchsorted(self.ints, key, side="right")) - 1  # the last of equal keys
        return (bool(self.tombstones[i]), int(self.positions[i])) if i >= 0 and self.ints[i] == key else None

    def tombstone(self, key: Any) -> bool | None:
        """True if the key's newest version is a tombstone, False if a row, None if absent."""
        hit = self.find(key)
        return None if hit is None else hit[0]

    def __len__(self) -> int:
        return len(self.other) if self.other is not None else len(self.ints)  # type: ignore[arg-type]

    @property
    def nbytes(self) -> int:
        """What the cache counts this key set as."""
        return KEY_ENTRY_BYTES * len(self) if self.other is not None else INT_KEY_ENTRY_BYTES * len(self)


@contextmanager
def reading(path: str) -> Iterator[None]:
    """Turns a Lance failure to open or read the SSTable at ``path`` into a
    :class:`~memwal.core.errors.TableDamagedError` naming its shard, generation and path.

    Every SSTable a reader touches is listed in a shard manifest it loaded, and GC removes
    none a reader may still use (``reader_grace_seconds``), so a listed SSTable that does not
    open or read is damage, not a race: the reader says which file, and that
    ``memwal repair`` restores reads, instead of passing Lance's error on.
    """
    try:
        yield
    except Exception as e:  # noqa: BLE001 - Lance raises untyped errors; lance_errors decides
        shard_dir, _, name = path.rstrip("/").rpartition("/")
        damaged = damaged_sstable(e, shard_dir.rpartition("/")[2], paths.sstable_generation(name), path)
        if damaged is None:
            raise
        raise damaged from e


def _row_bytes(schema: pa.Schema, columns: Sequence[str]) -> int:
    """About how many bytes a row of ``columns`` takes in memory (64 for a variable-width value)."""
    def width(t: pa.DataType) -> int | None:
        try:
            return max(1, t.bit_width // 8)
        except ValueError:  # not of fixed width
            return None

    total = 0
    for c in columns:
        t = schema.field(c).type if c in schema.names else pa.null()
        item = width(t.value_type) if pa.types.is_fixed_size_list(t) else None
        total += t.list_size * item if item is not None else (width(t) or 64)
    return total


class SSTableCache:
    """Open datasets, key sets and whole rows of SSTables, bounded by ``max_bytes``.

    Entries are keyed by path, which never names two different SSTables (a generation's
    directory is written once), so an entry is never stale; eviction is only for memory.
    """

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES, storage_options: dict[str, str] | None = None,
                 schema: pa.Schema | None = None) -> None:
        self.storage_options = storage_options
        self._lru: ByteLRU[tuple[str, str], Any] = ByteLRU(max_bytes)
        #: The table's columns as an SSTable written now stores them (``_tombstone`` included):
        #: what rows are returned as. An SSTable written before a column was added or dropped
        #: (:meth:`memwal.table.Table.update_schema`) is read as if written under it.
        self.schema = schema
        #: SSTables a lookup of many keys has taken rows from, and how often (see :meth:`take_many`)
        self._asked: dict[str, int] = {}

    def _names(self, path: str) -> list[str]:
        """The SSTable's columns, cached with it: a lookup asks on every take, and Lance builds
        a dataset's Arrow schema anew at each ask (~12 us)."""
        return self._stored(path).names

    def _stored(self, path: str) -> pa.Schema:
        return self._get("schema", path, lambda: self.dataset(path).schema, lambda sc: 64 * len(sc))

    def _missing(self, path: str, columns: Sequence[str] | None) -> bool:
        """Whether the SSTable does not simply hold ``columns`` (when None: the table's
        columns): it was written before a column was added, dropped or widened. Decided once
        per SSTable and column list (a lookup asks on every take)."""
        kind = "evolving" if columns is None else "evolving:" + ",".join(columns)
        return self._get(kind, path, lambda: self._decide_missing(path, columns), lambda _: 64)

    def _decide_missing(self, path: str, columns: Sequence[str] | None) -> bool:
        stored = self._stored(path)
        asked = columns if columns is not None else (self.schema.names if self.schema is not None else ())
        sources = widened_sources(stored.names)
        hidden = sorted(h for c in asked for h in sources.get(c, ()))
        if hidden and self._replayed_values(path, hidden):
            return True
        if columns is None:
            return self.schema is not None and (stored.names != self.schema.names or needs_evolving(stored, self.schema))
        if self.schema is None:  # types are the caller's to conform
            return any(c not in stored.names for c in columns)
        return needs_evolving(stored, pa.schema([self.schema.field(c) for c in columns]))

    def _replayed_values(self, path: str, hidden: list[str]) -> bool:
        """Whether the SSTable holds a value in one of the ``hidden`` older selves of widened
        columns: a writer replayed WAL entries of before a widening into it (:func:`as_evolved`).
        Every SSTable written since a widening has the hidden column, nearly always all null."""
        t = self.dataset(path).to_table(columns=hidden)
        return any(t.column(h).null_count < t.num_rows for h in hidden)

    def _evolved(self, table: pa.Table, columns: Sequence[str] | None = None) -> pa.Table:
        """``columns`` (all when None) of rows read from an SSTable written under an earlier
        schema, as the table's (:func:`memwal.core.schema.as_evolved`). Without :attr:`schema` (a
        cache shared by tables: Spark's executors) the rows are left as read (the columns the
        SSTable lacks left out, a widened column's older selves in), for the caller to conform."""
        if self.schema is None:
            return table
        return as_evolved(table, self.schema if columns is None else pa.schema([self.schema.field(c) for c in columns]))

    def _present(self, path: str, columns: Sequence[str] | None) -> list[str] | None:
        return None if columns is None else stored_columns(self._names(path), columns)

    @property
    def bytes_held(self) -> int:
        return self._lru.bytes_held

    @property
    def max_bytes(self) -> int:
        return self._lru.max_bytes

    def worth_caching(self, in_memory_bytes: int) -> bool:
        """Whether a scan should cache the rows of an SSTable of this size: at most a
        sixteenth of the cache, so one scan of large SSTables (a table just loaded) neither
        holds them all nor pushes out the key sets lookups use."""
        return in_memory_bytes <= self.max_bytes // 16

    def clear(self) -> None:
        self._lru.clear()

    def _get(self, kind: str, path: str, load: Callable[[], Any], size: Callable[[Any], int]) -> Any:
        with reading(path):
            return self._lru.get_or_load((kind, path), load, size)

    def dataset(self, path: str) -> lance.LanceDataset:
        """The SSTable at ``path`` as an open Lance dataset."""
        return self._get("dataset", path, lambda: lance.dataset(path, storage_options=self.storage_options), lambda _: DATASET_BYTES)

    def keys(self, path: str, primary_key: Sequence[str], rows: pa.Table | None = None) -> KeySet:
        """Every key of the SSTable (a scalar, or a tuple for composite keys) -> is it a tombstone.

        The SSTable's deletion vector has already kept only the newest row of each key.
        ``rows``: the SSTable's rows already read whole (every live row in order, the key
        columns and ``_tombstone`` among them), to build the key set from if it is not cached.
        """

        def load() -> KeySet:
            source = rows if rows is not None else self.dataset(path).to_table(columns=[*primary_key, TOMBSTONE])
            return KeySet.of(source, primary_key)

        return self._get("keys", path, load, lambda k: k.nbytes)

    def rows(self, path: str, columns: Sequence[str] | None = None) -> pa.Table:
        """Every row of the SSTable (``_tombstone`` included), as stored; only ``columns``
        (and ``_tombstone``) if given, cached apart from the whole rows: a scan of a few
        columns does not read, say, a vector column it does not return."""
        if columns is None:
            return self._get("rows", path, lambda: self._read_all(path), lambda t: t.nbytes)
        wanted = list(dict.fromkeys([*columns, TOMBSTONE]))
        whole = self._lru.get(("rows", path))
        if whole is not None:
            return self._evolved(whole.select(stored_columns(whole.schema.names, wanted)), wanted)
        kind = "rows:" + ",".join(wanted)
        return self._get(kind, path, lambda: self._read_all(path, wanted), lambda t: t.nbytes)

    def _read_all(self, path: str, columns: Sequence[str] | None = None) -> pa.Table:
        ds = self.dataset(path)
        if not self._missing(path, columns):
            return ds.to_table(columns=columns)
        return self._evolved(ds.to_table(columns=self._present(path, columns)), columns)

    def holds_rows(self, path: str, columns: Sequence[str]) -> bool:
        """Whether the SSTable's rows (all, or ``columns``) are in the cache."""
        wanted = list(dict.fromkeys([*columns, TOMBSTONE]))
        return ("rows", path) in self._lru or ("rows:" + ",".join(wanted), path) in self._lru

    def cache_small(self, path: str, columns: Sequence[str], rows_held: int) -> bool:
        """Read the SSTable's rows (``columns``) into the cache if it is small (at most
        :data:`READ_WHOLE_ROWS` rows whose size :meth:`worth_caching`); whether they are held."""
        if self.holds_rows(path, columns):
            return True
        if rows_held > READ_WHOLE_ROWS or not self.worth_caching(rows_held * _row_bytes(self._stored(path), columns)):
            return False
        wanted = list(dict.fromkeys([*columns, TOMBSTONE]))
        with reading(path):
            whole = self._read_all(path, wanted)
        if not self.worth_caching(whole.nbytes):
            return False
        self._lru.put(("rows:" + ",".join(wanted), path), whole, whole.nbytes)
        return True

    def take_many(self, path: str, positions: Sequence[int], columns: Sequence[str], rows_held: int) -> pa.Table:
        """The SSTable's live rows at ``positions`` for a lookup of many keys: from its rows in
        the cache when they are there (a ``take`` by Lance costs ~0.5 ms a call, a hundred
        SSTables 50 ms a lookup of a thousand keys), else by Lance. A small SSTable is read whole
        into the cache instead (:meth:`cache_small`), which costs about what the take would; a
        larger one asked a second time has its rows cached when they fit (estimated from the rows
        taken and the ``rows_held`` of its key set)."""
        if self.cache_small(path, columns, rows_held):
            return self.rows(path, columns).take(pa.array(positions, pa.int64())).select(list(columns))
        taken = self.take(path, positions, columns)
        asked = self._asked.get(path, 0) + 1
        if len(self._asked) >= 4096:
            self._asked.clear()
        self._asked[path] = asked
        if asked >= 2 and taken.num_rows and self.worth_caching(taken.nbytes * max(rows_held, 1) // taken.num_rows):
            self.rows(path, columns)  # for the next lookups of many keys
        return taken

    def take(self, path: str, positions: Sequence[int], columns: Sequence[str]) -> pa.Table:
        """The SSTable's live rows at ``positions`` (:meth:`KeySet.find`'s), uncached."""
        with reading(path):
            ds = self.dataset(path)
            if not self._missing(path, columns):
                return ds.take(list(positions), columns=list(columns))
            return self._evolved(ds.take(list(positions), columns=self._present(path, columns)), columns)

    def read(self, path: str, **to_table: Any) -> pa.Table:
        """``to_table(**to_table)`` of the SSTable at ``path``, uncached (a filtered read, a
        vector search). An SSTable written under an earlier schema is read whole as the table's
        and the read runs on that copy in memory, since its filter or columns may name a column
        the SSTable lacks (rare: only until compaction folds the SSTables of before a change)."""
        with reading(path):
            ds = self.dataset(path)
            if self.schema is None or not self._missing(path, None):
                return ds.to_table(**to_table)
            copy = lance.write_dataset(self._evolved(ds.to_table()), f"memory://evolved-{uuid.uuid4().hex}")
            return copy.to_table(**to_table)

    def has_index(self, path: str, field_name: str, kind: str) -> bool:
        """Whether the SSTable has an index of ``kind`` (a details type name) on a column."""
        with reading(path):
            ds = self.dataset(path)
            field_id = ds.lance_schema.field(field_name).id()
            return any(field_id in d.fields and kind in d.type_url for d in ds.describe_indices())

    def delta(
        self, snap: "Snapshot", tail: pa.Table | None, columns: Sequence[str], primary_key: Sequence[str]
    ) -> pa.Table | None:
        """The newest version of every key written after the snapshot's base version: its live
        SSTables (oldest first, per shard) and the WAL tail, tombstones included; None if none."""
        where = [paths.sstable_path(snap.dataset.uri, s.shard_id, t.path) for s in snap.shards for t in s.live_sstables]
        if len(where) > 1:
            # Opening and reading an SSTable is mostly waiting on storage and Lance's decoder,
            # both outside the GIL: read them in parallel, kept in generation order.
            with ThreadPoolExecutor(min(READ_THREADS, len(where))) as pool:
                tables = list(pool.map(lambda p: self.rows(p, columns), where))
        else:
            tables = [self.rows(p, columns) for p in where]
        parts = [t.select([*columns, TOMBSTONE]) for t in tables]
        if tail is not None:
            parts.append(tail.select([*columns, TOMBSTONE]))
        if not parts:
            return None
        return newest(pa.concat_tables(parts, promote_options="permissive"), primary_key)


class LiveKeySets:
    """Each shard's live SSTables in a snapshot, newest first, with their key sets: what a
    point lookup walks, and what a vector search and a background refresh load.

    Kept for the shard's state in the snapshot last asked about (its manifest version and
    where its live SSTables start, so a strong reader's new snapshot of an unchanged shard
    finds them too), so a lookup walks a list instead of asking the byte-bounded cache for
    each SSTable's key set (~6 us each, 0.6 ms a lookup at 100 SSTables). The list holds the
    live SSTables' key sets until the next snapshot: beyond the cache's bound if that is
    smaller than the key sets of one shard's live SSTables. With ``MERGED_MIN_SSTABLES`` or
    more integer key sets, :meth:`find` searches one merged key set instead of each
    (:class:`MergedKeys`).
    """

    def __init__(self, cache: SSTableCache, primary_key: Sequence[str]) -> None:
        self.cache = cache
        self.primary_key = list(primary_key)
        #: per shard: its state's fingerprint in the snapshot last asked about, its live
        #: SSTables' key sets, and their merged key set once a lookup asked for it
        self._shards: dict[str, tuple[tuple, list[tuple[str, KeySet]], list["MergedKeys | None"]]] = {}

    def _entry(self, snap: "Snapshot", shard_id: str) -> tuple[tuple, list[tuple[str, KeySet]], list["MergedKeys | None"]] | None:
        state = snap.shard(shard_id)
        if state is None:
            return None
        fingerprint = (snap.dataset.uri, state.manifest.version, state.compacted_generation, state.read_after)
        cached = self._shards.get(shard_id)
        if cached is not None and cached[0] == fingerprint:
            return cached
        where = [paths.sstable_path(snap.dataset.uri, shard_id, sst.path) for sst in reversed(state.live_sstables)]
        entry = (fingerprint, [(path, self.cache.keys(path, self.primary_key)) for path in where], [None])
        self._shards[shard_id] = entry
        return entry

    def newest(self, snap: "Snapshot", shard_id: str) -> list[tuple[str, KeySet]]:
        """The shard's live SSTables in ``snap``, newest first, with their key sets."""
        entry = self._entry(snap, shard_id)
        return [] if entry is None else entry[1]

    def merged(self, snap: "Snapshot", shard_id: str) -> "tuple[list[tuple[str, KeySet]], MergedKeys] | None":
        """The shard's live SSTables newest first and their key sets merged, built once per
        shard state; None when a key set is not of integer keys."""
        entry = self._entry(snap, shard_id)
        if entry is None:
            return None
        listed = entry[1]
        if not listed or not all(k.ints is not None for _, k in listed):
            return None
        merged = entry[2][0]
        if merged is None:
            merged = entry[2][0] = MergedKeys.of([k for _, k in listed])
        return listed, merged

    def find(self, snap: "Snapshot", shard_id: str, key: Any) -> tuple[str, bool, int] | None:
        """The newest live SSTable of the shard holding ``key`` (:func:`lookup_key`'s form):
        its path, whether the key's version there is a tombstone, and its row's position."""
        entry = self._entry(snap, shard_id)
        if entry is None:
            return None
        listed = entry[1]
        if len(listed) >= MERGED_MIN_SSTABLES and all(k.ints is not None for _, k in listed):
            merged = entry[2][0]
            if merged is None:
                merged = entry[2][0] = MergedKeys.of([k for _, k in listed])
            hit = merged.find(key)
            return None if hit is None else (listed[hit[0]][0], hit[1], hit[2])
        for path, keys in listed:
            found = keys.find(key)
            if found is not None:
                return path, found[0], found[1]
        return None


#: A shard with at least this many live SSTables of integer keys is looked up in one merged
#: key set (one binary search instead of one per SSTable).
MERGED_MIN_SSTABLES = 4


@dataclass(frozen=True)
class MergedKeys:
    """The integer key sets of a shard's live SSTables as one: every key once, sorted, with
    the newest SSTable holding it (an index into the list it was made from, newest first),
    its tombstone flag and its row's position there, as :meth:`KeySet.find` of that SSTable
    answers (within one SSTable the later row of a key wins)."""

    ints: np.ndarray
    levels: np.ndarray
    tombstones: np.ndarray
    positions: np.ndarray

    @classmethod
    def of(cls, newest_first: Sequence[KeySet]) -> "MergedKeys":
        keys, levels, tombs, positions = [], [], [], []
        for level, ks in enumerate(newest_first):
            assert ks.ints is not None and ks.tombstones is not None and ks.positions is not None
            last = np.ones(len(ks.ints), dtype=bool)  # the last row of equal keys (sorted stably)
            if len(ks.ints) > 1:
                np.not_equal(ks.ints[1:], ks.ints[:-1], out=last[:-1])
            keys.append(ks.ints[last])
            levels.append(np.full(int(last.sum()), level, dtype=np.int32))
            tombs.append(ks.tombstones[last])
            positions.append(ks.positions[last])
        ints = np.concatenate(keys) if keys else np.zeros(0, np.int64)
        order = np.argsort(ints, kind="stable")  # equal keys: the newest SSTable first
        ints = ints[order]
        first = np.ones(len(ints), dtype=bool)
        if len(ints) > 1:
            np.not_equal(ints[1:], ints[:-1], out=first[1:])
        pick = order[first]
        return cls(ints[first], np.concatenate(levels)[pick], np.concatenate(tombs)[pick], np.concatenate(positions)[pick])

    def find(self, key: Any) -> tuple[int, bool, int] | None:
        """(the SSTable's index, is it a tombstone, its row's position), or None if absent."""
        if not isinstance(key, int) or not -(2**63) <= key < 2**63:
            return None
        i = int(np.searchsorted(self.ints, key))
        if i < len(self.ints) and self.ints[i] == key:
            return int(self.levels[i]), bool(self.tombstones[i]), int(self.positions[i])
        return None
