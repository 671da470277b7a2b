"""Partial updates: folding records that carry only some columns, then resolving them
against the stored row. Pure functions over Arrow data, no I/O.

**Absent vs null.** A partial record changes only the columns it carries; a column it does
not carry is *absent* and keeps its stored value, while an explicit null sets null. Arrow
has one null, so presence travels beside the values: rows conformed to the table's write
schema (an absent cell is null there) plus a *presence* struct array with one non-null
boolean field per non-key column (:func:`presence_type`), True where the record carries the
column. Key columns are always present: a partial record without its key is refused
before it gets here. Through routing and Spark's exchange the presence is one more column,
:data:`PRESENT`, next to the rows it describes. How inputs set it:

- an Arrow table: a column missing from the table is absent in every row;
- a list of dicts (``Table.write``) or a JSON record (Kafka): a key missing from the
  object is absent in that record, ``"col": null`` is null.

**Folding one batch (per key, in order).** An upsert sets the columns it carries; later
records win, columns set earlier and not carried later persist. A delete resets the key:
what came before it is gone, and a partial record after it starts from an empty row (its
absent columns are null), not from the stored row, as Paimon's partial-update merge
engine does when it meets a retraction. So each key folds to one of:

- deleted (its last record is a delete): delete the key;
- reset (a delete, then upserts): an upsert of the folded row, nothing read;
- complete (every column carried since the batch began): an upsert, nothing read;
- otherwise: merged over the stored row (:func:`resolve`); a key that is not stored
  yet is inserted with its absent columns null.

**Why read-modify-write is safe.** The write path (:mod:`memwal.write.protocol`) reads the
stored row of a key after its writer claimed the key's shard, once every earlier write of the
shard is durable in its WAL; a strong read (base + SSTables + the WAL tail) therefore sees the
newest row, and a writer that claims the shard before the merged row is written fences this
one, which then reads and merges again instead of writing what it decided. A replayed batch
folds to the same result and setting the same columns twice changes nothing, so a replay
after a crash is idempotent as full upserts are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa

from memwal.core.errors import InvalidArgumentError

#: The presence column next to routed rows (internal names start with "__").
PRESENT = "__memwal_present"

#: Merge modes of a write: "full" replaces the row (upsert), "partial" changes only the
#: columns a record carries.
MERGE_MODES = ("full", "partial")

_POS = "__memwal_fold_position"
_DEL = "__memwal_fold_delete"
_SPOS = "__memwal_stored_position"


def check_merge(merge: str) -> str:
    """``merge`` if it is a known merge mode, else :class:`InvalidArgumentError`."""
    if merge not in MERGE_MODES:
        raise InvalidArgumentError(f"merge must be one of {list(MERGE_MODES)}, got {merge!r}")
    return merge


def value_columns(schema: pa.Schema, primary_key: Sequence[str]) -> list[str]:
    """The columns a partial record may leave out: every non-key column, in schema order."""
    return [n for n in schema.names if n not in primary_key]


def presence_type(schema: pa.Schema, primary_key: Sequence[str]) -> pa.StructType:
    """``struct<col: bool not null, ...>`` over the non-key columns of ``schema``."""
    return pa.struct([pa.field(c, pa.bool_(), nullable=False) for c in value_columns(schema, primary_key)])


def presence_of_columns(n: int, ptype: pa.StructType, columns: Iterable[str]) -> pa.StructArray:
    """Presence of ``n`` rows that all carry exactly ``columns`` (an Arrow table's columns)."""
    have = set(columns)
    return pa.StructArray.from_arrays(
        [pa.array(np.full(n, f.name in have), pa.bool_()) for f in ptype], fields=list(ptype)
    )


def presence_of_masks(masks: Mapping[str, np.ndarray], n: int, ptype: pa.StructType) -> pa.StructArray:
    """Presence from per-column boolean masks (a column without a mask: present in every row)."""
    arrays = [pa.array(np.asarray(masks[f.name], bool) if f.name in masks else np.ones(n, bool), pa.bool_()) for f in ptype]
    return pa.StructArray.from_arrays(arrays, fields=list(ptype))


def presence_of_dicts(records: Sequence[Mapping[str, Any]], ptype: pa.StructType) -> pa.StructArray:
    """Presence of records given as dicts: a key the dict lacks is absent in that record."""
    n = len(records)
    masks = {f.name: np.fromiter((f.name in r for r in records), bool, n) for f in ptype}
    return presence_of_masks(masks, n, ptype)


def check_keys_present(records: Sequence[Mapping[str, Any]], primary_key: Sequence[str]) -> None:
    """Refuse the first record that lacks a primary-key column (or has it null), naming it:
    a partial record must say which row it changes."""
    for i, r in enumerate(records):
        missing = [c for c in primary_key if r.get(c) is None]
        if missing:
            shown = repr(dict(r))
            shown = shown if len(shown) <= 200 else shown[:200] + "..."
            raise InvalidArgumentError(f"record {i} {shown} lacks primary-key column(s) {missing}; a partial record must carry its key")


def _as_array(a: pa.Array | pa.ChunkedArray) -> pa.Array:
    return a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a


@dataclass(frozen=True)
class Folded:
    """One batch folded to one row per key (in the order of each key's first record)."""

    #: Write-schema rows; a column no record set since the key's last delete is null.
    rows: pa.Table
    #: Which columns the batch set for each key since its last delete (:func:`presence_type`).
    present: pa.StructArray
    #: The key's last record is a delete.
    deleted: np.ndarray
    #: A delete came before the key's last upserts: the row starts empty, nothing is read.
    reset: np.ndarray

    @property
    def complete(self) -> np.ndarray:
        """Every non-key column was set (a full upsert): nothing needs to be read."""
        out = np.ones(self.rows.num_rows, bool)
        for i in range(self.present.type.num_fields):
            out &= np.asarray(self.present.field(i), bool)
        return out

    @property
    def needs_stored(self) -> np.ndarray:
        """Keys whose result depends on their stored row."""
        return ~self.deleted & ~self.reset & ~self.complete


def fold(rows: pa.Table, present: pa.StructArray | pa.ChunkedArray, deletes: Any, primary_key: Sequence[str]) -> Folded:
    """Fold ``rows`` (write schema, in order: later records win) per key.

    ``present`` is their presence, ``deletes`` a boolean per row (True: delete the key;
    its other columns are ignored). Vectorized: one group-by for all columns, then a take
    per column of the row that last set it after the key's last delete.
    """
    pk = list(primary_key)
    n = rows.num_rows
    present = _as_array(present)
    dels = np.asarray(_as_array(deletes) if not isinstance(deletes, np.ndarray) else deletes, bool)
    if n == 0:
        return Folded(rows, present, np.zeros(0, bool), np.zeros(0, bool))
    pos = np.arange(n, dtype=np.int64)
    cols = [f.name for f in present.type]
    work = {c: rows.column(c) for c in pk}
    work[_POS] = pa.array(pos)
    work[_DEL] = pa.array(np.where(dels, pos, -1))
    for i in range(len(cols)):
        sets = np.asarray(present.field(i), bool) & ~dels
        work[f"{_POS}:{i}"] = pa.array(pos, mask=~sets)
    grouped = pa.table(work).group_by(pk, use_threads=False).aggregate(
        [(_POS, "max"), (_DEL, "max")] + [(f"{_POS}:{i}", "max") for i in range(len(cols))]
    )
    last = grouped.column(f"{_POS}_max").to_numpy()
    last_del = grouped.column(f"{_DEL}_max").to_numpy()
    deleted = last_del == last
    reset = (last_del >= 0) & ~deleted
    out = {c: rows.column(c).take(pa.array(last)) for c in pk}
    flags = []
    for i, c in enumerate(cols):
        setter = grouped.column(f"{_POS}:{i}_max").fill_null(-1).to_numpy()
        setter = np.where(setter > last_del, setter, -1)  # set before the last delete: gone
        flags.append(pa.array(setter >= 0))
        out[c] = rows.column(c).take(pa.array(setter, mask=setter < 0))
    folded = pa.Table.from_arrays([out[c] for c in rows.schema.names], schema=rows.schema)
    return Folded(folded, pa.StructArray.from_arrays(flags, fields=list(present.type)), deleted, reset)


def resolve(folded: Folded, stored: pa.Table | None, primary_key: Sequence[str]) -> tuple[pa.Table, pa.Table]:
    """(keys to delete, full rows to upsert) of a folded batch.

    ``stored`` holds the live stored rows (write-schema columns) of at least the keys in
    :attr:`Folded.needs_stored`; a key it lacks is not stored, so its absent columns stay
    null. Columns the batch set win; the others come from the stored row.
    """
    pk = list(primary_key)
    rows = folded.rows
    dels = rows.filter(pa.array(folded.deleted)).select(pk)
    keep = ~folded.deleted
    ups = rows.filter(pa.array(keep))
    need = folded.needs_stored[keep]
    present = folded.present.filter(pa.array(keep))
    if not need.any() or stored is None or stored.num_rows == 0:
        return dels, ups
    n = ups.num_rows
    # Which stored row (if any) each upsert merges over: a join on the keys only (Arrow's
    # joins cannot carry every column type, e.g. fixed-size lists), values by take.
    probe = ups.select(pk).append_column(_POS, pa.array(np.arange(n, dtype=np.int64)))
    side = stored.select(pk).cast(probe.select(pk).schema).append_column(_SPOS, pa.array(np.arange(stored.num_rows, dtype=np.int64)))
    joined = probe.join(side, keys=pk, join_type="inner")
    spos = np.full(n, -1, np.int64)
    spos[joined.column(_POS).to_numpy()] = joined.column(_SPOS).to_numpy()
    spos[~need] = -1  # reset and complete rows never merge over the stored row
    if (spos < 0).all():
        return dels, ups
    columns = []
    for f in ups.schema:
        col = ups.column(f.name)
        if f.name in pk:
            columns.append(col)
            continue
        carried = np.asarray(present.field(f.name), bool)
        take_stored = ~carried & (spos >= 0)
        if not take_stored.any():
            columns.append(col)
            continue
        both = pa.chunked_array(col.chunks + stored.column(f.name).cast(f.type).chunks, f.type)
        idx = np.where(take_stored, n + spos, np.arange(n))
        columns.append(both.take(pa.array(idx)))
    return dels, pa.Table.from_arrays(columns, schema=ups.schema)
