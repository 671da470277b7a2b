"""Materialized views over a memwal table, refreshed incrementally from its change feed.

A view is a query over the base table: ``select`` expressions and a ``where`` predicate in
the DataFusion SQL dialect, Python UDF columns evaluated on Arrow batches, an optional
deterministic shuffle, or ``group_by`` with ``count``/``sum``/``min``/``max``/``avg``. It
is stored as a plain Lance table under ``{table}/_memwal/views/{name}``; each refresh is
one atomic commit of it, carrying the refresh's record.

Modules, one concept each:

* :mod:`~memwal.views.definition`: what a view computes, and the SQL it sniffs;
* :mod:`~memwal.views.evaluate`: evaluating that SQL on Arrow rows (DataFusion);
* :mod:`~memwal.views.aggregates`: aggregate states with add / retract / finish;
* :mod:`~memwal.views.udf`: the one UDF runner, local (checkpointed) and on Spark;
* :mod:`~memwal.views.checkpoints`, :mod:`~memwal.views.lease`: a refresh's UDF
  checkpoints and its lease, on the table's FileIO;
* :mod:`~memwal.views.refresh`: the change a refresh applies, and its one commit;
* :mod:`~memwal.views.history`: refresh records, read from the view's commits;
* :mod:`~memwal.views.layout`: where a view lives and the names it reserves;
* :mod:`~memwal.views.view`: :class:`View`, the user's handle.
"""

from memwal.views.definition import UdfColumn, ViewDefinition, parse_type
from memwal.views.errors import ViewBusyError, ViewError
from memwal.views.history import Freshness, RefreshRecord
from memwal.views.layout import GROUP_KEY, ROW_ID, view_uri, views_root
from memwal.views.udf import UdfStats
from memwal.views.view import View, list_views

__all__ = [
    "GROUP_KEY",
    "ROW_ID",
    "Freshness",
    "RefreshRecord",
    "UdfColumn",
    "UdfStats",
    "View",
    "ViewBusyError",
    "ViewDefinition",
    "ViewError",
    "list_views",
    "parse_type",
    "view_uri",
    "views_root",
]
