"""The storage seam: the few file operations memwal needs beyond what Lance does itself.

Lance reads and writes table data; memwal only lists shard directories, reads small
manifests and WAL entries, writes a shard manifest with put-if-not-exists semantics and
deletes what garbage collection frees. Those operations go through :class:`FileIO` so an
object-store implementation can be added without touching the modules that use it.
"""

from __future__ import annotations

import errno
import os
import shutil
import uuid
from typing import Protocol, runtime_checkable

from memwal.paths import normalize_uri


@runtime_checkable
class FileIO(Protocol):
    """Storage operations memwal performs outside Lance."""

    def read(self, path: str) -> bytes: ...

    def exists(self, path: str) -> bool: ...

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


class LocalFileIO:
    """:class:`FileIO` on a POSIX file system."""

    def read(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def list_dir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except FileNotFoundError:
            return []

    def write_if_absent(self, path: str, data: bytes) -> bool:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            # link() fails when the target exists, so two racing writers cannot both win,
            # and a reader never sees a half-written file.
            os.link(tmp, path)
            return True
        except OSError as e:
            if e.errno == errno.EEXIST:
                return False
            raise
        finally:
            os.unlink(tmp)

    def write(self, path: str, data: bytes) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)

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


def file_io_for(uri: str) -> FileIO:
    """The FileIO for a table URI. Only local paths are supported for now."""
    uri = normalize_uri(uri)
    if "://" in uri:
        scheme = uri.split("://", 1)[0]
        raise NotImplementedError(
            f"memwal supports local tables only for now (got scheme {scheme!r}); "
            "use a local path or file:// URI"
        )
    return LocalFileIO()
