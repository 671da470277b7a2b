"""The view refresh lease on FileIO: one holder at a time, safe takeover of an expired lease."""

from __future__ import annotations

import threading

import pytest

from memwal.core.errors import MemwalError
from memwal.core.io import LocalFileIO
from memwal.views.errors import ViewBusyError
from memwal.views.lease import Lease


def test_a_held_lease_refuses_a_second_refresher(tmp_path):
    io, root = LocalFileIO(), str(tmp_path / "lease")
    with Lease(io, root, 60):
        with pytest.raises(ViewBusyError):
            Lease(io, root, 60).acquire()
    with Lease(io, root, 60) as again:  # released: free to take
        again.check()
    assert issubclass(ViewBusyError, MemwalError)


def test_an_expired_lease_is_taken_over_and_its_old_holder_cannot_commit(tmp_path):
    io, root = LocalFileIO(), str(tmp_path / "lease")
    old = Lease(io, root, -1)  # expired as soon as it is taken
    old.acquire()
    new = Lease(io, root, 60)
    new.acquire()
    new.check()
    with pytest.raises(ViewBusyError):
        old.check()  # the old holder finds out before it commits
    new.release()


def test_racing_refreshers_never_hold_the_lease_together(tmp_path):
    io, root = LocalFileIO(), str(tmp_path / "lease")
    holders: list[int] = []
    overlaps: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(8)

    def refresher(i: int) -> None:
        start.wait()
        for _ in range(20):
            try:
                with Lease(io, root, 60) as lease:
                    with lock:
                        holders.append(i)
                        if len(holders) > 1:
                            overlaps.append(i)
                    lease.check()
                    with lock:
                        holders.remove(i)
            except ViewBusyError:
                continue

    threads = [threading.Thread(target=refresher, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == []
