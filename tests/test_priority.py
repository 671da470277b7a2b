"""``memwal maintain`` runs below writers and readers: every thread of its process, Lance's
included, is nicer than its caller by ``--nice``. Each check runs in a process of its own
(niceness, once raised, does not come back down)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pyarrow as pa
import pytest

from memwal import Table

BASE = os.getpriority(os.PRIO_PROCESS, 0)

pytestmark = pytest.mark.skipif(BASE > 14, reason="the tests already run at niceness > 14: nothing nicer to observe")

#: Prints the niceness of every thread of the process, as JSON, after ``body`` ran.
REPORT = """
import json, os
print(json.dumps([os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir("/proc/self/task")]))
"""


def run(body: str) -> list[int]:
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(body) + REPORT], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_every_thread_and_the_threads_they_start_get_nicer():
    niceness = run(
        """
        import threading
        from memwal.runtime import lower_cpu_priority

        go, hold = threading.Event(), threading.Event()
        def first():  # exists before the call, starts a thread after it
            go.wait()
            threading.Thread(target=hold.wait, daemon=True).start()
        t = threading.Thread(target=first, daemon=True)
        t.start()
        lower_cpu_priority(4)
        go.set()
        t.join()
        """
    )
    assert len(niceness) >= 2
    assert niceness == [BASE + 4] * len(niceness)


def test_maintain_runs_its_cycle_nicer(tmp_path):
    uri = str(tmp_path / "t")
    t = Table.create(uri, pa.schema([("id", pa.int64()), ("name", pa.string())]), ["id"], "bucket(id, 2)")
    t.write(pa.table({"id": list(range(100)), "name": ["x"] * 100}))
    t.close()
    niceness = run(
        f"""
        from memwal import cli
        assert cli.main(["maintain", {uri!r}, "--once", "--nice", "3"]) == 0
        """
    )
    # Lance's runtime threads started during the cycle are among them.
    assert len(niceness) > 1
    assert niceness == [BASE + 3] * len(niceness)


def test_nice_zero_leaves_the_process_as_it_was(tmp_path):
    uri = str(tmp_path / "t")
    Table.create(uri, pa.schema([("id", pa.int64())]), ["id"], "bucket(id, 2)").close()
    niceness = run(
        f"""
        from memwal import cli
        assert cli.main(["maintain", {uri!r}, "--once", "--nice", "0"]) == 0
        """
    )
    assert niceness == [BASE] * len(niceness)
