"""Exact vector distances, as Lance defines them (for brute-force search and the WAL tail),
and a shortlist in a reduced space for large sets scored without an index."""

from __future__ import annotations

from dataclasses import dataclass

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
    return rows_at(rows, *nearest(dist, k, among))


def rows_at(rows: pa.Table, picked: np.ndarray, dist: np.ndarray) -> pa.Table:
    """The rows at positions ``picked``, with their distances as ``_distance``."""
    return rows.take(pa.array(picked, pa.int64())).append_column("_distance", pa.array(dist, pa.float32()))


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


@dataclass(frozen=True)
class Projection:
    """An orthonormal basis (``dim`` x ``dims``) of the subspace that holds most of a set of
    vectors' energy (the top eigenvectors of their uncentred second moment), and, optionally,
    k-means centroids of the vectors in that subspace (partitions, as an IVF index has). An
    inner product of two projected vectors is the full one minus the product of their
    residuals, so it ranks candidates well enough for a shortlist that exact distances then
    order.

    A search reads the projected rows (a third of the bytes at 128 of 384 dimensions) of the
    partitions nearest to the query instead of every full row: scoring a large set without an
    index is bound by the memory it reads, not by arithmetic."""

    basis: np.ndarray
    #: (partitions, dims) centroids in the reduced space; None: one partition
    centroids: np.ndarray | None = None
    #: rows of the matrix it was fitted on
    fitted_rows: int = 0
    #: half the centroids' squared norms (squared L2 to a centroid, up to a term of the point's)
    half_norms: np.ndarray | None = None

    @classmethod
    def fit(cls, matrix: np.ndarray, dims: int, partitions: int = 1, sample_rows: int = 8192, seed: int = 0) -> "Projection":
        """The basis, and ``partitions`` centroids, from a sample of ``matrix``'s rows (null
        vectors left out)."""
        rng = np.random.default_rng(seed)
        rows = matrix[~np.isnan(matrix).any(axis=1)]
        if len(rows) > sample_rows:
            rows = rows[rng.choice(len(rows), sample_rows, replace=False)]
        _, vecs = np.linalg.eigh(rows.T.astype(np.float64) @ rows)  # ascending eigenvalues
        basis = np.ascontiguousarray(vecs[:, ::-1][:, :dims], dtype=np.float32)
        if partitions > 1 and len(rows) >= 4 * partitions:
            centroids = _kmeans(rows @ basis, partitions, rng)
            return cls(basis, centroids, len(matrix), _half_norms(centroids))
        return cls(basis, None, len(matrix))

    def apply(self, matrix: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(matrix @ self.basis)


def _half_norms(centroids: np.ndarray) -> np.ndarray:
    return 0.5 * np.einsum("ij,ij->i", centroids, centroids)


def _assign(points: np.ndarray, centroids: np.ndarray, half_norms: np.ndarray | None = None, chunk: int = 65536) -> np.ndarray:
    """Each point's nearest centroid (squared L2), ``chunk`` points at a time to bound memory."""
    if half_norms is None:
        half_norms = _half_norms(centroids)
    out = np.empty(len(points), np.int64)
    for start in range(0, len(points), chunk):
        part = points[start : start + chunk]
        out[start : start + chunk] = np.argmin(half_norms - part @ centroids.T, axis=1)
    return out


def _kmeans(points: np.ndarray, k: int, rng: np.random.Generator, iterations: int = 8) -> np.ndarray:
    """Lloyd's k-means from ``k`` random points (a centroid left empty keeps its place)."""
    centroids = points[rng.choice(len(points), k, replace=False)].astype(np.float32)
    labels = np.arange(k)[:, None]
    for _ in range(iterations):
        onehot = (_assign(points, centroids)[None, :] == labels).astype(np.float32)
        counts = onehot.sum(axis=1)
        moved = counts > 0
        centroids[moved] = (onehot @ points)[moved] / counts[moved, None]
    return np.ascontiguousarray(centroids)


#: A search probes at least this many partitions: with few partitions a share of them leaves
#: out too many neighbours near their borders (recall 0.94 probing 3 of 22, 0.97 probing 5).
MIN_PROBED = 8


@dataclass
class Shortlisted:
    """A matrix scored through its projection: the rows of the partitions nearest to the
    query (all rows without partitions) scored in the reduced space, the ``shortlist``
    nearest by that scored exactly, the ``k`` nearest of the shortlist returned. Its recall
    against exact scoring is the chance that a true neighbour lies in a probed partition and
    ranks among the shortlist (docs/bench-log/reads.md measures it on 384-d text embeddings).

    Invariant: ``reduced[i]`` is the projection of ``matrix[order[i]]``, rows grouped by
    partition, partition ``p`` at ``reduced[offsets[p]:offsets[p + 1]]``."""

    matrix: np.ndarray
    projection: Projection
    reduced: np.ndarray
    order: np.ndarray
    offsets: np.ndarray
    #: the rows' squared norms (l2 and cosine take them exact, only the inner product is approximate)
    norms: np.ndarray

    @classmethod
    def build(cls, matrix: np.ndarray, projection: Projection) -> "Shortlisted":
        reduced = projection.apply(matrix)
        if projection.centroids is None:
            order, offsets = np.arange(len(matrix)), np.array([0, len(matrix)])
        else:
            labels = _assign(np.nan_to_num(reduced), projection.centroids, projection.half_norms)
            order = np.argsort(labels, kind="stable")
            offsets = np.concatenate([[0], np.cumsum(np.bincount(labels, minlength=len(projection.centroids)))])
            reduced = np.ascontiguousarray(reduced[order])
        return cls(matrix, projection, reduced, order, offsets, np.einsum("ij,ij->i", matrix, matrix))

    def _dots(self, qr: np.ndarray, metric: str, probe: float) -> tuple[np.ndarray, np.ndarray]:
        """Positions and reduced inner products of the rows of the ``probe`` share of
        partitions nearest to the query (every row: ``probe`` >= 1 or no partitions)."""
        centroids = self.projection.centroids
        if centroids is None or probe >= 1:
            return self.order, matvec(self.reduced, qr)
        near = matvec(centroids, qr)
        score = (self.projection.half_norms - near) if metric == "l2" else -near
        n = min(len(centroids), max(MIN_PROBED, int(np.ceil(probe * len(centroids)))))
        chosen = np.sort(np.argpartition(score, n - 1)[:n])  # in memory order
        spans = [(self.offsets[p], self.offsets[p + 1]) for p in chosen]
        rows = np.concatenate([self.order[a:b] for a, b in spans])
        dots = np.concatenate([matvec(self.reduced[a:b], qr) for a, b in spans])
        return rows, dots

    def nearest(self, query: np.ndarray, metric: str, k: int, shortlist: int, probe: float = 1.0,
                keep: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """As :func:`nearest` of exact distances, the candidates being the ``shortlist``
        (at least ``k``) nearest by the reduced space among the rows of the ``probe`` share
        of partitions nearest to the query (all partitions if those hold fewer than the
        shortlist of rows ``keep`` allows); only rows ``keep`` (a mask) marks when given."""
        if metric not in METRICS:
            raise MemwalError(f"unknown distance metric {metric!r}; use one of {METRICS}")
        q = query.astype(np.float32)
        qr = q @ self.projection.basis
        size = max(shortlist, k)
        for p in (probe, 1.0) if probe < 1 else (1.0,):
            rows, dots = self._dots(qr, metric, p)
            if keep is not None:
                kept = keep[rows]
                rows, dots = rows[kept], dots[kept]
            if len(rows) >= size:
                break
        norms = self.norms[rows]
        if metric == "l2":
            approx = norms - 2 * dots
        elif metric == "cosine":
            with np.errstate(invalid="ignore", divide="ignore"):
                approx = -dots / np.sqrt(norms)
        else:
            approx = -dots
        approx = np.where(np.isnan(approx), np.inf, approx)
        picked = np.argpartition(approx, size - 1)[:size] if len(approx) > size else np.arange(len(approx))
        picked = picked[np.isfinite(approx[picked])]  # a null vector is never a result
        rows = rows[picked]
        pos, d = nearest(distances(self.matrix[rows], query, metric), k)
        return rows[pos], d
