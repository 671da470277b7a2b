"""What a reader does by default: one dataclass, :class:`ReadConfig`, passed to
:func:`memwal.readers.open` (``config=``); every default of the read path lives here."""

from __future__ import annotations

from dataclasses import dataclass

from memwal.errors import InvalidArgumentError


@dataclass(frozen=True)
class ReadConfig:
    """A reader's settings. The defaults were chosen by measurement (docs/bench-log/reads.md)."""

    #: Rows per record batch a scan reads and yields at most: with ``scan_sstables_ahead`` and
    #: the largest SSTable (``max_memtable_rows``), what bounds a scan's memory.
    scan_batch_rows: int = 65_536
    #: SSTables a scan reads ahead of the one it yields, on threads.
    scan_sstables_ahead: int = 4

    def __post_init__(self) -> None:
        for name in ("scan_batch_rows", "scan_sstables_ahead"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidArgumentError(f"{name} must be a positive integer, got {v!r}")
