"""A writer process SIGKILLed with acknowledged, unflushed writes: an operator can make them
visible to eventual readers before its 60 s lease runs out.

The writes are durable (in the WAL; strong readers see them at once), but maintenance leaves a
shard with a live writer lease alone, so eventual readers wait for the lease to expire. A lease
names its host and pid: when that process of this host is gone, maintenance flushes at once;
for a writer of another host (here: a real process in a UTS namespace with another hostname)
``memwal maintain --break-lease`` ends the lease, with a warning.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import PEOPLE, people

from memwal import Table, readers
from memwal.core.state import TableState
from memwal.write.pool import ShardWriterPool
from memwal.write.lease import WriterLease

WRITER = """
import sys, time
import pyarrow as pa
from memwal import Table
from helpers import people
t = Table.open(sys.argv[1])
t.write(people(range(int(sys.argv[2]), int(sys.argv[3])), "dead"))
print("acknowledged", flush=True)
time.sleep(3600)
"""


def start_writer(uri: str, lo: int, hi: int, hostname: str | None = None) -> subprocess.Popen:
    here = str(Path(__file__).parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, str(Path(here).parent)])}
    command = [sys.executable, "-c", WRITER, uri, str(lo), str(hi)]
    if hostname is not None:  # a real process whose lease names another host
        command = ["unshare", "--uts", "sh", "-c", f'hostname {hostname} && exec "$@"', "sh", *command]
    p = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    assert p.stdout is not None and p.stdout.readline().strip() == "acknowledged"
    return p


def kill(p: subprocess.Popen) -> None:
    p.send_signal(signal.SIGKILL)
    p.wait()


def maintain(uri: str, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "memwal", "maintain", uri, "--once", "--nice", "0", "--flush-stranded-after", "0", *flags],
        capture_output=True, text=True, timeout=600,
    )


def ids(uri: str, consistency: str = "eventual") -> set[int]:
    return {r["id"] for r in readers.Reader(TableState.load(uri), consistency=consistency).scan(columns=["id"]).to_pylist()}


def live_lease(uri: str) -> WriterLease:
    state = TableState.load(uri)
    (shard,) = state.manifests.list_shards()
    held = ShardWriterPool(state).lease(shard)
    assert held is not None and held.live()
    return held


def test_a_killed_local_writer_is_flushed_without_waiting_for_its_lease(table_uri):
    Table.create(table_uri, PEOPLE, ["id"], "unsharded").close()
    with Table.open(table_uri) as t:
        t.write(people(range(10)))
    writer = start_writer(table_uri, 10, 20)
    kill(writer)
    assert ids(table_uri, "strong") == set(range(20))  # durable: in the WAL
    assert ids(table_uri) == set(range(10))  # but not flushed
    held = live_lease(table_uri)
    assert held.holder_gone() and f":{writer.pid}:" in held.owner
    p = maintain(table_uri)
    assert p.returncode == 0, p.stderr
    assert held.live(), "the lease had not run out: the flush came from finding the process gone"
    assert ids(table_uri) == set(range(20))


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1) to run a writer under another hostname")
def test_a_killed_writer_of_another_host_waits_for_its_lease_unless_an_operator_breaks_it(table_uri):
    Table.create(table_uri, PEOPLE, ["id"], "unsharded").close()
    writer = start_writer(table_uri, 0, 10, hostname="elsewhere")
    kill(writer)
    held = live_lease(table_uri)
    assert held.owner.startswith("elsewhere:") and not held.holder_gone()

    p = maintain(table_uri)  # the lease is live and nothing is known of that host: left alone
    assert p.returncode == 0, p.stderr
    assert ids(table_uri) == set() and ids(table_uri, "strong") == set(range(10))

    p = maintain(table_uri, "--break-lease", "all")
    assert p.returncode == 0, p.stderr
    assert "warning: ended the writer lease" in p.stderr and "elsewhere:" in p.stderr
    assert ids(table_uri) == set(range(10))
    assert maintain(table_uri, "--break-lease", "no-such-shard").returncode == 2


def test_breaking_the_lease_of_a_live_writer_loses_nothing(table_uri):
    """The operator was wrong: the writer is alive. The flush fences it, it reopens on its next
    write (one fenced retry), every acknowledged row stays."""
    Table.create(table_uri, PEOPLE, ["id"], "unsharded").close()
    t = Table.open(table_uri)
    t.write(people(range(5)))
    p = maintain(table_uri, "--break-lease", "all")
    assert p.returncode == 0 and "warning" in p.stderr, p.stderr
    t.write(people(range(5, 10)))
    t.close()
    assert t.writers.stats.fenced_retries == 1
    assert ids(table_uri) == set(range(10))
    lease = json.loads(Path(table_uri, "_memwal", "writers").iterdir().__next__().read_text())
    assert lease["expires_at"] <= time.time()
