"""UDF results checkpointed per chunk while a refresh runs, so a rerun reuses them.

A checkpoint is named by a hash of everything its content depends on: the refresh (base
version reflected -> target, full or incremental), the UDF's name and identity (version
and code), and the chunk (first row, row count). Rows are put in a deterministic order
(source row id) before chunking, so a rerun of the same refresh names the same chunks;
a refresh that differs in any of these names different ones and never reads a stale
result. Checkpoints are written atomically (a reader sees a whole result or none) and are
cleared once the refresh has committed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import pyarrow as pa

from memwal.core import paths
from memwal.core.io import FileIO
from memwal.views.layout import CHECKPOINT_DIR


@dataclass(frozen=True)
class ChunkId:
    refresh_key: str
    udf: str
    identity: str
    start: int
    rows: int

    def name(self) -> str:
        text = f"{self.refresh_key}|{self.udf}|{self.identity}|{self.start}|{self.rows}"
        return hashlib.sha256(text.encode()).hexdigest()[:24] + ".arrow"


@dataclass(frozen=True)
class Checkpoints:
    """The checkpoints of one view, on the view's storage."""

    io: FileIO
    view_uri: str

    @property
    def root(self) -> str:
        return paths.join(self.view_uri, CHECKPOINT_DIR)

    def get(self, chunk: ChunkId) -> pa.Array | pa.ChunkedArray | None:
        try:
            data = self.io.read(paths.join(self.root, chunk.name()))
        except FileNotFoundError:
            return None
        with pa.ipc.open_stream(data) as r:
            return r.read_all().column(0)

    def put(self, chunk: ChunkId, result: pa.Array | pa.ChunkedArray) -> None:
        t = pa.table({"v": result})
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, t.schema) as w:
            w.write_table(t)
        self.io.write(paths.join(self.root, chunk.name()), sink.getvalue().to_pybytes())

    def clear(self) -> None:
        self.io.remove_tree(self.root)
