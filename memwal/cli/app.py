"""The ``memwal`` command line: a thin layer over the library.

Exit codes (decided in one place, :data:`EXIT_CODES` read by :func:`exit_code`): 0 success;
1 "not found" (``get`` of an absent key); 2 usage or input error (what the user typed or
passed: arguments, keys, files, a table URI with no table); 4 another process did something
first (a writer claimed the shard, a lease is held: retry); 5 the object store kept failing
past its retry bounds (5xx, resets, timeouts: retry once it recovers); 3 anything else (a full
disk, a damaged table, ...), reported as one line ``memwal: error: <reason>`` with a hint to
re-run with ``--debug`` for the traceback.

Defaults of options that configure the library are read from its config dataclasses
(``WriterConfig``, ``MaintenanceConfig``, ``GcConfig``, ...), never copied here.
"""

from __future__ import annotations

import sys

from memwal.core.runtime import configure_process, verbosity_in

configure_process(verbosity_in(sys.argv[1:]))  # before anything imports Lance: `-v` shows Lance's warnings

import argparse  # noqa: E402
import logging  # noqa: E402
import traceback  # noqa: E402
from typing import Sequence  # noqa: E402

from memwal.cli.commands import (  # noqa: E402
    EXIT_CONFLICT,
    EXIT_ERROR,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    cmd_alter,
    cmd_changes,
    cmd_check,
    cmd_delete,
    cmd_get,
    cmd_health,
    cmd_ingest,
    cmd_init,
    cmd_maintain,
    cmd_put,
    cmd_repair,
    cmd_scan,
    cmd_status,
    cmd_upgrade,
    cmd_view,
)
from memwal.core.errors import (  # noqa: E402
    ConcurrencyError,
    InputFileError,
    InvalidArgumentError,
    InvalidValueError,
    MemwalError,
    PrimaryKeyError,
    SchemaMismatchError,
    ShardingSpecError,
    StorageUnavailableError,
    TableExistsError,
    TableNotFoundError,
    UnknownColumnError,
)
from memwal.maintain.gc import GcConfig  # noqa: E402
from memwal.maintain.health import HealthConfig  # noqa: E402
from memwal.core.lance_errors import classify, lance_message  # noqa: E402
from memwal.maintain.maintenance import MaintenanceConfig  # noqa: E402
from memwal.core.metadata import DURABILITY_LEVELS, WriterConfig  # noqa: E402

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


#: Loggers that stay at WARNING however verbose the command: py4j's DEBUG log is every call the
#: driver makes into Spark's JVM, arguments included, and so the credentials memwal hands to
#: Spark's Hadoop settings for an s3a:// checkpoint.
_QUIET_LOGGERS = ("py4j",)


def _setup_logging(verbosity: int) -> None:
    level = logging.WARNING - 10 * verbosity
    logging.basicConfig(level=max(level, logging.DEBUG), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def _durability_flag(s: argparse.ArgumentParser, default: str | None = None, what: str = "durability of this command's writes") -> None:
    s.add_argument(
        "--durability", choices=DURABILITY_LEVELS, default=default,
        help=f"{what}: 'fsync' acknowledges a write once its WAL entry is fsynced (survives power loss on local disk), "
        "'os' once it is in the OS page cache; the same on object stores" + ("" if default else " (default: the table's)"),
    )


def _metrics_port(s: argparse.ArgumentParser) -> None:
    s.add_argument("--metrics-port", type=int, metavar="P",
        help="serve Prometheus metrics on http://127.0.0.1:P/metrics (0: a free port, printed on stderr; README, \"Metrics\")")


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


# -- parser -------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="memwal",
        description="Streaming upserts and deletes into Lance tables on Lance's MemWAL.",
    )
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-v info, -vv debug)")
    p.add_argument("--debug", action="store_true", help="on an error, print its full traceback")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars (they are drawn on a terminal only, on stderr)")
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

    s = sub.add_parser("alter", help="add, widen or drop columns",
        description="Add nullable columns, widen or drop columns, while the table is written and read elsewhere "
        "(docs/schema-evolution.md). Rows stored before read null for an added column. A widening casts the base's "
        "column once (maintenance commits nothing to the base meanwhile).")
    s.add_argument("uri", metavar="URI")
    s.add_argument("--add-column", action="append", default=[], metavar="NAME:TYPE",
        help="add a nullable column, e.g. note:string, total:decimal(12,2), at:timestamp[us]; repeatable")
    s.add_argument("--widen-column", action="append", default=[], metavar="NAME:TYPE",
        help="widen a column's type, e.g. qty:int64, price:decimal(14,2), ratio:double; repeatable")
    s.add_argument("--drop-column", action="append", default=[], metavar="NAME", help="drop a column (not a key or sharding column); repeatable")
    s.set_defaults(func=cmd_alter)

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

    s = sub.add_parser("changes", help="print the table's change feed",
        description="Print every change committed after a position, per shard in generation order: the table's columns plus "
        "_change_type (insert, update_preimage, update_postimage, delete), _shard, _generation and _commit_time. A key "
        "written several times within one flushed generation shows its net change; unflushed writes are not in the feed. "
        "The position after the last change is printed to stderr, to pass back as --since.")
    s.add_argument("uri", metavar="URI")
    s.add_argument("--since", metavar="VERSION|earliest|POSITION",
        help="the changes after this base version, the oldest still kept ('earliest'), or a position printed by a previous run")
    s.add_argument("--until", type=int, metavar="VERSION", help="stop at what this base version had folded (default: the last flush)")
    s.add_argument("--columns", metavar="A,B", help="the table's columns to print (the primary key always)")
    s.add_argument("--json", action="store_true", help="one JSON object per change")
    s.add_argument("--consumer", metavar="NAME",
        help="a registered consumer: start where it last committed (without --since) and commit the new position; "
        "GC keeps what it has not read (GcConfig.feed_retention_seconds)")
    s.add_argument("--no-commit", action="store_true", help="with --consumer: read without committing")
    s.set_defaults(func=cmd_changes)

    s = sub.add_parser("status",
        help="show shards, WAL and SSTables",
        description="Per shard: id, writer epoch, manifest version, WAL positions, SSTables and compacted generation; the base table's version and rows.")
    s.add_argument("uri", metavar="URI")
    s.add_argument("--json", action="store_true", help="one JSON object")
    s.add_argument("--watch", type=float, nargs="?", const=2.0, metavar="S",
        help="a live view of the same data, refreshed every S seconds (default 2) until Ctrl-C")
    s.set_defaults(func=cmd_status)

    s = sub.add_parser("health",
        help="exit 3 unless the table is healthy (a liveness probe)",
        description="Check that maintenance ran recently and its last cycle did not fail, that no shard's writes "
        "wait at the SSTable stop bound, that every WAL is contiguous and readable, and that every file reads "
        "(what `memwal check` reads). Exit 0 healthy, 3 not (each failing check named). The same checks are the "
        "memwal_health_check gauges of --metrics-port.")
    s.add_argument("uri", metavar="URI")
    health = HealthConfig()
    s.add_argument("--max-maintenance-age", type=float, default=health.max_maintenance_age_seconds, metavar="S",
        help="maintenance is stale when its last cycle published more than S seconds ago (default %(default)s)")
    s.add_argument("--shallow", action="store_true", help="skip the WAL and file checks (cheap on large tables)")
    s.add_argument("--json", action="store_true", help="one JSON object")
    s.set_defaults(func=cmd_health)

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
    s.add_argument("--topic", metavar="T", help="the topic (with --tables-root: topics, separated by commas)")
    s.add_argument("--table", metavar="URI", help="the table the topic's records go to")
    s.add_argument("--topic-pattern", metavar="REGEX",
        help="with --tables-root: every topic the regular expression matches, topics created later included")
    s.add_argument("--tables-root", metavar="URI",
        help="a whole database: each topic's Debezium change events into its own table under URI, named after the source "
        "table (shop.public.orders -> URI/public.orders) and created from its first event (docs/schema-evolution.md)")
    s.add_argument("--table-shards", type=int, default=1, metavar="N",
        help="with --tables-root: a table created from a topic's first event is sharded bucket(first key column, N) (default 1: unsharded)")
    s.add_argument("--checkpoint", required=True, metavar="DIR",
        help="Spark checkpoint directory (offsets): a local path, or s3a://BUCKET/PATH with the table's S3 settings (AWS_* variables, --storage-option)")
    s.add_argument("--kafka-source", choices=("spark", "python"),
        help="spark: Spark's own Kafka connector (the default when its jars are on the classpath: `python -m memwal.jvm fetch`); "
        "python: memwal's own source on librdkafka (for pip-only installs)")
    s.add_argument("--trigger-interval", type=float, metavar="S", help="seconds between micro-batches (default: as fast as possible)")
    s.add_argument("--available-now", action="store_true", help="process what the topic holds now, then stop")
    s.add_argument("--real-time", action="store_true",
        help="Spark's Real-Time Mode: each record reaches the table's writers within milliseconds, not per micro-batch "
        "(one long-running task per Kafka partition; docs/deploy.md, \"Real-time ingest\")")
    s.add_argument("--real-time-batch", type=float, default=60.0, metavar="S",
        help="with --real-time: seconds between Spark's offset checkpoints (at least 5; a crash replays at most this much)")
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
    s.add_argument("--evolve", choices=("compatible", "add", "none"), default="compatible",
        help="with --format debezium-json or avro from a registry: a field the events' schemas have and the table lacks is "
        "added as a nullable column and a column the source widened is widened (compatible, default); only added (add); "
        "or neither (none: new fields unread, wider values converted or dead letters); docs/schema-evolution.md")
    s.add_argument("--merge", choices=("full", "partial"), default="full",
        help="full: a record replaces its key's row (default); partial: a record changes only the columns it carries "
        "(a JSON key it lacks keeps the stored value; null sets null)")
    s.add_argument("--flush-interval", type=float, metavar="S",
        help="seal MemTables every S seconds (eventual readers' freshness; default: 2, 1 with --real-time)")
    s.add_argument("--exchange", choices=("auto", "none", "shard"), default="auto",
        help="none: the tasks that read the topic decode and write it, one Spark stage per micro-batch (format('memwal')); "
        "shard: rows are first exchanged by shard, so one task writes each shard (two stages: for a cluster whose topic's "
        "partitions do not line up with the table's shards, docs/deploy.md); auto (default): none on one executor, shard on several")
    s.add_argument("--max-write-tasks", type=int, metavar="N",
        help="with an exchange: write tasks per micro-batch (default: one per 50k rows of --max-offsets-per-trigger, up to Spark's task "
        "slots; each shard is written by one task)")
    s.add_argument("--master", metavar="URL",
        help="Spark master (spark://HOST:PORT, yarn, k8s://..., local-cluster[W,C,M], ...); default: the one spark-submit, --conf, "
        "PYSPARK_SUBMIT_ARGS or spark-defaults.conf name, else local[--cores]")
    s.add_argument("--cores", type=int, help="cores of the default local[N] master (default: the local session's)")
    s.add_argument("--maintain", action="store_true", help="also run the maintenance service in this process")
    s.add_argument("--writer-process", action=argparse.BooleanOptionalAction, default=None,
        help="write shards through one writer process per executor (kept across tasks and Python workers: shards are not "
        "claimed again when a task moves to another worker; the default), or in the Python workers (--no-writer-process)")
    _durability_flag(s)
    _metrics_port(s)
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
    s.add_argument("--break-lease", action="append", metavar="SHARD|all",
        help="end the writer lease of SHARD (or of every shard) now, so the writes of a writer known to be dead are "
        "flushed without waiting for its lease (60s) to run out; a writer that is alive after all is fenced and reopens. "
        "A lease naming a process of this host that is gone needs no breaking; repeatable")
    s.add_argument("--no-compact", action="store_true")
    s.add_argument("--no-indexes", action="store_true")
    s.add_argument("--no-gc", action="store_true")
    s.add_argument("--no-views", action="store_true", help="do not refresh the table's views")
    _metrics_port(s)
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


#: Error classes -> exit code, first match wins; what matches none exits with EXIT_ERROR. A Lance
#: error is matched as the memwal error it is (:func:`memwal.core.lance_errors.classify`).
EXIT_CODES: tuple[tuple[tuple[type[BaseException], ...], int], ...] = (
    (_INPUT_ERRORS, EXIT_USAGE),
    ((ConcurrencyError,), EXIT_CONFLICT),
    ((StorageUnavailableError,), EXIT_UNAVAILABLE),
)


def exit_code(exc: BaseException) -> int:
    """The exit code for an error that ended a command (:data:`EXIT_CODES`)."""
    known = exc if isinstance(exc, MemwalError) else (classify(exc) or exc)
    for classes, code in EXIT_CODES:
        if isinstance(exc, classes) or isinstance(known, classes):
            return code
    return EXIT_ERROR


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
