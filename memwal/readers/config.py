"""What a reader does by default: one dataclass, :class:`ReadConfig`, passed to
:func:`memwal.readers.open` (``config=``); every default of the read path lives here."""

from __future__ import annotations

from dataclasses import dataclass

from memwal.core.errors import InvalidArgumentError


@dataclass(frozen=True)
class ReadConfig:
    """A reader's settings. The defaults were chosen by measurement (docs/bench-log/reads.md)."""

    #: Rows per record batch a scan reads and yields at most: with ``scan_sstables_ahead`` and
    #: the largest SSTable (``max_memtable_rows``), what bounds a scan's memory.
    scan_batch_rows: int = 65_536
    #: SSTables a scan reads ahead of the one it yields, on threads.
    scan_sstables_ahead: int = 4
    #: Base batches a scan lets Lance decode while it still reads the SSTables (0: none).
    scan_base_batches_ahead: int = 4
    #: Point lookups: once a base version has had this many lookups that reach the base, its
    #: integer keys are read with their row ids (``BaseKeyMap``, ~25 ms per million rows), and
    #: a lookup takes its row by id: ~0.35 ms instead of ~0.65 ms through the key's index on a
    #: 1M-row base (docs/bench-log/reads.md).
    lookup_key_map_after: int = 32
    #: Point lookups: a base of more live rows than this gets no key map (it holds 16 bytes a
    #: row: 64 MiB at the default); 0 turns key maps off.
    lookup_key_map_max_rows: int = 4_000_000
    #: Vector search: IVF partitions of the base index probed per query. memwal builds
    #: IVF_HNSW_SQ with one partition per 250,000 rows (memwal.core.indexes), so up to 5M rows
    #: every partition is probed; recall then is the graphs' (0.998 on 384-d MiniLM text
    #: embeddings with the refine factor below, docs/bench-log/reads.md).
    vector_nprobes: int = 20
    #: Vector search: the base index's candidates re-ranked with exact distances, per result
    #: (Lance's refine factor): 4 took recall@10 from 0.95 to 0.998 for ~1-2 ms.
    vector_refine_factor: int = 4
    #: Vector search: base candidates fetched per result, so that dropping those an SSTable or
    #: the WAL tail supersedes leaves ``k`` (fetched again, four times as many, if not). 1.5
    #: against 2.0: 15% less latency at k=10 for recall 0.995 against 0.998 (reads.md); with
    #: a tenth of the base rows superseded, 15 candidates leave fewer than 10 once in 500.
    vector_overfetch: float = 1.5
    #: Vector search: SSTables of at most this many rows are scored exactly, from vectors the
    #: reader keeps per snapshot; larger ones are searched through their own index (Lance
    #: builds one per flushed MemTable once the base has a vector index).
    vector_exact_sstable_rows: int = 100_000
    #: Vector search: how the base is searched. "auto" chooses per query from what this reader
    #: measured: exact scoring of a matrix of the base's vectors (kept per base version) when
    #: its measured cost per vector, times the base's live rows, is below the index's measured
    #: latency; "exact" and "index" force one (memwal.readers.vector_search, VectorPlanner).
    vector_plan: str = "auto"
    #: Vector search: a base whose vectors take more than this many bytes is never scored
    #: exactly (the matrix is kept in memory): 256 MiB holds ~170k 384-d vectors.
    vector_exact_max_bytes: int = 256 << 20
    #: Vector search: SSTable rows scored without an index (their newest live rows, per
    #: snapshot) are first scored in a space of this many dimensions when they are at least
    #: ``vector_shortlist_min_rows``, and only the ``vector_shortlist`` nearest by it exactly:
    #: reading 45k 384-d vectors per search cost 3.3 ms of an 8.9 ms search at 178k live
    #: rows. 128 of 384 dimensions with a shortlist of 100 found 0.99 of the exact nearest
    #: of 45k MiniLM embeddings in 1.2 ms against 2.7 ms (docs/bench-log/reads.md). 0 scores
    #: them all exactly.
    vector_shortlist_dims: int = 128
    #: Vector search: see ``vector_shortlist_dims``.
    vector_shortlist_min_rows: int = 20_000
    #: Vector search: candidates of the reduced space re-scored exactly per search (at least ``k``).
    vector_shortlist: int = 100
    #: Vector search: the shortlisted rows are grouped into partitions of about this many rows
    #: (k-means in the reduced space, as an IVF index's), and a search scores the rows of the
    #: ``vector_shortlist_probe`` share of partitions nearest to it (at least 8); 0: no partitions.
    vector_shortlist_partition_rows: int = 2_000
    #: Vector search: see ``vector_shortlist_partition_rows`` (1.0: every partition).
    vector_shortlist_probe: float = 0.1

    def __post_init__(self) -> None:
        if self.vector_plan not in ("auto", "exact", "index"):
            raise InvalidArgumentError(f"vector_plan must be auto, exact or index, got {self.vector_plan!r}")
        if not self.vector_overfetch >= 1.0:
            raise InvalidArgumentError(f"vector_overfetch must be at least 1, got {self.vector_overfetch!r}")
        if isinstance(self.scan_base_batches_ahead, bool) or not isinstance(self.scan_base_batches_ahead, int) or self.scan_base_batches_ahead < 0:
            raise InvalidArgumentError(f"scan_base_batches_ahead must be a non-negative integer, got {self.scan_base_batches_ahead!r}")
        for name in ("lookup_key_map_after", "lookup_key_map_max_rows"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (1 if name == "lookup_key_map_after" else 0):
                raise InvalidArgumentError(f"{name} must be a {'positive' if name == 'lookup_key_map_after' else 'non-negative'} integer, got {v!r}")
        if not 0 < self.vector_shortlist_probe <= 1:
            raise InvalidArgumentError(f"vector_shortlist_probe must be in (0, 1], got {self.vector_shortlist_probe!r}")
        for name in ("vector_shortlist_dims", "vector_shortlist_min_rows", "vector_shortlist_partition_rows"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise InvalidArgumentError(f"{name} must be a non-negative integer, got {v!r}")
        for name in ("scan_batch_rows", "scan_sstables_ahead", "vector_nprobes", "vector_refine_factor", "vector_shortlist"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidArgumentError(f"{name} must be a positive integer, got {v!r}")
