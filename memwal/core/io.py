"""The storage seam: the few file operations memwal needs beyond what Lance does itself.

Lance reads and writes table data; memwal only lists shard directories, reads small
manifests and WAL entries, writes a shard manifest with put-if-not-exists semantics and
deletes what garbage collection frees. Those operations go through :class:`FileIO`, with one
implementation for local file systems (:class:`LocalFileIO`) and one for every object store
Lance supports (:class:`ObjectStoreFileIO`: S3, GCS, Azure, and memory for tests).

Paths are full URIs or absolute local paths, joined with ``/`` (:func:`memwal.core.paths.join`).
An object store has no directories: a "directory" is the set of objects whose keys start with
``path + "/"``, so listing a directory that holds nothing is the same as listing a missing one,
and the age of a directory is the age of the newest object under it.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol, TypeVar, runtime_checkable

import obstore
from obstore.exceptions import AlreadyExistsError, GenericError, NotFoundError, UnknownConfigurationKeyError
from obstore.store import MemoryStore, from_url

from memwal.core.errors import StorageFullError, StorageUnavailableError
from memwal.core.paths import normalize_uri
from memwal.core.storage import StorageConfig, StorageOptionError, UnsupportedSchemeError

T = TypeVar("T")

# Schemes served by ObjectStoreFileIO (those Lance reads and writes, plus memory for tests).
OBJECT_STORE_SCHEMES = frozenset({"s3", "s3a", "gs", "az", "azure", "abfs", "abfss", "adl", "memory"})
LOCAL_SCHEMES = frozenset({"", "file"})


class ObjectInfo(NamedTuple):
    """One file (object) under a prefix: its path relative to the prefix ('/'-separated), size, mtime."""

    path: str
    size: int
    mtime: float


@runtime_checkable
class FileIO(Protocol):
    """Storage operations memwal performs outside Lance."""

    #: True where a completed write is already durable (an object store), so :meth:`sync` is a no-op
    #: and callers can skip finding what to sync.
    durable_on_write: bool

    def read(self, path: str) -> bytes: ...

    def exists(self, path: str) -> bool: ...

    def is_file(self, path: str) -> bool:
        """True if a file (an object) is at ``path`` itself, not only under it."""
        ...

    def list_dir(self, path: str) -> list[str]:
        """Names (not paths) directly under ``path``; empty if it does not exist."""
        ...

    def write_if_absent(self, path: str, data: bytes) -> bool:
        """Atomically create ``path`` holding ``data``; False if it already existed."""
        ...

    def write(self, path: str, data: bytes) -> None:
        """Replace ``path`` atomically (readers see the old or the new content)."""
        ...

    def remove(self, path: str) -> None:
        """Remove a file; a missing file is not an error."""
        ...

    def remove_tree(self, path: str) -> None:
        """Remove a directory and everything under it; a missing one is not an error."""
        ...

    def tree_size(self, path: str) -> int:
        """Total bytes of the files under ``path``."""
        ...

    def stat(self, path: str) -> tuple[int, float]:
        """(size in bytes, modification time as a Unix timestamp); FileNotFoundError if missing."""
        ...

    def modified_time(self, path: str) -> float:
        """Modification time of a file as a Unix timestamp; FileNotFoundError if missing."""
        ...

    def newest_modified_time(self, prefix: str) -> float | None:
        """The newest modification time of the files under ``prefix``; None if there are none.

        This is a directory's age on a store without directory mtimes: it changes whenever a file
        under it is written, which is what a grace period has to wait out.
        """
        ...

    def list_prefix(self, prefix: str) -> list[ObjectInfo]:
        """Every file under ``prefix`` (recursively), sorted by relative path; empty if none."""
        ...

    def sync(self, paths: "list[str]", directory: str | None = None) -> None:
        """Make the files ``paths`` and the entries of ``directory`` durable (survive an OS crash
        or power loss) before returning. A no-op where a completed write is already durable
        (an object store acknowledges a PUT only once it is stored)."""
        ...


class LocalFileIO:
    """:class:`FileIO` on a POSIX file system."""

    durable_on_write = False

    def read(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def is_file(self, path: str) -> bool:
        return os.path.isfile(path)

    def list_dir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except (FileNotFoundError, NotADirectoryError):  # as on an object store: nothing under a file's name
            return []

    def write_if_absent(self, path: str, data: bytes) -> bool:
        with _disk_errors(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.{uuid.uuid4().hex}.tmp"
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                # link() fails when the target exists, so two racing writers cannot both win,
                # and a reader never sees a half-written file.
                os.link(tmp, path)
                return True
            except OSError as e:
                if e.errno == errno.EEXIST:
                    return False
                raise
            finally:
                _unlink_quietly(tmp)  # also a partial one (a full disk): never left beside the manifests

    def write(self, path: str, data: bytes) -> None:
        with _disk_errors(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.{uuid.uuid4().hex}.tmp"
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                os.replace(tmp, path)
            except BaseException:
                _unlink_quietly(tmp)
                raise

    def remove(self, path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def remove_tree(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def stat(self, path: str) -> tuple[int, float]:
        st = os.stat(path)
        return st.st_size, st.st_mtime

    def tree_size(self, path: str) -> int:
        total = 0
        for root, _dirs, files in os.walk(path):
            for name in files:
                try:
                    total += os.path.getsize(os.path.join(root, name))
                except FileNotFoundError:
                    pass  # removed concurrently (e.g. by GC); it no longer counts
        return total

    def modified_time(self, path: str) -> float:
        return os.stat(path).st_mtime

    def newest_modified_time(self, prefix: str) -> float | None:
        return max((info.mtime for info in self.list_prefix(prefix)), default=None)

    def list_prefix(self, prefix: str) -> list[ObjectInfo]:
        out: list[ObjectInfo] = []
        for root, _dirs, files in os.walk(prefix):
            for name in files:
                full = os.path.join(root, name)
                try:
                    st = os.stat(full)
                except FileNotFoundError:
                    continue  # removed concurrently (e.g. by GC)
                rel = os.path.relpath(full, prefix).replace(os.sep, "/")
                out.append(ObjectInfo(rel, st.st_size, st.st_mtime))
        return sorted(out)

    def sync(self, paths: list[str], directory: str | None = None) -> None:
        """fsync each file, then the directory: a file's data is durable once it is fsynced, but
        its name (the directory entry) only once its directory is, and a WAL entry nobody can
        find is as good as lost. A file removed meanwhile (by GC, after a flush covered it) has
        nothing left to protect and is skipped."""
        for path in paths:
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        if directory is not None:
            fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


#: errno values of a write that found no room: the device is full, the user's quota is used up, or the
#: file outgrew the process's size limit (RLIMIT_FSIZE).
_NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class _disk_errors:
    """Turns a local write's "no room" OSError into :class:`StorageFullError` naming the path."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        if isinstance(exc, OSError) and not isinstance(exc, StorageFullError) and exc.errno in _NO_ROOM:
            raise StorageFullError(
                exc.errno, f"no room to write {self.path} ({os.strerror(exc.errno)}); free space and retry"
            ) from exc
        return False


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# One MemoryStore per process and bucket name: two FileIOs on memory://b/... see the same objects, as
# two clients of one bucket do. It is not Lance's memory store, so it serves memwal-only tests.
_MEMORY_STORES: dict[str, Any] = {}
_MEMORY_LOCK = threading.Lock()

# object_store's bulk delete takes at most this many keys per request (the S3 DeleteObjects limit).
_DELETE_BATCH = 1000


def split_uri(uri: str) -> tuple[str, str, str]:
    """(scheme, bucket, key) of ``scheme://bucket/key``; the key has no leading or trailing '/'.

    Split by hand rather than with urllib, which would take a '#' or '?' in a key for a fragment or a query.
    """
    scheme, sep, rest = uri.partition("://")
    if not sep:
        raise ValueError(f"not a URI: {uri!r}")
    bucket, _, key = rest.partition("/")
    return scheme.lower(), bucket, key.strip("/")


class ObjectStoreFileIO:
    """:class:`FileIO` on an object store (S3, GCS, Azure, memory) through obstore.

    Paths are full URIs (``s3://bucket/table/_mem_wal/...``); one obstore client per bucket is built
    lazily from the :class:`~memwal.core.storage.StorageConfig` and reused, since creating one costs a
    credential lookup. ``write_if_absent`` is a conditional PUT (``If-None-Match: *`` on S3), the same
    primitive Lance commits its own manifests with, so exactly one of several racing writers creates an
    object. A plain PUT replaces an object atomically, which is all ``write`` promises.

    Failures of the store: obstore's client retries each request within the table's
    :class:`~memwal.core.storage.RetryPolicy`, but not a conditional PUT or a delete that was reset or
    timed out; those are repeated here (``operation_retries``). A conditional PUT whose earlier
    attempt may have landed is settled by reading the object back: the same bytes are this
    writer's own. S3's 409 ``ConditionalRequestConflict`` (another conditional write of the key in
    flight; obstore calls it "already exists") is retried too, never taken for "exists". What
    still fails raises :class:`~memwal.core.errors.StorageUnavailableError`, one line naming the
    operation and path.

    Picklable: the clients are rebuilt on the other side from the config.
    """

    durable_on_write = True

    def __init__(self, storage: StorageConfig | None = None) -> None:
        self.storage = storage or StorageConfig()
        self._stores: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"storage": self.storage}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["storage"])

    def __repr__(self) -> str:
        return f"ObjectStoreFileIO({self.storage!r})"

    def _store(self, scheme: str, bucket: str) -> Any:
        with self._lock:
            store = self._stores.get((scheme, bucket))
            if store is None:
                if scheme == "memory":
                    with _MEMORY_LOCK:
                        store = _MEMORY_STORES.setdefault(bucket, MemoryStore())
                else:
                    try:
                        store = from_url(f"{scheme}://{bucket}", **self.storage.obstore_kwargs(scheme))
                    except UnknownConfigurationKeyError as e:
                        # One line naming the key, instead of obstore's multi-line debug dump on every operation.
                        raise StorageOptionError(f"storage option not valid for {scheme}:// ({e.args[0].splitlines()[0]})") from e
                self._stores[(scheme, bucket)] = store
            return store

    def _locate(self, path: str) -> tuple[Any, str]:
        scheme, bucket, key = split_uri(path)
        return self._store(scheme, bucket), key

    def _attempts(self, what: str, path: str, fn: Callable[[], T], *, repeat: bool) -> T:
        """``fn()``; a failure of the store (obstore's ``GenericError``: 5xx past the client's
        retries, a reset, a timeout) is repeated up to ``operation_retries`` times when
        ``repeat`` (requests the client does not retry itself), then raised as
        :class:`StorageUnavailableError`."""
        policy = self.storage.retry
        attempt = 0
        while True:
            try:
                return fn()
            except GenericError as e:
                if not repeat or attempt >= policy.operation_retries:
                    raise _unavailable(what, path, e, attempt) from e
            attempt += 1
            time.sleep(policy.backoff(attempt))

    def read(self, path: str) -> bytes:
        store, key = self._locate(path)
        try:
            return self._attempts("read", path, lambda: bytes(obstore.get(store, key).bytes()), repeat=False)
        except _not_found_errors() as e:
            raise FileNotFoundError(errno.ENOENT, "no such object", path) from e

    def exists(self, path: str) -> bool:
        """Whether an object exists at ``path`` (one HEAD). A prefix with objects under it is not one."""
        store, key = self._locate(path)
        try:
            self._attempts("check", path, lambda: obstore.head(store, key), repeat=False)
            return True
        except _not_found_errors():
            return False

    def is_file(self, path: str) -> bool:
        return self.exists(path)

    def list_dir(self, path: str) -> list[str]:
        store, key = self._locate(path)
        # The delimiter listing returns the objects directly under the prefix and the "subdirectories"
        # (common prefixes), i.e. what os.listdir returns, in one paginated request sequence.
        listing = self._attempts("list", path, lambda: obstore.list_with_delimiter(store, key or None), repeat=False)
        names = {p.rsplit("/", 1)[-1] for p in listing["common_prefixes"]}
        names.update(m["path"].rsplit("/", 1)[-1] for m in listing["objects"])
        return sorted(names)

    def write_if_absent(self, path: str, data: bytes) -> bool:
        store, key = self._locate(path)
        policy = self.storage.retry
        maybe_landed = False  # an earlier attempt failed after it may have reached the store
        attempt = 0
        while True:
            try:
                obstore.put(store, key, data, mode="create")
                return True
            except AlreadyExistsError as e:
                if not _is_conflict(e):
                    if not maybe_landed:
                        return False
                    try:  # the object exists: this writer's own, if it holds these bytes
                        return self.read(path) == data
                    except FileNotFoundError:
                        pass  # removed meanwhile: try again
                error: Exception = e
            except GenericError as e:
                maybe_landed = True
                error = e
            if attempt >= policy.operation_retries:
                raise _unavailable("conditional write", path, error, attempt) from error
            attempt += 1
            time.sleep(policy.backoff(attempt))

    def write(self, path: str, data: bytes) -> None:
        store, key = self._locate(path)
        self._attempts("write", path, lambda: obstore.put(store, key, data), repeat=False)

    def remove(self, path: str) -> None:
        store, key = self._locate(path)
        self._attempts("delete", path, lambda: _delete_key(store, key), repeat=True)

    def remove_tree(self, path: str) -> None:
        store, key = self._locate(path)
        keys = [m["path"] for m in self._list(store, key, path)]
        for i in range(0, len(keys), _DELETE_BATCH):
            batch = keys[i : i + _DELETE_BATCH]
            self._attempts("delete under", path, lambda b=batch: _delete_keys(store, b), repeat=True)

    def tree_size(self, path: str) -> int:
        return sum(info.size for info in self.list_prefix(path))

    def stat(self, path: str) -> tuple[int, float]:
        store, key = self._locate(path)
        try:
            meta = self._attempts("check", path, lambda: obstore.head(store, key), repeat=False)
        except _not_found_errors() as e:
            raise FileNotFoundError(errno.ENOENT, "no such object", path) from e
        return int(meta["size"]), meta["last_modified"].timestamp()

    def modified_time(self, path: str) -> float:
        return self.stat(path)[1]

    def newest_modified_time(self, prefix: str) -> float | None:
        return max((info.mtime for info in self.list_prefix(prefix)), default=None)

    def list_prefix(self, prefix: str) -> list[ObjectInfo]:
        store, key = self._locate(prefix)
        skip = len(key) + 1 if key else 0
        out = [ObjectInfo(m["path"][skip:], int(m["size"]), m["last_modified"].timestamp()) for m in self._list(store, key, prefix)]
        return sorted(out)

    def sync(self, paths: list[str], directory: str | None = None) -> None:
        """Nothing to do: an object store acknowledges a PUT only once the object is durably stored."""

    def _list(self, store: Any, key: str, path: str) -> list[dict[str, Any]]:
        """Every object under ``key`` taken as a directory (object_store prefixes match whole path
        segments, so ``t`` never matches ``t_dead_letters/...``)."""
        return self._attempts("list", path, lambda: [meta for batch in obstore.list(store, key or None) for meta in batch], repeat=False)


def _delete_key(store: Any, key: str) -> None:
    try:
        obstore.delete(store, key)
    except _not_found_errors():
        pass  # S3 says nothing about a missing key; other stores raise. Both mean "gone".


def _delete_keys(store: Any, keys: list[str]) -> None:
    try:
        obstore.delete(store, keys)
    except _not_found_errors():
        # Some stores fail a bulk delete when a key went away concurrently (e.g. another GC);
        # one by one, each missing key is simply skipped.
        for k in keys:
            _delete_key(store, k)


#: obstore's "already exists" for S3's 409 ConditionalRequestConflict: another conditional write of the
#: key was in flight; nothing is known about the object yet (412 is the answer for "it exists").
_CONFLICT = re.compile(r"status code: 409\b")


def _is_conflict(exc: BaseException) -> bool:
    return _CONFLICT.search(str(exc)) is not None


def _unavailable(what: str, path: str, exc: BaseException, repeats: int) -> StorageUnavailableError:
    """One line: the operation, the path, the store's reason (its first line, without obstore's debug dump)."""
    reason = " ".join(str(exc).splitlines()[0].split()) if str(exc) else type(exc).__name__
    again = f" (repeated {repeats} time{'s' if repeats != 1 else ''})" if repeats else ""
    return StorageUnavailableError(f"object store failed: {what} {path}{again}: {reason}")


def _not_found_errors() -> tuple[type[BaseException], ...]:
    # obstore raises its NotFoundError from some calls and FileNotFoundError from others.
    return (NotFoundError, FileNotFoundError)


def uri_scheme(uri: str) -> str:
    """The lower-case scheme of a URI; '' for a local path."""
    return uri.split("://", 1)[0].lower() if "://" in uri else ""


def file_io_for(uri: str, storage_options: StorageConfig | Mapping[str, str] | None = None) -> FileIO:
    """The FileIO for a table URI: :class:`LocalFileIO` for local paths and ``file://``,
    :class:`ObjectStoreFileIO` for ``s3://``, ``gs://``, ``az://`` (``abfs[s]://``, ``adl://``) and ``memory://``.

    ``storage_options`` is a resolved :class:`StorageConfig`, or a mapping in Lance's spelling that is
    resolved here over the environment variables (explicit keys win).
    """
    scheme = uri_scheme(normalize_uri(uri))
    if scheme in LOCAL_SCHEMES:
        return LocalFileIO()
    if scheme in OBJECT_STORE_SCHEMES:
        storage = storage_options if isinstance(storage_options, StorageConfig) else StorageConfig.resolve(storage_options)
        return ObjectStoreFileIO(storage)
    raise UnsupportedSchemeError(
        f"memwal cannot store tables at {scheme}:// URIs; use a local path, file://, s3://, gs://, az:// or memory://"
    )
