"""Typed errors raised by memwal.

Every message says what went wrong and what to do about it, so a user reading a failed
pipeline's log can act without reading memwal's source.
"""

from __future__ import annotations


class MemwalError(Exception):
    """Base class of every error memwal raises on purpose."""


class TableNotFoundError(MemwalError):
    """No memwal table exists at the given URI."""


class TableExistsError(MemwalError):
    """A table already exists where a new one was to be created."""


class PrimaryKeyError(MemwalError):
    """The table has no usable primary key, or a key value is invalid (e.g. null)."""


class UnknownColumnError(MemwalError):
    """A column named in a spec, a key or a filter does not exist in the table schema."""


class ShardingSpecError(MemwalError):
    """A sharding spec cannot be parsed or cannot be applied to the table."""


class TransformTypeError(ShardingSpecError):
    """A sharding transform cannot take the type of its source column."""


class ShardRoutingError(MemwalError):
    """A row was about to be written to a shard that does not own its key."""


class InvalidValueError(MemwalError):
    """A value cannot be used, e.g. a date string that a time transform cannot parse."""


class SchemaMismatchError(MemwalError):
    """Data to write does not match the table schema."""


class ConcurrencyError(MemwalError):
    """Another process did something first: a writer claimed the shard, a compactor or a
    refresh committed, a lease is held. Nothing acknowledged is lost; the operation can be
    retried (or the other process stopped)."""


class FencedError(ConcurrencyError):
    """Another writer claimed the shard (a higher writer epoch) and this one lost it twice.

    memwal reopens a fenced writer once and retries; this error means the retry was
    fenced as well, i.e. another process is actively writing the same shard.
    """


class BatchInterruptedError(ConcurrencyError):
    """A micro-batch stopped part-way because its streaming query was being stopped. Spark
    did not commit the batch: the query replays it on restart, and the sink's writes are
    idempotent per micro-batch (every key ends at the batch's newest row for it however often
    the batch ran), so the table ends as if it ran once."""


class WriteStalledError(ConcurrencyError):
    """Writes into a shard waited for compaction longer than the stall timeout: the shard
    holds the table's ``stop_sstables`` uncompacted SSTables or more (an LSM write stall).
    Nothing of this write was applied; retry once maintenance has compacted the shard (is
    ``memwal maintain`` running?)."""


class ManifestError(MemwalError):
    """An on-disk manifest is missing, unreadable or inconsistent."""


class StaleCompactionError(ConcurrencyError):
    """A compaction commit lost a race: another compactor already compacted the generation."""


class CommitConflictError(ConcurrencyError):
    """A commit (to the base table, or of a shard manifest) lost to concurrent commits, e.g.
    Lance's commit-conflict and write-contention errors. Nothing was changed by it; retrying
    from a fresh read is safe."""


class InvalidArgumentError(MemwalError, ValueError):
    """An argument given to a memwal API (or on the command line) is out of its domain.

    Also a :class:`ValueError`, which is what it honestly is, so callers that guard a call
    with ``except ValueError`` keep working.
    """


class MetricsFormatError(MemwalError):
    """Maintenance metrics were written in a format this memwal does not understand (newer)."""


class TableDamagedError(MemwalError):
    """The table's on-disk state is inconsistent (e.g. an interrupted create); it needs repair
    or re-creation, not a retry."""


class WalGapError(TableDamagedError):
    """A shard's WAL misses an entry that later entries follow.

    Entries replay in position order and every reader (and Lance's own replay) stops at the
    first missing position, so the acknowledged writes after a gap would be silently
    dropped by the next flush. memwal refuses to read, flush or claim such a shard instead.
    """


class StorageError(MemwalError, OSError):
    """The table's storage failed an operation for a reason of its own (not a race with another
    process, not a damaged file): the object store, or the local disk.

    Also an :class:`OSError`, which is what it honestly is, so code that treats storage
    failures as ``OSError`` keeps working. Nothing acknowledged is lost by it: a write that
    raises it was not acknowledged, and what it may have left half-done (a file no manifest
    names) is never read and is collected as garbage."""


class StorageUnavailableError(StorageError):
    """The object store kept failing a request past the retry bounds
    (:class:`~memwal.core.storage.RetryPolicy`): 500/503 ``SlowDown`` answers, connection resets,
    timeouts. Transient: the operation can be run again once the store recovers."""


class StorageFullError(StorageError):
    """No space left on the device that holds the table (or a write larger than the file size
    limit). What was written before stays readable; free space and run the operation again."""


class InputFileError(MemwalError):
    """A file given as input (to ``put``, ``delete`` or ``init``) cannot be read: a directory,
    an unknown extension, a damaged body. Nothing was written from it."""


class WriterProcessError(MemwalError):
    """The executor's writer process (``SinkOptions(writer_process=True)``) could not be
    started or reached, or ended during a write. The task fails and Spark retries it, which
    starts a new writer process; what the old one acknowledged is durable in the WAL."""


class StateNotRetainedError(InvalidArgumentError):
    """A time-travel read asked for a table state that garbage collection no longer keeps
    (older than ``GcConfig.time_travel_seconds``), or that never existed; the message names
    the oldest state that can be read."""


class ChangesCollectedError(StateNotRetainedError):
    """A change-feed read asked for changes garbage collection no longer keeps (or from a
    base version that never existed). :attr:`oldest` is the oldest position still readable
    (None if it could not be determined), also named in the message."""

    def __init__(self, message: str, oldest: object | None = None) -> None:
        super().__init__(message)
        self.oldest = oldest
