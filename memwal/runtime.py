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


def lower_cpu_priority(increment: int) -> None:
    """Make this process ``increment`` nicer: every thread it has, and so every thread they start.

    Background services (``memwal maintain``) run below the writers and readers on the same
    host, as LSM stores run compaction at low priority: a compaction that waits a little
    costs nothing a reader sees, a reader that waits for a core does. On Linux niceness
    belongs to each thread and a new thread inherits its creator's, so every thread that
    exists (Lance's runtime threads among them, if Lance already started them) is set here;
    where ``/proc`` is missing the process's own call (``os.nice``) is all there is.
    """
    if increment <= 0:
        return
    try:
        threads = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        os.nice(increment)
        return
    for tid in threads:
        try:
            current = os.getpriority(os.PRIO_PROCESS, tid)
            os.setpriority(os.PRIO_PROCESS, tid, min(19, current + increment))
        except ProcessLookupError:  # the thread ended meanwhile
            pass


def executor_env() -> dict[str, str]:
    """The same settings for processes memwal starts elsewhere (Spark executors)."""
    configure_process()
    return {"LANCE_LOG": os.environ["LANCE_LOG"]}
