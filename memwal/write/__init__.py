"""The write side of memwal: everything that puts records into a table.

- :mod:`~memwal.write.api`: the one write API, ``TableWrite.prepare(batch) -> WriteMessage``
  and ``TableWrite.commit(messages) -> WriteReport``, which every writer calls;
- :mod:`~memwal.write.messages`: its plain records (write mode, shard results, messages, the
  report) and the payloads between processes, importable without loading Lance;
- :mod:`~memwal.write.protocol`: what one shard's records of a batch become and the protocol
  that writes them (``TableWriter``);
- :mod:`~memwal.write.pool`: Lance's shard writers, one per shard, resident (``ShardWriterPool``);
- :mod:`~memwal.write.lease`: who writes a shard until when;
- :mod:`~memwal.write.worker`, :mod:`~memwal.write.process`: a process's writers of its tables,
  and the per-executor writer process that Spark tasks share;
- :mod:`~memwal.write.wire`: routed records between processes (Arrow IPC);
- :mod:`~memwal.write.dead_letters`: the dead-letter table.

The names below load on first use: importing ``memwal.write.messages`` (a Spark driver's
commit does) must not load Lance through this package.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "ShardRecords": "memwal.write.protocol",
    "TableWriter": "memwal.write.protocol",
    "ShardWrites": "memwal.write.api",
    "TableWrite": "memwal.write.api",
    "WriteBatch": "memwal.write.api",
    "ShardWriteResult": "memwal.write.messages",
    "WriteMessage": "memwal.write.messages",
    "WriteMode": "memwal.write.messages",
    "WriteReport": "memwal.write.messages",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'memwal.write' has no attribute {name!r}")


__all__ = sorted(_LAZY)
