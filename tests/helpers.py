"""Test helpers shared by several test modules."""

from __future__ import annotations

import os

import json
import random
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import lance
import lance.mem_wal
import pyarrow as pa
import pyarrow.compute as pc

from memwal import readers
from memwal.core import paths
from memwal.core.io import LocalFileIO
from memwal.core.manifest import SsTable

PEOPLE = pa.schema(
    [
        pa.field("id", pa.int64()),
        pa.field("name", pa.string()),
        pa.field("score", pa.float64()),
    ]
)


def people(ids, tag: str = "v") -> pa.Table:
    """Rows of the PEOPLE schema whose values derive from id and tag."""
    ids = list(ids)
    return pa.table(
        {"id": ids, "name": [f"{tag}{i}" for i in ids], "score": [float(i) / 2 for i in ids]},
        schema=PEOPLE,
    )


def compact_by_hand(uri: str, shard_id: str, sst: SsTable) -> None:
    """What the notes describe, without memwal's compactor: tombstones delete, rows upsert,
    the final pass carries the compaction marker."""
    data = lance.dataset(paths.sstable_path(uri, shard_id, sst.path)).to_table()
    dead = data.filter(data["_tombstone"]).select(["id"])
    rows = data.filter(pc.invert(data["_tombstone"])).drop(["_tombstone"])
    ds = lance.dataset(uri)
    if dead.num_rows:
        ds.merge_insert("id").when_matched_delete().execute(dead)
        ds = lance.dataset(uri)
    marker = [lance.mem_wal.CompactedSsTable(shard_id, sst.generation)]
    ds.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().mark_sstables_as_compacted(
        marker
    ).execute(rows)


def keyed_changes(n: int, keys: int, seed: int, partitions: int = 3) -> tuple[list[tuple[bytes, dict, int]], dict[int, dict]]:
    """Keyed changes (upserts and deletes, several per key) as ``(key, value, partition)``
    with the value a dict for the caller to encode (JSON, Avro), and the model they produce.

    Keyed by id, like a real producer: one key's history stays in one partition, in order, so
    the model (last change per key wins) is what any exactly-once ingest must store. The
    same seed gives the same changes whatever the encoding."""
    rng = random.Random(seed)
    model: dict[int, dict] = {}
    records = []
    for i in range(n):
        k = rng.randrange(keys)
        if rng.random() < 0.15:
            value = {"id": k, "op": "delete"}
            model.pop(k, None)
        else:
            row = {"id": k, "name": f"n{i}", "score": round(rng.random() * 100, 3), "vec": [float(i % 7)] * 4}
            value = {**row, "op": "upsert"}
            model[k] = row
        records.append((str(k).encode(), value, k % partitions))
    return records, model


def workload(n: int, keys: int, seed: int, partitions: int = 3) -> tuple[list[tuple[bytes, bytes, int]], dict[int, dict]]:
    """:func:`keyed_changes` as JSON Kafka records, and the model they produce."""
    changes, model = keyed_changes(n, keys, seed, partitions)
    return [(k, json.dumps(value).encode(), p) for k, value, p in changes], model


def table_rows(uri: str, consistency: str = "eventual") -> dict[int, dict]:
    """A table's rows by id, as a reader of that consistency sees them."""
    rows = readers.open(uri, consistency=consistency).scan().to_pylist()
    return {r["id"]: r for r in rows}


def approx(rows: dict[int, dict]) -> dict[int, dict]:
    """Rows with their float32 vectors rounded, comparable with a model's float64 lists."""
    return {k: {**v, "vec": [round(x, 3) for x in v["vec"]] if v.get("vec") is not None else None} for k, v in rows.items()}


class CountingIO(LocalFileIO):
    """LocalFileIO that records the directories it lists and what it was asked to make durable
    (and still does both)."""

    def __init__(self) -> None:
        self.listed: list[str] = []
        self.synced: list[str] = []
        self.dirs: list[str] = []

    def list_dir(self, path: str) -> list[str]:
        self.listed.append(path)
        return super().list_dir(path)

    def sync(self, paths: list[str], directory: str | None = None) -> None:
        super().sync(paths, directory)
        self.synced.extend(paths)
        if directory is not None:
            self.dirs.append(directory)


def run_sink_batch(uri: str, options, data: pa.Table, batch_id: int):
    """One micro-batch of the ``foreachBatch`` sink run in this process as Spark runs it: the
    prepare and write stages (as in a worker), then the driver's commit; its report."""
    import pickle

    from memwal.core.state import TableState
    from memwal.streaming.sink import Prepare, Write
    from memwal.streaming.write_task import MESSAGE
    from memwal.write.api import TableWrite
    from memwal.write.dead_letters import dead_letter_uri

    exchange = list(Prepare(uri, options)(iter(data.to_batches())))
    out = list(Write(uri, options, batch_id, options.dead_letter_uri or dead_letter_uri(uri))(iter(exchange)))
    messages = [pickle.loads(b.column(MESSAGE)[0].as_py()).message for b in out]
    return TableWrite(TableState.load(uri), options.write_mode(), dead_letter_uri=options.dead_letter_uri).commit(messages, batch_id)


def sigkill_when(process: subprocess.Popen, ready: Callable[[], bool], log: Path, what: str, timeout: float = 300,
                 before: Callable[[], None] | None = None) -> None:
    """Wait until ``ready()`` while ``process`` (started with ``start_new_session``, its output
    in ``log``) runs, call ``before``, then SIGKILL its process group: the driver and its Python
    workers. A wait that fails kills it too; ``what`` names the progress it waited for."""
    try:
        deadline = time.monotonic() + timeout
        while not ready():
            assert process.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s"
            time.sleep(0.2)
        if before is not None:
            before()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


#: The driver JVMs the tests start in child processes (``memwal ingest``, scripts) run for
#: seconds on small topics: launched as memwal launches its own short commands (C1-only JIT,
#: the serial GC: ``session.LAUNCH_DEFAULTS``), not with the full JIT ``memwal ingest`` picks for
#: a query that runs for hours. A command-line ingest of 2,000 records took 21-24 s this way
#: against 26 s with the full JIT (2026-11-29). conftest puts them in the tests' environment.
SHORT_RUN_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def submit_args(*conf: str) -> str:
    """``PYSPARK_SUBMIT_ARGS`` for a child process: the short-run launch and ``--conf`` ``conf``."""
    return " ".join(["--driver-java-options", f"'{SHORT_RUN_JAVA_OPTIONS}'", *(f"--conf {c}" for c in conf), "pyspark-shell"])


#: How many examples property tests run: "dev" (``make test``, the default) a third of each
#: test's count, at least a few; "full" (``make test-full``, ``MEMWAL_TEST_PROFILE=full``) all of
#: them. The expensive ones (real Lance tables per example) are the ones that scale.
PROFILE = os.environ.get("MEMWAL_TEST_PROFILE", "dev")


def examples(n: int, least: int = 5) -> int:
    """``n`` examples under the full profile, a third of them (at least ``least``) otherwise."""
    return n if PROFILE == "full" else max(min(n, least), n // 3)
