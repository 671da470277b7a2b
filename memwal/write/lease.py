"""Writer leases: who writes a shard, until when.

Each open writer holds a *lease* on its shard, ``{table}/_memwal/writers/{shard}.json``
(owner ``host:pid:token``, expiry), written when it claims the shard and renewed by its writes
at most every ``renew_seconds``; flushing or closing the writer ends it. Maintenance's
stranded-write flush skips a shard whose lease is live: the writer is alive, merely idle, and
fencing it would only make it reopen (and, with short settings, fight maintenance over the
shard). A writer whose process died stops renewing, so its lease expires after
``lease_seconds`` and its writes are flushed; until then eventual readers do not see them.
Sooner when the lease names a process of this host that is gone (:meth:`WriterLease.holder_gone`),
or when an operator ends the lease (:meth:`ShardWriterPool.break_lease`, ``memwal maintain
--break-lease``). The lease is advisory (Lance's epochs still decide who owns a shard), so
ending the lease of a writer that is alive after all costs it one reopen, never a write; it
also tells a fenced writer who claimed the shard last.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from dataclasses import dataclass


def owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def owner_process(owner: str) -> tuple[str | None, int | None]:
    """(host, pid) named by a lease owner ``host:pid:token`` (maintenance's read "maintenance host:pid:token")."""
    parts = owner.rsplit(" ", 1)[-1].rsplit(":", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        return None, None
    return parts[0], int(parts[1])


@dataclass(frozen=True)
class WriterLease:
    """Who writes a shard, until when (seconds since the epoch). Live while ``expires_at`` is ahead."""

    owner: str
    expires_at: float

    def live(self, now: float | None = None) -> bool:
        return self.expires_at > (time.time() if now is None else now)

    def holder_gone(self) -> bool:
        """True if the lease names a process of this host that no longer runs (or is a zombie).

        Only ever True for this host's processes: elsewhere nothing is known, and the lease
        runs out. A reused pid looks alive (the lease then runs out too). A writer on another
        host with this host's name, in another pid namespace, may be taken for gone: it is
        fenced by the flush and reopens, which costs it a claim and loses nothing.
        """
        host, pid = owner_process(self.owner)
        if host != socket.gethostname() or pid is None:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False  # another user's live process
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:  # a killed child its parent has not reaped
                return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
        except (OSError, IndexError):
            return False

    def to_json(self) -> bytes:
        return json.dumps({"owner": self.owner, "expires_at": self.expires_at}).encode()

    @classmethod
    def from_json(cls, data: bytes) -> "WriterLease | None":
        try:
            d = json.loads(data)
            return cls(str(d["owner"]), float(d["expires_at"]))
        except (ValueError, KeyError, TypeError):
            return None  # advisory: an unreadable lease is no lease
