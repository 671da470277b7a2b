"""A streaming query's micro-batch reports, in the driver process that runs the query.

Each micro-batch ends in one :class:`~memwal.write.api.WriteReport`, made by the write API's
commit. The ``foreachBatch`` sink commits in the query's own process and records its reports
here directly; ``format("memwal")`` commits in a Python process Spark starts for it on the
driver, which leaves each report as a JSON file in a directory (the ``reportDir`` option,
:func:`memwal.spark.write.publish`) that :class:`Reports` reads and removes as it is asked.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import fields

from memwal.write.messages import WriteReport

log = logging.getLogger("memwal.streaming")

#: Reports kept (the newest); totals count every batch regardless.
KEPT_REPORTS = 1000

_FIELDS = {f.name for f in fields(WriteReport)}


class Reports:
    """The reports of one query's micro-batches: the newest :data:`KEPT_REPORTS` by batch, and
    totals over every batch. ``directory``: where commits in other processes leave theirs."""

    def __init__(self, directory: str | None = None) -> None:
        self.directory = directory
        self._reports: list[WriteReport] = []
        #: Counters summed over every micro-batch: kept apart from the reports, which forget
        #: old batches, so totals keep growing however long the query runs.
        self._totals: dict[str, float] = {"batches": 0}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, object]:
        """A copy sent elsewhere (a sink pickled to a Spark Connect server) starts with none:
        its reports are its own process's."""
        return {"directory": self.directory}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(state["directory"])  # type: ignore[misc, arg-type]

    def record(self, report: WriteReport) -> None:
        with self._lock:
            self._reports.append(report)
            self._reports.sort(key=lambda r: -1 if r.batch_id is None else r.batch_id)
            del self._reports[:-KEPT_REPORTS]
            for k, v in report.counters().items():
                self._totals[k] = self._totals.get(k, 0) + v
            self._totals["batches"] += 1

    def _collect(self) -> None:
        """Record the reports other processes left in :attr:`directory`, and remove their files."""
        if self.directory is None:
            return
        try:
            names = sorted(n for n in os.listdir(self.directory) if n.endswith(".json"))
        except FileNotFoundError:
            return
        for name in names:
            path = os.path.join(self.directory, name)
            try:
                with open(path) as f:
                    d = json.load(f)
                os.remove(path)
            except (OSError, ValueError) as e:  # half-written by a commit that crashed: not a report
                log.debug("skipping report file %s: %s", path, e)
                continue
            self.record(WriteReport(**{k: v for k, v in d.items() if k in _FIELDS}))

    @property
    def reports(self) -> list[WriteReport]:
        """The newest reports, oldest first."""
        self._collect()
        with self._lock:
            return list(self._reports)

    def report(self, batch_id: int) -> WriteReport | None:
        self._collect()
        with self._lock:
            for r in reversed(self._reports):
                if r.batch_id == batch_id:
                    return r
        return None

    def totals(self) -> dict[str, float]:
        """Every counter of :class:`~memwal.write.api.WriteReport` summed over all the
        micro-batches reported (``batches``: how many)."""
        self._collect()
        with self._lock:
            return dict(self._totals)
