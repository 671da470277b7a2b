"""A least-recently-used cache bounded by bytes, for memwal's caches of immutable files.

Everything memwal caches is immutable once written: a shard manifest version, a base
manifest's MemWAL index, a WAL entry, an SSTable. A cached value therefore never goes
stale; the bound is only about memory, so it is in bytes (an estimate the caller gives per
value), not in entries, which would let a few large SSTables take gigabytes. Each cache is
owned by the object whose lifetime it shares (a manifest store, a WAL reader, a reader),
never by the process.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Generic, Hashable, TypeVar

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
