"""``memwal ingest`` on a Spark cluster: ``local-cluster[2,1,1024]`` runs two executors in
separate JVMs with their own Python workers (as on a real cluster, with the pip pyspark), and
one of them is SIGKILLed mid-stream. Spark replaces it and replays the lost tasks; the new
writers fence the dead executor's shards and replay their WALs; the table equals the model,
and no record is applied twice (each is in one micro-batch; no key appears twice).

The topic's partitions line up with the table's shards (the producer partitions by shard:
:func:`memwal.streaming.partitioning.partitions`), so the tasks that read write, one stage
per micro-batch, each shard from one executor (the exchange by shard, what ``--exchange auto``
picks on a cluster, runs in tests/test_observe_ingest.py's cluster test)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from brokers import produce
from helpers import submit_args
from test_streaming import SCHEMA, approx, table_rows, workload

from memwal import Table, readers
from memwal.streaming.partitioning import partitions

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]

EXECUTOR_MAIN = "CoarseGrainedExecutorBackend"


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (read from /proc: no psutil needed)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # the command name may hold spaces or parentheses: the parent id follows the last ')'
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def executor_pids(driver_pid: int) -> list[int]:
    """The executor JVMs the driver process started (java, main class CoarseGrainedExecutorBackend)."""
    found = []
    for pid in descendants(driver_pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline and cmdline[0].endswith(b"java") and any(EXECUTOR_MAIN.encode() in part for part in cmdline):
            found.append(pid)
    return sorted(found)


def committed_batches(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    return sum(1 for f in commits.iterdir() if f.name.isdigit()) if commits.exists() else 0


def test_ingest_on_local_cluster_survives_a_killed_executor(kafka, tmp_path):
    topic = f"cluster-{time.monotonic_ns()}"
    kafka.create_topic(topic, 4)
    records, model = workload(3000, 500, seed=21, partitions=4)
    uri = str(tmp_path / "users")
    Table.create(uri, SCHEMA, ["id"], "bucket(id, 4)").close()
    aligned = partitions(uri, [{"id": int(key)} for key, _, _ in records], 4)
    produce(kafka, topic, [(key, value, int(p)) for (key, value, _), p in zip(records, aligned)])
    checkpoint = tmp_path / "ckpt"
    here = str(Path(__file__).resolve().parents[1])
    env = {
        **os.environ,
        # executors are separate JVMs started by the in-driver workers: they import memwal from here
        "PYSPARK_SUBMIT_ARGS": submit_args(f"spark.executorEnv.PYTHONPATH={here}"),
        "SPARK_WORKER_DIR": str(tmp_path / "spark-work"),  # not under the pip package's SPARK_HOME
    }
    command = [
        sys.executable, "-m", "memwal", "-v", "ingest",
        "--master", "local-cluster[2,1,1024]",
        "--bootstrap", kafka.bootstrap, "--topic", topic, "--table", uri, "--checkpoint", str(checkpoint),
        "--available-now", "--max-offsets-per-trigger", "200", "--exchange", "none",
    ]
    log = (tmp_path / "ingest.log").open("w")
    p = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=tmp_path)
    try:
        # mid-stream: two micro-batches committed, more to come, both executors up
        deadline = time.monotonic() + 600
        while committed_batches(checkpoint) < 2 or len(executor_pids(p.pid)) < 2:
            assert p.poll() is None, (tmp_path / "ingest.log").read_text()[-4000:]
            assert time.monotonic() < deadline, "the query made no progress"
            time.sleep(0.2)
        victim = executor_pids(p.pid)[0]
        os.kill(victim, signal.SIGKILL)
        killed_at = committed_batches(checkpoint)
        assert p.poll() is None  # the query was still running when its executor died
        out, _ = p.communicate(timeout=900)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        log.close()
    assert p.returncode == 0, (tmp_path / "ingest.log").read_text()[-4000:]
    # every record in one micro-batch (the lost tasks re-ran inside theirs), none dead-lettered
    assert f"ingested {len(records)} records" in out and "0 dead letter(s)" in out, out
    assert committed_batches(checkpoint) > killed_at  # batches ran after the kill
    assert approx(table_rows(uri)) == approx(model)
    ids = readers.open(uri).scan(columns=["id"]).column("id").to_pylist()
    assert len(ids) == len(set(ids)), "a key appears twice"
    # one stage a micro-batch; a shard written by two executors' writer processes only where
    # the killed executor's tasks moved to the other one
    lines = [line for line in (tmp_path / "ingest.log").read_text().splitlines() if "] batch " in line or ": batch " in line]
    assert lines and all("(1 stage)" in line for line in lines), lines[:5]
    assert sum("written by several processes" in line for line in lines) <= 2, lines
