"""The change feed: every change committed to a table, per shard and generation, in order.

What a change is. Writers flush MemTables to SSTables, one *generation* per shard at a time,
and the compactor folds them into the base table in generation order, recording per shard
the highest generation folded (``compacted_sstables`` of each base version). So a shard's
SSTables, in generation order, are the table's change log: upserts and tombstones per key.
The feed reads them, folded or not yet, so it is as fresh as the last flush; rows still in a
WAL (not flushed) are not in it. A key's rows all go to one shard (rows are routed by key),
so per key the feed is in commit order.

Each change is a row of the table's columns plus :data:`CHANGE_TYPE` (``insert``,
``update_preimage``, ``update_postimage``, ``delete``), :data:`SHARD`, :data:`GENERATION` and
:data:`COMMIT_TIME` (when the generation was flushed). A generation holds one row per key
(the MemTable keeps the newest), so a key written several times within one generation
yields its **net change**: an insert-then-update is one insert, an update-then-delete one
delete (with the row as it was before the generation), an insert-then-delete nothing.

Before-images. Whether a live row is an insert or an update, and what a delete removed, is
decided by the key's row in the state just before the generation: the base table at the
position's *anchor* version plus the shard's SSTables after the generation that version
had folded, newest row per key (:func:`memwal.core.lsm.newest_across`), a tombstone meaning
absent. The anchor is a base version ``V`` whose folded generations are at or below what
the position consumed, so the SSTables in between are exactly those still needed:
``(V, {shard: generation consumed})`` is a :class:`Position`.

One commit does not follow the rule (see :mod:`memwal.maintain.compactor`): the delete pass of a
generation that holds tombstones and live rows commits without the marker, so at a version
between it and the marker the base already lacks that generation's deleted keys. Anchors
are chosen before such a commit (:func:`clean_anchor`), and a position keeps its anchor.

Retention. A consumer that registers a name (:class:`Consumer`) holds what it has yet to
read: the SSTables after its anchor (:mod:`memwal.core.holds`, which GC respects) and the anchor
version itself (a Lance tag, which version cleanup keeps), for at most
``GcConfig.feed_retention_seconds`` after its last commit. Reading from a position whose
SSTables or anchor were collected raises :class:`ChangesCollectedError` naming the oldest
position still readable.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Sequence

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal.core import holds, paths
from memwal.core.errors import ChangesCollectedError, InvalidArgumentError
from memwal.core.lance_errors import is_not_found
from memwal.core.lsm import newest_across, newest_per_key
from memwal.core.manifest import SsTable
from memwal.core.schema import TOMBSTONE, as_evolved, needs_evolving, stored_columns, stored_schema
from memwal.core.sqltext import in_filter, sql_literal
from memwal.core.state import TableState

CHANGE_TYPE = "_change_type"
SHARD = "_shard"
GENERATION = "_generation"
COMMIT_TIME = "_commit_time"
#: the columns the feed adds to the table's
FEED_COLUMNS = (CHANGE_TYPE, SHARD, GENERATION, COMMIT_TIME)

INSERT = "insert"
UPDATE_PREIMAGE = "update_preimage"
UPDATE_POSTIMAGE = "update_postimage"
DELETE = "delete"
CHANGE_TYPES = (INSERT, UPDATE_PREIMAGE, UPDATE_POSTIMAGE, DELETE)

#: keys per ``IN (...)`` filter when reading rows by key
KEYS_PER_FILTER = 5_000
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$")
_ORDER = "__memwal_feed_order"


def feed_schema(schema: pa.Schema) -> pa.Schema:
    """The schema of change rows of a table with columns ``schema``."""
    return pa.schema(
        [
            *schema,
            pa.field(CHANGE_TYPE, pa.string(), nullable=False),
            pa.field(SHARD, pa.string(), nullable=False),
            pa.field(GENERATION, pa.int64(), nullable=False),
            pa.field(COMMIT_TIME, pa.timestamp("us", tz="UTC"), nullable=False),
        ]
    )


@dataclass(frozen=True)
class Position:
    """Where a feed reader stands: the anchor base version and, per shard, the highest
    generation consumed (a shard absent has consumed what the anchor had folded)."""

    base_version: int
    consumed: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    def generation(self, shard_id: str, anchor_folded: Mapping[str, int]) -> int:
        return self.consumed.get(shard_id, anchor_folded.get(shard_id, 0))

    def to_json(self) -> dict:
        return {"base_version": self.base_version, "consumed": dict(sorted(self.consumed.items()))}

    @classmethod
    def from_json(cls, data: Mapping) -> "Position":
        try:
            return cls(int(data["base_version"]), MappingProxyType({str(k): int(v) for k, v in data["consumed"].items()}))
        except (KeyError, TypeError, ValueError, AttributeError):
            raise InvalidArgumentError(f"not a change feed position: {data!r}") from None

    def __str__(self) -> str:
        gens = ", ".join(f"{s[:8]}:{g}" for s, g in sorted(self.consumed.items()))
        return f"base version {self.base_version} ({gens or 'nothing flushed'})"


@dataclass(frozen=True)
class GenerationChanges:
    """The net changes of one flushed generation of one shard."""

    shard_id: str
    generation: int
    #: when the generation was flushed (seconds since the epoch)
    commit_time: float
    #: change rows (:func:`feed_schema`), a key's preimage right before its postimage
    rows: pa.Table


def folded(state: TableState, version: int) -> dict[str, int]:
    """Per shard, the highest generation folded into base version ``version``."""
    index = state.manifests.mem_wal_index(version)
    return dict(index.compacted) if index else {}


def head(state: TableState) -> dict[str, int]:
    """Per shard, the highest generation flushed (listed in its newest manifest)."""
    state.manifests.clear_cache()  # an SSTable flushed since a cached read is what a feed wants
    out = {}
    for shard_id in state.manifests.list_shards():
        m = state.manifests.read_shard(shard_id)
        if m is not None:
            gens = [s.generation for s in m.sstables]
            out[shard_id] = max(gens, default=m.current_generation - 1)
    return out


def _retained_versions(state: TableState) -> list[int]:
    return [int(v["version"]) for v in state.dataset().versions()]


def _has_version(state: TableState, version: int) -> bool:
    try:
        state.dataset(version)
        return True
    except (OSError, ValueError) as e:
        if is_not_found(e) or "not found" in str(e).lower():
            return False
        raise


def anchor_for(state: TableState, consumed: Mapping[str, int], versions: Sequence[int] | None = None) -> int:
    """The newest retained base version whose folded generations are all at or below
    ``consumed`` (a shard absent from ``consumed`` at 0): the cheapest anchor for a position
    (the fewest SSTables to overlay). Folded generations only grow with versions, so bisect."""
    versions = list(versions) if versions is not None else _retained_versions(state)

    def fits(v: int) -> bool:
        return all(g <= consumed.get(s, 0) for s, g in folded(state, v).items())

    lo, hi = 0, len(versions)  # versions[:lo] fit, versions[hi:] do not
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(versions[mid]):
            lo = mid + 1
        else:
            hi = mid
    if lo == 0:
        oldest = oldest_position(state)
        raise ChangesCollectedError(
            f"{state.uri}: no retained base version precedes the position {dict(consumed)}; the oldest available position is {oldest}",
            oldest,
        )
    return clean_anchor(state, versions[lo - 1], consumed)


def clean_anchor(state: TableState, version: int, consumed: Mapping[str, int]) -> int:
    """``version``, or an older retained version, whose base holds every key of the
    generations right after its folded ones that a read from ``consumed`` looks up there.

    A delete pass (module doc) commits without the marker: from it until the marker's commit,
    the base lacks the deleted keys of the shard's next generation, whose before-images would
    then read as absent. Such a commit drops rows while the folded generations stay; so for a
    shard that reads that generation next (``consumed`` at the folded one) and whose SSTable
    holds tombstones, walk back over the versions with the same folded generation and step
    before any that lost rows. Versions already cleaned up are taken as clean: a delete pass
    is followed by its marker at once, unless its compactor died, and then it reruns."""
    versions = _retained_versions(state)
    rows: dict[int, int] = {}

    def count(v: int) -> int:
        if v not in rows:
            rows[v] = state.dataset(v).count_rows()
        return rows[v]

    state.manifests.clear_cache()
    for _ in range(len(versions) + 1):
        at = folded(state, version)
        moved = False
        for shard_id in sorted(set(at) | set(state.manifests.list_shards())):
            c = at.get(shard_id, 0)
            if consumed.get(shard_id, 0) != c:
                continue
            m = state.manifests.read_shard(shard_id)
            nxt = next((x for x in (m.sstables if m else ()) if x.generation == c + 1), None)
            if nxt is None:
                continue
            if not pc.any(read_sstable(state, shard_id, nxt, list(state.primary_key)).column(TOMBSTONE)).as_py():
                continue
            v = version
            while v - 1 in versions and folded(state, v - 1).get(shard_id, 0) == c:
                if count(v) < count(v - 1):
                    version, moved = v - 1, True
                    break
                v -= 1
            if moved:
                break
        if not moved:
            return version
    return version


def start_at(state: TableState, version: int) -> Position:
    """The position right after base version ``version``: the changes after what it had folded."""
    if not _has_version(state, version):
        oldest = oldest_position(state)
        raise ChangesCollectedError(
            f"{state.uri}: base version {version} is not kept (or never existed); the oldest available position is {oldest}",
            oldest,
        )
    consumed = folded(state, version)
    return Position(clean_anchor(state, version, consumed), MappingProxyType(consumed))


def oldest_position(state: TableState) -> Position:
    """The oldest position the feed can still be read from: the oldest retained base version
    after whose folded generations every shard's SSTables are all still listed."""
    state.manifests.clear_cache()
    listed: dict[str, set[int]] = {}
    top: dict[str, int] = {}
    for shard_id in state.manifests.list_shards():
        m = state.manifests.read_shard(shard_id)
        if m is not None:
            listed[shard_id] = {s.generation for s in m.sstables}
            top[shard_id] = max(listed[shard_id], default=m.current_generation - 1)

    def readable(v: int) -> bool:
        f = folded(state, v)
        return all(all(g in gens for g in range(f.get(s, 0) + 1, top[s] + 1)) for s, gens in listed.items())

    versions = _retained_versions(state)
    lo, hi = 0, len(versions)  # versions[:lo] unreadable, from hi on readable (readability only grows)
    while lo < hi:
        mid = (lo + hi) // 2
        if readable(versions[mid]):
            hi = mid
        else:
            lo = mid + 1
    v = versions[min(lo, len(versions) - 1)]
    consumed = folded(state, v)
    return Position(clean_anchor(state, v, consumed), MappingProxyType(consumed))


def end_at(state: TableState, version: int | None) -> dict[str, int]:
    """Per shard, the last generation a read up to base version ``version`` includes (what it
    had folded), or up to the last flush when None."""
    if version is None:
        return head(state)
    if not _has_version(state, version):
        raise InvalidArgumentError(f"{state.uri}: no base version {version} to read changes until")
    return folded(state, version)


def _key_strings(rows: pa.Table, pk: Sequence[str]) -> pa.Array:
    """One comparable value per row for its primary key (composite keys as JSON text)."""
    if len(pk) == 1:
        return rows.column(pk[0]).combine_chunks()
    cols = [rows.column(c).to_pylist() for c in pk]
    return pa.array([json.dumps(list(v), default=str) for v in zip(*cols)], pa.string())


def rows_by_key(ds: lance.LanceDataset, keys: pa.Table, columns: Sequence[str], primary_key: Sequence[str],
                schema: pa.Schema | None = None) -> pa.Table:
    """The rows of ``ds`` whose primary key is in ``keys`` (through the key's BTREE when there is one).
    ``schema``: the table's columns now, for a ``ds`` of a version before a column was added or
    dropped (read as if written under them)."""
    pk = list(primary_key)
    cols = list(dict.fromkeys([*pk, *columns]))
    if schema is not None:
        wanted = pa.schema([schema.field(c) for c in cols])
        if needs_evolving(ds.schema, wanted):
            found = rows_by_key(ds, keys, [c for c in stored_columns(ds.schema.names, cols) if c not in pk], pk)
            return as_evolved(found, wanted)
    parts = []
    for start in range(0, keys.num_rows, KEYS_PER_FILTER):
        chunk = keys.slice(start, KEYS_PER_FILTER)
        where: str | pc.Expression
        if len(pk) == 1:
            where = in_filter(pk[0], chunk.column(pk[0]), ds.schema.field(pk[0]).type)
        else:
            where = " OR ".join(
                "(" + " AND ".join(f"{c} = {sql_literal(v)}" for c, v in zip(pk, row)) + ")"
                for row in zip(*(chunk.column(c).to_pylist() for c in pk))
            )
        parts.append(ds.to_table(columns=cols, filter=where))
    if not parts:
        return ds.schema.empty_table().select(cols)
    return pa.concat_tables(parts)


def read_sstable(state: TableState, shard_id: str, s: SsTable, columns: Sequence[str]) -> pa.Table:
    """One SSTable's rows (``columns`` and the tombstone flag), newest per key; a collected
    one raises :class:`ChangesCollectedError`."""
    path = paths.sstable_path(state.uri, shard_id, s.path)
    try:
        ds = state.sstable_dataset(path)
        wanted = [*columns, TOMBSTONE]
        # Stored before a column was added, dropped or widened: read as the columns now.
        rows = ds.to_table(columns=stored_columns(ds.schema.names, wanted))
        stored = stored_schema(state.write_schema)
        rows = as_evolved(rows, pa.schema([stored.field(c) for c in wanted]))
    except (OSError, ValueError) as e:
        state.sstable_datasets.discard_where(lambda k: k == path)  # an opened one whose files went
        if not (is_not_found(e) or "not found" in str(e).lower()):
            raise
        raise ChangesCollectedError(
            f"{state.uri}: shard {shard_id} generation {s.generation} was collected while it was read",
            None,
        ) from None
    pk = list(state.primary_key)
    # a flushed MemTable holds one row per key; checking is a fraction of deduplicating
    if len(pk) == 1 and pc.count_distinct(rows.column(pk[0])).as_py() == rows.num_rows:
        return rows
    return newest_per_key(rows, pk)


def _flush_time(state: TableState, shard_id: str, s: SsTable) -> float:
    try:
        _size, mtime = state.io.stat(paths.join(paths.sstable_path(state.uri, shard_id, s.path), "_versions"))
        return mtime
    except (FileNotFoundError, OSError):
        pass
    ds = state.lance_dataset(paths.sstable_path(state.uri, shard_id, s.path))
    ts = ds.versions()[-1]["timestamp"]
    return ts.timestamp() if hasattr(ts, "timestamp") else float(ts)


def net_changes(
    state: TableState, start: Mapping[str, int], end: Mapping[str, int], columns: Sequence[str]
) -> tuple[dict[str, pa.Table], dict[str, SsTable]]:
    """Per shard, the newest row per key (``columns`` and the tombstone flag) across
    generations ``start[shard] + 1 .. end[shard]``: the feed without before-images, what a
    consumer that needs only the changed keys and their new rows reads (materialized views);
    and per shard the SSTable of generation ``end[shard] + 1`` if flushed. Raises
    :class:`ChangesCollectedError` if a generation is gone."""
    pk = list(state.primary_key)
    state.manifests.clear_cache()  # an SSTable flushed since a cached read may be the next generation
    out: dict[str, pa.Table] = {}
    following: dict[str, SsTable] = {}
    for shard_id in sorted(set(start) | set(end) | set(state.manifests.list_shards())):
        a, b = start.get(shard_id, 0), end.get(shard_id, 0)
        if b < a:
            raise ChangesCollectedError(f"{state.uri}: shard {shard_id} is at generation {b}, before {a}", None)
        m = state.manifests.read_shard(shard_id)
        by_gen = {s.generation: s for s in (m.sstables if m else ())}
        if any(g not in by_gen for g in range(a + 1, b + 1)):
            raise ChangesCollectedError(f"{state.uri}: shard {shard_id} generations {a + 1}-{b} are not all kept", None)
        tables = [read_sstable(state, shard_id, by_gen[g], columns) for g in range(a + 1, b + 1)]
        if tables:
            out[shard_id] = newest_across(tables, pk)
        if b + 1 in by_gen:
            following[shard_id] = by_gen[b + 1]
    return out, following


class FeedReader:
    """Reads the feed from one position on. Not thread-safe; cheap to make.

    ``columns``: the table's columns to carry (all by default; the primary key always)."""

    def __init__(self, state: TableState, start: Position, columns: Sequence[str] | None = None) -> None:
        self.state = state
        self.start = start
        pk = list(state.primary_key)
        names = state.schema.names
        if columns is not None:
            unknown = [c for c in columns if c not in names]
            if unknown:
                raise InvalidArgumentError(f"no column(s) {unknown} in {state.uri}; its columns are {names}")
        self.columns = list(dict.fromkeys([*pk, *(columns if columns is not None else names)]))
        self.schema = feed_schema(pa.schema([state.schema.field(c) for c in self.columns]))
        self._base: lance.LanceDataset | None = None
        self._anchor_folded: dict[str, int] | None = None

    # -- the anchor --------------------------------------------------------------------------

    def _anchor(self) -> tuple[lance.LanceDataset, dict[str, int]]:
        if self._base is None:
            v = self.start.base_version
            try:
                self._base = self.state.dataset(v)
            except (OSError, ValueError) as e:
                if not (is_not_found(e) or "not found" in str(e).lower()):
                    raise
                oldest = oldest_position(self.state)
                raise ChangesCollectedError(
                    f"{self.state.uri}: the position's base version {v} is no longer kept; "
                    f"the oldest available position is {oldest}",
                    oldest,
                ) from None
            self._anchor_folded = folded(self.state, v)
        assert self._anchor_folded is not None
        return self._base, self._anchor_folded

    # -- reading -----------------------------------------------------------------------------

    def end_position(self, end: Mapping[str, int]) -> Position:
        """The position after reading up to ``end`` (the same anchor)."""
        _, anchor = self._anchor()
        shards = set(self.start.consumed) | set(end)
        return Position(
            self.start.base_version,
            MappingProxyType({s: max(self.start.generation(s, anchor), end.get(s, 0)) for s in sorted(shards)}),
        )

    def generations(self, end: Mapping[str, int]) -> Iterator[GenerationChanges]:
        """Every generation after the start position up to ``end[shard]``, per shard in order
        (shards one after the other, sorted by id); generations without a change are skipped."""
        base, anchor = self._anchor()
        self.state.manifests.clear_cache()
        for shard_id in sorted(set(end)):
            since = self.start.generation(shard_id, anchor)
            if end[shard_id] <= since:
                continue
            yield from self._shard(base, anchor.get(shard_id, 0), shard_id, since, end[shard_id])

    def read(self, end: Mapping[str, int]) -> pa.Table:
        parts = [g.rows for g in self.generations(end)]
        return pa.concat_tables(parts) if parts else self.schema.empty_table()

    def _shard(self, base: lance.LanceDataset, folded_at: int, shard_id: str, since: int, until: int) -> Iterator[GenerationChanges]:
        m = self.state.manifests.read_shard(shard_id)
        by_gen = {s.generation: s for s in (m.sstables if m else ())}
        missing = [g for g in range(folded_at + 1, until + 1) if g not in by_gen]
        if missing:
            oldest = oldest_position(self.state)
            raise ChangesCollectedError(
                f"{self.state.uri}: shard {shard_id} generation {missing[0]} (needed from position {self.start}) "
                f"was collected; the oldest available position is {oldest}",
                oldest,
            )
        pk = list(self.state.primary_key)
        overlay = [read_sstable(self.state, shard_id, by_gen[g], self.columns) for g in range(folded_at + 1, since + 1)]
        state_rows = newest_across(overlay, pk) if overlay else None
        for g in range(since + 1, until + 1):
            rows = read_sstable(self.state, shard_id, by_gen[g], self.columns)
            if rows.num_rows == 0:
                continue
            when = _flush_time(self.state, shard_id, by_gen[g])
            pre = self._before(base, state_rows, rows)
            out = self._changes(rows, pre, shard_id, g, when)
            state_rows = rows if state_rows is None else newest_across([state_rows, rows], pk)
            if out.num_rows:
                yield GenerationChanges(shard_id, g, when, out)

    def _before(self, base: lance.LanceDataset, overlay: pa.Table | None, rows: pa.Table) -> pa.Table:
        """The live rows of ``rows``' keys just before their generation: the overlay of the
        shard's SSTables since the anchor (a tombstone there: absent), else the anchor's base."""
        pk = list(self.state.primary_key)
        keys = rows.select(pk)
        found: list[pa.Table] = []
        rest = keys
        if overlay is not None and overlay.num_rows:
            in_overlay = overlay.filter(pc.is_in(_key_strings(overlay, pk), value_set=_key_strings(keys, pk)))
            found.append(in_overlay.filter(pc.invert(in_overlay.column(TOMBSTONE))).drop_columns([TOMBSTONE]))
            rest = keys.filter(pc.invert(pc.is_in(_key_strings(keys, pk), value_set=_key_strings(in_overlay, pk))))
        if rest.num_rows:
            found.append(rows_by_key(base, rest, self.columns, pk, self.state.write_schema))
        cast = pa.schema([self.state.schema.field(c) for c in self.columns])
        return pa.concat_tables([f.select(self.columns).cast(cast) for f in found]) if found else cast.empty_table()

    def _changes(self, rows: pa.Table, pre: pa.Table, shard_id: str, g: int, when: float) -> pa.Table:
        pk = list(self.state.primary_key)
        cast = pa.schema([self.state.schema.field(c) for c in self.columns])
        keys = _key_strings(rows, pk)
        existed = pc.is_in(keys, value_set=_key_strings(pre, pk)) if pre.num_rows else pa.array(np.zeros(rows.num_rows, bool))
        tomb = rows.column(TOMBSTONE).combine_chunks()
        live = pc.invert(tomb)
        body = rows.drop_columns([TOMBSTONE]).select(self.columns).cast(cast)
        order = np.arange(rows.num_rows, dtype=np.int64) * 2
        kinds = np.where(np.asarray(existed, bool), UPDATE_POSTIMAGE, INSERT)
        posts = body.append_column(CHANGE_TYPE, pa.array(kinds, pa.string())).append_column(_ORDER, pa.array(order + 1))
        posts = posts.filter(live)
        parts = [posts]
        if pre.num_rows:
            # each preimage goes right before its key's postimage (or is the delete's row)
            where = np.asarray(pc.index_in(_key_strings(pre, pk), value_set=keys), np.int64)
            dead = np.asarray(tomb, bool)[where]
            ptype = np.where(dead, DELETE, UPDATE_PREIMAGE)
            parts.append(pre.append_column(CHANGE_TYPE, pa.array(ptype, pa.string())).append_column(_ORDER, pa.array(where * 2)))
        out = pa.concat_tables(parts)
        out = out.take(pc.sort_indices(out.column(_ORDER))).drop_columns([_ORDER])
        n = out.num_rows
        out = out.append_column(SHARD, pa.array([shard_id] * n, pa.string()))
        out = out.append_column(GENERATION, pa.array(np.full(n, g, np.int64)))
        out = out.append_column(COMMIT_TIME, pa.array(np.full(n, int(when * 1_000_000), np.int64)).cast(pa.timestamp("us", tz="UTC")))
        return out.cast(self.schema)


def changes(state: TableState, since: Position | int | str, until: int | None = None, columns: Sequence[str] | None = None) -> tuple[pa.Table, Position]:
    """Every change after ``since`` (a position, a base version, or ``"earliest"``) up to base
    version ``until`` (what it had folded) or the last flush; and the position after them."""
    start = resolve_start(state, since)
    end = end_at(state, until)
    reader = FeedReader(state, start, columns)
    return reader.read(end), reader.end_position(end)


def resolve_start(state: TableState, since: Position | int | str) -> Position:
    if isinstance(since, Position):
        return since
    if isinstance(since, str):
        if since == "earliest":
            return oldest_position(state)
        if since == "latest":
            consumed = head(state)
            return Position(anchor_for(state, consumed), MappingProxyType(consumed))
        if since.isdigit():
            return start_at(state, int(since))
        raise InvalidArgumentError(f"since={since!r}: a base version, 'earliest' or 'latest'")
    return start_at(state, int(since))


# -- registered consumers -----------------------------------------------------------------------


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise InvalidArgumentError(f"consumer name {name!r}: letters, digits, '-' and '_' (at most 100)")
    return name


class Consumer:
    """A named consumer of the feed: its committed position, held against GC.

    Commit only what is durably consumed downstream: the hold and the anchor tag move to the
    new position, and the changes before it may then be collected."""

    def __init__(self, state: TableState, name: str) -> None:
        self.state = state
        self.name = check_name(name)
        self.path = paths.feed_hold(state.uri, name)

    def position(self) -> Position | None:
        record = holds.read_feed_hold(self.state.io, self.path)
        return Position.from_json(record.position) if record is not None else None

    def commit(self, position: Position) -> Position:
        """Record ``position`` as consumed, re-anchored to the newest base version that fits
        it (so the hold shrinks as compaction catches up); returns the re-anchored position."""
        anchor = max(position.base_version, anchor_for(self.state, position.consumed))
        pos = Position(anchor, position.consumed)
        tag = holds.FEED_TAG_PREFIX + self.name
        ds = self.state.dataset()
        # tag first: between the two, GC keeps both the old hold's SSTables and the new anchor
        try:
            if tag in ds.tags.list():
                ds.tags.update(tag, anchor)
            else:
                ds.tags.create(tag, anchor)
        except (OSError, ValueError, RuntimeError):
            ds = self.state.dataset()
            if tag in ds.tags.list():
                ds.tags.update(tag, anchor)
            else:
                raise
        holds.write_feed_hold(self.state.io, self.path, holds.FeedHold(folded(self.state, anchor), pos.to_json(), time.time()))
        return pos

    def drop(self) -> None:
        """Unregister: GC may collect what this consumer had not read."""
        ds = self.state.dataset()
        tag = holds.FEED_TAG_PREFIX + self.name
        if tag in ds.tags.list():
            ds.tags.delete(tag)
        self.state.io.remove(self.path)


def consumers(state: TableState) -> list[str]:
    return sorted(n.removesuffix(".json") for n in state.io.list_dir(paths.feeds_dir(state.uri)) if n.endswith(".json"))
