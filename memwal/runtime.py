"""Process setup that memwal's entry points do once, before Lance is imported.

Lance configures its Rust logger from ``LANCE_LOG`` when it is first imported, and logs a
spurious ERROR ("Index __lance_mem_wal has no fields") on every base table update. The
entry points (the CLI, the demo, the local Spark session, which passes the setting on to
executors) call :func:`configure_process` first; a library user who imports memwal keeps
whatever logging they chose. A ``LANCE_LOG`` already set always wins.
"""

from __future__ import annotations

import os

#: memwal's default Lance log filter: errors only, without the index module's false alarm.
DEFAULT_LANCE_LOG = "error,lance::index=off"


def configure_process() -> None:
    """Set memwal's process defaults (today: Lance's log filter) unless the user set them."""
    os.environ.setdefault("LANCE_LOG", DEFAULT_LANCE_LOG)


def executor_env() -> dict[str, str]:
    """The same settings for processes memwal starts elsewhere (Spark executors)."""
    configure_process()
    return {"LANCE_LOG": os.environ["LANCE_LOG"]}
