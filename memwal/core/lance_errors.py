"""Lance's exceptions, classified: the one place that reads their text.

pylance raises untyped ``OSError`` (occasionally ``RuntimeError``/``ValueError``) whose
message is the Rust error's ``Display``, followed by the source locations of Lance's CI
build (``/home/runner/work/lance/...rs:LINE:COL``). Everything memwal decides about a
Lance failure (retry, reopen, report) is decided here, by exception type plus a pattern
anchored on the message Lance gives the *kind* of error, never a bare word: "conflict"
alone would match the ``conflict_resolver.rs`` path that follows almost every commit error.

The patterns are the real messages of the pinned pylance; tests/test_lance_errors.py
provokes each one and would fail if an upgrade reworded them.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import Callable
from typing import Any, TypeVar

from memwal.core.errors import (
    CommitConflictError,
    FencedError,
    MemwalError,
    StaleCompactionError,
    StorageError,
    StorageFullError,
    StorageUnavailableError,
    TableDamagedError,
)
from memwal.core.storage import RetryPolicy

log = logging.getLogger(__name__)
T = TypeVar("T")

#: The exception types pylance raises for Lance errors.
_LANCE_TYPES = (OSError, RuntimeError, ValueError)

#: Lance prefixes some messages with the error's category, e.g. "LanceError(IO): ".
_PREFIX = r"^(?:LanceError\(\w+\): )?(?:Invalid user input: )?"

#: A writer whose shard was claimed by a newer epoch (Lance ``Error::Fenced``). Lance words a WAL
#: write that failed past its own retries the same way, "Writer fenced (persistence failure)",
#: though no other writer is involved: that one is the storage's failure (:data:`_PERSISTENCE`).
_FENCED = re.compile(r"Writer fenced \((?!persistence failure\))")
_PERSISTENCE = re.compile(r"Writer fenced \(persistence failure\)")
#: Opening a writer lost the race to commit the next shard manifest version.
_CLAIM_RACE = re.compile(_PREFIX + r"Failed to claim shard \S+ \(version \d+\)")
#: ``mark_sstables_as_compacted`` with a generation at or below the recorded one.
_STALE_COMPACTION = re.compile(_PREFIX + r"Stale SSTable compaction for shard \S+")
#: A commit that lost to concurrent commits and may be retried from a fresh read: Lance's
#: ``TooMuchWriteContention`` (retries exhausted, or ``conflict_retries(0)``),
#: ``RetryableCommitConflict`` and ``CommitConflict``. ``Incompatible transaction`` (e.g.
#: a concurrent overwrite) is deliberately not here: the operation's plan is void.
_COMMIT_CONFLICT = re.compile(
    _PREFIX
    + r"(?:Too many concurrent writers\. |Too many concurrent writes"
    + r"|Retryable commit conflict for version \d+|Commit conflict for version \d+)"
)

#: A writer's WAL replay (when it claims a shard) met an entry that is not an Arrow IPC stream.
#: Lance does not name the entry; the caller finds it (``memwal.core.wal.first_unreadable_entry``).
_WAL_UNREADABLE = re.compile(_PREFIX + r"(?:LanceError\(IO\): )?failed to open WAL IPC stream reader")

#: Opening a dataset (an SSTable, say) whose directory holds no versions. Lance's message
#: gives the path without its leading ``/``; memwal's messages name the path themselves.
_DATASET_NOT_FOUND = re.compile(_PREFIX + r"Dataset at path \S+ was not found")

#: A request to the object store that failed for the store's own reasons after object_store's retries
#: (memwal.core.storage.RetryPolicy): a 5xx answer (500 InternalError, 503 SlowDown), a 200 whose body is
#: an error, or the connection (reset, timed out). object_store words it "Generic <Store> error:
#: Error performing <METHOD> <url> ... - <reason>"; a 4xx (credentials, a missing bucket) is left alone.
_STORE_UNAVAILABLE = re.compile(
    r"Generic \w+ error: .*?Error performing .*? - "
    r"(?:HTTP error|Server returned non-2xx status code: 5\d\d|Server returned error response)",
    re.DOTALL,
)

#: A local write that found no room: ENOSPC (28), EFBIG (27, a file over the process's size limit),
#: EDQUOT (122), as Rust's io::Error prints them inside Lance's message.
_NO_ROOM = re.compile(r"\(os error (28|27|122)\)")

#: A flush whose new SSTable's first commit (a conditional PUT) Lance took for "already exists":
#: S3 answered 409 ConditionalRequestConflict, which object_store reports that way (found by the
#: soak under faults), or an earlier attempt landed and its answer was lost. Whatever is there is
#: an orphan no manifest lists (GC collects it); flushing again makes a new SSTable.
_SSTABLE_EXISTS = re.compile(_PREFIX + r"(?:LanceError\(IO\): )?Dataset already exists: \S*_mem_wal/\S+_gen_\d+")

#: ", /home/runner/work/lance/lance/rust/.../file.rs:12:34" (and any other build path).
_SOURCE_LOCATION = re.compile(r",?\s*/[^\s,]*\.rs:\d+:\d+")


def _text(exc: BaseException) -> str | None:
    return str(exc) if isinstance(exc, _LANCE_TYPES) else None


def _matches(pattern: re.Pattern[str], exc: BaseException) -> bool:
    text = _text(exc)
    return text is not None and pattern.search(text) is not None


def is_fenced(exc: BaseException) -> bool:
    """True if ``exc`` is Lance's error for a writer whose shard was claimed by another."""
    return _matches(_FENCED, exc)


def is_claim_race(exc: BaseException) -> bool:
    """True if opening a writer lost the race to claim the shard; reload and claim again."""
    return _matches(_CLAIM_RACE, exc)


def is_stale_compaction(exc: BaseException) -> bool:
    """True if a compaction marker was at or below the generation already recorded."""
    return _matches(_STALE_COMPACTION, exc)


def is_commit_conflict(exc: BaseException) -> bool:
    """True if a base-table commit lost to concurrent commits and may be retried.

    A claim race also carries "Retryable commit conflict" (of the shard manifest), nested
    after its own message; the anchored pattern leaves it to :func:`is_claim_race`.
    """
    return _matches(_COMMIT_CONFLICT, exc)


def is_wal_unreadable(exc: BaseException) -> bool:
    """True if Lance could not replay a shard's WAL because an entry does not parse."""
    return _matches(_WAL_UNREADABLE, exc)


def is_not_found(exc: BaseException) -> bool:
    """Lance could not find the dataset, or the version of it, that was asked for."""
    return _matches(_DATASET_NOT_FOUND, exc)


def is_store_unavailable(exc: BaseException) -> bool:
    """True if the object store failed a request past its retries (5xx, a reset, a timeout)."""
    return _matches(_STORE_UNAVAILABLE, exc)


def is_no_room(exc: BaseException) -> bool:
    """True if a local write found the disk full (or the file over its size limit)."""
    if isinstance(exc, OSError) and exc.errno in (28, 27, 122):
        return True
    return _matches(_NO_ROOM, exc)


def lance_message(exc: BaseException) -> str:
    """``exc``'s message without Lance's build paths: what a user may be shown."""
    return _SOURCE_LOCATION.sub("", str(exc)).strip()


def _short(exc: BaseException) -> str:
    """One line of a storage failure: Lance's message without build paths and without the XML
    body of the store's answer (its code, e.g. ``SlowDown``, is kept)."""
    text = lance_message(exc)
    head, xml, body = text.partition("<?xml")
    code = re.search(r"<Code>(\w+)</Code>", body) if xml else None
    text = head.rstrip(": ") + (f" ({code.group(1)})" if code else "")
    return " ".join(text.split())


def classify(exc: BaseException) -> MemwalError | None:
    """The memwal error for a Lance exception, or None if it is none of the known kinds.

    The caller raises it ``from exc`` (the original keeps the full text for ``--debug``).
    """
    if isinstance(exc, MemwalError):
        return exc
    if is_fenced(exc) or is_claim_race(exc):
        return FencedError(f"another writer claimed the shard: {lance_message(exc)}")
    if is_stale_compaction(exc):
        return StaleCompactionError(f"another compactor already compacted this generation: {lance_message(exc)}")
    if is_commit_conflict(exc):
        return CommitConflictError(f"a concurrent commit won: {lance_message(exc)}")
    if is_no_room(exc):
        found = _NO_ROOM.search(str(exc))
        code = int(found.group(1)) if found else getattr(exc, "errno", None) or 28
        return StorageFullError(code, f"no space left for the table (disk full, quota or file size limit): {_short(exc)}; "
                                "free space and retry")
    if is_store_unavailable(exc):
        return StorageUnavailableError(f"the object store kept failing: {_short(exc)}; retry once it recovers")
    if _matches(_SSTABLE_EXISTS, exc):
        return StorageUnavailableError(f"the object store failed a flush's commit: {_short(exc)}; flush again")
    if _matches(_PERSISTENCE, exc):
        # Its cause not a full disk nor an outage past the retries: Lance lost track of a WAL
        # append ("position taken after a failed PUT": the store applied it and the answer was
        # lost, or answered 409). A reopened writer replays what landed; the write is repeated.
        return StorageUnavailableError(f"a WAL write's outcome is unknown: {_short(exc)}; reopen and repeat it")
    return None


class _MemwalErrors:
    """:func:`memwal_errors`: a context manager, and a decorator that is a plain ``try``
    (contextlib's decorator makes a generator per call: ~15 us of a 0.7 ms point lookup)."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        if exc is None or isinstance(exc, MemwalError) or not isinstance(exc, _LANCE_TYPES):
            return False
        known = classify(exc)
        if known is None:
            return False
        raise known from exc

    def __call__(self, fn: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(fn)
        def translated(*args: Any, **kwargs: Any) -> T:
            try:
                return fn(*args, **kwargs)
            except MemwalError:
                raise
            except _LANCE_TYPES as e:
                known = classify(e)
                if known is None:
                    raise
                raise known from e

        return translated


_MEMWAL_ERRORS = _MemwalErrors()


def memwal_errors() -> _MemwalErrors:
    """Inside the block, a Lance (or storage) failure of a known kind is raised as memwal's
    error for it (:func:`classify`), from the original; anything else as it was. Also a
    decorator (``@memwal_errors()``) for the public entry points of the API."""
    return _MEMWAL_ERRORS


def storage_failure(exc: BaseException) -> MemwalError | None:
    """memwal's error for ``exc`` if it is a failure of the storage itself (the object store past
    its retries, a full disk), which is never damage of the table; else None."""
    known = exc if isinstance(exc, MemwalError) else classify(exc)
    return known if isinstance(known, StorageError) else None


def repeat_unavailable(fn: Callable[[], T], policy: RetryPolicy, what: str) -> T:
    """``fn()``, repeated while it fails because the object store is unavailable (a Lance commit
    whose manifest PUT was reset or timed out: neither Lance nor its client repeats those), at
    most ``policy.operation_retries`` times. Only for an ``fn`` that may run again whatever the
    failed attempt did: one that reads afresh and whose commit is idempotent or refused when
    already done (a compaction's marker, an index catch-up)."""
    attempt = 0
    while True:
        try:
            return fn()
        except _LANCE_TYPES as e:
            known = e if isinstance(e, MemwalError) else classify(e)
            if not isinstance(known, StorageUnavailableError):
                raise
            if attempt >= policy.operation_retries:
                if known is e:
                    raise
                raise known from e
            attempt += 1
            log.warning("%s failed on the object store (%s); repeating it (%d of %d)", what, known, attempt,
                        policy.operation_retries)
            time.sleep(policy.backoff(attempt))


def damaged_sstable(exc: BaseException, shard_id: str, generation: int | None, path: str) -> TableDamagedError | None:
    """The memwal error for a Lance failure to open or read an SSTable a shard manifest
    lists, or None if ``exc`` is not such a failure (not a Lance error, or a known kind).

    A listed SSTable is immutable and must exist, so whatever else stops Lance from opening
    or reading it is damage: the directory gone ("Dataset at path ... was not found", with
    the path missing its leading ``/``) or a file in it that does not decode (errors of many
    shapes, none naming the SSTable). The message names the file and ``memwal repair``;
    ``memwal check`` tells damage from a storage error that did not last.
    """
    if isinstance(exc, MemwalError) or _text(exc) is None or classify(exc) is not None:
        return None
    what = f"the SSTable of generation {generation}" if generation is not None else "an SSTable"
    if _matches(_DATASET_NOT_FOUND, exc):
        problem = "is missing"
    else:
        problem = f"cannot be read ({' '.join(lance_message(exc).split())})"
    return TableDamagedError(
        f"shard {shard_id}: {what} at {path} {problem}; "
        "`memwal check` confirms the damage, `memwal repair` restores reads"
    )
