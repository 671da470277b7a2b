"""memwal's own table metadata, stored in the Lance table's config under ``memwal.table``.

Lance records the primary key (field metadata) and, for bucket/identity/unsharded specs,
the sharding spec. memwal adds what Lance has no place for: the table UUID that seeds
shard UUIDs, memwal-only transforms, writer defaults and which base indexes to maintain.
Keeping it in the Lance manifest makes it versioned and atomic with the table itself.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping

from memwal.core.errors import InvalidArgumentError, MemwalError

log = logging.getLogger(__name__)

CONFIG_KEY = "memwal.table"
FORMAT_VERSION = 1


#: The settings of ``WriterConfig.durability``, weakest first.
DURABILITY_LEVELS = ("os", "fsync")


def check_durability(value: object) -> str:
    """``value`` if it is a durability level, else :class:`InvalidArgumentError`."""
    if value not in DURABILITY_LEVELS:
        raise InvalidArgumentError(f"durability must be one of {', '.join(DURABILITY_LEVELS)}, got {value!r}")
    return value  # type: ignore[return-value]


@dataclass(frozen=True)
class WriterConfig:
    """ShardWriter settings memwal applies to every writer of the table.

    ``max_wal_flush_interval_ms`` bounds a durable put's latency: a put waits for the next
    WAL flush tick. Lance's default is 100 ms; memwal defaults to 10 ms, which measured
    ~5x the single-writer throughput here (docs/benchmarks.md).

    ``durability`` is what an acknowledged write survives on local disk (docs/deploy.md,
    "Durability"): ``"os"`` (the default) returns once Lance has written the WAL entry, which
    then sits in the OS page cache and survives a crash of the process but not of the machine;
    ``"fsync"`` returns only once the entry and its directory are fsynced, so it survives power
    loss too. On object stores both are the same: a PUT is durable when it returns. memwal
    applies it (Lance 14.0.2 never fsyncs), so it is not passed to Lance.
    """

    max_memtable_rows: int = 100_000
    #: Record batches a MemTable holds before Lance seals it (and flushes it in the background,
    #: the writer staying open). It is also the lever of a timed seal: the pool's next put into
    #: a shard whose seal is due carries exactly the batches still missing (see
    #: :meth:`memwal.write.pool.ShardWriterPool.put`), so it must stay small enough for one write's
    #: rows to reach it (Lance's own default is 8,000).
    max_memtable_batches: int = 256
    max_wal_flush_interval_ms: int = 10
    durable_write: bool = True
    durability: str = "os"

    def __post_init__(self) -> None:
        # Checked here, before a table is created with them: Lance takes unsigned 64-bit
        # values (a negative one fails half-way through creating the table), and a MemTable
        # of 0 rows accepts no write, ever.
        for name, least in (("max_memtable_rows", 1), ("max_memtable_batches", 2), ("max_wal_flush_interval_ms", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not least <= v < 1 << 63:
                raise InvalidArgumentError(f"{name} must be an integer of at least {least}, got {v!r}")
        check_durability(self.durability)

    def lance_kwargs(self) -> dict[str, Any]:
        kwargs = asdict(self)
        del kwargs["durability"]  # memwal's, not Lance's
        return kwargs

    @classmethod
    def stored(cls, d: Mapping[str, Any]) -> "WriterConfig":
        """The config recorded in a table's metadata. A value this memwal refuses (a table
        created before it checked) is replaced by its default with a warning, so the table
        stays readable and becomes writable."""
        try:
            return cls(**d)
        except InvalidArgumentError as e:
            fixed = {}
            for k, v in d.items():
                try:
                    cls(**{k: v})
                    fixed[k] = v
                except InvalidArgumentError:
                    pass  # refused: left out, so the dataclass default takes its place
            log.warning("table metadata: %s; using the default instead", e)
            return cls(**fixed)


#: A bound no table reaches (:meth:`Bounds.unbounded`); an int, so it round-trips through the
#: table metadata's JSON like any other bound.
NO_BOUND = 2**62


@dataclass(frozen=True)
class Bounds:
    """What a long-lived table may accumulate, and what happens at each bound.

    Maintenance enforces the bounds (:mod:`memwal.maintain.bounds`): it compacts the shards with the
    most uncompacted SSTables first, merges base fragments (Lance ``compact_files``) when
    there are more than ``max_base_fragments`` or the base manifest outgrows
    ``max_manifest_bytes``, and removes base versions beyond ``max_base_versions``. Writers
    get back-pressure when compaction falls behind, like an LSM's write stall: from
    ``slowdown_sstables`` uncompacted SSTables in a shard each write into it is delayed
    (longer the closer the shard is to the stop), and from ``stop_sstables`` writes into it
    wait for compaction, raising :class:`~memwal.core.errors.WriteStalledError` after
    ``stall_timeout_seconds``. The writer-side check reads nothing from storage while a shard
    is below the slowdown bound (see :class:`memwal.write.pool.ShardBacklog`).
    """

    #: Uncompacted SSTables per shard that maintenance keeps shards under (compacted first).
    max_sstables: int = 32
    #: From this many uncompacted SSTables in a shard, writes into it slow down ...
    slowdown_sstables: int = 48
    #: ... and from this many they wait for compaction ...
    stop_sstables: int = 64
    #: ... for at most this long (then WriteStalledError).
    stall_timeout_seconds: float = 120.0
    #: The delay of one write just below the stop bound (it grows linearly from 0 at slowdown).
    max_slowdown_seconds: float = 0.25
    #: How often a slowed or stalled writer re-reads the shard's compacted generation.
    recheck_seconds: float = 0.5
    #: More base fragments than this are merged (Lance compact_files) ...
    max_base_fragments: int = 64
    #: ... and so is a base whose manifest is larger than this (each fragment adds to it).
    max_manifest_bytes: int = 4 << 20
    #: Base versions kept beyond the newest (older ones are removed once they are older than
    #: the reader grace, whatever the time-travel retention says).
    max_base_versions: int = 100
    #: Disk use above this multiple of the live base data is reported, and old base versions
    #: are then removed down to the reader grace. None: not checked.
    max_disk_ratio: float | None = 3.0

    def __post_init__(self) -> None:
        if not 1 <= self.max_sstables <= self.slowdown_sstables <= self.stop_sstables:
            raise InvalidArgumentError(
                "bounds must satisfy 1 <= max_sstables <= slowdown_sstables <= stop_sstables, got "
                f"{self.max_sstables}, {self.slowdown_sstables}, {self.stop_sstables}"
            )
        for name in ("max_base_fragments", "max_manifest_bytes", "max_base_versions"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidArgumentError(f"{name} must be a positive integer, got {v!r}")
        for name in ("stall_timeout_seconds", "max_slowdown_seconds", "recheck_seconds"):
            if not getattr(self, name) >= 0:
                raise InvalidArgumentError(f"{name} must be >= 0, got {getattr(self, name)!r}")

    def slowdown_delay(self, pending: int) -> float:
        """Seconds one write into a shard with ``pending`` uncompacted SSTables is delayed
        (0 below the slowdown bound; the stop bound is not a delay but a wait)."""
        if pending < self.slowdown_sstables or pending >= self.stop_sstables:
            return 0.0
        span = self.stop_sstables - self.slowdown_sstables
        return self.max_slowdown_seconds * (pending - self.slowdown_sstables + 1) / (span + 1)

    @classmethod
    def unbounded(cls) -> "Bounds":
        """Bounds that never act: writes are never slowed or stalled however many SSTables wait
        in a shard, and maintenance never merges base fragments or removes base versions for
        the bounds' sake (compaction and GC still run on their own rules).

        For tables whose flushes are not followed by maintenance on purpose (tests of fencing
        or of the LSM against a model, benchmarks piling up SSTables); a streaming table
        wants the defaults. Every bound is :data:`NO_BOUND`, a count no table reaches, rather
        than a special case the writer and maintenance would each have to know about.
        """
        return cls(
            max_sstables=NO_BOUND,
            slowdown_sstables=NO_BOUND,
            stop_sstables=NO_BOUND,
            max_base_fragments=NO_BOUND,
            max_manifest_bytes=NO_BOUND,
            max_base_versions=NO_BOUND,
            max_disk_ratio=None,
        )

    @classmethod
    def stored(cls, d: Mapping[str, Any]) -> "Bounds":
        """The bounds recorded in a table's metadata; defaults (with a warning) if refused."""
        try:
            return cls(**d)
        except (InvalidArgumentError, TypeError) as e:
            log.warning("table metadata: bounds %s refused (%s); using the defaults", dict(d), e)
            return cls()


@dataclass(frozen=True)
class IndexConfig:
    """Base table indexes memwal builds and keeps caught up after compaction."""

    #: BTREE on the primary key (single-column keys): point lookups on compacted data.
    primary_key_btree: bool = True
    #: Column for a vector index (IVF_HNSW_SQ, memwal.core.indexes), built once the base table has enough rows.
    vector_column: str | None = None
    vector_metric: str = "l2"
    #: Column for an inverted (full-text) index.
    fts_column: str | None = None


@dataclass(frozen=True)
class TableMetadata:
    """What memwal records about a table beyond Lance's own metadata."""

    table_uuid: uuid.UUID
    primary_key: tuple[str, ...]
    sharding: str  # the spec in parse_sharding_spec syntax
    sharding_spec_id: int = 1
    sharding_field_ids: tuple[str, ...] = ()
    writer: WriterConfig = field(default_factory=WriterConfig)
    indexes: IndexConfig = field(default_factory=IndexConfig)
    format_version: int = FORMAT_VERSION
    #: Tables created before bounds existed get the defaults.
    bounds: Bounds = field(default_factory=Bounds)

    def to_json(self) -> str:
        d = asdict(self)
        d["table_uuid"] = str(self.table_uuid)
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "TableMetadata":
        d = json.loads(text)
        if d.get("format_version", 0) > FORMAT_VERSION:
            raise MemwalError(
                f"table metadata format {d['format_version']} is newer than this memwal "
                f"understands ({FORMAT_VERSION}); upgrade memwal"
            )
        return cls(
            table_uuid=uuid.UUID(d["table_uuid"]),
            primary_key=tuple(d["primary_key"]),
            sharding=d["sharding"],
            sharding_spec_id=d.get("sharding_spec_id", 1),
            sharding_field_ids=tuple(d.get("sharding_field_ids", ())),
            writer=WriterConfig.stored(d.get("writer", {})),
            indexes=IndexConfig(**d.get("indexes", {})),
            format_version=d.get("format_version", FORMAT_VERSION),
            bounds=Bounds.stored(d.get("bounds", {})),
        )

    @classmethod
    def from_config(cls, config: Mapping[str, str]) -> "TableMetadata | None":
        text = config.get(CONFIG_KEY)
        return cls.from_json(text) if text else None

    def with_indexes(self, indexes: IndexConfig) -> "TableMetadata":
        return replace(self, indexes=indexes)

    def with_bounds(self, bounds: Bounds) -> "TableMetadata":
        return replace(self, bounds=bounds)
