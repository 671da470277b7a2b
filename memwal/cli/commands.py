"""The ``memwal`` command line's commands: each takes the parsed arguments, calls the library
and prints through :mod:`memwal.cli.render`; it returns its exit code, or raises, and
:func:`memwal.cli.app.main` maps the error to one (the one place that does).

Imported by :mod:`memwal.cli.app` after it set the process up (Lance's log filter).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import os
import re
import sys
import time
from typing import Any, Iterator

import pyarrow as pa

from memwal.cli import files as formats
from memwal.core import paths
from memwal.maintain.bounds import FoldSchedule
from memwal.core.errors import InputFileError, InvalidArgumentError, PrimaryKeyError, SchemaMismatchError
from memwal.maintain.gc import GcConfig
from memwal.core.io import file_io_for
from memwal.core.jsonvalues import row_to_json
from memwal.maintain.maintenance import MaintenanceConfig
from memwal.core.metadata import IndexConfig, WriterConfig
from memwal.core.progress import Progress as ProgressRecord, ProgressCallback, notify
from memwal.cli.render import render_check, render_plan, render_position, render_repair, render_row_stream, render_rows, render_status
from memwal.core.state import TableState
from memwal.core.storage import StorageConfig
from memwal.maintain.status import table_status
from memwal.table import Table
from memwal.cli.terminal import ProgressBars, bars_wanted

log = logging.getLogger("memwal.cli.app")

EXIT_OK = 0
EXIT_NOT_FOUND = 1
EXIT_USAGE = 2
EXIT_ERROR = 3
EXIT_CONFLICT = 4
EXIT_UNAVAILABLE = 5

#: How often long-running commands log progress.
PROGRESS_SECONDS = 5.0

#: The SSTable cache of a reader that serves one command (get, scan): enough for key sets and
#: open datasets; a scan of a large table then holds little more than what it prints.
ONE_SHOT_CACHE_BYTES = 32 << 20

#: Rows `memwal scan` turns into text at a time.
PRINT_ROWS = 1024


# -- init / put / delete -----------------------------------------------------------------------


def cmd_init(args: argparse.Namespace) -> int:
    # Everything is checked before anything is created: a table half-created by a refused
    # argument would make every later init of the same URI fail with "table exists".
    writer = WriterConfig(
        max_memtable_rows=args.max_memtable_rows, max_wal_flush_interval_ms=args.wal_flush_interval_ms, durability=args.durability
    )
    if file_io_for(args.uri, _storage(args)).is_file(paths.normalize_uri(args.uri)):  # before reading any input
        raise InvalidArgumentError(f"{args.uri} is a file, not a directory; a table is a directory: pick another URI")
    schema, primary_key = _init_schema(args)
    table = Table.create(
        args.uri,
        schema,
        primary_key=primary_key,
        shard_by=args.shard_by,
        writer=writer,
        indexes=IndexConfig(vector_column=args.vector_column, fts_column=args.fts_column),
        storage_options=_storage(args),
    )
    print(f"created {table.uri}: primary key {', '.join(table.primary_key)}; sharding {table.spec.render()}")
    return 0


def _init_schema(args: argparse.Namespace) -> tuple[pa.Schema, list[str]]:
    """The schema and primary key ``init`` creates: from a data file, or from a Debezium change
    event (whose key, when given, names the primary key; --primary-key overrides it)."""
    if (args.schema_from is None) == (args.schema_from_debezium is None):
        raise InvalidArgumentError("give one of --schema-from FILE and --schema-from-debezium FILE|-")
    if args.schema_from is not None:
        if not args.primary_key:
            raise InvalidArgumentError("--primary-key COL is required with --schema-from")
        return formats.read_schema(args.schema_from), args.primary_key
    from memwal.streaming.debezium import schema_from_event

    source = args.schema_from_debezium
    try:
        if source == "-":
            text = sys.stdin.buffer.read()
        else:
            with open(source, "rb") as f:
                text = f.read()
    except OSError as e:
        raise InputFileError(f"cannot read the change event {source}: {e.strerror or e}") from e
    event = schema_from_event(text)
    primary_key = args.primary_key or list(event.primary_key or ())
    if not primary_key:
        raise InvalidArgumentError("the change event came without its key: give --primary-key COL (or the key's JSON before the value)")
    return event.schema, primary_key


def _storage(args: argparse.Namespace) -> StorageConfig:
    """The storage config of a command: its --storage-option flags over the environment."""
    return StorageConfig.from_args(getattr(args, "storage_option", None) or [])


def _state(args: argparse.Namespace, uri: str | None = None) -> TableState:
    return TableState.load(uri or args.uri, _storage(args))


def _partial_batches(path: str, schema: pa.Schema) -> Iterator[Any]:
    """A file's rows for ``put --merge partial``: JSON lines as lists of dicts, so a key a
    record lacks is absent in that record alone (Arrow would make it null); other formats as
    record batches, whose missing columns are absent in every row."""
    if not path.lower().endswith(formats.JSONL):
        yield from (pa.Table.from_batches([b]) for b in formats.iter_batches(path, schema))
        return
    chunk: list[dict[str, Any]] = []
    with open(path, "rb") as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise SchemaMismatchError(f"{path}: line {i + 1} is not valid JSON: {e}") from None
            if not isinstance(obj, dict):
                raise SchemaMismatchError(f"{path}: line {i + 1} is not a JSON object")
            chunk.append(obj)
            if len(chunk) >= 65_536:
                yield chunk
                chunk = []
    if chunk:
        yield chunk


def _apply_file(uri: str, path: str, deletes: bool, storage: StorageConfig, merge: str = "full",
                durability: str | None = None, progress: ProgressCallback | None = None) -> tuple[int, int]:
    """Upsert (or delete) every row of a file, streaming it in batches; returns (rows, shards).

    The file is read twice: first every batch is checked against the table (so a bad row
    anywhere refuses the whole file before anything is written), then written. A failure
    while writing (I/O, a fenced writer) says how many rows were applied: each applied
    row is durable, and re-running the command is safe (upserts and deletes are idempotent).
    Returns once the table is closed, which flushes MemTables to SSTables: every reader
    sees the rows when the command ends.
    """
    what = "delete" if deletes else "put"
    with Table.open(uri, storage) as table:
        table.writers.durability = durability
        total = 0
        last = time.monotonic()
        batches = (lambda: _partial_batches(path, table.schema)) if merge == "partial" else (
            lambda: (pa.Table.from_batches([b]) for b in formats.iter_batches(path, table.schema)))
        for batch in batches():
            total += table.validate(batch, deletes=deletes, merge=merge)
            notify(progress, f"{what}: checking {os.path.basename(path)}", total)
            if time.monotonic() - last > PROGRESS_SECONDS:
                log.warning("%s: %d rows checked so far", what, total)
                last = time.monotonic()
        rows = 0
        op = table.delete if deletes else (lambda b: table.write(b, merge=merge))
        try:
            for batch in batches():
                rows += op(batch).rows
                notify(progress, f"{what}: writing {os.path.basename(path)}", rows, total)
                if time.monotonic() - last > PROGRESS_SECONDS:
                    log.warning("%s: %d of %d rows so far", what, rows, total)
                    last = time.monotonic()
        except Exception:
            print(
                f"memwal: {what}: {rows} of {total} rows of {path} were applied before the error "
                "(they are durable; re-running the command is safe)",
                file=sys.stderr,
            )
            raise
        shards = len(table.writers.open_shards)
    return rows, shards


def _bars(args: argparse.Namespace) -> ProgressBars:
    """Progress bars on stderr for this command: only on a terminal, never with --json or --quiet."""
    return ProgressBars(bars_wanted(sys.stderr, json_output=getattr(args, "json", False), quiet=args.quiet))


def cmd_put(args: argparse.Namespace) -> int:
    with _bars(args) as bars:
        rows, shards = _apply_file(args.uri, args.file, False, _storage(args), args.merge, args.durability, bars)
    print(f"upserted {rows} rows into {shards} shard(s)")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    with _bars(args) as bars:
        rows, shards = _apply_file(args.uri, args.file, True, _storage(args), durability=args.durability, progress=bars)
    print(f"deleted {rows} key(s) in {shards} shard(s)")
    return 0


def cmd_alter(args: argparse.Namespace) -> int:
    from memwal.core.schema import parse_type

    table = Table.open(args.uri, _storage(args))
    update = table.update_schema()
    def typed(flag: str, spec: str) -> tuple[str, pa.DataType]:
        name, sep, type_text = spec.partition(":")
        if not sep:
            raise InvalidArgumentError(f"{flag} {spec!r}: give NAME:TYPE, e.g. note:string")
        return name.strip(), parse_type(type_text)

    for spec in args.add_column:
        update.add_column(*typed("--add-column", spec))
    for spec in args.widen_column:
        update.widen_column(*typed("--widen-column", spec))
    for name in args.drop_column:
        update.drop_column(name)
    change = update.commit()
    widened = [f"{name} to {type_text}" for name, type_text in change.widened]
    print(f"added {list(change.added)}, widened {widened}, dropped {list(change.dropped)} "
          f"(base version {change.version_before} -> {change.version_after})")
    return 0


# -- get / scan ---------------------------------------------------------------------------------


def parse_key(text: str, table: TableState) -> dict[str, Any]:
    """A key from the command line: a bare value (single-column keys), ``col=value,...``, or JSON."""
    pk = table.primary_key
    if text.lstrip().startswith("{"):
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise PrimaryKeyError(f"key {text!r} is not a valid JSON object: {e}") from None
    elif "=" in text and all("=" in part for part in text.split(",")):
        raw = dict(part.split("=", 1) for part in text.split(","))
    elif len(pk) == 1:
        raw = {pk[0]: text}
    else:
        raise PrimaryKeyError(f"the primary key is {list(pk)}; give the key as {','.join(c + '=...' for c in pk)}")
    missing = [c for c in pk if c not in raw]
    if missing:
        raise PrimaryKeyError(f"key {text!r} lacks primary-key column(s) {missing}")
    out = {}
    for c in pk:
        t = table.schema.field(c).type
        v = raw[c]
        if isinstance(v, str) and not (pa.types.is_string(t) or pa.types.is_large_string(t)):
            try:
                v = pa.array([v]).cast(t)[0].as_py()
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                raise PrimaryKeyError(f"key column {c!r} is {t}; {raw[c]!r} is not a valid value") from None
        out[c] = v
    return out


def _columns(text: str | None) -> list[str] | None:
    return [c.strip() for c in text.split(",") if c.strip()] if text else None


def cmd_get(args: argparse.Namespace) -> int:
    from memwal.readers import Reader

    # A reader of the table's state: a read holds no writer (a Table would, and close it).
    state = _state(args)
    reader = Reader(state, consistency=args.consistency)
    row = reader.get(parse_key(args.key, state), columns=_columns(args.columns))
    if row is None:
        print(f"key {args.key} not found", file=sys.stderr)
        return EXIT_NOT_FOUND
    if args.json:
        print(row_to_json(row))
    else:
        print(render_rows(pa.Table.from_pylist([row])))
    return 0


def _as_of(text: str) -> int | datetime.datetime:
    """``--as-of``: a base version number, or an ISO-8601 time (without a zone: UTC)."""
    if text.strip().isdigit():
        return int(text)
    try:
        return datetime.datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidArgumentError(f"--as-of {text!r}: give a base version number or an ISO-8601 time, e.g. 2026-11-27T14:30:00") from None


def cmd_scan(args: argparse.Namespace) -> int:
    from memwal.readers import Reader

    # One scan and done: caching SSTable rows for later reads would only add to its memory.
    as_of = _as_of(args.as_of) if args.as_of is not None else args.version
    reader = Reader(_state(args), consistency=args.consistency, as_of=as_of, cache_bytes=ONE_SHOT_CACHE_BYTES)
    if args.explain:
        print(render_plan(reader.plan(args.where)))
        return 0
    # Streamed: each batch is printed as the reader yields it, so the first rows appear at
    # once and memory stays bounded however large the table (ReadConfig.scan_batch_rows).
    batches = reader.to_batches(columns=_columns(args.columns), where=args.where, limit=args.limit)
    out = sys.stdout
    # Printed a slice at a time: a batch's rows as Python objects take many times its bytes.
    slices = (batch.slice(i, PRINT_ROWS) for batch in batches for i in range(0, batch.num_rows, PRINT_ROWS))
    if args.json:
        for part in slices:
            out.write("".join(row_to_json(row) + "\n" for row in part.to_pylist()))
    else:
        for text in render_row_stream(slices, batches.schema):
            out.write(text + "\n")
    return 0


def _since(text: str) -> Any:
    """``--since``: a base version, ``earliest``, or a position as ``memwal changes`` printed it."""
    from memwal.readers.feed import Position

    text = text.strip()
    if text.startswith("{"):
        try:
            return Position.from_json(json.loads(text))
        except json.JSONDecodeError:
            raise InvalidArgumentError(f"--since {text!r}: not a position (JSON)") from None
    if text.isdigit() or text in ("earliest", "latest"):
        return int(text) if text.isdigit() else text
    raise InvalidArgumentError(f"--since {text!r}: a base version, 'earliest', 'latest' or a position printed by memwal changes")


def cmd_changes(args: argparse.Namespace) -> int:
    from memwal.readers import feed

    state = _state(args)
    consumer = feed.Consumer(state, args.consumer) if args.consumer else None
    if args.since is not None:
        start = feed.resolve_start(state, _since(args.since))
    elif consumer is not None and consumer.position() is not None:
        start = consumer.position()
    else:
        raise InvalidArgumentError("give --since (a base version, 'earliest' or a position), or a --consumer that has committed")
    end = feed.end_at(state, args.until)
    reader = feed.FeedReader(state, start, _columns(args.columns))
    batches = (b for g in reader.generations(end) for b in g.rows.to_batches())
    slices = (batch.slice(i, PRINT_ROWS) for batch in batches for i in range(0, batch.num_rows, PRINT_ROWS))
    out = sys.stdout
    if args.json:
        for part in slices:
            out.write("".join(row_to_json(row) + "\n" for row in part.to_pylist()))
    else:
        for text in render_row_stream(slices, reader.schema):
            out.write(text + "\n")
    out.flush()
    after = reader.end_position(end)
    if consumer is not None and not args.no_commit:
        after = consumer.commit(after)
    print(render_position(after), file=sys.stderr)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    state = _state(args)
    if args.watch is not None:
        from memwal.cli.terminal import watch_status

        if args.json:
            raise InvalidArgumentError("--watch shows a live view; --json prints one object (run it again to poll)")
        if args.watch <= 0:
            raise InvalidArgumentError(f"--watch {args.watch}: the interval must be positive")

        def load():
            state.manifests.clear_cache()
            return table_status(state)

        try:
            watch_status(load, args.watch, plain=render_status)
        except KeyboardInterrupt:
            pass
        return 0
    status = table_status(state)
    print(status.to_json() if args.json else render_status(status))
    return 0


def cmd_health(args: argparse.Namespace) -> int:
    from memwal.maintain.health import HealthConfig, table_health
    from memwal.cli.render import render_health

    report = table_health(_state(args), HealthConfig(max_maintenance_age_seconds=args.max_maintenance_age, deep=not args.shallow))
    print(report.to_json() if args.json else render_health(report))
    return EXIT_OK if report.ok else EXIT_ERROR


def cmd_check(args: argparse.Namespace) -> int:
    from memwal.maintain.check import check_table

    with _bars(args) as bars:
        report = check_table(_state(args), bars)
    print(report.to_json() if args.json else render_check(report))
    return EXIT_OK if report.clean else EXIT_ERROR


def cmd_repair(args: argparse.Namespace) -> int:
    from memwal.maintain.repair import repair_table

    with _bars(args) as bars:
        report = repair_table(_state(args), dry_run=args.dry_run, progress=bars)
    print(report.to_json() if args.json else render_repair(report))
    return EXIT_OK if report.ok else EXIT_ERROR


def cmd_upgrade(args: argparse.Namespace) -> int:
    from memwal.cli.render import render_upgrade
    from memwal.maintain.upgrade import purge_upgrades, upgrade

    storage = _storage(args)
    if args.purge:
        report = purge_upgrades(args.uri, grace_seconds=args.grace, dry_run=args.dry_run, storage_options=storage)
    else:
        with _bars(args) as bars:
            report = upgrade(args.uri, dry_run=args.dry_run, storage_options=storage, progress=bars)
    print(report.to_json() if args.json else render_upgrade(report))
    return EXIT_OK


def cmd_maintain(args: argparse.Namespace) -> int:
    from memwal.maintain.maintenance import Maintenance

    if args.nice:
        os.nice(args.nice)  # a positive increment needs no privilege
    config = MaintenanceConfig(
        interval_seconds=args.interval,
        compact=not args.no_compact,
        indexes=not args.no_indexes,
        gc=not args.no_gc,
        views=not args.no_views,
        max_generations_per_commit=args.max_generations_per_commit,
        fold=FoldSchedule(fraction=args.fold_fraction, max_wait_seconds=args.fold_after, at_sstables=args.fold_at_sstables),
        flush_stranded_after_seconds=args.flush_stranded_after,
        gc_config=GcConfig(
            reader_grace_seconds=args.reader_grace,
            base_version_retention_seconds=args.base_retention,
            drain_interval_seconds=args.drain_interval,
        ),
    )
    service = Maintenance(_state(args), config)
    _break_leases(service, args.break_lease or [])
    server = _metrics_server(args, args.uri)
    if server is not None:
        from memwal.observe.maintenance import MaintenanceObserver

        service.observers.append(MaintenanceObserver(server.registry))
    if args.once:
        from memwal.core.errors import TableDamagedError
        from memwal.cli.render import render_cycle, render_damaged_shards

        try:
            with _bars(args) as bars:  # a cycle's work is not counted ahead: the bar shows it runs, and for how long
                bars.spinner("maintenance cycle")
                report = service.run_cycle()
                bars.finish("maintenance cycle")
        except TableDamagedError:
            if service.last_report is None:  # the cycle did not get to its end
                raise
            report = service.last_report
        print(render_cycle(report))
        # Damaged shards were skipped, the others maintained: exit 3 naming each shard and file.
        for line in render_damaged_shards(report):
            print(line, file=sys.stderr)
        return EXIT_ERROR if report.damaged_shards else EXIT_OK
    try:
        service.run_forever()
    except KeyboardInterrupt:
        pass
    return 0


def _metrics_server(args: argparse.Namespace, uri: str):
    """``--metrics-port P``: the table's gauges (memwal.observe.table_health) served on
    http://127.0.0.1:P/metrics (P 0: a free port, named on stderr); None without the flag.
    The command adds its own series (ingest, maintenance) to ``server.registry``."""
    if args.metrics_port is None:
        return None
    from prometheus_client import CollectorRegistry

    from memwal.observe.server import MetricsServer
    from memwal.observe.table_health import TableCollector

    registry = CollectorRegistry()
    TableCollector(uri, _storage(args), registry=registry)
    server = MetricsServer(registry, args.metrics_port)
    print(f"memwal: metrics on {server.url}", file=sys.stderr, flush=True)
    return server


def _break_leases(service: Any, which: list[str]) -> None:
    """``--break-lease SHARD|all``: end writer leases now, with a warning naming each holder."""
    if not which:
        return
    shards = service.state.manifests.list_shards()
    wanted = shards if "all" in which else which
    for shard_id in wanted:
        if shard_id not in shards:
            raise InvalidArgumentError(f"--break-lease {shard_id}: no such shard (`memwal status` lists them)")
        ended = service.writers.break_lease(shard_id)
        if ended is not None:
            print(
                f"memwal: warning: ended the writer lease of shard {shard_id} held by {ended.owner} "
                f"({ended.expires_at - time.time():.0f}s before it expired); if that writer is alive, "
                "it is fenced by the flush and reopens (nothing is lost)",
                file=sys.stderr,
            )


def _adaptive_sizing(args: argparse.Namespace):
    """``--adaptive-max-rows``: micro-batches sized by backlog, steady at
    ``--max-offsets-per-trigger`` (default 10,000)."""
    if not args.adaptive_max_rows:
        return None
    from memwal.streaming.adaptive import AdaptiveSizing

    return AdaptiveSizing(
        steady_rows=args.max_offsets_per_trigger or AdaptiveSizing.steady_rows,
        max_rows=args.adaptive_max_rows,
        **_given(max_bytes=args.adaptive_max_bytes),
    )


def cmd_ingest(args: argparse.Namespace) -> int:
    from memwal.streaming import SinkOptions, ingest, local_session

    options = SinkOptions(
        source="kafka-json",
        **_value_format(args),
        sequence_field=args.sequence_field,
        drop_stale_across_batches=args.drop_stale,
        merge=args.merge,
        evolve=args.evolve,
        durability=args.durability,
        **_given(flush_interval_seconds=args.flush_interval, max_write_tasks=args.max_write_tasks, writer_process=args.writer_process),
        # '' on the command line: records carry no operation field (all upserts)
        **({} if args.op_field is None else {"op_field": args.op_field or None}),
    )
    if args.tables_root is not None:
        return _ingest_database(args, options)
    if args.table is None or args.topic is None or args.topic_pattern is not None:
        raise InvalidArgumentError("give --topic T and --table URI (or --tables-root URI with --topic T1,T2 or --topic-pattern REGEX)")
    if args.real_time:
        return _ingest_real_time(args, options)
    # An ingest query runs for minutes to days: the full JIT (session.LONG_RUNNING_LAUNCH).
    spark = local_session(**_given(cores=args.cores), master=args.master, fast_start=False)
    server = _metrics_server(args, args.table)
    observers: list[Any] = []
    if server is not None:
        from memwal.observe.ingest import IngestMetrics

        observers.append(IngestMetrics(server.registry))
    bars = _bars(args)
    observers.append(_ingest_progress(bars, args.topic))
    maintenance = _maintenance(args, server)
    job = ingest(
        spark,
        bootstrap=args.bootstrap,
        topic=args.topic,
        table_uri=args.table,
        checkpoint=args.checkpoint,
        trigger_interval=args.trigger_interval,
        available_now=args.available_now,
        starting_offsets=args.starting_offsets,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
        options=options,
        storage_options=_storage(args),
        adaptive=_adaptive_sizing(args),
        kafka_source=args.kafka_source,
        observers=observers,
        exchange=args.exchange,
    )
    with bars:
        _run_until_stopped(job, spark, maintenance)
    totals = job.reports.totals()
    print(
        f"ingested {int(totals.get('rows', 0))} records in {int(totals.get('batches', 0))} micro-batch(es): "
        f"{int(totals.get('upserts', 0))} upserts, {int(totals.get('deletes', 0))} deletes, "
        f"{int(totals.get('dead_letters', 0))} dead letter(s)"
        + (f", {int(totals['skipped'])} skipped" if totals.get("skipped") else "")
    )
    return 0


def _ingest_database(args: argparse.Namespace, options: Any) -> int:
    """``memwal ingest --tables-root``: a whole database's topics into one table each."""
    from memwal.streaming import local_session
    from memwal.streaming.database import ingest_database

    if args.table is not None or (args.topic is None) == (args.topic_pattern is None):
        raise InvalidArgumentError("--tables-root takes --topic T1,T2,... or --topic-pattern REGEX (one of them), and no --table")
    if args.real_time or args.maintain or args.exchange != "auto" or args.adaptive_max_rows is not None:
        raise InvalidArgumentError("--tables-root runs micro-batches through the foreachBatch sink: "
                                   "no --real-time, --maintain, --exchange or --adaptive-max-rows (run `memwal maintain` per table)")
    spark = local_session(**_given(cores=args.cores), master=args.master, fast_start=False)
    server = _metrics_server(args, args.tables_root)
    observers: list[Any] = []
    if server is not None:
        from memwal.observe.ingest import IngestMetrics

        observers.append(IngestMetrics(server.registry))
    job = ingest_database(
        spark, bootstrap=args.bootstrap, root=args.tables_root, checkpoint=args.checkpoint,
        topics=[t.strip() for t in args.topic.split(",") if t.strip()] if args.topic else (), topic_pattern=args.topic_pattern,
        trigger_interval=args.trigger_interval, available_now=args.available_now, starting_offsets=args.starting_offsets,
        max_offsets_per_trigger=args.max_offsets_per_trigger, options=options, storage_options=_storage(args),
        observers=observers, shards=args.table_shards,
    )
    _run_until_stopped(job, spark, None)
    for uri, totals in sorted(job.reports.table_totals().items()):
        print(f"{uri}: {int(totals.get('rows', 0))} records, {int(totals.get('upserts', 0))} upserts, "
              f"{int(totals.get('deletes', 0))} deletes, {int(totals.get('dead_letters', 0))} dead letter(s)")
    totals = job.reports.totals()
    print(f"ingested {int(totals.get('rows', 0))} records into {len(job.reports.table_totals())} table(s) "
          f"in {int(totals.get('batches', 0))} micro-batch(es)")
    return 0


def _maintenance(args: argparse.Namespace, server: Any) -> Any:
    """``--maintain``: maintenance running beside the ingest (started), else None."""
    if not args.maintain:
        return None
    from memwal.maintain.maintenance import Maintenance

    maintenance = Maintenance(_state(args, args.table))
    if server is not None:
        from memwal.observe.maintenance import MaintenanceObserver

        maintenance.observers.append(MaintenanceObserver(server.registry))
    maintenance.start()
    return maintenance


def _ingest_real_time(args: argparse.Namespace, options: Any) -> int:
    """``memwal ingest --real-time``: runs until stopped (Ctrl-C or a signal)."""
    from memwal.streaming import local_session
    from memwal.streaming.realtime import SEAL_SECONDS, ingest_real_time, partition_count

    if args.available_now or args.trigger_interval is not None or args.max_offsets_per_trigger is not None:
        raise InvalidArgumentError("--real-time runs until stopped, record by record: it takes no --available-now, --trigger-interval "
                         "or --max-offsets-per-trigger")
    # One long-running task per Kafka partition: a local session gets a task slot for each.
    cores = args.cores if args.cores is not None else max(2, partition_count(args.bootstrap, args.topic))
    if args.flush_interval is None:
        options = dataclasses.replace(options, flush_interval_seconds=SEAL_SECONDS)
    spark = local_session(cores=cores, master=args.master, fast_start=False)
    # Seals every --flush-interval make SSTables that only compaction keeps under the bounds.
    maintenance = _maintenance(args, _metrics_server(args, args.table))
    job = ingest_real_time(spark, bootstrap=args.bootstrap, topic=args.topic, table_uri=args.table, checkpoint=args.checkpoint,
                           options=options, batch_seconds=args.real_time_batch, starting_offsets=args.starting_offsets,
                           storage_options=_storage(args))
    _run_until_stopped(job, spark, maintenance)
    return 0


def _run_until_stopped(job: Any, spark: Any, maintenance: Any) -> None:
    """Wait for an ingest query (Ctrl-C stops it), then stop maintenance and the session."""
    try:
        job.await_termination()
    except KeyboardInterrupt:
        job.stop()
    finally:
        if maintenance is not None:
            maintenance.stop()
        # Stopped before the interpreter exits: on a cluster master the executors are released
        # in order instead of racing the JVM's shutdown (which relaunches them meanwhile).
        spark.stop()


def _ingest_progress(bars: ProgressBars, topic: str) -> Any:
    """An ingest observer moving one bar: records taken, out of those plus the Kafka lag the
    last micro-batch left (so the ETA is the backlog's)."""
    done = 0

    def observe(batch: Any) -> None:
        nonlocal done
        done += batch.records
        bars(ProgressRecord(f"ingesting {topic}", done, done + batch.lag_records if batch.lag else None, "records"))

    return observe


def _value_format(args: argparse.Namespace) -> dict[str, Any]:
    """The sink's value-format options of ``ingest``'s flags (the .avsc file read here, on the driver)."""
    out: dict[str, Any] = {"value_format": args.format}
    if args.avro_schema is not None:
        try:
            with open(args.avro_schema, encoding="utf-8") as f:
                out["avro_schema"] = f.read()
        except OSError as e:
            raise InvalidArgumentError(f"cannot read the Avro schema {args.avro_schema}: {e.strerror or e}") from e
    if args.format != "avro" and (args.avro_schema or args.avro_schema_id is not None or args.schema_registry):
        raise InvalidArgumentError("--avro-schema, --avro-schema-id and --schema-registry go with --format avro")
    return out | _given(avro_schema_id=args.avro_schema_id, schema_registry=args.schema_registry)


def _given(**options: Any) -> dict[str, Any]:
    """The options the user gave; the others keep the library's defaults."""
    return {k: v for k, v in options.items() if v is not None}


def _parse_udf(text: str):
    from memwal.views import UdfColumn

    # name=module:function(input,input)->type@version
    m = re.fullmatch(r"\s*(\w+)\s*=\s*([\w.]+:[\w.]+)\s*\(([^)]*)\)\s*->\s*([^@]+?)\s*(?:@\s*(\S+))?\s*", text)
    if not m:
        raise InvalidArgumentError(f"--udf {text!r}: expected name=module:function(col,...)->type[@version]")
    inputs = tuple(c.strip() for c in m.group(3).split(",") if c.strip())
    return UdfColumn(m.group(1), m.group(2), inputs, m.group(4), m.group(5) or "1")


def cmd_view(args: argparse.Namespace) -> int:
    from memwal.views import View, list_views

    if args.view_command == "create":
        view = View.create(
            _state(args),
            args.name,
            select=args.select or [],
            where=args.where,
            group_by=args.group_by or [],
            udfs=[_parse_udf(u) for u in args.udf or []],
            shuffle_seed=args.shuffle_seed,
            refresh=not args.no_refresh,
            **_given(max_rows_per_fragment=args.max_rows_per_fragment),
        )
        print(f"created view {view.definition.name}: {view.uri}")
        return 0
    if args.view_command == "list":
        for name in list_views(_state(args)):
            print(name)
        return 0
    view = View.open(_state(args), args.name)
    if args.view_command == "refresh":
        record = view.refresh(args.src_version, **_given(max_rows_per_fragment=args.max_rows_per_fragment))
        if record is None:
            print(f"view {args.name} is up to date")
        else:
            print(f"view {args.name} refreshed to base version {record.base_version} ({record.mode}, "
                  f"{record.rows_changed} rows changed, {record.udf_calls} UDF calls, {record.seconds:.2f}s)")
        return 0
    if args.view_command == "status":
        f = view.freshness()
        history = view.history()
        doc = {
            "name": view.definition.name,
            "uri": view.uri,
            "definition": json.loads(view.definition.to_json()),
            "rows": view.dataset().count_rows(),
            "freshness": f.__dict__,
            "refreshes": [r.__dict__ for r in history[-args.history:]],
        }
        if args.json:
            print(json.dumps(doc, sort_keys=True, default=str))
        else:
            print(f"view {doc['name']} at {doc['uri']}: {doc['rows']} rows")
            print(f"  reflects base version {f.base_version_reflected} of {f.base_version_latest} "
                  f"({f.versions_behind} behind, {f.seconds_behind if f.seconds_behind is not None else '-'}s); "
                  f"{f.uncompacted_sstables} SSTables ({f.uncompacted_rows} rows) not yet compacted")
            for r in history[-args.history:]:
                print(f"  base v{r.base_version} -> view v{r.view_version}: {r.mode}, {r.rows_changed} rows, "
                      f"{r.udf_calls} UDF calls, {r.seconds:.2f}s at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(r.refreshed_at))}")
        return 0
    if args.view_command == "drop":
        view.drop()
        print(f"dropped view {args.name}")
        return 0
    raise AssertionError(args.view_command)
