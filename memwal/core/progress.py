"""Progress of long operations, as typed records handed to a callback.

Library functions that can run for more than a few seconds (``check_table``,
``repair_table``, ``upgrade``) take ``progress: ProgressCallback | None``; they call it with a
:class:`Progress` as work is done and never decide how it is shown. The CLI shows it as
progress bars on a terminal (:mod:`memwal.cli.terminal`); anyone else may log it or ignore it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Progress:
    """How far one task of an operation is."""

    #: what is being done, e.g. "checking shards"; one bar per distinct task
    task: str
    done: int
    #: None: not known (no bar's end, no ETA)
    total: int | None = None
    #: what ``done`` counts: "rows", "shards", "bytes", "records", "steps"
    unit: str = "rows"


ProgressCallback = Callable[[Progress], None]


def notify(callback: ProgressCallback | None, task: str, done: int, total: int | None = None, unit: str = "rows") -> None:
    """Call ``callback`` (if any) with a :class:`Progress`."""
    if callback is not None:
        callback(Progress(task, done, total, unit))
