"""The refresh lease: at most one refresh of a view computes and commits at a time.

The lease is a sequence of numbered objects in the view's lease directory, on the
table's :class:`~memwal.core.io.FileIO`. Each holds its owner (host, process, a random token)
and when it expires; the highest-numbered one is the lease. To take the lease, a refresher
reads the highest, and if it is free (released, expired, or held by a process of this host
that no longer exists) creates the next number with create-if-absent.

Invariant: at most one refresher holds the lease at any time. Creating a number is atomic
and succeeds for one creator only, so two refreshers that both found the lease free cannot
both win the same number; and a winner whose number is not the highest (it read a number
that was already superseded and cleaned up) withdraws. A free lease is never deleted, it
is *marked* released, so the highest number only ever grows. Taking over an expired lease
is safe for the same reason: the old holder finds, before it commits, that its number is
no longer the highest (:meth:`Lease.check`) and gives up.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from dataclasses import asdict, dataclass

from memwal.core import paths
from memwal.core.io import FileIO
from memwal.views.errors import ViewBusyError

_SUFFIX = ".json"
_RELEASED = ".released"


@dataclass(frozen=True)
class LeaseRecord:
    """Who holds the lease, and until when."""

    host: str
    pid: int
    token: str
    at: float
    expires_at: float

    def free(self, now: float) -> bool:
        """True if the holder can no longer be relied on to hold it: it expired, or its
        process (on this host) is gone."""
        if now > self.expires_at:
            return True
        if self.host == socket.gethostname():
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return True
            except PermissionError:
                return False
        return False


class Lease:
    """The lease of ``root`` (a directory), held for at most ``seconds`` per acquisition.
    Use as a context manager; raises :class:`ViewBusyError` if another refresher holds it."""

    def __init__(self, io: FileIO, root: str, seconds: float, what: str = "the view") -> None:
        self.io = io
        self.root = root
        self.seconds = seconds
        self.what = what
        self.epoch: int | None = None

    def _path(self, epoch: int, suffix: str = _SUFFIX) -> str:
        return paths.join(self.root, f"{epoch:020d}{suffix}")

    def _epochs(self) -> tuple[list[int], set[int]]:
        """(lease numbers ascending, numbers marked released)."""
        held, released = [], set()
        for name in self.io.list_dir(self.root):
            stem, _, suffix = name.partition(".")
            if stem.isdigit() and f".{suffix}" == _SUFFIX:
                held.append(int(stem))
            elif stem.isdigit() and f".{suffix}" == _RELEASED:
                released.add(int(stem))
        return sorted(held), released

    def _holder(self, epoch: int) -> LeaseRecord | None:
        """The record of lease ``epoch``; None if it cannot be read (a holder that wrote an
        unreadable record is not relied on either)."""
        try:
            return LeaseRecord(**json.loads(self.io.read(self._path(epoch))))
        except FileNotFoundError:
            raise
        except (OSError, ValueError, TypeError):
            return None

    def acquire(self) -> None:
        for _ in range(3):
            epochs, released = self._epochs()
            top = epochs[-1] if epochs else 0
            if top and top not in released:
                try:
                    holder = self._holder(top)
                except FileNotFoundError:
                    continue  # cleaned up under us: look again
                if holder is not None and not holder.free(time.time()):
                    raise ViewBusyError(
                        f"another refresh of {self.what} holds its lease (pid {holder.pid} on {holder.host}, "
                        f"for {max(0.0, holder.expires_at - time.time()):.0f}s more); rerun when it has finished"
                    )
            now = time.time()
            record = LeaseRecord(socket.gethostname(), os.getpid(), uuid.uuid4().hex, now, now + self.seconds)
            if not self.io.write_if_absent(self._path(top + 1), json.dumps(asdict(record)).encode()):
                continue  # another refresher took this number first: look at it
            self.epoch = top + 1
            if not self._is_highest():
                self.release()
                break
            for old in epochs:
                self.io.remove(self._path(old, _RELEASED))
                self.io.remove(self._path(old))
            return
        raise ViewBusyError(f"another refresh of {self.what} took its lease at the same time; rerun the refresh")

    def _is_highest(self) -> bool:
        epochs, _ = self._epochs()
        return bool(epochs) and epochs[-1] == self.epoch

    def check(self) -> None:
        """Raise :class:`ViewBusyError` if the lease was taken over (it expired while held)."""
        if self.epoch is None or not self._is_highest():
            raise ViewBusyError(f"the refresh lease of {self.what} expired and was taken over; rerun the refresh")

    def release(self) -> None:
        if self.epoch is not None:
            self.io.write(self._path(self.epoch, _RELEASED), b"")
            self.epoch = None

    def __enter__(self) -> "Lease":
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
