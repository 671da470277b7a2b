"""Point reads: the base table's live rows of one key, and many keys at once.

A point lookup is one Lance scan of the base through its primary-key index (or a ``take``
from the SSTable that holds the key, :mod:`memwal.readers.sstables`). Profiled on a 1M-row
base (docs/bench-log/reads.md, "Where a lookup's time goes"), Lance's own work was about
0.85 ms; around it, pylance's Python scanner builder cost ~0.1 ms per call (it deep-copies
its options on every scan, for a ``to_pandas`` this never calls) and memwal's own steps
~0.3 ms (the deleted-row filter, schema lookups, building the row). :class:`BaseLookup`
builds the scanner's options once per column set and hands them to Lance's native scanner,
so a lookup costs Lance's work and a few microseconds of memwal's.
"""

from __future__ import annotations

import copy
import logging
from typing import Any, Sequence

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lance.dataset import ScannerBuilder

log = logging.getLogger(__name__)

#: The scanner options a point read of the base sets (see :func:`base_point_read`).
POINT_READ_OPTIONS: dict[str, Any] = {"with_row_id": True, "include_deleted_rows": True, "late_materialization": False}


def _native_args(b: ScannerBuilder, filter: str) -> tuple:  # noqa: A002 - Lance's name
    """The arguments ``ScannerBuilder.to_scanner`` of pylance 14.0.2 passes to the native
    scanner, in its order, with ``filter``."""
    return (
        b._columns, b._columns_with_transform, filter, b._search_filter, b._prefilter, b._limit, b._offset, b._nearest,
        b._batch_size, b._batch_size_bytes, b._io_buffer_size, b._batch_readahead, b._fragment_readahead, b._scan_in_order,
        b._fragments, b._index_segments, b._with_row_id, b._with_row_address, b._use_stats, b._substrait_filter,
        b._fast_search, b._full_text_query, b._late_materialization, b._blob_handling, b._use_scalar_index,
        b._include_deleted_rows, b._scan_stats_callback, b._strict_batch_size, b._orderings,
        b._disable_scoring_autoprojection, b._substrait_aggregate, b._row_addr_allowlist, b._row_addr_blocklist,
        b._minhash_query,
    )


class BaseLookup:
    """Filtered reads of one base dataset version with fixed options, built once.

    ``read(columns, filter)`` equals ``dataset.to_table(columns=columns, filter=filter,
    **options)``; it skips pylance's per-call Python (the scanner builder and its deep copy)
    by calling the native scanner with the builder's arguments, made once per column set.
    ``native`` says whether it does: should a pylance release change the native signature,
    the first call falls back to ``to_table`` for good (logged once), and a test that asserts
    ``native`` fails, so the change is seen rather than silently slower.
    """

    def __init__(self, dataset: lance.LanceDataset, **options: Any) -> None:
        self.dataset = dataset
        self.options = options
        self.native = True
        self._builders: dict[tuple[str, ...], ScannerBuilder] = {}

    def _builder(self, columns: tuple[str, ...]) -> ScannerBuilder:
        b = self._builders.get(columns)
        if b is None:
            b = ScannerBuilder(self.dataset)
            b = self.dataset._apply_default_scan_options(b)
            b.columns(list(columns))
            for name, value in self.options.items():
                getattr(b, name)(value)
            if len(self._builders) >= 64:  # column sets a caller asks for are few; bound it anyway
                self._builders.clear()
            self._builders[columns] = b
        return b

    def read(self, columns: Sequence[str], filter: str) -> pa.Table:  # noqa: A002 - Lance's name
        return self._scan(columns, filter)

    def search(self, columns: Sequence[str], nearest: dict[str, Any], filter: str | None,  # noqa: A002 - Lance's name
               prefilter: bool | None) -> pa.Table:
        """``dataset.to_table(nearest=nearest, columns=columns, filter=filter,
        prefilter=prefilter, **options)``, through the native scanner as :meth:`read`."""
        return self._scan(columns, filter, nearest, prefilter)

    def _scan(self, columns: Sequence[str], filter: str | None,  # noqa: A002 - Lance's name
              nearest: dict[str, Any] | None = None, prefilter: bool | None = None) -> pa.Table:
        if self.native:
            try:
                b = self._builder(tuple(columns))
                if nearest is not None:
                    b = copy.copy(b)  # the cached builder stays as it was
                    b.nearest(**nearest)
                    if prefilter is not None:
                        b.prefilter(prefilter)
                return self.dataset._ds.scanner(*_native_args(b, filter)).to_pyarrow().read_all()
            except TypeError as e:  # the native signature changed (a pylance upgrade)
                self.native = False
                log.warning("Lance's native scanner signature changed (%s); base reads use to_table", e)
        extra = {} if nearest is None else {"nearest": nearest, "prefilter": prefilter}
        return self.dataset.to_table(columns=list(columns), filter=filter, **self.options, **extra)


def live_rows(rows: pa.Table) -> pa.Table:
    """``rows`` read with ``include_deleted_rows`` and ``_rowid`` (see :func:`base_point_read`),
    without the deleted ones and without ``_rowid``."""
    rowid = rows.column("_rowid")
    if rowid.null_count:
        rows = rows.filter(pc.is_valid(rowid))
    return rows.drop_columns(["_rowid"])


def base_point_read(dataset: lance.LanceDataset | BaseLookup, columns: Sequence[str], predicate: str) -> pa.Table:
    """The live base rows matching ``predicate`` (a point predicate on the primary key).

    Asked for its live rows, Lance builds the whole table's deletion mask for every query, at
    about 9 ns per deleted row: every base row the compactor updated or deleted and base
    compaction has not yet rewritten away, 1.6 ms of a 2.6 ms lookup on a soaked 1.9M-row
    table against 0.8 ms on the same rows written fresh (docs/bench-log/lookup-history.md). Asked for
    deleted rows too, it skips the mask; a deleted row then comes back with a null
    ``_rowid``, so dropping those rows leaves exactly the live ones. The index narrows the
    read to the key's few versions first, so the extra rows cost nothing measurable.
    """
    lookup = dataset if isinstance(dataset, BaseLookup) else BaseLookup(dataset, **POINT_READ_OPTIONS)
    rows = lookup.read(columns, predicate)
    return live_rows(rows) if "_rowid" in rows.column_names else rows


def point_lookup(dataset: lance.LanceDataset) -> BaseLookup:
    """Point reads of ``dataset`` for :func:`base_point_read`: with deleted rows (then dropped
    by memwal) when it has deletions, else plain ones, which read no ``_rowid`` (~3% of a
    lookup on a 1M-row base). Whether it has any is read once per base version, from its
    fragments' metadata."""
    deletions = any(f.metadata.deletion_file is not None for f in dataset.get_fragments())
    return BaseLookup(dataset, **POINT_READ_OPTIONS) if deletions else BaseLookup(dataset)


class BaseKeyMap:
    """A base version's integer keys, sorted, with their rows' ids: a point read of that
    version is then a binary search and a ``take`` of one row (~0.35 ms on a 1M-row base)
    instead of a scan through the key's index (~0.65 ms, most of it Lance planning the scan).
    Built from the version's live rows (~25 ms per million, then 16 bytes a row); a version
    never changes, so neither does its map."""

    def __init__(self, dataset: lance.LanceDataset, column: str) -> None:
        self.version = dataset.version
        t = dataset.to_table(columns=[column], with_row_id=True)
        keys = t.column(column).to_numpy().astype(np.int64, copy=False)
        order = np.argsort(keys, kind="stable")
        self.keys = keys[order]
        self.row_ids = t.column("_rowid").to_numpy()[order]

    def row_id(self, key: int) -> int | None:
        """The row id of ``key``'s live row in the version, or None if it has none."""
        i = int(np.searchsorted(self.keys, key))
        return int(self.row_ids[i]) if i < len(self.keys) and self.keys[i] == key else None

    def row_ids_of(self, keys: np.ndarray) -> np.ndarray:
        """The row ids of those of ``keys`` the version holds, each once, ascending (the order
        a take reads fastest in)."""
        if not len(self.keys):
            return np.zeros(0, np.uint64)
        i = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        return np.unique(self.row_ids[i[self.keys[i] == keys]])

    def read(self, dataset: lance.LanceDataset, key: int, columns: Sequence[str]) -> pa.Table | None:
        """``key``'s live row (``columns``) in ``dataset`` (the map's version), or None if it
        has none."""
        rid = self.row_id(key)
        return None if rid is None else dataset._take_rows([rid], columns=list(columns))

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.row_ids.nbytes


def first_row(rows: pa.Table) -> dict[str, Any]:
    """The first row of ``rows`` as a dict: column by column, half the cost of ``to_pylist``
    on a one-row table (~15 against ~30 us for three columns)."""
    return {name: col.to_pylist()[0] for name, col in zip(rows.column_names, rows.columns)}
