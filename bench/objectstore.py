"""Object-store cost benchmark: requests and bytes per 10k-row micro-batch, memwal against the naive sink.

Everything runs against moto's S3 server on 127.0.0.1, started in this process; every request
it answers is counted by a WSGI middleware wrapped around the server's app, so the counts are
exact and include every client (Lance's object_store, memwal's obstore FileIO). The counter is
checked first against a known sequence of boto3 calls. Request counts (not moto's latencies)
are what carry over to real S3: they are what S3 bills.

Phases, on tables created from the same ``--base-rows`` base (the workload of
docs/benchmarks.md: id int64 key, val, name, vec 64 x float32; micro-batches of
``--batch-rows`` rows, half updates of existing ids, half new ids), ``--batches`` micro-batches each:

a. memwal's write path: ``Table.write`` of each micro-batch (routed to the ``bucket(id, 4)``
   shards) and a flush of every shard every N micro-batches (``--flush-every``, one run per N).
   The Spark sink keeps writers open across micro-batches and flushes a shard at most every
   2 s; N=1 (one flush per shard per micro-batch) is the most the sink ever flushes;
b. the naive sink: one Lance ``merge_insert`` of the same micro-batch into a plain Lance table;
c. one compaction (``Compactor.run_once``) of the SSTables of the first memwal run, then the
   base index catch-up maintenance does before GC can collect them;
d. a GC pass with the default config (nothing is old enough yet: what every maintenance cycle
   pays), then a collecting one (grace periods 0: drains and deletes what compaction made redundant),
   then the removal of old base versions (``memwal.maintain.basefiles``, their owner since issue 34; GC
   did it before);
e. an idle maintenance cycle (``Maintenance.run_cycle`` with the default config when nothing is
   pending: no SSTable to fold, nothing to collect) on a ``--idle-shards``-shard table, after
   cycles that folded its SSTables and caught its indexes up. What a service pays every
   ``interval_seconds`` (5 s) while the table is quiet; it should grow with the shards, not
   with the table's history.

Run: ``python bench/objectstore.py`` (a few minutes); ``--idle-cycle-only`` runs phase e alone.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import parse_qs

from memwal.core.runtime import configure_process  # noqa: E402

configure_process()  # Lance's log filter, before Lance is imported

import lance  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import SCHEMA, base_rows, batch_rows, git_rev, machine, report, today  # noqa: E402

from memwal import Table  # noqa: E402
from memwal.maintain.basefiles import BaseFiles  # noqa: E402
from memwal.maintain.compactor import Compactor  # noqa: E402
from memwal.maintain.gc import GarbageCollector, GcConfig  # noqa: E402
from memwal.core.indexes import IndexMaintainer  # noqa: E402
from memwal.maintain.maintenance import Maintenance  # noqa: E402
from memwal.core.state import TableState  # noqa: E402

#: The request classes S3 prices; every request falls in exactly one.
CLASSES = ("GET", "PUT", "LIST", "HEAD", "DELETE")
#: S3 Standard request prices, us-east-1 list prices as published by AWS, USD per 1,000
#: requests: PUT, COPY, POST and LIST $0.005; GET and all other requests $0.0004; DELETE free.
PRICE_PER_1000 = {"PUT": 0.005, "LIST": 0.005, "GET": 0.0004, "HEAD": 0.0004, "DELETE": 0.0}
SECONDS_PER_DAY = 86_400

BUCKET = "memwal-bench"
ACCESS_KEY_ID = "memwal-bench-key"
SECRET_ACCESS_KEY = "memwal-bench-secret"
REGION = "us-east-1"


# -- counting at the server -----------------------------------------------------------------------


def classify(method: str, path: str, query: str, copy_source: bool) -> tuple[str, str]:
    """(price class, S3 operation) of one path-style request ``/bucket[/key]``."""
    parts = path.lstrip("/").split("/", 1)
    key = parts[1] if len(parts) > 1 else ""
    q = parse_qs(query, keep_blank_values=True)
    if method == "GET":
        return ("GET", "GetObject") if key else ("LIST", "ListObjects")
    if method == "HEAD":
        return "HEAD", "HeadObject" if key else "HeadBucket"
    if method == "PUT":
        if "partNumber" in q:
            return "PUT", "UploadPart"
        if copy_source:
            return "PUT", "CopyObject"
        return "PUT", "PutObject" if key else "CreateBucket"
    if method == "POST":
        if "delete" in q:
            return "DELETE", "DeleteObjects"
        if "uploads" in q:
            return "PUT", "CreateMultipartUpload"
        if "uploadId" in q:
            return "PUT", "CompleteMultipartUpload"
        return "PUT", "Post"
    if method == "DELETE":
        return "DELETE", "AbortMultipartUpload" if "uploadId" in q else "DeleteObject"
    return "GET", method  # any other verb is priced as "other requests"


@dataclass
class Counts:
    """Requests and payload bytes over some interval: bytes in = request bodies sent to the
    store, bytes out = response bodies it returned."""

    requests: Counter = field(default_factory=Counter)  # price class -> requests
    operations: Counter = field(default_factory=Counter)  # S3 operation (and status, when not 2xx) -> requests
    bytes_in: int = 0
    bytes_out: int = 0

    @property
    def total(self) -> int:
        return sum(self.requests.values())

    def dollars(self) -> float:
        return sum(n * PRICE_PER_1000[c] / 1000 for c, n in self.requests.items())

    def scaled(self, factor: float) -> dict[str, Any]:
        """A JSON record, every number multiplied by ``factor`` (1/batches: per micro-batch)."""
        return {
            "requests": {c: self.requests[c] * factor for c in CLASSES},
            "total": self.total * factor,
            "operations": {k: v * factor for k, v in sorted(self.operations.items())},
            "bytes_in": self.bytes_in * factor,
            "bytes_out": self.bytes_out * factor,
            "dollars": self.dollars() * factor,
        }


class _CountingInput:
    """A request body stream counting what the app reads (chunked uploads have no Content-Length)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.read_bytes = 0

    def read(self, *args: Any) -> bytes:
        data = self.stream.read(*args)
        self.read_bytes += len(data)
        return data

    def readline(self, *args: Any) -> bytes:
        data = self.stream.readline(*args)
        self.read_bytes += len(data)
        return data

    def __iter__(self) -> Iterator[bytes]:
        for line in self.stream:
            self.read_bytes += len(line)
            yield line


class RequestLog:
    """WSGI middleware around moto's app: records every request before its response is sent.

    Recording happens before the response body leaves the server, so when a client call has
    returned, its requests are counted: a snapshot taken after a call is exact for that call.
    """

    def __init__(self, app: Callable) -> None:
        self.app = app
        self._lock = threading.Lock()
        self._records: list[tuple[str, str, int, int]] = []  # (class, operation, bytes in, bytes out)

    def __call__(self, environ: dict, start_response: Callable) -> list[bytes]:
        stream = _CountingInput(environ["wsgi.input"])
        environ["wsgi.input"] = stream
        status: list[int] = []

        def record_status(s: str, headers: list, exc_info: Any = None) -> Callable:
            status.append(int(s.split()[0]))
            return start_response(s, headers, exc_info)

        result = self.app(environ, record_status)
        try:
            body = list(result)
        finally:
            if hasattr(result, "close"):
                result.close()
        length = environ.get("CONTENT_LENGTH")
        cls, op = classify(
            environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""), environ.get("QUERY_STRING", ""), "HTTP_X_AMZ_COPY_SOURCE" in environ
        )
        if environ.get("HTTP_IF_NONE_MATCH") == "*":
            op += " if-none-match"
        code = status[0] if status else 0
        if not 200 <= code < 300:
            op += f" {code}"
        with self._lock:
            self._records.append((cls, op, int(length) if length else stream.read_bytes, sum(len(b) for b in body)))
        return body

    def mark(self) -> int:
        """A position in the log (what :meth:`since` counts from)."""
        with self._lock:
            return len(self._records)

    def since(self, mark: int) -> Counts:
        with self._lock:
            records = self._records[mark:]
        c = Counts()
        for cls, op, n_in, n_out in records:
            c.requests[cls] += 1
            c.operations[op] += 1
            c.bytes_in += n_in
            c.bytes_out += n_out
        return c


@dataclass(frozen=True)
class MotoS3:
    endpoint: str
    log: RequestLog

    def uri(self, name: str) -> str:
        return f"s3://{BUCKET}/{name}"

    def storage_options(self) -> dict[str, str]:
        return {
            "aws_access_key_id": ACCESS_KEY_ID,
            "aws_secret_access_key": SECRET_ACCESS_KEY,
            "aws_region": REGION,
            "aws_endpoint": self.endpoint,
            "allow_http": "true",
        }

    def boto3(self) -> Any:
        import boto3
        from botocore.config import Config

        # Checksums only when required: a plain Content-Length upload, whose size is the payload's.
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY_ID,
            aws_secret_access_key=SECRET_ACCESS_KEY,
            region_name=REGION,
            config=Config(request_checksum_calculation="when_required", response_checksum_validation="when_required"),
        )


@contextlib.contextmanager
def moto_s3() -> Iterator[MotoS3]:
    """moto's S3 server on 127.0.0.1 (a free port) with a :class:`RequestLog` around its app."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        # The werkzeug server reads ``app`` per request; nothing has been requested yet.
        wsgi = server._server
        log = RequestLog(wsgi.app)
        wsgi.app = log
        host, port = server.get_host_and_port()
        s3 = MotoS3(f"http://{host}:{port}", log)
        s3.boto3().create_bucket(Bucket=BUCKET)
        yield s3
    finally:
        server.stop()


def verify_counter(s3: MotoS3) -> Counts:
    """Make a known sequence of boto3 calls and check the log counts exactly those."""
    client = s3.boto3()
    sizes = [1, 1000, 250_000]
    mark = s3.log.mark()
    for i, n in enumerate(sizes):
        client.put_object(Bucket=BUCKET, Key=f"verify/{i}", Body=b"x" * n)
    got = [len(client.get_object(Bucket=BUCKET, Key=f"verify/{i}")["Body"].read()) for i in (1, 2)]
    client.head_object(Bucket=BUCKET, Key="verify/0")
    client.head_object(Bucket=BUCKET, Key="verify/2")
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix="verify/")["KeyCount"]
    try:
        client.put_object(Bucket=BUCKET, Key="verify/0", Body=b"y", IfNoneMatch="*")
        raise AssertionError("a conditional PUT of an existing object succeeded")
    except client.exceptions.ClientError as e:
        assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 412, e
    for i in range(len(sizes)):
        client.delete_object(Bucket=BUCKET, Key=f"verify/{i}")
    c = s3.log.since(mark)
    expected = {"PUT": 4, "GET": 2, "HEAD": 2, "LIST": 1, "DELETE": 3}
    assert dict(c.requests) == expected, f"request log counted {dict(c.requests)}, boto3 made {expected}"
    assert c.operations["PutObject if-none-match 412"] == 1, c.operations
    assert got == sizes[1:] and listed == 3
    assert c.bytes_in == sum(sizes) + 1, f"bytes in {c.bytes_in} != {sum(sizes) + 1}"
    assert c.bytes_out >= sum(sizes[1:]), f"bytes out {c.bytes_out} < {sum(sizes[1:])}"
    return c


# -- the workload ---------------------------------------------------------------------------------


def micro_batches(n: int, size: int, base: int) -> list[pa.Table]:
    return [pa.Table.from_pylist(batch_rows(b, size, base), schema=SCHEMA) for b in range(n)]


def run_memwal(s3: MotoS3, uri: str, batches: list[pa.Table], flush_every: int) -> tuple[list[Counts], list[Counts]]:
    """Write each micro-batch as the sink's write tasks do (writers kept open), flushing every
    shard after every ``flush_every``-th one; the counts of each micro-batch's write (which
    reopens the writers a flush closed: claim + WAL replay) and of its flush."""
    writes, flushes = [], []
    with Table.open(uri, storage_options=s3.storage_options()) as t:
        for i, batch in enumerate(batches, 1):
            mark = s3.log.mark()
            t.write(batch)
            writes.append(s3.log.since(mark))
            mark = s3.log.mark()
            if i % flush_every == 0:
                t.flush()
            flushes.append(s3.log.since(mark))
    return writes, flushes


def run_naive(s3: MotoS3, uri: str, batches: list[pa.Table]) -> list[Counts]:
    """One merge_insert per micro-batch, on a freshly opened dataset (as bench/ingest.py's naive sink)."""
    out = []
    for batch in batches:
        mark = s3.log.mark()
        ds = lance.dataset(uri, storage_options=s3.storage_options())
        ds.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(batch)
        out.append(s3.log.since(mark))
    return out


def total(counts: list[Counts]) -> Counts:
    t = Counts()
    for c in counts:
        t.requests.update(c.requests)
        t.operations.update(c.operations)
        t.bytes_in += c.bytes_in
        t.bytes_out += c.bytes_out
    return t


def measure(s3: MotoS3, fn: Callable[[], Any]) -> tuple[Counts, Any, float]:
    mark = s3.log.mark()
    t0 = time.perf_counter()
    result = fn()
    return s3.log.since(mark), result, time.perf_counter() - t0


def same_rows(memwal: pa.Table, naive: pa.Table) -> bool:
    a, b = memwal.sort_by("id"), naive.sort_by("id")
    if a.num_rows != b.num_rows:
        return False
    for name in ("id", "val", "name"):
        if not pc.all(pc.equal(a.column(name), b.column(name))).as_py():
            return False
    va, vb = (pc.list_flatten(t.column("vec").combine_chunks()) for t in (a, b))
    return bool(pc.all(pc.equal(va, vb)).as_py())


def idle_cycles(s3: MotoS3, base: pa.Table, batches: list[pa.Table], shards: int, cycles: int = 3) -> dict[str, Any]:
    """Requests of ``cycles`` idle maintenance cycles of a ``shards``-shard table: its base and
    micro-batches written and flushed, then cycles run until one folds nothing (folds, index
    catch-up), then the cycles counted. Each counted cycle must find nothing to do."""
    opts = s3.storage_options()
    uri = s3.uri(f"idle-{shards}")
    with Table.create(uri, SCHEMA, ["id"], f"bucket(id, {shards})", initial_data=base, storage_options=opts) as t:
        for batch in batches:
            t.write(batch)
        t.flush()
    m = Maintenance(TableState.load(uri, opts))
    for _ in range(5):  # settle: fold what is pending, create and catch up the indexes
        r = m.run_cycle()
        if not (r.compaction_commits or r.indexes_caught_up or r.indexes_created or r.base_fragments_compacted):
            break
    counted = []
    for _ in range(cycles):
        c, r, secs = measure(s3, lambda: m.run_cycle(fold_now=False))
        assert not (r.compaction_commits or r.indexes_caught_up or r.indexes_created or r.sstables_removed or r.base_fragments_compacted), r
        counted.append((c, secs))
    per = total([c for c, _ in counted]).scaled(1 / cycles)
    return {"shards": shards, "cycles": cycles, "seconds": sum(s for _, s in counted) / cycles,
            "per_cycle_totals": [c.total for c, _ in counted], **per}


# -- output ---------------------------------------------------------------------------------------


def fmt(x: float) -> str:
    return f"{x:,.1f}" if x != int(x) else f"{int(x):,}"


def print_table(title: str, rows: list[tuple[str, dict]]) -> None:
    print(f"\n{title}")
    head = f"{'':34}" + "".join(f"{c:>9}" for c in CLASSES) + f"{'total':>9}{'MB in':>9}{'MB out':>9}{'$/1M':>10}"
    print(head)
    for name, r in rows:
        cells = "".join(f"{fmt(r['requests'][c]):>9}" for c in CLASSES)
        print(
            f"{name:34}{cells}{fmt(r['total']):>9}{r['bytes_in'] / 1e6:>9.2f}{r['bytes_out'] / 1e6:>9.2f}"
            f"{r['dollars'] * 1e6:>10.2f}"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-rows", type=int, default=100_000)
    p.add_argument("--batches", type=int, default=8, help="micro-batches per sink (8 = one compaction commit per shard)")
    p.add_argument("--batch-rows", type=int, default=10_000)
    p.add_argument("--shard-by", default="bucket(id, 4)")
    p.add_argument("--flush-every", default="1,2,8", help="comma-separated N: one memwal run per N (flush every N micro-batches)")
    p.add_argument("--idle-shards", default="4", help="comma-separated shard counts: one idle-cycle table per count (phase e)")
    p.add_argument("--idle-cycle-only", action="store_true", help="run phase e (idle maintenance cycles) alone")
    p.add_argument("--json", help="write the results here too")
    args = p.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's per-request log lines
    flush_every = [int(n) for n in args.flush_every.split(",")]
    if any(args.batches % n for n in flush_every):
        p.error("--batches must be a multiple of every --flush-every, so every run ends flushed")
    results: dict = {"date": today(), "machine": machine(), "commit": git_rev(), "args": vars(args), "prices_per_1000": PRICE_PER_1000}
    per = 1 / args.batches
    with moto_s3() as s3:
        check = verify_counter(s3)
        print(f"request log verified against {check.total} boto3 calls (counts and bytes exact)")
        opts = s3.storage_options()
        t0 = time.perf_counter()
        base = base_rows(args.base_rows)
        batches = micro_batches(args.batches, args.batch_rows, args.base_rows)
        created, _, _ = measure(s3, lambda: lance.write_dataset(base, s3.uri("naive"), storage_options=opts))
        results["setup"] = {"naive_create": created.scaled(1)}
        idle = {}
        for n in (int(x) for x in args.idle_shards.split(",")):
            idle[f"idle cycle, {n} shards"] = idle_cycles(s3, base, batches[:2], n)
        results["idle_maintenance_cycle"] = idle
        print_table("requests of one idle maintenance cycle (mean of 3)", list(idle.items()))
        for name, r in idle.items():
            print(f"  {name}: per cycle {r['per_cycle_totals']}, {r['seconds']:.2f}s; by operation: "
                  + ", ".join(f"{k} {v:g}" for k, v in r["operations"].items()))
        if args.idle_cycle_only:
            report(results, args.json)
            return
        for n in flush_every:
            created, _, _ = measure(
                s3, lambda n=n: Table.create(s3.uri(f"memwal-{n}"), SCHEMA, ["id"], args.shard_by, initial_data=base, storage_options=opts).close()
            )
            results["setup"][f"memwal_{n}_create"] = created.scaled(1)
        print(f"{args.base_rows:,}-row base tables on s3 in {time.perf_counter() - t0:.1f}s; {args.batches} micro-batches of {args.batch_rows:,} rows")

        runs: dict[str, dict] = {}
        steps: dict[str, dict] = {}
        for n in flush_every:
            t0 = time.perf_counter()
            writes, flushes = run_memwal(s3, s3.uri(f"memwal-{n}"), batches, n)
            counts = [total([w, f]) for w, f in zip(writes, flushes)]
            runs[f"memwal, flush every {n}"] = {"flush_every": n, "seconds": time.perf_counter() - t0, **total(counts).scaled(per),
                                                "total_per_batch": [c.total for c in counts], "writes_per_batch": [w.total for w in writes]}
            steps[f"memwal, flush every {n}: writes"] = total(writes).scaled(per)
            steps[f"memwal, flush every {n}: flushes"] = total(flushes).scaled(per)
        t0 = time.perf_counter()
        counts = run_naive(s3, s3.uri("naive"), batches)
        runs["naive merge_insert"] = {"seconds": time.perf_counter() - t0, **total(counts).scaled(per), "total_per_batch": [c.total for c in counts]}
        results["per_micro_batch"] = runs
        results["memwal_steps_per_micro_batch"] = steps

        # Maintenance of the first memwal run's table, as one cycle of the maintenance service would.
        state = TableState.load(s3.uri(f"memwal-{flush_every[0]}"), opts)
        maint: dict[str, dict] = {}
        c, done, secs = measure(s3, lambda: Compactor(state).run_once())
        maint["compaction"] = {"seconds": secs, "commits": len(done), "generations": sum(len(r.generations) for r in done),
                               "rows": sum(r.rows_upserted for r in done), **c.scaled(1)}
        c, caught_up, secs = measure(s3, lambda: IndexMaintainer(state).catch_up())
        maint["index catch-up"] = {"seconds": secs, "caught_up": caught_up, **c.scaled(1)}
        c, collected, secs = measure(s3, lambda: GarbageCollector(state).run_once())
        maint["GC pass, default config"] = {"seconds": secs, "sstables_removed": sum(len(r.sstables_removed) for r in collected), **c.scaled(1)}
        time.sleep(1.0)  # every base version is now older than the zero grace period
        collect = GcConfig(reader_grace_seconds=0, manifest_retention_seconds=0, drain_interval_seconds=0, base_version_retention_seconds=0)
        gc = GarbageCollector(state, collect)
        c, collected, secs = measure(s3, gc.run_once)
        maint["GC pass, collecting"] = {
            "seconds": secs,
            "sstables_removed": sum(len(r.sstables_removed) for r in collected),
            "wal_entries_removed": sum(r.wal_entries_removed for r in collected),
            "manifests_removed": sum(r.manifests_removed for r in collected),
            "bytes_reclaimed": gc.bytes_reclaimed,
            **c.scaled(1),
        }
        base_files = BaseFiles(state, state.metadata.bounds, reader_grace_seconds=0, version_retention_seconds=0)
        c, removed, secs = measure(s3, base_files.remove_versions)
        maint["base versions"] = {"seconds": secs, "versions_removed": removed.versions_removed, "bytes_removed": removed.bytes_removed, **c.scaled(1)}
        results["maintenance"] = maint

        memwal_rows = Table.open(s3.uri(f"memwal-{flush_every[0]}"), storage_options=opts).reader("eventual").scan()
        naive_rows = lance.dataset(s3.uri("naive"), storage_options=opts).to_table()
        results["tables_equal"] = same_rows(memwal_rows, naive_rows)
        assert results["tables_equal"], "memwal and the naive sink disagree"

    print_table(f"requests per {args.batch_rows:,}-row micro-batch (mean of {args.batches})", list(runs.items()))
    print_table("of which (per micro-batch)", list(steps.items()))
    naive = runs["naive merge_insert"]
    ratios = {}
    for name, r in runs.items():
        if name.startswith("memwal"):
            ratios[name] = {c: naive["requests"][c] / r["requests"][c] if r["requests"][c] else None for c in CLASSES}
            ratios[name].update(total=naive["total"] / r["total"], dollars=naive["dollars"] / r["dollars"], bytes_in=naive["bytes_in"] / r["bytes_in"])
            cells = "  ".join(f"{c} -" if v is None else f"{c} {v:.2f}x" for c, v in ratios[name].items())
            print(f"naive / {name}: {cells}")
    results["naive_over_memwal"] = ratios
    print_table(f"maintenance of the {args.batches} micro-batches of 'memwal, flush every {flush_every[0]}'", list(maint.items()))
    comp = maint["compaction"]
    print(f"compaction: {comp['commits']} commits, {comp['generations']} generations, {comp['rows']:,} rows")
    g = maint["GC pass, collecting"]
    print(f"collecting GC: {g['sstables_removed']} SSTables, {g['wal_entries_removed']} WAL entries, {g['manifests_removed']} manifests, "
          f"{g['bytes_reclaimed'] / 1e6:.1f} MB")

    # Per day at a sustained rate of one micro-batch per second (10k rows/s with 10k-row
    # micro-batches), with one maintenance cycle (compaction, index catch-up, collecting GC,
    # old base versions) per --batches micro-batches.
    per_day: dict[str, dict] = {}
    steps = ("compaction", "index catch-up", "GC pass, collecting", "base versions")
    cycle = sum(maint[k]["dollars"] for k in steps)
    cycle_requests = sum(maint[k]["total"] for k in steps)
    for name, r in runs.items():
        d = {"requests": r["total"] * SECONDS_PER_DAY, "dollars": r["dollars"] * SECONDS_PER_DAY}
        if name.startswith("memwal"):
            d["maintenance_requests"] = cycle_requests * SECONDS_PER_DAY / args.batches
            d["maintenance_dollars"] = cycle * SECONDS_PER_DAY / args.batches
        per_day[name] = d
    results["per_day_at_one_batch_per_second"] = per_day
    print(f"\nper day at one {args.batch_rows:,}-row micro-batch per second (maintenance: one cycle per {args.batches} micro-batches):")
    for name, d in per_day.items():
        extra = f" + maintenance {d['maintenance_requests']:,.0f} requests ${d['maintenance_dollars']:.2f}" if "maintenance_dollars" in d else ""
        print(f"  {name:28} {d['requests']:>12,.0f} requests ${d['dollars']:8.2f}{extra}")
    report(results, args.json)


if __name__ == "__main__":
    main()
