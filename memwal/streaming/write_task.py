"""The sink's write stage: one task per write partition, every shard in exactly one task.

The task reads its partition's exchange rows (:mod:`memwal.streaming.exchange`), splits the
routed rows by shard and hands each shard's rows, as a :class:`~memwal.streaming.worker.ShardJob`,
to the process that keeps the shard's writer: this Python worker, or with
``SinkOptions.writer_process`` the executor's writer process
(:mod:`memwal.streaming.writer_process`, so a task moving to another worker keeps its writers).
What the rows become is the write path's (:mod:`memwal.writepath`). The first partition's task
also records the batch's dead letters. One summary row per shard goes back to the driver.
"""

from __future__ import annotations

import functools
import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from memwal.sharding import ShardValues
from memwal.storage import StorageConfig
from memwal.streaming.exchange import COUNT_SKIPPED, DEAD_PAYLOAD, PAYLOAD, SHARD, SHARDS_KEY, from_payload, summary, with_timing
from memwal.streaming.options import SinkOptions
from memwal.streaming.worker import ShardJob
from memwal.writepath import MAX_SHARD_THREADS


class Write:
    """The write stage, pickled to executors (``mapInArrow`` after ``repartition``)."""

    def __init__(self, uri: str, options: SinkOptions, batch_id: int, dead_letter_uri: str, storage: StorageConfig | None = None,
                 *, fused: bool = False) -> None:
        self.uri = uri
        #: prepare runs in this same task (one stage): waiting for input is then reading and
        #: preparing, already counted as such, not an exchange.
        self.fused = fused
        self.options = options
        self.batch_id = batch_id
        self.dead_letter_uri = dead_letter_uri
        #: None: the executor's own environment.
        self.storage = storage

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        routed: list[pa.Table] = []
        dead: list[pa.Table] = []
        shards: dict[str, ShardValues] = {}
        skipped = 0
        t0 = time.perf_counter()
        read_s = prepare_s = 0.0
        stamps: list[int] = []
        for b in batches:
            skipped += pc.sum(b.column(COUNT_SKIPPED)).as_py() or 0
            read_s += sum(x or 0.0 for x in b.column("read_seconds").to_pylist())
            prepare_s += sum(x or 0.0 for x in b.column("prepare_seconds").to_pylist())
            stamps += [x for c in ("min_timestamp_ms", "max_timestamp_ms") for x in b.column(c).to_pylist() if x is not None]
            for p in b.column(PAYLOAD).to_pylist():
                if p:
                    t = from_payload(p)
                    shards.update((sid, tuple(v)) for sid, v in json.loads(t.schema.metadata[SHARDS_KEY]).items())
                    routed.append(t)
            for p in b.column(DEAD_PAYLOAD).to_pylist():
                if p:
                    dead.append(from_payload(p))
        # The task's phase timings ride on its first summary row (one row per shard stays).
        waited = time.perf_counter() - t0
        exchange_s = max(0.0, waited - read_s - prepare_s) if self.fused else waited
        timing = {"read_seconds": read_s, "prepare_seconds": prepare_s, "exchange_seconds": exchange_s,
                  "min_timestamp_ms": min(stamps, default=None), "max_timestamp_ms": max(stamps, default=None)}
        if dead:
            yield with_timing(self._dead_letters(pa.concat_tables(dead)), timing)
            timing = {}
        if skipped:
            yield with_timing(summary("", skipped=skipped), timing)
            timing = {}
        if not routed:
            return
        data = pa.concat_tables(routed)
        ids = pc.unique(data.column(SHARD)).to_pylist()
        write_shard = self._shard_writer()
        if len(ids) == 1:
            yield with_timing(write_shard(ids[0], shards[ids[0]], data), timing)
            return
        column = data.column(SHARD)
        with ThreadPoolExecutor(max_workers=min(MAX_SHARD_THREADS, len(ids))) as pool:
            futures = [pool.submit(write_shard, sid, shards[sid], data.filter(pc.equal(column, sid))) for sid in ids]
            for f in futures:
                yield with_timing(f.result(), timing)
                timing = {}

    def _shard_writer(self) -> Callable[[str, ShardValues, pa.Table], pa.RecordBatch]:
        """The shard job run here, or by the executor's writer process (which keeps the
        shards' writers whichever worker runs the next task)."""
        job = ShardJob(self.uri, self.options, self.batch_id, self.storage)
        if not self.options.writer_process:
            return job.run
        from memwal.streaming.writer_process import client

        remote = client(self.options.writer_process_idle_seconds)
        return functools.partial(remote.write_shard, job)

    def _dead_letters(self, bad: pa.Table) -> pa.RecordBatch:
        from memwal.streaming.dead_letters import dead_letter_rows, write_dead_letters

        t0 = time.perf_counter()
        write_dead_letters(self.dead_letter_uri, dead_letter_rows(bad, self.batch_id, self.uri), self.storage)
        return summary("", rows=0, dead_letters=bad.num_rows, seconds=time.perf_counter() - t0)
