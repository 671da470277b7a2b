"""The errors views raise."""

from __future__ import annotations

from memwal.core.errors import ConcurrencyError, MemwalError


class ViewError(MemwalError):
    """A view cannot be created, refreshed or read as asked."""


class ViewBusyError(ViewError, ConcurrencyError):
    """A concurrency conflict: another refresh of the view holds its lease, or committed
    to the view while this one was computing. Rerunning the refresh later resolves it."""
