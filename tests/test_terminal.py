"""The CLI on a terminal: progress bars and ``memwal status --watch`` under a real
pseudo-terminal, and neither when the output is not a terminal (or with --json/--quiet)."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from typing import Callable

from helpers import PEOPLE, people

from memwal import Table

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")


class Terminal:
    """A command running on the slave side of a pseudo-terminal (200x50), its screen read
    from the master side."""

    def __init__(self, *args: str) -> None:
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
        env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "200", "LINES": "50"}
        env.pop("NO_COLOR", None)
        self.process = subprocess.Popen([sys.executable, "-m", "memwal", *args], stdin=slave, stdout=slave, stderr=slave,
                                        env=env, close_fds=True)
        os.close(slave)
        self.raw = b""

    @property
    def text(self) -> str:
        return ANSI.sub("", self.raw.decode("utf-8", "replace"))

    def read(self, until: Callable[[str], bool] | None = None, timeout: float = 120.0) -> str:
        """Read the screen until ``until(text)`` holds (or the command ends)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if until is not None and until(self.text):
                return self.text
            ready, _, _ = select.select([self.master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:  # EIO: the slave side closed (the command ended)
                    break
                if not chunk:
                    break
                self.raw += chunk
            elif self.process.poll() is not None and until is None:
                break
        if until is not None and not until(self.text):
            raise AssertionError(f"the terminal never showed what was awaited; it shows:\n{self.text[-3000:]}")
        return self.text

    def finish(self, timeout: float = 120.0) -> int:
        self.read(timeout=timeout)
        code = self.process.wait(timeout)
        os.close(self.master)
        return code


def _rows_file(tmp_path, n: int = 30_000) -> str:
    path = tmp_path / "people.jsonl"
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": i, "name": f"n{i}", "score": i / 2}) + "\n")
    return str(path)


def test_put_and_check_draw_progress_bars_on_a_terminal(tmp_path, table_uri):
    data = _rows_file(tmp_path)
    Table.create(table_uri, PEOPLE, ["id"], "bucket(id, 4)").close()
    term = Terminal("put", table_uri, data)
    assert term.finish() == 0
    screen = term.text
    assert "put: checking people.jsonl" in screen and "put: writing people.jsonl" in screen
    assert "30,000/30,000 rows" in screen  # the writing bar ends at the rows the check counted
    assert "upserted 30000 rows into 4 shard(s)" in screen
    assert "━" in screen  # a bar was drawn

    term = Terminal("check", table_uri)
    assert term.finish() == 0 and "clean" in term.text
    assert "checking shards" in term.text and "4/4 shards" in term.text


def test_no_progress_bars_without_a_terminal_or_with_json_or_quiet(tmp_path, table_uri):
    data = _rows_file(tmp_path, 5_000)
    Table.create(table_uri, PEOPLE, ["id"], "bucket(id, 4)").close()
    piped = subprocess.run([sys.executable, "-m", "memwal", "put", table_uri, data], capture_output=True, text=True)
    assert piped.returncode == 0
    assert piped.stdout == "upserted 5000 rows into 4 shard(s)\n"
    assert "put:" not in piped.stderr and "\x1b[" not in piped.stderr and "━" not in piped.stderr

    quiet = Terminal("--quiet", "put", table_uri, data)
    assert quiet.finish() == 0
    assert "put:" not in quiet.text and "━" not in quiet.text and "upserted 5000 rows" in quiet.text

    as_json = Terminal("check", table_uri, "--json")
    assert as_json.finish() == 0
    assert "checking shards" not in as_json.text
    assert json.loads(as_json.text.strip())["clean"] is True


def test_status_watch_refreshes_a_live_view_until_interrupted(table_uri):
    table = Table.create(table_uri, PEOPLE, ["id"], "bucket(id, 2)")
    table.write(people(range(100)))
    table.flush()
    term = Terminal("status", table_uri, "--watch", "0.3")
    first = term.read(lambda t: "pending" in t and t.count("1/64") >= 2)
    assert table_uri in first and "bucket(id, 2)" in first and "memwal status --watch: every 0.3s" in first
    assert "maintenance: never ran" in first
    table.write(people(range(100, 200)))
    table.flush()  # a second SSTable in each shard: the view shows it without being asked
    term.read(lambda t: t.count("2/64") >= 2)
    term.process.send_signal(signal.SIGINT)
    assert term.finish() == 0
    # the one-shot JSON is unchanged by --watch's existence
    doc = json.loads(subprocess.run([sys.executable, "-m", "memwal", "status", table_uri, "--json"], capture_output=True,
                                    text=True, check=True).stdout)
    assert [s["pending_sstables"] for s in doc["shards"]] == [2, 2]
    refused = subprocess.run([sys.executable, "-m", "memwal", "status", table_uri, "--watch", "--json"], capture_output=True, text=True)
    assert refused.returncode == 2


def test_status_watch_into_a_pipe_prints_the_text_status_each_interval(table_uri):
    table = Table.create(table_uri, PEOPLE, ["id"], "unsharded")
    table.write(people(range(10)))
    table.flush()
    watcher = subprocess.Popen([sys.executable, "-m", "memwal", "status", table_uri, "--watch", "0.2"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = ""
    deadline = time.monotonic() + 120
    while seen.count("primary key  id") < 2 and time.monotonic() < deadline:
        seen += watcher.stdout.readline()
    watcher.send_signal(signal.SIGINT)
    assert watcher.wait(60) == 0
    assert seen.count("primary key  id") >= 2 and "\x1b[" not in seen


def test_check_and_repair_report_progress_per_shard(table_uri):
    from memwal.maintain.check import check_table
    from memwal.core.progress import Progress
    from memwal.maintain.repair import repair_table
    from memwal.core.state import TableState

    table = Table.create(table_uri, PEOPLE, ["id"], "bucket(id, 3)")
    table.write(people(range(60)))
    table.flush()
    heard: list[Progress] = []
    check_table(TableState.load(table_uri), heard.append)
    assert heard[0] == Progress("checking shards", 0, 3, "shards") and heard[-1] == Progress("checking shards", 3, 3, "shards")
    assert [p.done for p in heard] == [0, 1, 2, 3]
    heard.clear()
    repair_table(TableState.load(table_uri), dry_run=True, progress=heard.append)
    assert heard[-1] == Progress("checking shards", 3, 3, "shards")  # clean: nothing to repair


def test_maintain_once_shows_that_its_cycle_runs(table_uri):
    table = Table.create(table_uri, PEOPLE, ["id"], "unsharded")
    table.write(people(range(20)))
    table.flush()
    term = Terminal("maintain", table_uri, "--once")
    assert term.finish() == 0
    assert "maintenance cycle" in term.text and "compacted 1 generation(s)" in term.text
    piped = subprocess.run([sys.executable, "-m", "memwal", "maintain", table_uri, "--once"], capture_output=True, text=True)
    assert piped.returncode == 0 and "maintenance cycle" not in piped.stderr
