"""Refresh records: what each refresh of a view reflects, kept in the view's commits.

Every refresh is one commit of the view table carrying its :class:`RefreshRecord` in the
commit's transaction properties, so the view's refresh history is its commit history and
cannot disagree with its data.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Iterator

import lance

from memwal.core.lance_errors import is_not_found
from memwal.views.layout import RECORD_KEY


@dataclass(frozen=True)
class RefreshRecord:
    """What one refresh reflects; stored in the view commit's transaction properties."""

    base_version: int
    compacted: dict[str, int]
    refreshed_at: float
    view_version: int
    mode: str  # "full" or "incremental"
    rows_changed: int
    udf_versions: dict[str, str]
    udf_calls: int = 0
    seconds: float = 0.0

    def to_properties(self) -> dict[str, str]:
        return {RECORD_KEY: json.dumps(asdict(self))}


@dataclass
class Freshness:
    """How far a view is behind its table."""

    base_version_reflected: int | None
    base_version_latest: int
    versions_behind: int
    seconds_behind: float | None
    #: data in the table's MemWAL not yet compacted into the base (invisible to the view)
    uncompacted_sstables: int
    uncompacted_rows: int


def refresh_records(view: lance.LanceDataset, newest_first: bool = False) -> Iterator[RefreshRecord]:
    """The records of the view's refreshes, read from its commits one by one (so the
    newest can be found without reading the whole history)."""
    if newest_first:
        yield from _newest_first(view)
        return
    for v in view.versions():
        record = _record(view, v["version"])
        if record is not None:
            yield record


def last_record(view: lance.LanceDataset) -> RefreshRecord | None:
    """The view's newest refresh record: its latest commit's, or (an index commit came
    after it) one of the few before; without listing the view's versions, whose cost grows
    with its history."""
    return next(_newest_first(view), None)


def _newest_first(view: lance.LanceDataset) -> Iterator[RefreshRecord]:
    for v in range(view.version, 0, -1):
        try:
            record = _record(view, v)
        except (OSError, ValueError) as e:  # Lance's untyped errors: a version cleaned up ends the history
            if is_not_found(e) or "not found" in str(e).lower():
                return
            raise
        if record is not None:
            yield record


def _record(view: lance.LanceDataset, version: int) -> RefreshRecord | None:
    txn = view.read_transaction(version)
    props = (txn.transaction_properties or {}) if txn is not None else {}
    return RefreshRecord(**json.loads(props[RECORD_KEY])) if RECORD_KEY in props else None
