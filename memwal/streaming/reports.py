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
        #: A whole-database ingest's batches: their per-table reports (the newest batches),
        #: and totals per table over every batch.
        self._tables: dict[int, tuple[WriteReport, ...]] = {}
        self._table_totals: dict[str, dict[str, float]] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, object]:
        """A copy sent elsewhere (a sink pickled to a Spark Connect server) starts with none:
        its reports are its own process's."""
        return {"directory": self.directory}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(state["directory"])  # type: ignore[misc, arg-type]

    def record(self, report: WriteReport, tables: tuple[WriteReport, ...] = ()) -> None:
        """Record a batch's report; ``tables``: its per-table reports, when it wrote several
        tables (``report`` is then their sum, :meth:`WriteReport.combined`)."""
        with self._lock:
            self._reports.append(report)
            self._reports.sort(key=lambda r: -1 if r.batch_id is None else r.batch_id)
            del self._reports[:-KEPT_REPORTS]
            for k, v in report.counters().items():
                self._totals[k] = self._totals.get(k, 0) + v
            self._totals["batches"] += 1
            if tables and report.batch_id is not None:
                self._tables[report.batch_id] = tuple(tables)
                for old in sorted(self._tables)[:-KEPT_REPORTS]:
                    del self._tables[old]
                for t in tables:
                    totals = self._table_totals.setdefault(t.table, {"batches": 0})
                    for k, v in t.counters().items():
                        totals[k] = totals.get(k, 0) + v
                    totals["batches"] += 1

    def tables(self, batch_id: int) -> tuple[WriteReport, ...]:
        """The per-table reports of a batch that wrote several tables (else none)."""
        with self._lock:
            return self._tables.get(batch_id, ())

    def table_totals(self) -> dict[str, dict[str, float]]:
        """Per table written: its counters summed over the batches that wrote it."""
        with self._lock:
            return {t: dict(v) for t, v in self._table_totals.items()}

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
