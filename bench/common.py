"""Shared pieces of the benchmarks: the workload of docs/benchmarks.md and small statistics."""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import tempfile

from typing import Callable, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

DIM = 64
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64()),
        pa.field("val", pa.float64()),
        pa.field("name", pa.string()),
        pa.field("vec", pa.list_(pa.float32(), DIM)),
    ]
)


def machine() -> str:
    """One line naming the machine, for the results table."""
    try:
        model = next(
            (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?"
        )
    except OSError:
        model = platform.processor() or "?"
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores ({model}), {mem:.0f} GiB, {platform.system()} {platform.release()}, Python {platform.python_version()}"


def today() -> str:
    return dt.date.today().isoformat()


def git_rev() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def base_rows(n: int, seed: int = 0) -> pa.Table:
    """``n`` rows with ids 0..n-1: the 1M-row base of the workload."""
    rng = np.random.default_rng(seed)
    vec = pa.FixedSizeListArray.from_arrays(pa.array(rng.random(n * DIM, dtype=np.float32)), DIM)
    ids = pa.array(np.arange(n, dtype=np.int64))
    # f"name-{i:012d}-base", built by Arrow: a Python list of 30M strings costs minutes and GBs
    name = pc.binary_join_element_wise("name-", pc.utf8_lpad(pc.cast(ids, pa.string()), 12, "0"), "-base", "")
    return pa.table(
        {
            "id": ids,
            "val": pa.array(rng.random(n)),
            "name": name,
            "vec": vec,
        },
        schema=SCHEMA,
    )


def batch_rows(batch: int, size: int, base: int, seed: int = 1) -> list[dict]:
    """Micro-batch ``batch``: half updates of existing ids, half new ids (as in the baselines)."""
    rng = random.Random(seed * 1_000_003 + batch)
    half = size // 2
    updates = rng.sample(range(base), half)
    new = range(base + batch * half, base + batch * half + (size - half))
    rows = []
    for i in list(updates) + list(new):
        rows.append(
            {
                "id": i,
                "val": rng.random(),
                "name": f"name-{i:012d}-b{batch:04d}",
                "vec": [round(rng.random(), 4) for _ in range(DIM)],
            }
        )
    return rows


#: Pre-encoded vectors for :func:`batch_json`: drawing 64 floats and encoding them per record
#: costs ~50 us in Python, which caps one producer thread near 10k records/s.
_VECTOR_POOL: list[str] = []


def batch_json(batch: int, size: int, base: int, seed: int = 1) -> list[tuple[int, bytes]]:
    """:func:`batch_rows`'s ids, vals and names as ``(id, JSON value)``, cheap enough to produce
    20k records/s from one Python thread: each vector is one of 4,096 drawn once (same shape
    and value range as batch_rows's, so decoding costs the same)."""
    if not _VECTOR_POOL:
        pool = random.Random(seed)
        _VECTOR_POOL.extend(json.dumps([round(pool.random(), 4) for _ in range(DIM)]) for _ in range(4096))
    rng = random.Random(seed * 1_000_003 + batch)
    half = size // 2
    ids = rng.sample(range(base), half) + list(range(base + batch * half, base + batch * half + (size - half)))
    return [(i, f'{{"id": {i}, "val": {rng.random()!r}, "name": "name-{i:012d}-b{batch:04d}", "vec": {_VECTOR_POOL[i % 4096]}}}'.encode())
            for i in ids]


#: The workload's rows as Avro records (``--value-format avro``; bench/formats.py too).
AVSC = {
    "type": "record",
    "name": "row",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "val", "type": ["null", "double"]},
        {"name": "name", "type": ["null", "string"]},
        {"name": "vec", "type": ["null", {"type": "array", "items": "float"}]},
        {"name": "op", "type": ["null", "string"], "default": None},
    ],
}


def value_encoder(fmt: str) -> Callable[[dict], bytes]:
    """Encodes one workload row as a Kafka value: "json", or "avro" (bare datum of AVSC)."""
    if fmt == "json":
        return lambda r: json.dumps(r).encode()
    import fastavro

    parsed = fastavro.parse_schema(AVSC)

    def avro(r: dict) -> bytes:
        b = io.BytesIO()
        fastavro.schemaless_writer(b, parsed, r)
        return b.getvalue()

    return avro


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(p / 100 * (len(s) - 1)))))]


def trigger_cadence(timestamps: Sequence[str], durations: Sequence[Mapping[str, float]]) -> dict:
    """How often micro-batches started (from Spark's progress ``timestamp``s, ISO 8601 in UTC,
    in batch order) and the mean of each of Spark's ``durationMs`` phases; {} for fewer than
    two micro-batches."""
    starts = [dt.datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp() for t in timestamps]
    gaps = [1000 * (b - a) for a, b in zip(starts, starts[1:])]
    if not gaps:
        return {}
    keys = sorted({k for d in durations for k in d})
    means = {k: sum(float(d.get(k, 0)) for d in durations) / len(durations) for k in keys}
    return {"cadence_ms_p50": pct(gaps, 50), "cadence_ms_p90": pct(gaps, 90), "spark_duration_ms_mean": means}


def read_samples(path: str, *fields) -> list[tuple]:
    """The lines of a prober's comma-separated log, each field converted by ``fields`` (one
    callable per field); a line without that many fields, or that does not convert, is the
    one being written and is skipped."""
    out = []
    with open(path) as f:
        for line in f:
            parts = line.strip().split(",")
            if len(parts) != len(fields):
                continue
            try:
                out.append(tuple(convert(v) for convert, v in zip(fields, parts)))
            except ValueError:
                continue
    return out


def summary_ms(values: list[float]) -> str:
    return f"{pct(values, 50) * 1000:.0f} / {pct(values, 99) * 1000:.0f}"


def mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")



def report(results: dict, json_path: str | None) -> None:
    """End a benchmark run: print the date, machine and commit; write the results as
    JSON when asked."""
    print(f"\n{results['date']}, {results['machine']}, commit {results['commit']}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(results, f, indent=2)


@contextlib.contextmanager
def work_dir(path: str | None, prefix: str) -> Iterator[str]:
    """``path``, or a temporary directory removed afterwards."""
    work = path or tempfile.mkdtemp(prefix=prefix)
    try:
        yield work
    finally:
        if not path:
            shutil.rmtree(work, ignore_errors=True)


#: Process categories of a Spark ingest on this machine, by what their command line holds.
_CPU_CATEGORIES = (
    ("writer process", ("memwal.write.process",)),
    ("driver's Python workers (data source setup, commit)", ("python_streaming_sink_runner", "create_data_source", "commit_data_source")),
    ("Python workers (tasks)", ("pyspark.daemon", "pyspark/daemon")),
    ("Kafka broker", ("kafka.Kafka", "KafkaRaftServer", "kafka-broker")),
    ("Spark JVM", ("org.apache.spark", "spark-kafka", "pyspark/jars")),
)


class CpuByProcess:
    """CPU seconds spent by each kind of process (the Spark JVM, its Python workers, memwal's
    writer process, the broker, this process) while the ``with`` block runs, sampled from
    /proc twice a second: where a run's cores went, beside its wall time."""

    def __init__(self) -> None:
        import threading

        self.seconds: dict[str, float] = {}
        self.processes: dict[str, int] = {}
        self._first: dict[int, tuple[str, int]] = {}
        self._last: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _category(pid: int, cmd: str) -> str | None:
        if pid == os.getpid():
            return "this process (driver)"
        for name, needles in _CPU_CATEGORIES:
            if any(n in cmd for n in needles):
                return name
        return None

    def _sample(self) -> None:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                ticks = int(fields[11]) + int(fields[12])
                if pid not in self._first:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
                    cat = self._category(pid, cmd)
                    if cat is None:
                        continue
                    self._first[pid] = (cat, ticks)
                self._last[pid] = ticks
            except (OSError, IndexError, ValueError):
                continue

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self._sample()

    def __enter__(self) -> "CpuByProcess":
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        hz = os.sysconf("SC_CLK_TCK")
        out: dict[str, float] = {}
        count: dict[str, int] = {}
        for pid, (cat, first) in self._first.items():
            out[cat] = out.get(cat, 0.0) + (self._last.get(pid, first) - first) / hz
            count[cat] = count.get(cat, 0) + 1
        self.seconds = dict(sorted(out.items(), key=lambda kv: -kv[1]))
        #: How many processes of each kind ran (a kind started anew per micro-batch shows here).
        self.processes = count

    def line(self) -> str:
        return ", ".join(f"{k} {v:.1f}" + (f" ({self.processes[k]} processes)" if self.processes.get(k, 1) > 1 else "")
                         for k, v in self.seconds.items() if v >= 0.05)
