"""Soak: stream into a table at a fixed rate for an hour and watch whether it stays fast.

A producer writes upserts (half updates of existing ids, half new ids) into a local broker at
``--rate`` rows/s; memwal's ingest query (Kafka -> Spark -> foreachBatch shard writers) takes
them in micro-batches of ``--batch-rows``. Beside it, in processes of their own:
``memwal maintain`` (compaction, index catch-up, GC) and a prober doing point lookups of
random keys through an eventual reader, plus one full deduped scan per sample; and a control
prober doing the same lookups against two tables nobody writes to (a memwal table and a plain
Lance table of the starting rows). The machine is shared, so lookups slow down as the load on it
grows, whatever the table does; the control measures that, and the summary divides it out.

Every ``--sample`` seconds (30 by default) one CSV line: rows/s ingested, the broker backlog,
uncompacted SSTables (max over the sample), base fragments, the newest base manifest's bytes,
the table's bytes on disk, lookup p50/p99, the full scan's rows/s and the freshness (how old
the newest row the reader sees was when the scan ran: every row carries its produce time in
``val``). At the end (or on Ctrl-C) one PNG draws those lines over time; ``--plot CSV``
redraws it from a CSV alone.

The table stays fast when lookups, SSTables, fragments and manifest bytes are flat over the
hour and disk tracks the live data (docs/bench-log/soak.md, "Soak").

Under faults (``--faults RATE``): the table lives on an S3 API (moto's server, a process of its
own) behind a fault-injecting proxy (tests/faultproxy.py, another process) that fails RATE of
all requests, with S3's 503 SlowDown and 500 InternalError, connection resets (before and after
the store applied the request), 409 on conditional PUTs and latency spikes; every process of
the run (ingest, ``memwal maintain``, the probers) goes through it, and the run's own
measurements go to moto directly. ``--broker-restart-every MIN`` also restarts the Kafka
broker. The CSV then carries the faults injected, lookups that failed, maintenance cycles that
failed and broker restarts, and the end of the run reports them with the failed requests the
clients sent again (their retries).

Run: ``python bench/soak.py`` (``--rate 10000 --minutes 60`` by default; needs the ``bench``
extra for the PNG); under faults e.g. ``python bench/soak.py --faults 0.01 --rate 400
--base-rows 100000 --minutes 30 --broker-restart-every 10``, and its baseline, the same on S3
without faults, ``--s3`` instead of ``--faults 0.01`` (the S3 API on 127.0.0.1 takes far fewer
rows/s than a local disk: pick a rate the baseline sustains).
"""

from __future__ import annotations

import argparse
import csv
import faulthandler
import itertools
import json
import logging
import multiprocessing
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from memwal.core.runtime import configure_process  # noqa: E402

configure_process()  # Lance's log filter, before Lance is imported

import lance  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import git_rev, machine, pct, read_samples, today  # noqa: E402
from ingest import open_broker  # noqa: E402
from keepup import SCHEMA, base_table, disk_bytes, read_probes  # noqa: E402

from memwal import readers, Table  # noqa: E402
from memwal.core import paths  # noqa: E402
from memwal.core.io import FileIO, file_io_for  # noqa: E402
from memwal.maintain.maintenance import MaintenanceConfig  # noqa: E402
from memwal.maintain.metrics import MaintenanceMetrics  # noqa: E402
from memwal.streaming import SinkOptions, ingest, local_session  # noqa: E402

#: CSV columns, in order; the PNG draws them in panels of like units.
COLUMNS = [
    "t_s", "rows_per_s", "backlog", "uncompacted_sstables", "base_fragments", "manifest_bytes", "disk_bytes",
    "live_bytes", "index_bytes", "live_rows", "lookup_p50_ms", "lookup_p99_ms", "lookups", "scan_rows_per_s", "freshness_s", "query_restarts", "produce_failed",
    "maintain_rss_bytes", "prober_rss_bytes", "small_base_fragments",
    # under --faults / --broker-restart-every (cumulative but for lookup_errors, per sample)
    "faults_injected", "retried_requests", "lookup_errors", "maintain_cycles", "maintain_failures", "broker_restarts",
]
#: The control prober's lookups by kind (its CSV's ``which``) -> the prefix of their columns.
CONTROL_KINDS = {"memwal": "control_memwal", "lance": "control_lance", "inline": "inline_refresh"}
CONTROL_COLUMNS = [f"{prefix}_p{q}_ms" for prefix in CONTROL_KINDS.values() for q in (50, 99)]
COLUMNS += CONTROL_COLUMNS
#: The counts the issue wants flat: the summary gives each its slope over the last 30 minutes.
FLAT_COLUMNS = ("uncompacted_sstables", "base_fragments", "small_base_fragments", "manifest_bytes")


class Producer(threading.Thread):
    """Sends ``rate`` rows/s in ticks of 0.1 s (half updates of ids below ``base``, half new
    ids), each row's ``val`` its produce time. It stops sending while ``max_backlog`` rows
    wait for the sink: a backlog means the sink fell behind (the CSV shows it), and a deep
    one would make the local broker, not memwal, the thing measured."""

    def __init__(self, config: dict, topic: str, rate: int, base: int, consumed, max_backlog: int) -> None:
        super().__init__(daemon=True)
        self.config, self.topic, self.rate, self.base, self.consumed = config, topic, rate, base, consumed
        self.max_backlog = max_backlog
        self.stop = threading.Event()
        #: Rows the broker acknowledged, and rows it refused or librdkafka gave up on: the
        #: backlog is what the broker holds beyond what the sink took, so a refused row must
        #: not count as waiting (the producer would pause on a backlog nobody can drain).
        self.sent = 0
        self.failed = 0
        self.last_error = ""

    def _delivered(self, err, msg) -> None:
        if err is None:
            self.sent += 1
        else:
            self.failed += 1
            self.last_error = str(err)

    def run(self) -> None:
        import confluent_kafka

        producer = confluent_kafka.Producer({**self.config, "linger.ms": 20, "queue.buffering.max.messages": 1_000_000})
        rng = random.Random(1)
        next_new = self.base
        queued = 0
        owed = 0.0  # rows the fixed rate owes since the last tick
        last = time.monotonic()
        while not self.stop.is_set():
            now = time.monotonic()
            owed += (now - last) * self.rate
            last = now
            # rows queued but not yet acknowledged count too, so the cap holds while they fly
            room = max(0, self.max_backlog - (queued - self.failed - int(self.consumed())))
            n = min(int(owed), room)
            owed = min(owed - n, float(self.rate))  # time spent stalled is not made up later
            stamp = time.time()
            for i in range(n):
                if i % 2:
                    key, next_new = next_new, next_new + 1
                else:
                    key = rng.randrange(self.base)
                value = json.dumps({"id": key, "val": stamp, "name": f"name-{key:012d}-{queued + i:010d}"})
                while True:
                    try:
                        producer.produce(self.topic, key=str(key).encode(), value=value.encode(), partition=key % 3,
                                         on_delivery=self._delivered)
                        break
                    except BufferError:
                        producer.poll(0.05)
            queued += n
            producer.poll(0)
            self.stop.wait(max(0.0, 0.1 - (time.monotonic() - now)))
        producer.flush(60)


class Ingest:
    """memwal's ingest query, restarted from its checkpoint when it dies (up to ``restarts``
    times): on a loaded machine Spark sometimes gives up on starting a Python worker within
    its 10 s, and an hour's run should not end there. Rows count across restarts."""

    def __init__(self, start, restarts: int) -> None:
        self.start, self.restarts_left, self.restarts = start, restarts, 0
        self.job = start()
        self.before = 0  # rows ingested by the queries before this one

    def rows(self) -> int:
        return self.before + int(self.job.reports.totals().get("rows", 0))

    def alive(self) -> bool:
        """True while a query runs (restarting a dead one if restarts are left)."""
        if self.job.query.isActive:
            return True
        print(f"the ingest query stopped: {self.job.query.exception()}", flush=True)
        if self.restarts_left <= 0:
            return False
        self.restarts_left -= 1
        self.restarts += 1
        self.before = self.rows()
        try:
            self.job.stop()  # its listener goes; a query that failed flushes nothing
        except Exception:  # noqa: BLE001 - it is dead already; only its leftovers matter
            pass
        self.job = self.start()
        print("restarted it from its checkpoint", flush=True)
        return True

    def stop(self) -> None:
        if self.job.query.isActive:
            self.job.stop()


def probe(uri: str, base: int, lookups_out: str, scans_out: str, scan_every: float, background: bool = True) -> None:
    """Point lookups of random base keys through an eventual reader (refreshed every second, on
    a thread of its own unless ``background`` is False),
    every 50 ms, appending ``wall time, seconds, hit`` to ``lookups_out``; every
    ``scan_every`` seconds one full deduped scan of ``id, val``, appending ``wall time,
    seconds, rows, newest val`` to ``scans_out``. Runs until killed."""
    reader = readers.open(uri, refresh_interval_ms=1000, refresh_in_background=background)
    rng = random.Random(2)
    next_scan = time.time() + 5
    with open(lookups_out, "a", buffering=1) as lf, open(scans_out, "a", buffering=1) as sf:
        while True:
            if time.time() >= next_scan:
                next_scan = time.time() + scan_every
                t0 = time.perf_counter()
                try:
                    rows = reader.scan(columns=["id", "val"])
                    newest = rows.column("val").to_numpy().max() if rows.num_rows else float("nan")
                    sf.write(f"{time.time()},{time.perf_counter() - t0},{rows.num_rows},{newest}\n")
                    del rows
                except Exception as e:  # noqa: BLE001 - a failed scan is a sample without one
                    logging.warning("scan failed: %s", e)
            key = rng.randrange(base)
            t0 = time.perf_counter()
            try:
                hit = reader.get(key, columns=["val"]) is not None  # every base key exists
            except Exception:  # noqa: BLE001 - counted as an error; a reader must not fail
                hit = False
            lf.write(f"{time.time()},{time.perf_counter() - t0},{int(hit)}\n")
            time.sleep(0.05)


def control_probe(static_uri: str, plain_uri: str, live_uri: str, base: int, out_path: str, background: bool = True) -> None:
    """The load's yardstick: the prober's lookups, at its pace, against two tables nobody
    writes to, in a process of its own: a memwal table of the run's starting rows (the same
    read path as the prober's, with no growth and no history) and a plain Lance table of the
    same rows with a BTREE. Both share the machine with the run, so their latency over the hour
    is what the load alone does to a lookup; the live table's latency divided by theirs is what
    the table's growth and history do. When the prober refreshes in the background, a third
    reader looks up the live table refreshing inline (in the read that finds its snapshot
    stale): the two ways under one load. (Not the other way round: a refresh thread on the
    growing table in this process would load the yardstick with the table's work.) Takes them
    in turn, appending ``wall time, which, seconds`` lines (``which``: ``memwal``, ``lance`` or
    ``inline``) to ``out_path``. Runs until killed."""
    reader = readers.open(static_uri, refresh_interval_ms=1000, refresh_in_background=background)
    kinds = ("memwal", "lance", "inline") if background else ("memwal", "lance")
    live = readers.open(live_uri, refresh_interval_ms=1000) if background else None
    plain = lance.dataset(plain_uri)
    rng = random.Random(2)
    with open(out_path, "a", buffering=1) as f:
        for i in itertools.count():
            key = rng.randrange(base)
            which = kinds[i % len(kinds)]
            t0 = time.perf_counter()
            try:
                if which == "memwal":
                    reader.get(key, columns=["val"])
                elif which == "lance":
                    plain.to_table(columns=["val"], filter=f"id = {key}")
                else:
                    live.get(key, columns=["val"])
            except Exception as e:  # noqa: BLE001 - a failed lookup is a sample without one
                logging.warning("control lookup (%s) failed: %s", which, e)
                time.sleep(0.05)
                continue
            f.write(f"{time.time()},{which},{time.perf_counter() - t0}\n")
            time.sleep(0.05)


def read_control(path: str) -> list[tuple[float, str, float]]:
    """``wall time, which, seconds`` lines of the control prober."""
    return read_samples(path, float, str, float)


def read_scans(path: str) -> list[tuple[float, float, int, float]]:
    """``wall time, seconds, rows, newest val`` lines of the prober's scans."""
    return read_samples(path, float, float, int, float)


def newest_manifest_bytes(uri: str, io: FileIO) -> int:
    sizes = [(f.mtime, f.size) for f in io.list_prefix(paths.join(uri, "_versions")) if f.path.endswith(".manifest")]
    return max(sizes)[1] if sizes else 0


def index_bytes(ds: lance.LanceDataset) -> int:
    """Bytes of the index files the base table's current version uses (every segment)."""
    return sum(d.total_size_bytes or 0 for d in ds.describe_indices() if d.name != "__lance_mem_wal")


def live_bytes(ds: lance.LanceDataset, uri: str, io: FileIO) -> int:
    """Bytes of the data files the base table's current version reads: the live data, plus the
    rows its deletion files hide (what compaction of the base has not yet dropped)."""
    sizes = {f.path: f.size for f in io.list_prefix(paths.join(uri, "data"))}
    # a file a newer version's compaction removed while we looked counts 0
    return sum(sizes.get(f.path, 0) for frag in ds.get_fragments() for f in frag.data_files())


class FaultyStore:
    """``--faults``: moto's S3 server and the fault proxy in front of it, each a process of its
    own (in the driver they would take the GIL from the ingest), stopped by :meth:`stop`."""

    BUCKET = "soak"

    def __init__(self, work: str, rate: float, seed: int = 1) -> None:
        from memwal_dev.local_broker import free_port

        self.work = work
        port = free_port()
        self.moto_endpoint = f"http://127.0.0.1:{port}"
        self.moto = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                                     stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "moto.log"), "w"))
        deadline = time.monotonic() + 60
        while True:
            try:
                import urllib.request

                urllib.request.urlopen(self.moto_endpoint, timeout=1)
                break
            except OSError:
                assert self.moto.poll() is None and time.monotonic() < deadline, "moto_server did not start"
                time.sleep(0.2)
        import boto3

        boto3.client("s3", endpoint_url=self.moto_endpoint, aws_access_key_id="soak", aws_secret_access_key="soak",
                     region_name="us-east-1").create_bucket(Bucket=self.BUCKET)
        tests = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
        self.stats_path = os.path.join(work, "proxy.json")
        self.proxy = subprocess.Popen(
            [sys.executable, os.path.join(tests, "faultproxy.py"), "--upstream", self.moto_endpoint, "--rate", str(rate),
             "--seed", str(seed), "--stats", self.stats_path],
            stdout=subprocess.PIPE, stderr=open(os.path.join(work, "proxy.log"), "w"), text=True,
        )
        self.endpoint = self.proxy.stdout.readline().strip()
        assert self.endpoint.startswith("http://"), "the fault proxy did not start"

    def uri(self, name: str) -> str:
        return f"s3://{self.BUCKET}/{name}"

    def options(self, endpoint: str) -> dict[str, str]:
        return {"aws_access_key_id": "soak", "aws_secret_access_key": "soak", "aws_region": "us-east-1",
                "aws_endpoint": endpoint, "allow_http": "true"}

    def direct(self) -> dict[str, str]:
        """Options that reach moto without faults: the run's own measurements."""
        return self.options(self.moto_endpoint)

    def environment(self) -> dict[str, str]:
        """The AWS_* variables every process of the run inherits: through the proxy."""
        return {"AWS_ACCESS_KEY_ID": "soak", "AWS_SECRET_ACCESS_KEY": "soak", "AWS_REGION": "us-east-1",
                "AWS_ENDPOINT_URL": self.endpoint, "AWS_ALLOW_HTTP": "true"}

    def stats(self) -> dict:
        try:
            with open(self.stats_path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}

    def stop(self) -> None:
        for p in (self.proxy, self.moto):
            if p.poll() is None:
                p.terminate()
                p.wait(30)


def maintenance_totals(uri: str, io: FileIO) -> tuple[int, int]:
    """(cycles, failed cycles) the maintenance service published so far."""
    try:
        m = MaintenanceMetrics.from_json(io.read(paths.maintenance_metrics(uri)))
    except (OSError, ValueError):
        return 0, 0
    return m.totals.cycles, m.totals.failures


def plot(csv_path: str, png_path: str, title: str = "") -> None:
    """One PNG of the CSV's lines over time, in panels of like units."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(csv_path) as f:
        rows = [{k: float(v) if v not in ("", "nan") else float("nan") for k, v in r.items()} for r in csv.DictReader(f)]
    for r in rows:  # CSVs written before the columns existed
        for col in ("index_bytes", "maintain_rss_bytes", "prober_rss_bytes", "small_base_fragments", *CONTROL_COLUMNS):
            r.setdefault(col, float("nan"))
    t = [r["t_s"] / 60 for r in rows]
    panels = [
        ("rows/s ingested", [("rows_per_s", "rows/s")]),
        ("count", [("uncompacted_sstables", "uncompacted SSTables"), ("base_fragments", "base fragments"),
                   ("small_base_fragments", "base fragments under maintenance's small_fragment_rows")]),
        ("lookup ms", [("lookup_p50_ms", "p50"), ("lookup_p99_ms", "p99"),
                       ("control_memwal_p50_ms", "p50, static memwal table (load alone)"),
                       ("control_lance_p50_ms", "p50, static plain Lance table"),
                       ("inline_refresh_p50_ms", "p50, live table, refreshed inline")]),
        ("MB", [("disk_bytes", "table on disk"), ("live_bytes", "base version's data files"),
                ("index_bytes", "base version's index files")]),
        ("manifest KB", [("manifest_bytes", "base manifest")]),
        ("RSS MB", [("maintain_rss_bytes", "maintenance process"), ("prober_rss_bytes", "lookup prober")]),
        ("scan M rows/s", [("scan_rows_per_s", "full deduped scan")]),
        ("freshness s", [("freshness_s", "age of newest visible row")]),
    ]
    scale = {"disk_bytes": 1e-6, "live_bytes": 1e-6, "index_bytes": 1e-6, "maintain_rss_bytes": 1e-6,
             "prober_rss_bytes": 1e-6, "manifest_bytes": 1e-3, "scan_rows_per_s": 1e-6}
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.0 * len(panels)), sharex=True)
    for ax, (label, lines) in zip(axes, panels):
        for col, name in lines:
            ax.plot(t, [r[col] * scale.get(col, 1) for r in rows], marker=".", label=name)
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        if len(lines) > 1:
            ax.legend(loc="upper left", fontsize="small")
    axes[-1].set_xlabel("minutes")
    if title:
        fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    fig.savefig(png_path, dpi=80)
    plt.close(fig)


def rss_bytes(pid: int | None) -> int | str:
    """Resident memory of a process ("" once it is gone): the maintenance and prober processes
    hold Lance's caches, whose bound is the memory this run must show flat."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration, TypeError):
        return ""


def interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of every process below ``pid``: Spark's JVM and its Python workers."""
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            children = open(f"/proc/{parent}/task/{parent}/children").read().split()
        except OSError:
            continue
        for c in map(int, children):
            try:
                cmd = open(f"/proc/{c}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            out.append((c, cmd))
            todo.append(c)
    return out


def dump_stall(work: str, minute: float) -> str:
    """Write every thread's stack of this process, of its Python descendants (py-spy, when
    installed: ``PYSPY`` or on the PATH) and of Spark's JVM (jstack) to one file: when the
    ingest query stops progressing without an error, this is what says where it waits."""
    path = os.path.join(work, f"stall-{minute:05.1f}min.txt")
    pyspy = os.environ.get("PYSPY") or shutil.which("py-spy")
    with open(path, "w") as f:
        f.write(f"# stall at minute {minute:.1f}, {time.strftime('%Y-%m-%d %H:%M:%S')}\n\n# driver {os.getpid()}\n")
        f.flush()
        faulthandler.dump_traceback(file=f, all_threads=True)
        for pid, cmd in [(os.getpid(), "driver")] + descendants(os.getpid()):
            tool = (["jstack", str(pid)] if "java" in cmd.split(" ")[0]
                    else [pyspy, "dump", "--pid", str(pid)] if pyspy and "python" in cmd else None)
            if tool is None:
                continue
            f.write(f"\n# {pid}: {cmd[:300]}\n")
            f.flush()
            try:
                f.write(subprocess.run(tool, capture_output=True, text=True, timeout=60).stdout)
            except (OSError, subprocess.SubprocessError) as e:
                f.write(f"({tool[0]} failed: {e})\n")
    return path


def compare_fresh(uri: str, work: str, lookups: int = 1000, start_rows: int | None = None) -> dict[str, float]:
    """Point-lookup p50/p99 of the soaked table (memwal reader) against the same rows written
    fresh into a plain Lance table with a BTREE on the key, same keys, alternating, this
    process: the issue's "within 2x of a fresh table" yardstick for the end of the hour.

    With ``start_rows`` (the run's base rows, keys 0 .. start_rows - 1), a fresh table of just
    those rows is measured too, on the same keys: what the table's growth alone does to a
    lookup, with no history, against which the run's last / first minutes can be read."""
    reader = readers.open(uri)
    rows = reader.scan(columns=["id", "val", "name"])
    tables = {"fresh": rows}
    if start_rows:
        tables["fresh_start"] = rows.filter(pc.less(rows.column("id"), start_rows))
    opened = {}
    for name, t in tables.items():
        path = os.path.join(work, name)
        shutil.rmtree(path, ignore_errors=True)
        lance.write_dataset(t, path).create_scalar_index("id", "BTREE")
        opened[name] = lance.dataset(path)
    keys = rows.column("id").to_numpy()
    if start_rows:
        keys = keys[keys < start_rows]  # every table holds them
    rng = random.Random(3)
    names = ["memwal", *opened]
    took: dict[str, list[float]] = {n: [] for n in names}
    for i in range(lookups):
        k = int(keys[rng.randrange(len(keys))])
        for name in names[i % len(names):] + names[: i % len(names)]:  # each goes first in turn
            t0 = time.perf_counter()
            got = (reader.get(k, columns=["val"]) if name == "memwal"
                   else opened[name].to_table(columns=["val"], filter=f"id = {k}").num_rows or None)
            took[name].append(time.perf_counter() - t0)
            assert got is not None, f"key {k} missing from the {name} table"
    out = {f"{n}_p{q}_ms": round(pct(v, q) * 1000, 2) for n, v in took.items() for q in (50, 99)}
    out["rows"] = rows.num_rows
    # The disk target's yardstick: what the same rows take as a plain Lance table with the index.
    out["fresh_disk_mb"] = round(disk_bytes(os.path.join(work, "fresh")) / 1e6, 1)
    out["memwal_disk_mb"] = round(disk_bytes(uri) / 1e6, 1)
    out["ratio_p50"] = round(out["memwal_p50_ms"] / out["fresh_p50_ms"], 2)
    if start_rows:
        out["growth_p50"] = round(out["fresh_p50_ms"] / out["fresh_start_p50_ms"], 2)
    return out


def print_comparison(c: dict[str, float]) -> None:
    print(f"\nlookups at the end, {c['rows']:,} rows: memwal p50 {c['memwal_p50_ms']} / p99 {c['memwal_p99_ms']} ms; "
          f"fresh Lance table with a BTREE p50 {c['fresh_p50_ms']} / p99 {c['fresh_p99_ms']} ms; "
          f"p50 ratio {c['ratio_p50']}x (target <= 2x); on disk {c['memwal_disk_mb']:,} MB against "
          f"{c['fresh_disk_mb']:,} MB for the fresh table", flush=True)
    if "growth_p50" in c:
        print(f"a fresh table of the run's starting rows only: p50 {c['fresh_start_p50_ms']} / p99 {c['fresh_start_p99_ms']} ms; "
              f"the end's fresh table is {c['growth_p50']}x that (the table's growth alone, no history)", flush=True)


def trend(points: list[tuple[float, float]], lag_points: int) -> tuple[float, float]:
    """(slope, its standard error) of a least-squares line through ``points`` (x, y).

    The error is Newey-West's (Bartlett weights over ``lag_points`` neighbours), not the
    textbook one: the counts sampled here are sawtooths (small fragments pile up, then one
    compaction merges them; SSTables rise between folds), so neighbouring residuals are
    correlated, and the textbook error would call a sawtooth's phase at the window's ends a
    trend. With the lag spanning a sawtooth's period, a bounded count gives |slope| within
    about two errors, and a count that keeps growing gives many (docs/bench-log/soak.md, "Soak").
    """
    n = len(points)
    mx = statistics.mean(x for x, _ in points)
    my = statistics.mean(y for _, y in points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    scores = [(x - mx) * (y - my - slope * (x - mx)) for x, y in points]
    s = sum(u * u for u in scores)
    for lag in range(1, min(lag_points, n - 1) + 1):
        s += 2 * (1 - lag / (lag_points + 1)) * sum(scores[i] * scores[i - lag] for i in range(lag, n))
    return slope, max(s, 0.0) ** 0.5 / sxx


def summarize(csv_path: str, window_s: float = 600, trend_s: float = 1800, period_s: float = 300) -> dict[str, float]:
    """The issue's yardsticks from a run's CSV: for each lookup column, the median of its
    samples in the first and the last ``window_s`` seconds and their ratio; the live table's
    ratios divided by the static memwal table's (what is left once the load is divided out);
    the slope per minute over the last ``trend_s`` seconds of the counts that must stay flat,
    with its standard error (:func:`trend`, over sawtooths of up to ``period_s``); and disk over
    the base version's data files in the last window."""
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return {}
    num = lambda r, k: float(r[k]) if r.get(k) not in (None, "", "nan") else None  # noqa: E731
    end = num(rows[-1], "t_s") or 0.0
    out: dict[str, float] = {"minutes": round(end / 60, 1)}
    first = [r for r in rows if num(r, "t_s") <= window_s]
    last = [r for r in rows if num(r, "t_s") > end - window_s]
    for k in ("lookup_p50_ms", "lookup_p99_ms", *CONTROL_COLUMNS):
        a = [v for r in first if (v := num(r, k)) is not None]
        b = [v for r in last if (v := num(r, k)) is not None]
        if a and b:
            out[f"{k}_first"], out[f"{k}_last"] = statistics.median(a), statistics.median(b)
            out[f"{k}_ratio"] = round(out[f"{k}_last"] / out[f"{k}_first"], 2)
    for q in (50, 99):
        live, ctl = out.get(f"lookup_p{q}_ms_ratio"), out.get(f"control_memwal_p{q}_ms_ratio")
        if live and ctl:
            out[f"p{q}_ratio_over_load"] = round(live / ctl, 2)
    tail = [r for r in rows if num(r, "t_s") > end - trend_s]
    for k in FLAT_COLUMNS:
        pts = [(num(r, "t_s") / 60, v) for r in tail if (v := num(r, k)) is not None]
        if len(pts) > 2:
            step = (pts[-1][0] - pts[0][0]) * 60 / (len(pts) - 1)  # seconds between samples
            slope, error = trend(pts, max(1, round(period_s / step)))
            out[f"{k}_slope_per_min"] = round(slope, 3)
            out[f"{k}_slope_error"] = round(error, 3)
            out[f"{k}_mean"] = round(statistics.mean(y for _, y in pts), 1)
    ratios = [d / lv for r in last if (d := num(r, "disk_bytes")) and (lv := num(r, "live_bytes"))]
    if ratios:
        out["disk_over_live"] = round(statistics.median(ratios), 2)
    return out


def print_fault_report(proxied: dict, csv_path: str, query_restarts: int, broker_restarts: int) -> None:
    """What the faults did: injected by kind, the clients' repeated writes, and what failed above
    the retries (lookups, maintenance cycles, ingest queries)."""
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    lookups = sum(int(r["lookups"] or 0) for r in rows)
    errors = sum(int(r["lookup_errors"] or 0) for r in rows)
    last = rows[-1] if rows else {}
    injected = proxied.get("injected", {})
    requests = sum(proxied.get("requests", {}).values())
    failed = sum(n for k, n in injected.items() if not k.startswith("delay"))
    print(f"\nfaults: {sum(injected.values()):,} injected into {requests:,} requests to the store "
          f"({', '.join(f'{n} {k}' for k, n in sorted(injected.items(), key=lambda kv: -kv[1])) or 'none'}); "
          f"the clients sent {proxied.get('retried', 0):,} of the {failed:,} failed requests again", flush=True)
    print(f"above the retries: {errors:,} of {lookups:,} lookups failed; {last.get('maintain_failures', 0)} of "
          f"{last.get('maintain_cycles', 0)} maintenance cycles failed; {query_restarts} ingest query restart(s); "
          f"{broker_restarts} broker restart(s)", flush=True)


def print_summary(s: dict[str, float], window_min: float = 10, trend_min: float = 30) -> None:
    if not s:
        return
    print(f"\nfirst / last {window_min:g} minutes (medians of the samples), target last/first <= 1.5x:")
    if s.get("minutes", 0) < 2 * window_min:
        print("  (the run is shorter than two windows: they overlap, and ratios near 1 mean nothing)")
    for k, name in (("lookup_p50_ms", "lookup p50"), ("lookup_p99_ms", "lookup p99"),
                    ("control_memwal_p50_ms", "static memwal table p50"), ("control_memwal_p99_ms", "static memwal table p99"),
                    ("control_lance_p50_ms", "static Lance table p50"), ("control_lance_p99_ms", "static Lance table p99"),
                    ("inline_refresh_p50_ms", "live, inline refresh, p50"), ("inline_refresh_p99_ms", "live, inline refresh, p99")):
        if f"{k}_ratio" in s:
            print(f"  {name:24} {s[f'{k}_first']:8.2f} -> {s[f'{k}_last']:8.2f} ms  {s[f'{k}_ratio']:.2f}x")
    for q in (50, 99):
        if f"p{q}_ratio_over_load" in s:
            print(f"  p{q}: the live table's ratio over the static memwal table's (the load divided out): {s[f'p{q}_ratio_over_load']:.2f}x")
    for k in FLAT_COLUMNS:
        if f"{k}_slope_per_min" in s:
            slope, error = s[f"{k}_slope_per_min"], s[f"{k}_slope_error"]
            verdict = "an upward trend" if slope > 2 * error else "flat" if abs(slope) <= 2 * error else "falling"
            print(f"  {k}: {slope:+.3f} ± {error:.3f} per minute over the last {trend_min:g} minutes "
                  f"(mean {s[f'{k}_mean']:,}): {verdict}")
    if "disk_over_live" in s:
        print(f"  disk / base data files, last {window_min:g} minutes: {s['disk_over_live']:.2f} (target <= 2)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=int, default=10_000, help="rows/s the producer sends")
    p.add_argument("--minutes", type=float, default=60)
    p.add_argument("--base-rows", type=int, default=1_000_000)
    p.add_argument("--batch-rows", type=int, default=10_000, help="rows per micro-batch at most")
    p.add_argument("--sample", type=float, default=30, help="seconds per CSV line")
    p.add_argument("--max-backlog-seconds", type=float, default=60, help="the producer pauses beyond this backlog")
    p.add_argument("--restarts", type=int, default=3, help="times a dead ingest query is restarted from its checkpoint")
    p.add_argument("--maintain-interval", type=float, default=5.0)
    p.add_argument("--maintain-nice", type=int, default=MaintenanceConfig.nice, help="memwal maintain --nice: how much lower its CPU priority is")
    p.add_argument("--reader-grace", type=float, default=30.0, help="GC keeps compacted SSTables this long for readers")
    p.add_argument("--workdir", help="keep the table here (default: a temporary directory, removed)")
    p.add_argument("--csv", default="soak.csv")
    p.add_argument("--png", default="soak.png")
    p.add_argument("--plot", metavar="CSV", help="only draw --png from this CSV")
    p.add_argument("--stall-dump", type=float, default=120,
                   help="seconds without progress while a backlog waits before every stack is dumped into the workdir")
    p.add_argument("--kafka-source", choices=("spark", "python"), default="spark",
                   help="the Kafka source: Spark's connector (default) or memwal's Python source")
    p.add_argument("--prober-refresh", choices=("background", "inline"), default="background",
                   help="how the probers' readers refresh: on a thread of their own (refresh_in_background) or in the lookup that finds the snapshot stale")
    p.add_argument("--writer-process", action=argparse.BooleanOptionalAction, default=SinkOptions.writer_process,
                   help="the sink's writer process (SinkOptions.writer_process; on by default)")
    p.add_argument("--no-control", action="store_true", help="skip the control prober (lookups of static tables beside the run)")
    p.add_argument("--no-compare", action="store_true", help="skip the end-of-run lookup comparison with a fresh Lance table")
    p.add_argument("--compare", metavar="TABLE", help="only compare TABLE's lookups (a finished run's, in --workdir/t) "
                   "with fresh Lance tables of its rows and of its first --base-rows keys")
    p.add_argument("--faults", type=float, default=0.0, metavar="RATE",
                   help="put the table on an S3 API behind a proxy failing RATE of all requests (0.01: 1%%; see the docstring)")
    p.add_argument("--s3", action="store_true",
                   help="the table on the S3 API behind the proxy even without --faults: the baseline of a faults run")
    p.add_argument("--broker-restart-every", type=float, default=0.0, metavar="MIN",
                   help="restart the Kafka broker (5 s down) every MIN minutes")
    args = p.parse_args()
    if args.plot:
        plot(args.plot, args.png)
        print_summary(summarize(args.plot))
        return
    if args.compare:
        scratch = tempfile.mkdtemp(prefix="memwal-bench-compare-")
        try:
            print_comparison(compare_fresh(args.compare, scratch, start_rows=args.base_rows))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return
    logging.basicConfig(level=logging.WARNING)
    # A SIGTERM ends the run as Ctrl-C does: the maintenance and prober processes are stopped
    # and the PNG drawn, rather than left running with the broker.
    signal.signal(signal.SIGTERM, interrupt)
    work = args.workdir or tempfile.mkdtemp(prefix="memwal-bench-soak-")
    faults = (f", faults {args.faults:.2%} of requests" if args.faults else ", on S3 (moto), no faults" if args.s3 else "") + (
        f", broker restarted every {args.broker_restart_every:g} min" if args.broker_restart_every else "")
    title = (f"soak: {args.rate:,} rows/s, {args.base_rows:,}-row base, {args.kafka_source} source, {args.prober_refresh} refresh"
             f"{faults}; {today()}, commit {git_rev()}")
    print(f"{title}\n{machine()}", flush=True)
    maintain = prober = control = store = None
    try:
        store = FaultyStore(work, args.faults) if args.faults or args.s3 else None
        uri = store.uri("t") if store else os.path.join(work, "t")
        direct = store.direct() if store else None  # the run's own measurements: no faults
        io = file_io_for(uri, direct)
        base = base_table(args.base_rows)
        Table.create(uri, SCHEMA, ["id"], "bucket(id, 4)", initial_data=base, storage_options=direct).close()
        if store:
            os.environ.update(store.environment())  # every process from here on: through the faults
            args.no_compare = True  # it reads a local table
        control_csv = os.path.join(work, "control.csv")
        if not args.no_control:
            Table.create(os.path.join(work, "static"), SCHEMA, ["id"], "bucket(id, 4)", initial_data=base).close()
            lance.write_dataset(base, os.path.join(work, "plain")).create_scalar_index("id", "BTREE")
        del base
        spark = local_session(app="memwal-bench-soak")
        spark.sparkContext.setLogLevel("ERROR")
        with open_broker(os.path.join(work, "broker")) as broker:
            broker.create_topic("soak", 3)
            maintain = subprocess.Popen(
                [sys.executable, "-m", "memwal", "-v", "maintain", uri, "--interval", str(args.maintain_interval),
                 "--reader-grace", str(args.reader_grace), "--base-retention", "60", "--nice", str(args.maintain_nice)],
                stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "maintain.log"), "w"),
            )
            job = Ingest(lambda: ingest(spark, bootstrap=broker.bootstrap, topic="soak", table_uri=uri, checkpoint=os.path.join(work, "ckpt"),
                                        kafka_source=args.kafka_source,
                                        max_offsets_per_trigger=args.batch_rows, options=SinkOptions(source="kafka-json", op_field=None,
                                                                                      writer_process=args.writer_process)),
                         args.restarts)
            producer = Producer(broker.client_config(), "soak", args.rate, args.base_rows, job.rows,
                                int(args.rate * args.max_backlog_seconds))
            producer.start()
            lookups_csv, scans_csv = os.path.join(work, "lookups.csv"), os.path.join(work, "scans.csv")
            prober = multiprocessing.get_context("spawn").Process(
                target=probe, args=(uri, args.base_rows, lookups_csv, scans_csv, args.sample, args.prober_refresh == "background"),
                daemon=True)
            prober.start()
            if not args.no_control:
                open(control_csv, "a").close()  # sampled before the control's first line
                control = multiprocessing.get_context("spawn").Process(
                    target=control_probe, args=(os.path.join(work, "static"), os.path.join(work, "plain"), uri, args.base_rows, control_csv,
                          args.prober_refresh == "background"),
                    daemon=True)
                control.start()
            table = Table.open(uri, direct)
            restarts, restarted_at = 0, time.time()
            waited = time.time()
            while job.rows() == 0 and time.time() - waited < 300 and job.alive():
                time.sleep(1)  # the clock starts with the query's first micro-batch
            out = open(args.csv, "w", newline="", buffering=1)
            writer = csv.DictWriter(out, COLUMNS)
            writer.writeheader()
            print(f"{'min':>5} {'rows/s':>8} {'backlog':>8} {'SSTables':>8} {'frags':>6} {'manifest KB':>11} {'disk MB':>8} "
                  f"{'lookup p50/p99 ms':>18} {'scan Mrows/s':>12} {'fresh s':>7}", flush=True)
            start = time.time()
            last_rows, last_t = job.rows(), start
            progressed, dumped = start, False
            failed_before = 0
            try:
                while time.time() - start < args.minutes * 60:
                    if not job.alive():
                        break
                    end = min(start + args.minutes * 60, last_t + args.sample)
                    pending = 0
                    while time.time() < end:
                        pending = max(pending, sum(s.pending_sstables for s in table.status().shards))
                        time.sleep(5 if store else 1)  # a status costs dozens of requests on S3
                    now = time.time()
                    rows = job.rows()
                    probed = [(s, hit) for at, s, hit in read_probes(lookups_csv) if last_t <= at < now]
                    took = [s for s, _ in probed]
                    ctl = read_control(control_csv) if control is not None else []
                    ctl_took = {w: [s for at, which, s in ctl if which == w and last_t <= at < now] for w in CONTROL_KINDS}
                    scans = [s for s in read_scans(scans_csv) if last_t <= s[0] < now]
                    ds = lance.dataset(uri, storage_options=direct)
                    frags = [f.metadata for f in ds.get_fragments()]
                    cycles, cycle_failures = maintenance_totals(uri, io)
                    proxied = store.stats() if store else {}
                    scan = scans[-1] if scans else None
                    r = {
                        "t_s": round(now - start, 1),
                        "rows_per_s": round((rows - last_rows) / (now - last_t)),
                        "backlog": producer.sent - rows,
                        "uncompacted_sstables": pending,
                        "base_fragments": len(frags),
                        # what base-file compaction owes; the others are full (the count of
                        # those grows with the rows, one per target_rows_per_fragment)
                        "small_base_fragments": sum(f.num_rows < MaintenanceConfig.small_fragment_rows for f in frags),
                        "manifest_bytes": newest_manifest_bytes(uri, io),
                        "disk_bytes": io.tree_size(uri),
                        "live_bytes": live_bytes(ds, uri, io),
                        "index_bytes": index_bytes(ds),
                        "live_rows": scan[2] if scan else "",
                        "lookup_p50_ms": round(pct(took, 50) * 1000, 2),
                        "lookup_p99_ms": round(pct(took, 99) * 1000, 2),
                        "lookups": len(took),
                        "query_restarts": job.restarts,
                        "produce_failed": producer.failed,
                        "scan_rows_per_s": round(scan[2] / scan[1]) if scan else "",
                        # scan start - the newest visible row's produce time (base rows carry no time: < 1e9)
                        "freshness_s": round(scan[0] - scan[1] - scan[3], 1) if scan and scan[3] > 1e9 else "",
                        "maintain_rss_bytes": rss_bytes(maintain.pid),
                        "prober_rss_bytes": rss_bytes(prober.pid),
                        **{f"{CONTROL_KINDS[w]}_p{q}_ms": round(pct(v, q) * 1000, 2) if v else ""
                           for w, v in ctl_took.items() for q in (50, 99)},
                        "faults_injected": sum(proxied.get("injected", {}).values()),
                        "retried_requests": proxied.get("retried", 0),
                        "lookup_errors": sum(1 for _, hit in probed if not hit),  # every probed key exists
                        "maintain_cycles": cycles,
                        "maintain_failures": cycle_failures,
                        "broker_restarts": restarts,
                    }
                    writer.writerow(r)
                    print(f"{r['t_s'] / 60:5.1f} {r['rows_per_s']:8,} {r['backlog']:8,} {pending:8} {r['base_fragments']:6} "
                          f"{r['manifest_bytes'] / 1e3:11.1f} {r['disk_bytes'] / 1e6:8.0f} "
                          f"{r['lookup_p50_ms']:8.2f} / {r['lookup_p99_ms']:<8.2f} "
                          f"{(scan[2] / scan[1] / 1e6) if scan else float('nan'):12.2f} {r['freshness_s']:>7}", flush=True)
                    if producer.failed > failed_before:
                        print(f"the broker refused {producer.failed - failed_before:,} rows since the last sample: "
                              f"{producer.last_error}", flush=True)
                        failed_before = producer.failed
                    if rows > last_rows or r["backlog"] <= 0:
                        progressed, dumped = now, False
                    elif now - progressed >= args.stall_dump and not dumped:
                        print(f"no progress for {now - progressed:.0f} s with {r['backlog']:,} rows waiting; "
                              f"stacks in {dump_stall(work, (now - start) / 60)}", flush=True)
                        dumped = True
                    last_rows, last_t = rows, now
                    if args.broker_restart_every and now - restarted_at >= args.broker_restart_every * 60:
                        t0 = time.monotonic()
                        broker.restart(down_seconds=5.0)  # same ports and data
                        restarts, restarted_at = restarts + 1, time.time()
                        print(f"restarted the broker ({time.monotonic() - t0:.0f} s down)", flush=True)
            except KeyboardInterrupt:
                print("interrupted; drawing what was sampled", flush=True)
            out.close()
            prober.terminate()
            if control is not None:
                control.terminate()
            producer.stop.set()
            totals = job.job.reports.totals()  # the last query's (a restart starts them again)
            print(f"shard writers: {int(totals.get('writer_opens', 0)):,} opens and {int(totals.get('fenced_retries', 0)):,} "
                  f"fenced retries in {int(totals.get('batches', 0)):,} micro-batches", flush=True)
            if store or args.broker_restart_every:
                print_fault_report(store.stats() if store else {}, args.csv, job.restarts, restarts)
            job.stop()
            producer.join(60)
        spark.stop()
        maintain.terminate()
        maintain.wait(60)
        if not args.no_compare:
            print_comparison(compare_fresh(uri, work, start_rows=args.base_rows))
    finally:
        for p in (prober, control):
            if p is not None and p.is_alive():
                p.terminate()
        if maintain is not None:
            maintain.terminate()
            maintain.wait(60)
        if store is not None:
            store.stop()
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    plot(args.csv, args.png, title)
    print_summary(summarize(args.csv))
    print(f"\nwrote {args.csv} and {args.png}")


if __name__ == "__main__":
    main()
