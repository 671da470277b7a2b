"""The write side of memwal: everything that puts records into a table.

- :mod:`~memwal.write.api`: the one write API, ``TableWrite.prepare(batch) -> WriteMessage``
  and ``TableWrite.commit(messages) -> WriteReport``, which every writer calls;
- :mod:`~memwal.write.protocol`: what one shard's records of a batch become and the protocol
  that writes them (``TableWriter``);
- :mod:`~memwal.write.pool`: Lance's shard writers, one per shard, resident (``ShardWriterPool``);
- :mod:`~memwal.write.lease`: who writes a shard until when;
- :mod:`~memwal.write.worker`, :mod:`~memwal.write.process`: a process's writers of its tables,
  and the per-executor writer process that Spark tasks share;
- :mod:`~memwal.write.wire`: records and dead letters between processes (Arrow IPC);
- :mod:`~memwal.write.dead_letters`: the dead-letter table.
"""

from memwal.write.api import ShardWrites, TableWrite, WriteBatch, WriteMessage, WriteReport
from memwal.write.protocol import ShardRecords, ShardWriteResult, TableWriter, WriteMode

__all__ = ["ShardRecords", "ShardWriteResult", "ShardWrites", "TableWrite", "TableWriter", "WriteBatch", "WriteMessage", "WriteMode",
           "WriteReport"]
