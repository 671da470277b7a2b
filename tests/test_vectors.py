"""Vector search on real embeddings: recall at the reader's defaults, across base, SSTables
and the WAL tail, on a sample of all-MiniLM-L6-v2 embeddings of real text
(tests/data/minilm_sample.npz, made by bench/embeddings.py --sample; the benchmark holds the
full measurement, docs/bench-log/reads.md)."""

from __future__ import annotations

import os

import lance
import numpy as np
import pyarrow as pa
import pytest

from memwal import IndexConfig, Table, readers
from memwal.core import indexes as indexes_module
from memwal.core.indexes import IndexMaintainer, vector_index_params

SAMPLE = os.path.join(os.path.dirname(__file__), "data", "minilm_sample.npz")
DIM = 384
SCHEMA = pa.schema([("id", pa.int64()), ("kind", pa.string()), ("vec", pa.list_(pa.float32(), DIM))])


def _rows(ids: np.ndarray, vectors: np.ndarray, kind: str) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "kind": [kind] * len(ids),
                     "vec": pa.FixedSizeListArray.from_arrays(pa.array(vectors.astype(np.float32).reshape(-1)), DIM)}, schema=SCHEMA)


@pytest.fixture()
def embedded(table_uri, monkeypatch, request):
    """A table of the sample as a stream leaves it: 70% in the base (with the vector index
    memwal builds, when ``request.param`` says so), 20% new rows, 5% updated (another text's
    vector) and 2% deleted in SSTables, and 1% unflushed in the WAL tail."""
    data = np.load(SAMPLE)
    vectors, queries = data["rows"].astype(np.float32), data["queries"].astype(np.float32)
    n = len(vectors) * 100 // 110  # the rest: updates' and the tail's vectors
    nb, nnew, nupd, ndel = int(0.7 * n), int(0.2 * n), int(0.05 * n), int(0.02 * n)
    if request.param:
        # The sample is smaller than the size from which memwal indexes (bench/read.py measures that size).
        monkeypatch.setattr(indexes_module, "MIN_ROWS_FOR_VECTOR_INDEX", 1_000)
    rng = np.random.default_rng(11)
    t = Table.create(table_uri, SCHEMA, ["id"], "bucket(id, 2)", initial_data=_rows(np.arange(nb), vectors[:nb], "base"),
                     indexes=IndexConfig(vector_column="vec"))
    created = IndexMaintainer(t.state).ensure_indexes()
    assert bool(created) == request.param
    for part in np.array_split(np.arange(nb, nb + nnew), 3):
        t.write(_rows(part, vectors[part], "new"))
        t.flush()
    updated = rng.choice(nb, nupd, replace=False)
    t.write(_rows(updated, vectors[n : n + nupd], "updated"))
    t.delete({"id": rng.choice(np.setdiff1d(np.arange(nb), updated), ndel, replace=False).tolist()})
    t.flush()
    tail = np.arange(n + nupd, len(vectors))
    t.write(_rows(10_000 + tail, vectors[tail], "tail"))  # unflushed: only a strong reader sees them
    yield table_uri, queries
    t.close()


@pytest.mark.parametrize("embedded", [True, False], ids=["indexed", "exact"], indirect=True)
def test_recall_at_10_on_real_embeddings_at_the_defaults(embedded):
    uri, queries = embedded
    r = readers.open(uri, consistency="strong")
    assert r.snapshot.num_live_sstables > 0
    live = r.scan(columns=["id", "vec"])
    ids = live.column("id").to_numpy()
    mat = live.column("vec").combine_chunks().flatten().to_numpy().reshape(-1, DIM)
    recall, kinds = [], set()
    for q in queries:
        want = set(ids[np.argsort(((mat - q) ** 2).sum(1))[:10]].tolist())
        found = r.search(q, k=10, columns=["id", "kind"])
        assert found.column_names == ["id", "kind", "_distance"]
        got = found.column("id").to_pylist()
        assert len(got) == 10 == len(set(got))  # only live rows, each once
        recall.append(len(set(got) & want) / 10)
        kinds.update(found.column("kind").to_pylist())
    assert np.mean(recall) >= 0.95
    assert {"base", "new", "updated"} <= kinds  # the nearest come from every level
    desc = lance.dataset(uri).describe_indices()
    index_types = {d.index_type for d in desc if "Vector" in d.type_url}
    assert index_types in (set(), {vector_index_params(10**6)["index_type"]})


@pytest.mark.parametrize("embedded", [True], ids=["indexed"], indirect=True)
def test_each_plan_of_the_base_returns_the_exact_top_k_up_to_the_index_recall(embedded):
    """The base read exactly (a matrix of its vectors, superseded rows masked) returns what exact
    scoring over the live rows returns, with and without a filter; through the index, the same
    up to its recall; ``auto`` measures both and keeps choosing one of them."""
    from memwal.readers import ReadConfig

    uri, queries = embedded
    readers_by_plan = {plan: readers.open(uri, consistency="strong", config=ReadConfig(vector_plan=plan))
                       for plan in ("exact", "index", "auto")}
    live = readers_by_plan["exact"].scan(columns=["id", "kind", "vec"])
    ids = live.column("id").to_numpy()
    base = np.array([k == "base" for k in live.column("kind").to_pylist()])
    mat = live.column("vec").combine_chunks().flatten().to_numpy().reshape(-1, DIM)
    recall: dict[str, list[float]] = {plan: [] for plan in readers_by_plan}
    for q in queries[:40]:
        d = ((mat - q) ** 2).sum(1)
        for where, rows in ((None, np.arange(len(ids))), ("kind = 'base'", np.flatnonzero(base))):
            want = ids[rows[np.argsort(d[rows], kind="stable")[:10]]].tolist()
            for plan, r in readers_by_plan.items():
                found = r.search(q, k=10, columns=["id", "kind"], where=where)
                got = found.column("id").to_pylist()
                assert len(got) == len(set(got)) == 10
                if where:
                    assert set(found.column("kind").to_pylist()) == {"base"}
                if plan == "exact":
                    assert set(got) == set(want), where  # the exact plan's answer is exact
                    assert np.all(np.diff(found.column("_distance").to_numpy()) >= 0)
                recall[plan].append(len(set(got) & set(want)) / 10)
    assert min(np.mean(v) for v in recall.values()) >= 0.95
    chosen = readers_by_plan["auto"]._vectors.planner.chosen
    assert chosen["exact"] > 0 and chosen["index"] > 0  # both measured


@pytest.mark.parametrize("embedded", [True], ids=["indexed"], indirect=True)
@pytest.mark.parametrize("partition_rows", [0, 40], ids=["one partition", "partitions"])
def test_sstable_rows_scored_through_a_shortlist_are_the_exact_nearest_up_to_its_recall(embedded, partition_rows):
    """Many SSTable rows are scored in a reduced space first (the rows of the partitions
    nearest to the query) and the shortlist of the nearest by it exactly: with every row on
    the shortlist the answer is exact scoring's, for each metric and with a filter; with a
    short one and a third of the partitions probed, the same up to its recall."""
    from memwal.readers import ReadConfig

    uri, queries = embedded
    base = dict(vector_plan="exact", vector_shortlist_min_rows=1, vector_shortlist_dims=48,
                vector_shortlist_partition_rows=partition_rows)
    whole = readers.open(uri, consistency="strong", config=ReadConfig(**base, vector_shortlist=10**6, vector_shortlist_probe=1.0))
    short = readers.open(uri, consistency="strong", config=ReadConfig(**base, vector_shortlist=30, vector_shortlist_probe=0.34))
    live = whole.scan(columns=["id", "kind", "vec"])
    ids = live.column("id").to_numpy()
    mat = live.column("vec").combine_chunks().flatten().to_numpy().reshape(-1, DIM).astype(np.float64)
    base_rows = np.array([k == "base" for k in live.column("kind").to_pylist()])
    norms = np.linalg.norm(mat, axis=1)
    recall = []
    for q in queries[:25]:
        q64 = q.astype(np.float64)
        model = {"l2": ((mat - q64) ** 2).sum(1), "cosine": 1 - mat @ q64 / (norms * np.linalg.norm(q64)), "dot": 1 - mat @ q64}
        for metric, d in model.items():
            for where, rows in ((None, np.arange(len(ids))), ("kind <> 'base'", np.flatnonzero(~base_rows))):
                want = set(ids[rows[np.argsort(d[rows], kind="stable")[:10]]].tolist())
                got = whole.search(q, k=10, columns=["id"], metric=metric, where=where).column("id").to_pylist()
                assert set(got) == want, (metric, where)
                found = short.search(q, k=10, columns=["id", "kind"], metric=metric, where=where)
                assert len(set(found.column("id").to_pylist())) == 10
                if where:
                    assert "base" not in found.column("kind").to_pylist()
                recall.append(len(set(found.column("id").to_pylist()) & want) / 10)
    assert np.mean(recall) >= 0.9
    used = [d.shortlisted for d in short._vectors._deltas.values() if d.shortlisted is not None]
    assert used and used[0].reduced.shape[1] == 48  # the shortlist was taken, in 48 dimensions
    assert (used[0].projection.centroids is not None) == bool(partition_rows)
