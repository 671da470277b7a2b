"""Protobuf messages of Lance's MemWAL formats (generated from ``lance_table.proto``)."""

from memwal.proto import lance_table_pb2 as pb

__all__ = ["pb"]
