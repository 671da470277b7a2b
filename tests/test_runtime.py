"""Lance's log filter (memwal.core.runtime): normal reads and writes print no Lance log line, the
CLI's ``-v`` shows Lance's warnings, and a LANCE_LOG the user set wins."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from memwal.core.runtime import DEFAULT_LANCE_LOG, lance_log_filter, verbosity_in

#: A line of Lance's Rust logger (env_logger's format).
LANCE_LINE = re.compile(r"^\[\S+ +(ERROR|WARN|INFO|DEBUG|TRACE) +lance", re.MULTILINE)

#: Writes (two handles of one table fencing each other's writer, which makes Lance's flusher
#: log an ERROR), a vector index, compaction (a base update) and every kind of read.
SCRIPT = """
import sys
import numpy as np, pyarrow as pa
from memwal import IndexConfig, Table, readers
from memwal.maintain.compactor import Compactor
from memwal.core.indexes import IndexMaintainer
dim = 8
schema = pa.schema([("id", pa.int64()), ("vec", pa.list_(pa.float32(), dim))])
rng = np.random.default_rng(0)
def rows(ids):
    vec = pa.FixedSizeListArray.from_arrays(pa.array(rng.random(len(ids) * dim, dtype=np.float32)), dim)
    return pa.table({"id": pa.array(ids, pa.int64()), "vec": vec}, schema=schema)
uri = sys.argv[1]
a = Table.create(uri, schema, ["id"], "unsharded", initial_data=rows(np.arange(6000)), indexes=IndexConfig(vector_column="vec"))
IndexMaintainer(a.state).ensure_indexes()
a.write(rows(np.arange(10)))
b = Table.open(uri)
b.write(rows(np.arange(10, 20)))  # claims the shard: a's writer is fenced
a.write(rows(np.arange(20, 30)))  # a reopens it and fences b
b.close()
a.close()
Compactor(a.state).run_once()
r = readers.open(uri)
r.search(rng.random(dim), k=5)
r.get(3); r.get_many(range(100)); r.scan(limit=5); r.count()
print("done")
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "LANCE_LOG"}
    env.update(extra)
    return env


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=300)


def test_normal_reads_and_writes_print_no_lance_log_line(tmp_path):
    done = _run(["-c", SCRIPT, str(tmp_path / "t")], _env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "done"
    assert not LANCE_LINE.search(done.stderr), done.stderr


def test_with_lances_warnings_on_the_same_work_prints_them(tmp_path):
    """The scenario above does make Lance log (a fenced flush, the search's deprecation
    warning): the quiet run is quiet because of the filter, and a user's LANCE_LOG wins."""
    done = _run(["-c", SCRIPT, str(tmp_path / "t")], _env(LANCE_LOG="warn"))
    assert done.returncode == 0, done.stderr
    assert LANCE_LINE.search(done.stderr)


@pytest.mark.parametrize(("argv", "count"), [
    (["scan", "uri"], 0), (["-v", "scan", "uri"], 1), (["-vv", "get", "u", "1"], 2), (["--verbose", "-v", "status", "u"], 2),
    (["--debug", "-v", "scan", "u", "-v"], 1),  # an option after the command is the command's, not the global -v
    (["scan", "uri", "--columns", "-v"], 0),
])
def test_the_cli_counts_its_v_before_it_parses_its_arguments(argv, count):
    assert verbosity_in(argv) == count


@pytest.mark.parametrize(("argv", "user", "expected"), [
    (["status", "x"], None, DEFAULT_LANCE_LOG),
    (["-v", "status", "x"], None, lance_log_filter(1)),
    (["-vvv", "status", "x"], None, "debug"),
    (["-v", "status", "x"], "trace", "trace"),
])
def test_the_cli_sets_lances_filter_from_its_v_count_unless_the_user_set_one(argv, user, expected):
    code = f"import sys; sys.argv = ['memwal', *{argv!r}]; import memwal.cli.app, os; print(os.environ['LANCE_LOG'])"
    done = _run(["-c", code], _env(**({"LANCE_LOG": user} if user else {})))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == expected
