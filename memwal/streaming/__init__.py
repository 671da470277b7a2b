"""Spark Structured Streaming for memwal: ``ingest``, the ``foreachBatch`` sink and the Kafka source.

>>> from memwal.streaming import MemwalSink, SinkOptions, ingest, local_session
>>> spark = local_session()
>>> job = ingest(spark, bootstrap="127.0.0.1:9092", topic="users", table_uri="/data/users",
...              checkpoint="/data/ckpt/users")

The names below load on first use: a module of this package that Spark's driver-side Python
processes import (the sink's options, for a micro-batch's commit) must not load Lance through it.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "BatchReport": "memwal.streaming.sink",
    "DatabaseSink": "memwal.streaming.database",
    "ingest_database": "memwal.streaming.database",
    "IngestJob": "memwal.streaming.job",
    "MemwalProgressListener": "memwal.streaming.job",
    "MemwalSink": "memwal.streaming.sink",
    "SinkOptions": "memwal.streaming.sink_options",
    "ingest": "memwal.streaming.job",
    "kafka_stream": "memwal.streaming.job",
    "local_session": "memwal.streaming.session",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'memwal.streaming' has no attribute {name!r}")


__all__ = sorted(_LAZY)
