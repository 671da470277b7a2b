"""Spark Structured Streaming for memwal: the foreachBatch sink and the Kafka source.

>>> from memwal.streaming import MemwalSink, SinkOptions, ingest, local_session
>>> spark = local_session()
>>> job = ingest(spark, bootstrap="127.0.0.1:9092", topic="users", table_uri="/data/users",
...              checkpoint="/data/ckpt/users")
"""

from memwal.streaming.ingest import IngestJob, MemwalProgressListener, ingest, kafka_stream
from memwal.streaming.session import local_session
from memwal.streaming.sink import BatchReport, MemwalSink, SinkOptions

__all__ = [
    "BatchReport",
    "IngestJob",
    "MemwalProgressListener",
    "MemwalSink",
    "SinkOptions",
    "ingest",
    "kafka_stream",
    "local_session",
]
