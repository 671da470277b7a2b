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
#: The longest a failpoint waits (for its test to kill the process, or to remove the marker):
#: every wait in a writer is bounded, also one a test that died has left armed.
MAX_WAIT_SECONDS = 600.0


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
        deadline = time.monotonic() + MAX_WAIT_SECONDS
        while os.path.exists(marker):  # until the test removes the marker
            if time.monotonic() > deadline:
                raise TimeoutError(f"failpoint {name}: nobody removed {marker} within {MAX_WAIT_SECONDS:.0f} s")
            time.sleep(0.05)
        return
    if action == "exit":
        os._exit(EXIT_CODE)
    if action == "pause":
        # Until the test kills us; a test that died first leaves no process behind for long.
        time.sleep(MAX_WAIT_SECONDS)
        os._exit(EXIT_CODE)
    raise ValueError(f"unknown failpoint action {action!r} for {name}")
