"""The ``memwal`` command line: a thin layer over the library.

Exit codes (decided in one place, :func:`exit_code`): 0 success; 1 "not found" (``get`` of
an absent key); 2 usage or input error (what the user typed or passed: arguments, keys,
files, a table URI with no table); 3 anything else, reported as one line
``memwal: error: <reason>`` with a hint to re-run with ``--debug`` for the traceback.

Defaults of options that configure the library are read from its config dataclasses
(``WriterConfig``, ``MaintenanceConfig``, ``GcConfig``, ...), never copied here.
"""

from __future__ import annotations

import sys

from memwal.runtime import configure_process, verbosity_in

configure_process(verbosity_in(sys.argv[1:]))  # before anything imports Lance: `-v` shows Lance's warnings

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from typing import Any, Iterator, Sequence  # noqa: E402

import pyarrow as pa  # noqa: E402

from memwal import formats, paths  # noqa: E402
from memwal.io import file_io_for  # noqa: E402
from memwal.jsonvalues import row_to_json  # noqa: E402
from memwal.errors import (  # noqa: E402
    ConcurrencyError,
    InputFileError,
    InvalidArgumentError,
    InvalidValueError,
    MemwalError,
    PrimaryKeyError,
    SchemaMismatchError,
    ShardingSpecError,
    TableExistsError,
    TableNotFoundError,
    UnknownColumnError,
)
from memwal.bounds import FoldSchedule  # noqa: E402
from memwal.gc import GcConfig  # noqa: E402
from memwal.lance_errors import classify, lance_message  # noqa: E402
from memwal.maintenance import MaintenanceConfig  # noqa: E402
from memwal.metadata import DURABILITY_LEVELS, IndexConfig, WriterConfig  # noqa: E402
from memwal.render import render_check, render_plan, render_repair, render_row_stream, render_rows, render_status  # noqa: E402
from memwal.state import TableState  # noqa: E402
from memwal.storage import StorageConfig  # noqa: E402
from memwal.status import table_status  # noqa: E402
from memwal.table import Table  # noqa: E402

log = logging.getLogger("memwal.cli")

EXIT_OK = 0
EXIT_NOT_FOUND = 1
EXIT_USAGE = 2
EXIT_ERROR = 3
EXIT_CONFLICT = 4

#: Errors caused by what the user typed or passed: exit code 2, like argparse's own. A table
#: URI with no table is one (the user named it), as a missing input file is; "not found"
#: (1) is reserved for a query that ran and found nothing, like grep's 1.
_INPUT_ERRORS: tuple[type[BaseException], ...] = (
    InputFileError,
    InvalidArgumentError,
    InvalidValueError,
    PrimaryKeyError,
    SchemaMismatchError,
    ShardingSpecError,
    TableExistsError,
    TableNotFoundError,
    UnknownColumnError,
    FileNotFoundError,
)

DEBUG_HINT = "memwal: re-run with --debug to see the traceback"

#: The SSTable cache of a reader that serves one command (get, scan): enough for key sets and
#: open datasets; a scan of a large table then holds little more than what it prints.
ONE_SHOT_CACHE_BYTES = 32 << 20

#: Rows `memwal scan` turns into text at a time.
PRINT_ROWS = 1024

#: How often long-running commands log progress.
PROGRESS_SECONDS = 5.0


def _setup_logging(verbosity: int) -> None:
    level = logging.WARNING - 10 * verbosity
    logging.basicConfig(level=max(level, logging.DEBUG), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


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


def _durability_flag(s: argparse.ArgumentParser, default: str | None = None, what: str = "durability of this command's writes") -> None:
    s.add_argument(
        "--durability", choices=DURABILITY_LEVELS, default=default,
        help=f"{what}: 'fsync' acknowledges a write once its WAL entry is fsynced (survives power loss on local disk), "
        "'os' once it is in the OS page cache; the same on object stores" + ("" if default else " (default: the table's)"),
    )


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
                durability: str | None = None) -> tuple[int, int]:
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
            if time.monotonic() - last > PROGRESS_SECONDS:
                log.warning("%s: %d rows checked so far", what, total)
                last = time.monotonic()
        rows = 0
        op = table.delete if deletes else (lambda b: table.write(b, merge=merge))
        try:
            for batch in batches():
                rows += op(batch).rows
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


def cmd_put(args: argparse.Namespace) -> int:
    rows, shards = _apply_file(args.uri, args.file, False, _storage(args), args.merge, args.durability)
    print(f"upserted {rows} rows into {shards} shard(s)")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    rows, shards = _apply_file(args.uri, args.file, True, _storage(args), durability=args.durability)
    print(f"deleted {rows} key(s) in {shards} shard(s)")
    return 0


# -- get / scan ---------------------------------------------------------------------------------


def parse_key(text: str, table: Table) -> dict[str, Any]:
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

    table = Table.open(args.uri, _storage(args))
    reader = Reader(table.state, consistency=args.consistency)
    row = reader.get(parse_key(args.key, table), columns=_columns(args.columns))
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


def cmd_status(args: argparse.Namespace) -> int:
    status = table_status(_state(args))
    print(status.to_json() if args.json else render_status(status))
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from memwal.check import check_table

    report = check_table(_state(args))
    print(report.to_json() if args.json else render_check(report))
    return EXIT_OK if report.clean else EXIT_ERROR


def cmd_repair(args: argparse.Namespace) -> int:
    from memwal.repair import repair_table

    report = repair_table(_state(args), dry_run=args.dry_run)
    print(report.to_json() if args.json else render_repair(report))
    return EXIT_OK if report.ok else EXIT_ERROR


def cmd_upgrade(args: argparse.Namespace) -> int:
    from memwal.render import render_upgrade
    from memwal.upgrade import purge_upgrades, upgrade

    storage = _storage(args)
    if args.purge:
        report = purge_upgrades(args.uri, grace_seconds=args.grace, dry_run=args.dry_run, storage_options=storage)
    else:
        report = upgrade(args.uri, dry_run=args.dry_run, storage_options=storage)
    print(report.to_json() if args.json else render_upgrade(report))
    return EXIT_OK


def _nice_increment(value: str) -> int:
    """``--nice``: 0-19, how much lower than the caller's the CPU priority is (raising it
    would need privileges)."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if not 0 <= n <= 19:
        raise argparse.ArgumentTypeError(f"{n} is not between 0 and 19")
    return n


def cmd_maintain(args: argparse.Namespace) -> int:
    from memwal.maintenance import Maintenance

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
    if args.once:
        from memwal.errors import TableDamagedError
        from memwal.render import render_cycle, render_damaged_shards

        try:
            report = service.run_cycle()
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
        durability=args.durability,
        writer_process=args.writer_process,
        **_given(flush_interval_seconds=args.flush_interval, max_write_tasks=args.max_write_tasks),
        # '' on the command line: records carry no operation field (all upserts)
        **({} if args.op_field is None else {"op_field": args.op_field or None}),
    )
    spark = local_session(**_given(cores=args.cores), master=args.master)
    maintenance = None
    if args.maintain:
        from memwal.maintenance import Maintenance

        maintenance = Maintenance(_state(args, args.table))
        maintenance.start()
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
    )
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
    totals = job.sink.totals()
    print(
        f"ingested {int(totals.get('rows', 0))} records in {int(totals.get('batches', 0))} micro-batch(es): "
        f"{int(totals.get('upserts', 0))} upserts, {int(totals.get('deletes', 0))} deletes, "
        f"{int(totals.get('dead_letters', 0))} dead letter(s)"
        + (f", {int(totals['skipped'])} skipped" if totals.get("skipped") else "")
    )
    return 0


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


# -- parser -------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="memwal",
        description="Streaming upserts and deletes into Lance tables on Lance's MemWAL.",
    )
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-v info, -vv debug)")
    p.add_argument("--debug", action="store_true", help="on an error, print its full traceback")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("init", help="create a table", description="Create an empty memwal table.")
    s.add_argument("uri", metavar="URI", help="table location: a local path, or s3://, gs://, az:// URI")
    s.add_argument("--schema-from", metavar="FILE", help="Parquet, Arrow IPC or JSON-lines file whose schema to use (no rows are written)")
    s.add_argument("--schema-from-debezium", metavar="FILE|-",
        help="a Debezium change event as Kafka Connect's JSON converter writes it with its schema (its key too, before or after it, "
        "gives the primary key): each column gets the Arrow type of its Connect type (docs/formats.md)")
    s.add_argument("--primary-key", action="append", metavar="COL",
        help="primary-key column; repeat for a composite key (required with --schema-from; with --schema-from-debezium, the event's key)")
    s.add_argument("--shard-by", default="unsharded", metavar="SPEC", help="sharding spec, e.g. 'bucket(id,4)', 'identity(region)', 'unsharded' (default)")
    s.add_argument("--max-memtable-rows", type=int, default=WriterConfig.max_memtable_rows, help="rows per MemTable before it is flushed to an SSTable")
    s.add_argument("--wal-flush-interval-ms", type=int, default=WriterConfig.max_wal_flush_interval_ms, help="WAL flush tick; a durable write waits for it")
    s.add_argument("--vector-column", help="build and maintain a vector index (IVF_HNSW_SQ) on this column")
    s.add_argument("--fts-column", help="build and maintain a full-text index on this column")
    _durability_flag(s, WriterConfig.durability, "the table's default durability of acknowledged writes")
    s.set_defaults(func=cmd_init)

    s = sub.add_parser("put",
        help="upsert rows from a file", description="Upsert rows from a Parquet, CSV or JSON-lines file. Returns when the rows are flushed to SSTables.")
    s.add_argument("uri", metavar="URI")
    s.add_argument("file", metavar="FILE")
    s.add_argument("--merge", choices=("full", "partial"), default="full",
        help="full: a row replaces its key's row (default); partial: a row changes only the columns it carries "
        "(a JSON-lines key it lacks, or a column the file lacks, keeps the stored value; null sets null)")
    _durability_flag(s)
    s.set_defaults(func=cmd_put)

    s = sub.add_parser("delete",
        help="delete keys listed in a file",
        description="Delete the primary keys listed in a Parquet, CSV or JSON-lines file (other columns are ignored). Returns when flushed.")
    s.add_argument("uri", metavar="URI")
    s.add_argument("file", metavar="FILE")
    _durability_flag(s)
    s.set_defaults(func=cmd_delete)

    s = sub.add_parser("get", help="look up one key", description="Print the live row of one primary key; exit code 1 when it is absent.")
    s.add_argument("uri", metavar="URI")
    s.add_argument("key", metavar="KEY", help="a value (single-column key), col=value,col2=value2, or a JSON object")
    s.add_argument("--columns", metavar="A,B", help="columns to print")
    s.add_argument("--json", action="store_true", help="print the row as one JSON object")
    s.add_argument("--consistency", choices=("eventual", "strong"), default="eventual", help="strong also reads unflushed WAL entries")
    s.set_defaults(func=cmd_get)

    s = sub.add_parser("scan", help="print live rows", description="Print live rows (newest version per key), optionally filtered.")
    s.add_argument("uri", metavar="URI")
    s.add_argument("--where", metavar="SQL", help="filter, e.g. \"score > 3 AND region = 'eu'\"")
    s.add_argument("--columns", metavar="A,B", help="columns to print")
    s.add_argument("--limit", type=int)
    s.add_argument("--json", action="store_true", help="one JSON object per row")
    s.add_argument("--consistency", choices=("eventual", "strong"), default="eventual")
    s.add_argument("--as-of", metavar="VERSION|TIME",
        help="read the table as it was at a base version or an ISO-8601 time (UTC unless it names a zone), base and SSTables")
    s.add_argument("--version", type=int, help="the same as --as-of VERSION")
    s.add_argument("--explain", action="store_true", help="print which shards and SSTables the scan reads")
    s.set_defaults(func=cmd_scan)

    s = sub.add_parser("status",
        help="show shards, WAL and SSTables",
        description="Per shard: id, writer epoch, manifest version, WAL positions, SSTables and compacted generation; the base table's version and rows.")
    s.add_argument("uri", metavar="URI")
    s.add_argument("--json", action="store_true", help="one JSON object")
    s.set_defaults(func=cmd_status)

    s = sub.add_parser("check",
        help="find damaged files (exit 3 if any)",
        description="Check that every shard manifest decodes, every listed SSTable opens, the unflushed WAL parses "
        "with no gap, and the MemWAL index agrees with the shards. Reads only. Exit 0 clean, 3 damaged (each "
        "damaged file named with what is wrong).")
    s.add_argument("uri", metavar="URI")
    s.add_argument("--json", action="store_true", help="one JSON object")
    s.set_defaults(func=cmd_check)

    s = sub.add_parser("repair",
        help="quarantine damaged files and restore a readable, writable table",
        description="Move what cannot be read under {table}/_memwal/quarantine/{time}/, fall back to the newest "
        "intact shard manifest, drop missing SSTables, cut the WAL before a gap or damaged entry, and report "
        "exactly which rows may be lost. Stop the table's writers first. Exit 0 when the table is clean afterwards.")
    s.add_argument("uri", metavar="URI")
    s.add_argument("--dry-run", action="store_true", help="report what would be done; change nothing")
    s.add_argument("--json", action="store_true", help="one JSON object")
    s.set_defaults(func=cmd_repair)

    s = sub.add_parser(
        "ingest",
        help="stream a Kafka topic into a table with Spark",
        description="Run a Spark Structured Streaming query reading records (JSON, Debezium JSON or Avro: --format) from a Kafka topic "
        "into the table: upserts and deletes (operation field), bad records to the dead-letter table "
        "{table}_dead_letters. Offsets live in the checkpoint directory; a restarted query resumes there.",
    )
    s.add_argument("--bootstrap", required=True, metavar="HOST:PORT", help="Kafka bootstrap servers")
    s.add_argument("--topic", required=True, metavar="T")
    s.add_argument("--table", required=True, metavar="URI")
    s.add_argument("--checkpoint", required=True, metavar="DIR",
        help="Spark checkpoint directory (offsets): a local path, or s3a://BUCKET/PATH with the table's S3 settings (AWS_* variables, --storage-option)")
    s.add_argument("--kafka-source", choices=("spark", "python"),
        help="spark: Spark's own Kafka connector (the default when its jars are on the classpath: `python -m memwal.jvm fetch`); "
        "python: memwal's own source on librdkafka (for pip-only installs)")
    s.add_argument("--trigger-interval", type=float, metavar="S", help="seconds between micro-batches (default: as fast as possible)")
    s.add_argument("--available-now", action="store_true", help="process what the topic holds now, then stop")
    s.add_argument("--starting-offsets", default="earliest", help="earliest (default), latest, or JSON per partition")
    s.add_argument("--max-offsets-per-trigger", type=int, metavar="N", help="records per micro-batch at most")
    s.add_argument("--format", default="json", choices=("json", "debezium-json", "avro"),
        help="record values: json objects with the table's columns (default), debezium-json change events "
        "(the source position fills --sequence-field), or avro (see --avro-schema)")
    s.add_argument("--avro-schema", metavar="FILE.avsc", help="with --format avro: the schema values are written with (or read as)")
    s.add_argument("--avro-schema-id", type=int, metavar="ID",
        help="with --format avro: values carry the Confluent header with this schema id; other ids go to the dead-letter table")
    s.add_argument("--schema-registry", metavar="URL",
        help="with --format avro: values carry the Confluent header; writer schemas are fetched from this schema registry by id")
    s.add_argument("--adaptive-max-rows", type=int, metavar="N",
        help="adaptive micro-batches: --max-offsets-per-trigger records (default 10000) when caught up, growing 8x per micro-batch "
        "while a backlog waits, up to N records (the batch log line says why)")
    s.add_argument("--adaptive-max-bytes", type=int, metavar="B", help="with --adaptive-max-rows: at most B bytes per micro-batch (~1 KiB a record)")
    s.add_argument("--op-field", help="JSON field holding the operation (upsert/delete); '' for none (default: the sink's)")
    s.add_argument("--sequence-field", help="JSON field ordering versions of a key (highest wins)")
    s.add_argument("--drop-stale", action="store_true", help="with --sequence-field: drop rows older than the stored version")
    s.add_argument("--merge", choices=("full", "partial"), default="full",
        help="full: a record replaces its key's row (default); partial: a record changes only the columns it carries "
        "(a JSON key it lacks keeps the stored value; null sets null)")
    s.add_argument("--flush-interval", type=float, metavar="S",
        help="flush MemTables at most every S seconds (eventual readers' freshness; default: the sink's)")
    s.add_argument("--max-write-tasks", type=int, metavar="N",
        help="write tasks per micro-batch (default: one per 50k rows of --max-offsets-per-trigger, up to Spark's task slots; each shard is written by "
        "one task)")
    s.add_argument("--master", metavar="URL",
        help="Spark master (spark://HOST:PORT, yarn, k8s://..., local-cluster[W,C,M], ...); default: the one spark-submit, --conf, "
        "PYSPARK_SUBMIT_ARGS or spark-defaults.conf name, else local[--cores]")
    s.add_argument("--cores", type=int, help="cores of the default local[N] master (default: the local session's)")
    s.add_argument("--maintain", action="store_true", help="also run the maintenance service in this process")
    s.add_argument("--writer-process", action="store_true",
        help="write shards through one writer process per executor (kept across tasks and Python workers: shards are not "
        "claimed again when a task moves to another worker)")
    _durability_flag(s)
    s.set_defaults(func=cmd_ingest)

    s = sub.add_parser("view", help="materialized views", description="Materialized views over a table, refreshed incrementally.")
    vsub = s.add_subparsers(dest="view_command", required=True, metavar="ACTION")
    v = vsub.add_parser("create",
        help="define a view and fill it",
        description="Define a view: SELECT expressions and a WHERE predicate (DataFusion SQL), Python UDF columns, or GROUP BY aggregates (count, "
        "sum, min, max, avg).")
    v.add_argument("uri", metavar="URI", help="the table")
    v.add_argument("name", metavar="NAME")
    v.add_argument("--select", action="append", metavar="EXPR", help="an output column, e.g. 'upper(name) AS uname' or 'sum(score) AS total'; repeat")
    v.add_argument("--where", metavar="SQL")
    v.add_argument("--group-by", action="append", metavar="COL", help="group by this column (repeat); the other --select items must be aggregates")
    v.add_argument("--udf", action="append", metavar="SPEC",
        help="name=module:function(col,...)->type[@version], e.g. emb=myudfs:embed(text)->list<float32>[8]@2")
    v.add_argument("--shuffle-seed", type=int, help="store rows in a deterministic pseudo-random order")
    v.add_argument("--max-rows-per-fragment", type=int, help="rows per view fragment (default: the view's)")
    v.add_argument("--no-refresh", action="store_true", help="define only; fill on the first refresh")
    v = vsub.add_parser("refresh", help="bring a view up to date", description="Refresh a view from the table's change feed (one atomic commit).")
    v.add_argument("uri", metavar="URI")
    v.add_argument("name", metavar="NAME")
    v.add_argument("--src-version", type=int, help="refresh to this base table version (default: latest)")
    v.add_argument("--max-rows-per-fragment", type=int, help="rows per view fragment (default: the view's)")
    v = vsub.add_parser("status", help="definition, freshness and refresh history", description="Show a view's definition, freshness and refresh history.")
    v.add_argument("uri", metavar="URI")
    v.add_argument("name", metavar="NAME")
    v.add_argument("--json", action="store_true")
    v.add_argument("--history", type=int, default=10, help="refreshes to show (default 10)")
    v = vsub.add_parser("list", help="views of a table", description="List the views of a table.")
    v.add_argument("uri", metavar="URI")
    v = vsub.add_parser("drop", help="delete a view", description="Delete a view and its data.")
    v.add_argument("uri", metavar="URI")
    v.add_argument("name", metavar="NAME")
    s.set_defaults(func=cmd_view)

    s = sub.add_parser(
        "maintain",
        help="compact, index and collect garbage",
        description="Run maintenance: compaction of SSTables into the base table in generation order, "
        "base index catch-up, garbage collection. Loops until interrupted unless --once.",
    )
    s.add_argument("uri", metavar="URI")
    s.add_argument("--once", action="store_true", help="run one cycle and exit")
    maintenance, gc = MaintenanceConfig(), GcConfig()
    s.add_argument("--interval", type=float, default=maintenance.interval_seconds, metavar="S", help="seconds between cycles (default %(default)s)")
    s.add_argument("--nice", type=_nice_increment, default=maintenance.nice, metavar="N",
        help="lower this process's CPU priority by N (os.nice), so readers and writers on the same machine come first (default %(default)s)")
    s.add_argument("--max-generations-per-commit", type=int, default=maintenance.max_generations_per_commit,
        help="consecutive generations compacted in one commit (default %(default)s)")
    s.add_argument("--fold-fraction", type=float, default=maintenance.fold.fraction, metavar="F",
        help="fold SSTables into the base once their rows are F of the base's (0: every cycle; default %(default)s) ...")
    s.add_argument("--fold-after", type=float, default=maintenance.fold.max_wait_seconds, metavar="S",
        help="... or once one has waited S seconds (default %(default)s) ...")
    s.add_argument("--fold-at-sstables", type=int, default=maintenance.fold.at_sstables, metavar="N",
        help="... or once a shard has N of them (default %(default)s); --once folds whatever is pending")
    s.add_argument("--reader-grace", type=float, default=gc.reader_grace_seconds, metavar="S",
        help="keep SSTables compacted less than S seconds ago (readers may still read them; default %(default)s)")
    s.add_argument("--base-retention", type=float, default=gc.base_version_retention_seconds, metavar="S",
        help="keep base table versions younger than S seconds (time travel; default %(default)s)")
    s.add_argument("--drain-interval", type=float, default=gc.drain_interval_seconds, metavar="S",
                   help="drain a shard's collected SSTables at most every S seconds (each drain fences its writer once; default %(default)s)")
    s.add_argument("--flush-stranded-after", type=float, default=maintenance.flush_stranded_after_seconds, metavar="S",
        help="flush writes left unflushed S seconds by a crashed or idle writer (default %(default)s)")
    s.add_argument("--no-compact", action="store_true")
    s.add_argument("--no-indexes", action="store_true")
    s.add_argument("--no-gc", action="store_true")
    s.add_argument("--no-views", action="store_true", help="do not refresh the table's views")
    s.set_defaults(func=cmd_maintain)

    s = sub.add_parser(
        "upgrade",
        help="move a table made by the previous version to the current layout",
        description="Rewrite a base table that has stable row ids (tables made before 2026-11-24) into one without "
        "them, offline: refuses while a writer or view refresh is live; flushes and compacts every shard, copies the "
        "base, swaps it in (the old one is kept under {table}/_memwal/upgrade/{time}/old) and recreates every view. "
        "A rerun finishes an interrupted upgrade; on a current table it does nothing. Local tables only.",
    )
    s.add_argument("uri", metavar="URI")
    s.add_argument("--dry-run", action="store_true", help="say what would be done; change nothing")
    s.add_argument("--purge", action="store_true", help="remove old bases of upgrades finished more than --grace seconds ago")
    s.add_argument("--grace", type=float, default=7 * 24 * 3600.0, metavar="S", help="with --purge (default %(default)s)")
    s.add_argument("--json", action="store_true", help="one JSON object")
    s.set_defaults(func=cmd_upgrade)

    # Every command that opens a table takes storage options (credentials, endpoint, ...).
    view_actions = sub.choices["view"]._subparsers._group_actions[0].choices  # noqa: SLF001 - argparse keeps them here
    for command in [*(c for n, c in sub.choices.items() if n != "view"), *view_actions.values()]:
        command.add_argument(
            "--storage-option", action="append", metavar="KEY=VALUE",
            help="object-store option in Lance's spelling (aws_endpoint=..., aws_region=..., allow_http=true); "
            "repeatable; overrides the AWS_*/GOOGLE_*/AZURE_* environment variables",
        )
    return p


def exit_code(exc: BaseException) -> int:
    """The exit code for an error that ended a command: the one place that maps classes to codes."""
    if isinstance(exc, _INPUT_ERRORS):
        return EXIT_USAGE
    known = exc if isinstance(exc, MemwalError) else classify(exc)
    return EXIT_CONFLICT if isinstance(known, ConcurrencyError) else EXIT_ERROR


def error_line(exc: BaseException) -> str:
    """The one line a user sees for ``exc``: a memwal error's message; for a Lance error its
    memwal meaning, else its own text without Lance's build paths; for anything else also its type."""
    known = exc if isinstance(exc, MemwalError) else classify(exc)
    if known is not None:
        reason = str(known)
    elif isinstance(exc, _INPUT_ERRORS):
        reason = str(exc)
    else:
        reason = f"{type(exc).__name__}: {lance_message(exc)}"
    return f"memwal: error: {' '.join(reason.split())}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.verbose)
    try:
        return int(args.func(args) or EXIT_OK)
    except BrokenPipeError:
        return EXIT_OK
    except Exception as e:  # noqa: BLE001 - the CLI's one error boundary: every failure ends here
        code = exit_code(e)
        if args.debug:
            traceback.print_exc()
        print(error_line(e), file=sys.stderr)
        if code == EXIT_ERROR and not args.debug:
            print(DEBUG_HINT, file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
