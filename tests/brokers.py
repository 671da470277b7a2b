"""The tests' Kafka broker: Apache Kafka 4 (KRaft, one node) on 127.0.0.1.

A thin layer over :mod:`memwal_dev.local_broker`, which the demo and the benchmarks
use too: the broker's jars come from Maven (``python -m memwal.jvm fetch``, run by ``make
test``); each broker formats its storage in the test's temporary directory and is stopped
by its PID when the test (or the session) ends.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from memwal_dev.local_broker import BrokerError, LocalBroker, Record, free_port, start_local_broker

Broker = LocalBroker

__all__ = ["Broker", "BrokerError", "Record", "free_port", "produce", "start_broker"]


@contextlib.contextmanager
def start_broker(workdir: os.PathLike[str] | str, **kwargs: Any) -> Iterator[LocalBroker]:
    """A broker for the ``with`` block's duration (see :func:`start_local_broker`)."""
    broker = start_local_broker(Path(workdir), **kwargs)
    try:
        yield broker
    finally:
        broker.stop(grace=5.0)


def produce(broker: LocalBroker, topic: str, records: Iterable[Record], **kwargs: Any) -> list[tuple[int, int]]:
    """Produce ``records`` ((key, value, partition) each) in order; their (partition, offset)."""
    return broker.produce(topic, list(records), **kwargs)
