"""memwal's caches of immutable files: a least-recently-used cache bounded by bytes, and the
Lance session (Lance's own index and metadata caches) a table handle opens its base with.

Everything memwal caches is immutable once written: a shard manifest version, a base
manifest's MemWAL index, a WAL entry, an SSTable. A cached value therefore never goes
stale; the bound is only about memory, so it is in bytes (an estimate the caller gives per
value), not in entries, which would let a few large SSTables take gigabytes. Each cache is
owned by the object whose lifetime it shares (a manifest store, a WAL reader, a reader, a
table handle), never by the process.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Callable, Generic, Hashable, TypeVar

import lance

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class ByteLRU(Generic[K, V]):
    """Thread-safe LRU map whose entries' sizes add up to at most ``max_bytes``.

    The newest entry is kept even if it alone exceeds the bound, so a caller always gets
    back what it just loaded.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def bytes_held(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> V | None:
        with self._lock:
            hit = self._entries.get(key)
            if hit is None:
                return None
            self._entries.move_to_end(key)
            return hit[0]

    def __contains__(self, key: K) -> bool:
        with self._lock:
            return key in self._entries

    def put(self, key: K, value: V, nbytes: int) -> V:
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._entries[key] = (value, nbytes)
            self._bytes += nbytes
            while self._bytes > self.max_bytes and len(self._entries) > 1:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._bytes -= dropped
        return value

    def get_or_load(self, key: K, load: Callable[[], V], size: Callable[[V], int]) -> V:
        """The cached value, or ``load()``'s (cached); loads run outside the lock, so loads
        of different keys overlap (two loads of one key may both run; both give the same)."""
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                self._entries.move_to_end(key)
                return hit[0]
        value = load()
        return self.put(key, value, size(value))

    def discard_where(self, predicate: Callable[[K], bool]) -> None:
        """Drop the entries whose key matches (e.g. WAL entries a flush has covered)."""
        with self._lock:
            for key in [k for k in self._entries if predicate(k)]:
                self._bytes -= self._entries.pop(key)[1]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0


class LanceCaches:
    """Lance's index and file-metadata caches (a ``lance.Session``), shared by every base
    dataset one table handle opens, and renewed whole once they outgrow a bound.

    Without a session each ``lance.dataset`` call starts cold, and memwal opens the base anew
    for every reader refresh, compaction commit and index catch-up: a compaction
    ``merge_insert`` of 25k rows into a 19M-row base reloads the primary-key index and file
    metadata it touches, 1.22 s per commit cold against 0.45 s warm (docs/bench-log/soak.md,
    "Soak"). Lance caches immutable files keyed by file and index ids, so a session shared
    across versions never serves stale data.

    Why renew instead of letting Lance evict: every index catch-up replaces segments, and the
    replaced ones stay cached. Lance's cache admits entries by frequency (moka's TinyLFU), so
    once it is full a new, live segment (seen once) can lose to an old, replaced one (seen
    often). A 512 MiB cache ran the soak hour slower than no cache, likely for this reason;
    a 2 GiB one grew the processes to 3.1-3.6 GB. So the capacity is twice ``renew_bytes``
    and not reached in practice: once what the session holds passes ``renew_bytes``, the next
    open starts a new session, which again holds only what is live.

    The size is checked at most every ``check_seconds``: Lance walks the whole cache to
    measure it (1.1 ms at 361 MiB), and a reader opens the base on every refresh.

    Invariant: the current session exceeds ``renew_bytes`` by at most what was loaded in one
    check interval; a replaced session lives only as long as the datasets opened with it. A
    base whose working set exceeds ``renew_bytes`` renews often and degrades to cold caches,
    never to a thrashing cache.
    """

    def __init__(self, renew_bytes: int = 768 << 20, metadata_bytes: int = 64 << 20, check_seconds: float = 5.0) -> None:
        self.renew_bytes = renew_bytes
        self.metadata_bytes = metadata_bytes
        self.check_seconds = check_seconds
        self.renewals = 0
        self._session: lance.Session | None = None
        self._checked_at = 0.0
        self._lock = threading.Lock()

    def session(self) -> lance.Session:
        """The session to open a dataset with: the current one, or a new one if it is full."""
        with self._lock:
            now = time.monotonic()
            if self._session is not None and now - self._checked_at >= self.check_seconds:
                self._checked_at = now
                if self._session.size_bytes() > self.renew_bytes:
                    self._session = None
                    self.renewals += 1
            if self._session is None:
                self._session = lance.Session(
                    index_cache_size_bytes=2 * self.renew_bytes, metadata_cache_size_bytes=self.metadata_bytes
                )
            return self._session

    def size_bytes(self) -> int:
        """What the current session holds (0 before the first open)."""
        with self._lock:
            return self._session.size_bytes() if self._session is not None else 0
