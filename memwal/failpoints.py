"""Named failure points, for crash tests that kill a real process at an exact step.

``MEMWAL_FAILPOINTS="compactor.between_passes=pause"`` makes the process, on reaching that
point, create the file ``$MEMWAL_FAILPOINT_DIR/<name>`` and then wait to be killed;
``=exit`` ends it on the spot with ``os._exit(86)`` (no cleanup, like a crash); ``=wait``
creates the file and waits until the test removes it, then goes on (interleaving tests: another
writer acts while this one stands at the point). With the variable unset (always, outside
tests) a failpoint is a dictionary lookup.
"""

from __future__ import annotations

import os
import time

ENV = "MEMWAL_FAILPOINTS"
DIR_ENV = "MEMWAL_FAILPOINT_DIR"
EXIT_CODE = 86


def _active() -> dict[str, str]:
    spec = os.environ.get(ENV, "")
    return dict(item.split("=", 1) for item in spec.split(",") if "=" in item)


def failpoint(name: str) -> None:
    """Act on the failpoint ``name`` if the environment arms it."""
    action = _active().get(name) if ENV in os.environ else None
    if action is None:
        return
    marker_dir = os.environ.get(DIR_ENV)
    marker = os.path.join(marker_dir, name) if marker_dir else None
    if marker:
        with open(marker, "w") as f:
            f.write(str(os.getpid()))
    if action == "wait":
        if marker is None:
            raise ValueError(f"failpoint {name}=wait needs {DIR_ENV}")
        while os.path.exists(marker):  # until the test removes the marker
            time.sleep(0.05)
        return
    if action == "exit":
        os._exit(EXIT_CODE)
    if action == "pause":
        while True:  # until the test kills us
            time.sleep(3600)
    raise ValueError(f"unknown failpoint action {action!r} for {name}")
