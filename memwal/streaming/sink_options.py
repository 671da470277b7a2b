"""How the Spark sink interprets and writes records: :class:`SinkOptions`, the one config
dataclass of the sink (its driver, prepare and write tasks and the writer process read it)."""

from __future__ import annotations

from dataclasses import dataclass

from memwal.core.errors import InvalidArgumentError
from memwal.core.metadata import check_durability
from memwal.write.messages import WriteMode

#: What a sink does with fields the records' own schemas have and the table lacks (``SinkOptions.evolve``).
EVOLVE_MODES = ("compatible", "add", "none")


@dataclass(frozen=True)
class SinkOptions:
    """How records are interpreted and written."""

    #: "columns": the DataFrame has the table's columns; "kafka-json": it is a Kafka
    #: DataFrame (key, value, topic, partition, offset, ...) whose values are JSON objects.
    source: str = "columns"
    #: Field/column naming the operation ("upsert", "delete", ...); None: all upserts.
    op_field: str | None = "op"
    #: Optional field/column ordering versions of a key (like Paimon's sequence.field):
    #: within a micro-batch the highest wins, ties broken by Kafka (partition, offset).
    sequence_field: str | None = None
    #: With a sequence field: also drop a row older than the version already stored.
    drop_stale_across_batches: bool = False
    #: Rows larger than this go to the dead-letter table.
    max_row_bytes: int = 8 << 20
    #: Flush a shard's MemTable to an SSTable at most this often (seconds), so eventual
    #: readers see new data; strong readers see it at once. None: only when MemTables fill.
    flush_interval_seconds: float | None = 2.0
    #: Partitions for shards of specs without a fixed shard count (identity, time, ...).
    partitions_for_open_specs: int = 8
    #: At most this many write tasks per micro-batch (None: Spark's default parallelism,
    #: i.e. its task slots; ``ingest`` with bounded micro-batches: one per 50k rows). With more shards than that, a task writes several shards in
    #: parallel threads; every shard is still written by exactly one task. A wave of tasks
    #: beyond the slots costs a micro-batch more than the writes it parallelizes
    #: (docs/bench-log/ingest.md, "Ingest").
    max_write_tasks: int | None = None
    #: Dead-letter table; default ``{table}_dead_letters``.
    dead_letter_uri: str | None = None
    #: "full": a record replaces its key's row (upsert). "partial": a record changes only the
    #: columns it carries (a JSON key it lacks keeps the stored value, ``null`` sets null;
    #: with the "columns" source, a column the DataFrame lacks), see :mod:`memwal.core.partial`.
    merge: str = "full"
    #: Kafka values: "json" (objects with the table's columns and ``op_field``),
    #: "debezium-json" (change events, :mod:`memwal.streaming.debezium`; the source position
    #: fills ``sequence_field``) or "avro" (:mod:`memwal.streaming.avro`).
    value_format: str = "json"
    #: With "avro": the schema (the text of an ``.avsc``) values are written with, or read as.
    avro_schema: str | None = None
    #: With "avro": values carry Confluent's header with this schema id (others are dead letters).
    avro_schema_id: int | None = None
    #: With "avro": values carry Confluent's header; writer schemas come from this registry URL.
    schema_registry: str | None = None
    #: When the records' own schemas (Debezium JSON with ``schemas.enable``, Avro from a
    #: registry) differ from the table's columns (docs/schema-evolution.md): "compatible" adds
    #: the fields the table lacks as nullable columns and widens a column whose field the source
    #: widened (``int`` to ``bigint``, ``numeric(10,2)`` to ``numeric(12,2)``); "add" only adds;
    #: "none" changes nothing (new fields unread, wider values converted or dead letters).
    evolve: str = "compatible"
    #: "os" or "fsync" (``WriterConfig.durability``) for this sink's writes; None: the table's default.
    durability: str | None = None
    #: Write shards through the executor's writer process (:mod:`memwal.write.process`)
    #: instead of in the Python worker: a task moving between workers does not claim its
    #: shards again, and a small micro-batch with one write task runs in one stage
    #: (``single_stage_max_rows``). On by default: measured faster per micro-batch with two
    #: write tasks (docs/bench-log/writer-process.md) and on Spark's Kafka connector with one
    #: (docs/bench-log/ingest.md, "Spark's Kafka connector").
    writer_process: bool = True
    #: With ``writer_process``: seconds without writes after which a writer process it starts
    #: exits (None: its default, or ``$MEMWAL_WRITER_PROCESS_IDLE_SECONDS``).
    writer_process_idle_seconds: float | None = None
    #: With ``writer_process`` and a single write partition, a micro-batch following one of at
    #: most this many rows runs prepare and write in one Spark stage (``coalesce(1)``: no
    #: shuffle, no second stage to schedule), which shortens the small micro-batches that set
    #: freshness; larger ones keep two stages, whose read tasks run in parallel. Without the
    #: writer process the fused task's writes land in alternating Python workers, each claiming
    #: the shards again (measured: 269 fenced retries a minute), so it stays two stages.
    #: 0: always two stages.
    single_stage_max_rows: int = 20_000

    def __post_init__(self) -> None:
        if self.durability is not None:
            check_durability(self.durability)
        if self.evolve not in EVOLVE_MODES:
            raise InvalidArgumentError(f"evolve must be one of {EVOLVE_MODES}, got {self.evolve!r}")


    def write_mode(self) -> WriteMode:
        """How the write path (:mod:`memwal.write.protocol`) turns a shard's records into writes."""
        return WriteMode(merge=self.merge, sequence_field=self.sequence_field,
                         drop_stale=bool(self.sequence_field and self.drop_stale_across_batches))
