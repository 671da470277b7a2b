"""The freshness probe's reader: a separate (spawned) process that polls a table for the probe
record and reports each new value it sees, with the moment it saw it.

Freshness is "producer send -> visible to a reader in another process": a reader in the
ingesting process could see state that only that process holds (a cached dataset, a writer's
MemTable), and would share its interpreter lock with Spark's driver and the producer. Spawned,
not forked: the parent runs a JVM and threads, which a fork would copy half-way.

The probe's ``val`` is its send time (``time.time()`` in the producer); the reader stamps
``time.time()`` when it first sees a value, so both ends use this machine's one wall clock.
"""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

from memwal.core.runtime import configure_process  # noqa: E402

configure_process()  # Lance's log filter, before Lance is imported

#: How often the reader polls (the resolution of the measurement).
POLL_SECONDS = 0.02

#: What a reader can be: memwal's strong reader (MemTables' WAL entries included), memwal's
#: eventual reader refreshed at every read, or Lance on the base table (the naive sink's).
KINDS = ("strong", "eventual", "lance")


def _probe(kind: str, uri: str, key: int):
    """A callable returning the probe's ``val``, or None while it is not visible."""
    if kind == "lance":
        import lance

        def lance_probe():
            t = lance.dataset(uri).to_table(columns=["val"], filter=f"id = {key}")
            return t.column(0)[0].as_py() if t.num_rows else None

        return lance_probe
    from memwal import readers

    reader = readers.open(uri, consistency="strong") if kind == "strong" else readers.open(uri, refresh_interval_ms=0)

    def memwal_probe():
        r = reader.get(key, columns=["val"])
        return r["val"] if r else None

    return memwal_probe


def watch(kind: str, uri: str, key: int, seen: Any, ready: Any, stop: Any) -> None:
    """The child's loop: put ``(val, seen_at)`` on ``seen`` whenever the probe's value grows,
    until ``stop`` is set. Errors of one read (a table between commits) are a miss, not an end."""
    probe = _probe(kind, uri, key)
    ready.set()
    last = 0.0
    while not stop.is_set():
        try:
            v = probe()
        except Exception:  # noqa: BLE001 - the next poll reads again
            v = None
        now = time.time()
        if v is not None and v > last:
            last = v
            seen.put((v, now))
        time.sleep(POLL_SECONDS)


class ProbeReader:
    """The parent's handle on the reader process: start it, read what it saw, stop it."""

    def __init__(self, kind: str, uri: str, key: int) -> None:
        if kind not in KINDS:
            raise ValueError(f"reader kind {kind!r} is not one of {KINDS}")
        ctx = multiprocessing.get_context("spawn")
        self.seen = ctx.Queue()
        self._ready = ctx.Event()
        self._stop = ctx.Event()
        self.process = ctx.Process(target=watch, args=(kind, uri, key, self.seen, self._ready, self._stop), daemon=True)

    def start(self, timeout: float = 120.0) -> None:
        """Start the process and wait until its reader is open (opening is not freshness)."""
        self.process.start()
        until = time.monotonic() + timeout
        while not self._ready.wait(0.2):
            if not self.process.is_alive() or time.monotonic() > until:
                raise RuntimeError(f"the probe reader did not open within {timeout:.0f}s (exit code {self.process.exitcode})")

    def next(self, timeout: float) -> tuple[float, float] | None:
        """The next ``(val, seen_at)``, or None if none came within ``timeout``."""
        import queue

        try:
            return self.seen.get(timeout=timeout)
        except queue.Empty:
            return None

    def stop(self) -> None:
        self._stop.set()
        self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
