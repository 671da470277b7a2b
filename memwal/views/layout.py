"""Where a view lives and the names it reserves in its Lance table.

A view of table ``T`` named ``N`` is a plain Lance table at ``T/_memwal/views/N``. Its
definition is in the Lance config under :data:`CONFIG_KEY`; each refresh's record is in
its commit's transaction properties under :data:`RECORD_KEY`. Beside Lance's own files it
holds two memwal directories: UDF checkpoints and the refresh lease. Columns whose names
start with ``__`` are memwal's (source key or row id, group key, aggregate states) and are hidden
from readers of the view.
"""

from __future__ import annotations

from memwal.core import paths
from memwal.core.io import FileIO

#: Row views made before views were keyed on the primary key: the stable row id of the base
#: row a view row was computed from (such views keep Lance's ``delta()`` change feed).
ROW_ID = "__source_row_id"
#: Row views: the primary key of the base row a view row was computed from, as text
#: (see :func:`memwal.views.changes.source_keys`).
SOURCE_KEY = "__source_key"
#: Aggregate views: the group's key (JSON of its GROUP BY values).
GROUP_KEY = "__memwal_group"
#: Aggregate views: rows in the group; a group with none left is removed.
COUNT = "__memwal_count"
#: Lance config key holding the view definition (JSON).
CONFIG_KEY = "memwal.view"
#: Transaction property holding a refresh record (JSON).
RECORD_KEY = "memwal.refresh"
#: Directory (in the view) of UDF results checkpointed by a refresh in progress.
CHECKPOINT_DIR = "_memwal_checkpoints"
#: Directory (in the view) of the refresh lease's objects.
LEASE_DIR = "_memwal_refresh_lease"
#: Lance's directory of a table's versions: a view exists once it has one.
VERSIONS_DIR = "_versions"


def views_root(table_uri: str) -> str:
    return paths.views_dir(paths.normalize_uri(table_uri))


def view_uri(table_uri: str, name: str) -> str:
    return paths.view_meta_dir(paths.normalize_uri(table_uri), name)


def view_exists(io: FileIO, uri: str) -> bool:
    """True once the view's Lance table has been written (not merely its directory)."""
    return bool(io.list_dir(paths.join(uri, VERSIONS_DIR)))


def view_names(io: FileIO, table_uri: str) -> list[str]:
    """Names of the table's views, sorted."""
    root = views_root(table_uri)
    return [n for n in io.list_dir(root) if view_exists(io, paths.join(root, n))]
