"""The per-executor writer process: real Lance tables, real server processes, real SIGKILLs,
and one real Spark query whose write tasks hop between Python workers."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import pyarrow as pa
import pytest

from brokers import produce

from memwal import Table, readers
from memwal.core.errors import TableNotFoundError, WriterProcessError
from memwal.core.failpoints import DIR_ENV as FAILPOINT_DIR_ENV
from memwal.core.failpoints import ENV as FAILPOINT_ENV
from memwal.streaming import SinkOptions
from memwal.write.dead_letters import dead_letter_uri
from memwal.streaming.sink import Prepare, Write
from memwal.streaming.write_task import MESSAGE
from memwal.write.process import DIR_ENV, ORPHAN_ENV, Endpoint, ProcessShards

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])
OPTIONS = SinkOptions(source="columns", max_write_tasks=1, flush_interval_seconds=None, writer_process=True,
                      writer_process_idle_seconds=60)


@pytest.fixture
def socket_dir(monkeypatch):
    """A short private directory for the sockets (their paths are limited to ~107 bytes);
    the servers started in it are stopped at the end."""
    d = Path(tempfile.mkdtemp(prefix="wp", dir="/tmp"))
    monkeypatch.setenv(DIR_ENV, str(d))
    yield d
    for pid_file in d.glob("*.pid"):
        _kill(int(pid_file.read_text()), signal.SIGTERM)
    shutil.rmtree(d, ignore_errors=True)


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (this test process started it and has not reaped it) is dead too
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _wait_dead(pid: int, endpoint: Endpoint) -> None:
    """Until ``pid`` is dead and nothing answers on ``endpoint`` (a killed process's other
    threads, its listening socket with them, can outlive its zombie main thread briefly)."""
    while True:
        if not _alive(pid):
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(str(endpoint.socket))
            except (ConnectionRefusedError, FileNotFoundError):
                return
            finally:
                probe.close()
        time.sleep(0.05)


def rows_of(ids: range, tag: str) -> pa.Table:
    return pa.table({"id": list(ids), "name": [f"{tag}{i}" for i in ids]}).cast(SCHEMA)


def write_batch(uri: str, batch_id: int, rows: pa.Table, options: SinkOptions = OPTIONS) -> list[dict]:
    """One micro-batch's prepare and write stages, as Spark runs them in a worker: what each
    shard's write did (its result, and ``pid``: the process that wrote it)."""
    exchange = list(Prepare(uri, options)(iter(rows.to_batches())))
    out = list(Write(uri, options, batch_id, dead_letter_uri(uri))(iter(exchange)))
    message = pickle.loads(out[0].column(MESSAGE)[0].as_py()).message
    return [{**asdict(s), "pid": int(s.writer.rsplit(":", 1)[1])} for s in message.shards]


def stored(uri: str) -> dict[int, str]:
    return {r["id"]: r["name"] for r in readers.open(uri, consistency="strong").scan().to_pylist()}


def server_pid() -> int:
    return int(Endpoint.for_environment().pid_file.read_text())


def test_writes_through_the_writer_process_and_keep_the_writers(socket_dir, table_uri):
    Table.create(table_uri, SCHEMA, ["id"], "bucket(id, 4)").close()
    first = write_batch(table_uri, 0, rows_of(range(400), "a"))
    second = write_batch(table_uri, 1, rows_of(range(200, 600), "b"))
    pid = server_pid()
    assert pid != os.getpid() and {s["pid"] for s in first + second} == {pid}
    assert sum(s["upserts"] for s in first) == 400 and sum(s["upserts"] for s in second) == 400
    # the writers stay open in the server between micro-batches: each shard claimed once
    assert [s["writer_opens"] for s in first] == [1, 1, 1, 1]
    assert sum(s["writer_opens"] for s in second) == 0
    assert sum(s["fenced_retries"] for s in first + second) == 0
    assert stored(table_uri) == {**{i: f"a{i}" for i in range(200)}, **{i: f"b{i}" for i in range(200, 600)}}


def test_an_error_keeps_its_class(socket_dir, table_uri):
    Table.create(table_uri, SCHEMA, ["id"], "bucket(id, 1)").close()
    records = Table.open(table_uri).writer.route(rows_of(range(10), "a").cast(Table.open(table_uri).write_schema))
    missing = str(Path(table_uri).parent / "missing")
    with pytest.raises(TableNotFoundError):  # raised in the writer process, raised again here
        ProcessShards(missing).write(records)
    # the server survived the failed request
    assert _alive(server_pid())
    assert sum(s["upserts"] for s in write_batch(table_uri, 1, rows_of(range(10), "b"))) == 10


def test_a_killed_writer_process_is_replaced_and_loses_no_acknowledged_row(socket_dir, table_uri, tmp_path, monkeypatch):
    Table.create(table_uri, SCHEMA, ["id"], "bucket(id, 2)").close()
    write_batch(table_uri, 0, rows_of(range(300), "a"))  # acknowledged, not flushed: only in the WALs
    first = server_pid()
    os.kill(first, signal.SIGKILL)
    _wait_dead(first, Endpoint.for_environment())
    summaries = write_batch(table_uri, 1, rows_of(range(300, 400), "b"))
    second = server_pid()
    assert second != first and {s["pid"] for s in summaries} == {second}
    assert sum(s["writer_opens"] for s in summaries) == 2  # the new server claimed both shards
    assert stored(table_uri) == {**{i: f"a{i}" for i in range(300)}, **{i: f"b{i}" for i in range(300, 400)}}

    # Killed in the middle of a write: the task fails with WriterProcessError (Spark retries it).
    markers = tmp_path / "failpoints"
    markers.mkdir()
    monkeypatch.setenv(FAILPOINT_ENV, "write.wrote.batch-2=pause")
    monkeypatch.setenv(FAILPOINT_DIR_ENV, str(markers))
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(write_batch, table_uri, 2, rows_of(range(400, 500), "c"))
        marker = markers / "write.wrote.batch-2"
        while not marker.exists():
            assert not pending.done(), pending.exception()
            time.sleep(0.05)
        paused = int(marker.read_text())
        os.kill(paused, signal.SIGKILL)
        with pytest.raises(WriterProcessError):
            pending.result()
        _wait_dead(paused, Endpoint.for_environment())
    # the retried task (a new server in the same environment) writes the batch again
    monkeypatch.setenv(FAILPOINT_ENV, "write.wrote.batch-99=pause")
    write_batch(table_uri, 2, rows_of(range(400, 500), "c"))
    assert stored(table_uri) == {**{i: f"a{i}" for i in range(300)}, **{i: f"b{i}" for i in range(300, 400)},
                                 **{i: f"c{i}" for i in range(400, 500)}}


_CLIENT = """
import json, sys
import pyarrow as pa
sys.path.insert(0, {tests!r})
from test_writer_process import rows_of, write_batch
summaries = write_batch({uri!r}, {batch}, rows_of(range({lo}, {hi}), "p"))
print(json.dumps(sorted({{s["pid"] for s in summaries}})))
"""


def test_two_worker_processes_share_one_writer_process(socket_dir, table_uri):
    Table.create(table_uri, SCHEMA, ["id"], "bucket(id, 4)").close()
    tests = str(Path(__file__).parent)
    procs = [
        subprocess.Popen([sys.executable, "-c", _CLIENT.format(tests=tests, uri=table_uri, batch=b, lo=lo, hi=lo + 200)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for b, lo in ((0, 0), (1, 1000))
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    pids = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert pids[0] == pids[1] == [server_pid()]
    assert len(list(socket_dir.glob("*.sock"))) == 1
    assert set(stored(table_uri)) == set(range(200)) | set(range(1000, 1200))


def test_an_idle_writer_process_exits_and_the_next_write_starts_another(socket_dir, table_uri):
    Table.create(table_uri, SCHEMA, ["id"], "bucket(id, 1)").close()
    quick = SinkOptions(**{**OPTIONS.__dict__, "writer_process_idle_seconds": 1.0})
    write_batch(table_uri, 0, rows_of(range(10), "a"), quick)
    first = server_pid()
    ep = Endpoint.for_environment()
    while _alive(first) or ep.pid_file.exists():
        time.sleep(0.1)
    assert not ep.socket.exists() and not ep.pid_file.exists()  # it removed its socket and pid file
    write_batch(table_uri, 1, rows_of(range(10, 20), "b"), quick)
    assert server_pid() != first
    assert set(stored(table_uri)) == set(range(20))


# -- through Spark --------------------------------------------------------------------------


@pytest.mark.spark
@pytest.mark.kafka
def test_spark_write_tasks_moving_between_workers_claim_each_shard_once(spark, kafka, tmp_path):
    """Several micro-batches through a real query on local[2]: Spark hands the write tasks to
    whichever Python worker is free, and with the writer process no shard is claimed again
    (opens == shards) and no writer is fenced."""
    from helpers import approx, table_rows, workload
    from test_streaming import SCHEMA as USERS

    from memwal.streaming import ingest

    topic = f"wp-{time.monotonic_ns()}"
    kafka.create_topic(topic, 3)
    records, model = workload(6000, 800, seed=12)
    produce(kafka, topic, records)
    uri = str(tmp_path / "users")
    Table.create(uri, USERS, ["id"], "bucket(id, 4)").close()
    job = ingest(
        spark,
        bootstrap=kafka.bootstrap,
        topic=topic,
        table_uri=uri,
        checkpoint=str(tmp_path / "ckpt"),
        available_now=True,
        max_offsets_per_trigger=1000,
        # Two write tasks per micro-batch, on both Python workers (the server exits a minute
        # after the test). No interval flushes: a flush closes the writer, which reopens.
        options=SinkOptions(source="kafka-json", max_write_tasks=2, flush_interval_seconds=None, writer_process=True,
                            writer_process_idle_seconds=60),
    )
    job.await_termination()
    assert job.query.exception() is None
    totals = job.reports.totals()
    assert totals["batches"] >= 6
    assert approx(table_rows(uri)) == approx(model)  # the end of the query flushed everything
    assert totals["writer_opens"] == len(Table.open(uri).manifests.list_shards()) == 4
    assert totals["fenced_retries"] == 0


_STUCK_CLIENT = """
import sys
sys.path.insert(0, {tests!r})
from test_writer_process import rows_of, write_batch
write_batch({uri!r}, 7, rows_of(range(10), "s"))
"""


def test_a_writer_process_exits_when_its_clients_are_gone(socket_dir, table_uri, tmp_path, monkeypatch):
    """A request stuck in the writer process (here at a failpoint a killed test left armed) whose
    client was killed does not keep the process alive: once every running request's client has
    been gone for the orphan delay, it exits; a client that connects and says nothing does not
    hold it either. What the process had acknowledged is in the WAL: the next writer replays it."""
    Table.create(table_uri, SCHEMA, ["id"], "bucket(id, 1)").close()
    markers = tmp_path / "markers"
    markers.mkdir()
    monkeypatch.setenv(FAILPOINT_ENV, "write.wrote.batch-7=pause")
    monkeypatch.setenv(FAILPOINT_DIR_ENV, str(markers))
    monkeypatch.setenv(ORPHAN_ENV, "1")
    write_batch(table_uri, 6, rows_of(range(100, 110), "a"))  # acknowledged before the stuck request
    server = server_pid()
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.connect(str(Endpoint.for_environment().socket))  # connects, never sends a request
    client = subprocess.Popen([sys.executable, "-c", _STUCK_CLIENT.format(tests=str(Path(__file__).parent), uri=table_uri)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not (markers / "write.wrote.batch-7").exists():
        assert client.poll() is None, client.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline
        time.sleep(0.05)
    client.kill()
    client.wait()
    silent.close()
    deadline = time.monotonic() + 60
    while _alive(server):
        assert time.monotonic() < deadline, "the writer process outlived its killed client"
        time.sleep(0.1)
    assert {i: f"a{i}" for i in range(100, 110)}.items() <= stored(table_uri).items()


def test_decimals_and_dates_cross_to_the_writer_process_aligned(socket_dir, table_uri):
    """Rows travel to the writer process as Arrow IPC and are read there without a copy, except
    buffers misaligned for their type: Lance refuses a decimal128 buffer that is not 16-byte
    aligned (it panicked on one at an 8-byte offset), which IPC's 8-byte padding allows."""
    import datetime as dt
    from decimal import Decimal

    schema = pa.schema([("id", pa.int64()), ("note", pa.string()), ("amount", pa.decimal128(12, 2)), ("day", pa.date32())])
    table = Table.create(table_uri, schema, ["id"], "bucket(id, 2)")
    want = {}
    for b in range(12):  # notes of varying lengths move the decimal buffer's offset in the stream
        ids = range(b * 10, b * 10 + 7)
        rows = pa.table({"id": list(ids), "note": ["x" * (b * 3 + i) for i in range(7)],
                         "amount": [Decimal(i * 7 + b) / 100 for i in ids], "day": [dt.date(2026, 1, 1 + b)] * 7}).cast(table.write_schema)
        ProcessShards(table_uri).write(table.writer.route(rows))
        want.update({r["id"]: r for r in rows.to_pylist()})
    table.close()
    got = {r["id"]: r for r in readers.open(table_uri, consistency="strong").scan().to_pylist()}
    assert got == want
