"""How long a SIGKILLed writer's acknowledged writes stay invisible to eventual readers.

A writer process (tests/test_dead_writer.py's) writes 10 rows, is acknowledged, and is
SIGKILLed; then ``memwal maintain --once --flush-stranded-after 0`` runs every 5 s until an
eventual reader sees the rows. Three cases: a writer of another host (run in a UTS namespace
with another hostname, ``unshare --uts``: its lease must run out, 60 s), a writer of this host
(its pid is gone: flushed at once), and another host's writer with ``--break-lease all``.
Before the lease named a gone local process, a writer of this host took as long as another
host's. Run: ``python bench/dead_writer.py [--dir /tmp/dead-writer]`` (needs unshare and root).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
from helpers import PEOPLE  # noqa: E402
from test_dead_writer import start_writer  # noqa: E402

from memwal import Table, readers  # noqa: E402
from memwal.core.state import TableState  # noqa: E402


def visible(uri: str) -> int:
    return len(readers.Reader(TableState.load(uri)).scan(columns=["id"]))


def measure(uri: str, hostname: str | None, flags: list[str]) -> tuple[float, int]:
    """(seconds from the kill until the rows are visible, maintenance runs it took)."""
    shutil.rmtree(uri, ignore_errors=True)
    Table.create(uri, PEOPLE, ["id"], "unsharded").close()
    writer = start_writer(uri, 0, 10, hostname=hostname)
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    t0, runs = time.monotonic(), 0
    while True:
        subprocess.run([sys.executable, "-m", "memwal", "maintain", uri, "--once", "--nice", "0",
                        "--flush-stranded-after", "0", *flags], capture_output=True, check=True)
        runs += 1
        if visible(uri):
            return time.monotonic() - t0, runs
        time.sleep(5)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", help="work here (default: a temporary directory, removed)")
    args = p.parse_args()
    work = args.dir or tempfile.mkdtemp(prefix="memwal-bench-dead-writer-")
    try:
        cases = (("another host's writer", "elsewhere", []),
                 ("this host's writer (its pid gone)", None, []),
                 ("another host's writer, --break-lease all", "elsewhere", ["--break-lease", "all"]))
        for i, (name, hostname, flags) in enumerate(cases):
            seconds, runs = measure(os.path.join(work, f"case{i}"), hostname, flags)
            print(f"{name}: visible {seconds:.1f} s after the kill, {runs} maintain run(s)", flush=True)
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
