"""Process setup done once, before Lance is imported: Lance's log filter.

Lance configures its Rust logger from ``LANCE_LOG`` when it is first imported and writes
straight to stderr, outside Python's logging. Left at its default it prints, during normal
reads and writes, a deprecation warning on every vector search, a false ERROR ("Index
__lance_mem_wal has no fields") on every base table update, and an ERROR from a shard
writer's background flush when a newer writer claimed its shard ("Writer fenced"). That last
one is an expected event, and Lance also raises it to the caller (the put, flush or close
waiting on the flush), where memwal handles it (the writer pool reopens the shard) and logs
it with its own logger at the right level; a real failure of the flush is raised the same
way, so memwal reports it and nothing is lost by not printing it twice.

So memwal sets the filter in one place, :func:`configure_process`, called when the
``memwal`` package is imported (library use) and by its entry points (the CLI, with its
``-v`` count, the demo, the local Spark session, which passes it on to executors). A
``LANCE_LOG`` the user set always wins, and a process that imported Lance before memwal keeps
the filter Lance read then.
"""

from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger(__name__)

ENV = "LANCE_LOG"
#: Normal use: Lance's errors, without the index module's false alarm and the shard writer's
#: task errors (raised to the caller; see the module doc).
DEFAULT_LANCE_LOG = "error,lance::index=off,lance::dataset::mem_wal::write=off"
#: With ``-v``: everything Lance warns about, its writer's task errors included; ``-vv``
#: adds Lance's info, ``-vvv`` its debug lines.
VERBOSE_LANCE_LOG = ("warn", "info", "debug")

#: The filter this module set (so a later call may change it), None if it set none.
_ours: str | None = None


def lance_log_filter(verbosity: int = 0) -> str:
    """The ``LANCE_LOG`` filter for a verbosity (0: quiet, 1: ``-v``, ...)."""
    if verbosity <= 0:
        return DEFAULT_LANCE_LOG
    return VERBOSE_LANCE_LOG[min(verbosity, len(VERBOSE_LANCE_LOG)) - 1]


def configure_process(verbosity: int = 0) -> None:
    """Set Lance's log filter for ``verbosity`` unless the user set ``LANCE_LOG``."""
    global _ours
    current = os.environ.get(ENV)
    if current is not None and current != _ours:
        return  # the user's
    wanted = lance_log_filter(verbosity)
    if "lance" in sys.modules and current != wanted:
        log.debug("Lance was imported before memwal set %s=%s; its log filter stays what it read then", ENV, wanted)
    os.environ[ENV] = _ours = wanted


def verbosity_in(argv: list[str]) -> int:
    """How many ``-v`` a command line gives before its command (``-v``, ``-vv``, ``--verbose``),
    for the CLI to set Lance's filter before it imports Lance and parses its arguments."""
    count = 0
    for arg in argv:
        if arg == "--verbose":
            count += 1
        elif len(arg) > 1 and arg[0] == "-" and arg[1] != "-" and set(arg[1:]) == {"v"}:
            count += len(arg) - 1
        elif not arg.startswith("-"):
            break  # the command: its own options are not the global -v
    return count


def executor_env() -> dict[str, str]:
    """This process's settings, for processes memwal starts elsewhere (Spark executors)."""
    if ENV not in os.environ:
        configure_process()
    return {ENV: os.environ[ENV]}
