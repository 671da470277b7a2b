"""Exact vector distances, as Lance defines them (for brute-force search and the WAL tail)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from memwal.core.errors import MemwalError

METRICS = ("l2", "cosine", "dot")


def as_matrix(col: pa.ChunkedArray | pa.Array, dim: int) -> np.ndarray:
    """A fixed-size-list (or list) column as an (n, dim) float32 matrix (nulls -> NaN rows)."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    n = len(arr)
    if n == 0:
        return np.zeros((0, dim), np.float32)
    out = np.full((n, dim), np.nan, np.float32)
    valid = ~np.asarray(arr.is_null()) if arr.null_count else np.ones(n, bool)
    if valid.any():
        flat = arr.filter(pa.array(valid)).flatten().to_numpy(zero_copy_only=False).astype(np.float32)
        out[valid] = flat.reshape(-1, dim)
    return out


def matvec(matrix: np.ndarray, vector: np.ndarray) -> np.ndarray:
    """``matrix @ vector`` on the calling thread. NumPy's ``@`` hands a matrix-vector product
    to OpenBLAS's thread pool, whose threads spin for a core: 13.7 ms against 0.3 ms
    single-threaded for 4,700 x 384 with other work on the machine (docs/bench-log/reads.md);
    ``einsum`` keeps it on this thread, as a reader serving concurrent searches wants."""
    return np.einsum("ij,j->i", matrix, vector)


def distances(matrix: np.ndarray, query: np.ndarray, metric: str) -> np.ndarray:
    """Lance's distances: squared Euclidean (``l2``), ``1 - cosine similarity``, ``1 - dot``."""
    q = query.astype(np.float32)
    if metric == "l2":
        diff = matrix - q
        return np.einsum("ij,ij->i", diff, diff)
    if metric == "cosine":
        norms = np.linalg.norm(matrix, axis=1) * np.linalg.norm(q)
        with np.errstate(invalid="ignore", divide="ignore"):
            return 1.0 - matvec(matrix, q) / norms
    if metric == "dot":
        return 1.0 - matvec(matrix, q)
    raise MemwalError(f"unknown distance metric {metric!r}; use one of {METRICS}")


def vector_columns(schema: pa.Schema) -> list[str]:
    """Columns that hold float vectors (fixed-size lists of floats)."""
    return [
        f.name
        for f in schema
        if pa.types.is_fixed_size_list(f.type) and pa.types.is_floating(f.type.value_type)
    ]


def top_k(rows: pa.Table, dist: np.ndarray, k: int, among: np.ndarray | None = None) -> pa.Table:
    """The ``k`` rows of ``rows`` nearest by ``dist`` (NaN last), nearest first, with
    ``_distance``; only rows at the positions ``among`` (sorted) when given, so a caller with
    a mask takes k rows instead of copying every kept one first."""
    picked, d = nearest(dist, k, among)
    return rows.take(pa.array(picked, pa.int64())).append_column("_distance", pa.array(d, pa.float32()))


def nearest(dist: np.ndarray, k: int, among: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The positions of the ``k`` nearest by ``dist`` (NaN last), nearest first, and their
    distances; only among the positions ``among`` (sorted) when given."""
    if among is not None:
        dist = dist[among]
    if len(dist) == 0:
        return np.zeros(0, np.int64), dist
    d = np.where(np.isnan(dist), np.inf, dist)
    order = np.argpartition(d, k - 1)[:k] if len(d) > k else np.arange(len(d))
    order = order[np.argsort(d[order], kind="stable")]
    return (order if among is None else among[order]), dist[order]
