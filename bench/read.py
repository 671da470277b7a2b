"""Read benchmark: memwal's reader against plain Lance, in one run.

1. point lookups p50/p99 on a ``--base-rows`` table with 0, 10 and 100 uncompacted SSTables
   (one shard, so a lookup sees all of them), against a plain Lance table with a BTREE on
   the key and no MemWAL; and ``get_many`` of 1,000 keys against plain Lance's filter
   (``id IN (...)``) and ``take`` of 1,000 rows;
2. full deduplicated scan rows/s, same tables (median of 5 scans by fresh readers; the
   ratio to memwal's own compacted table, 0 SSTables, is the "scans stay fast" target);
3. vector search on real embeddings (bench/embeddings.py: docstring paragraphs embedded
   with all-MiniLM-L6-v2, 384-d): ``--vector-rows`` rows, 70% in the base with the index
   memwal builds, 20% new rows, 5% updated and 2% deleted in SSTables, a few unflushed
   writes in the WAL tail (a strong reader); ``--queries`` held-out queries; recall@10
   against exact search over the live rows, p50 against plain Lance with the same index
   on the same live rows compacted, and against exact search in NumPy. More rows than the data
   set holds (``--vector-rows 200000``) are synthesized from the real vectors: row ``i`` is
   real vector ``i mod n`` plus Gaussian noise (sigma 0.02 per dimension, ~0.4 in norm against
   unit vectors, so a copy is nearer its source than to other texts but never equal), scaled
   back to unit length; the queries stay real held-out vectors.

Run: ``python bench/read.py`` (needs the ``bench`` extra for part 3's data set, made and
cached on the first run).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from memwal.core.runtime import configure_process  # noqa: E402

configure_process()  # Lance's log filter, before Lance is imported

import lance  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import DIM, SCHEMA, base_rows, git_rev, machine, pct, report, today, work_dir  # noqa: E402

from memwal import Bounds, Table, WriterConfig, readers  # noqa: E402


def update_rows(rng: np.random.Generator, ids: np.ndarray) -> pa.Table:
    n = len(ids)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "val": pa.array(rng.random(n)),
            "name": pa.array([f"name-{i:012d}-upd" for i in ids]),
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(rng.random(n * DIM, dtype=np.float32)), DIM),
        },
        schema=SCHEMA,
    )


def add_sstables(table: Table, count: int, rows_each: int, base: int, rng: np.random.Generator) -> None:
    """``count`` flushes of ``rows_each`` rows (half updates, half new ids): one SSTable each."""
    for i in range(count):
        ids = np.concatenate([rng.choice(base, rows_each // 2, replace=False), base + i * rows_each + np.arange(rows_each // 2)])
        table.write(update_rows(rng, ids))
        table.flush()


def time_calls(fn, args: list) -> list[float]:
    out = []
    for a in args:
        t0 = time.perf_counter()
        fn(a)
        out.append(time.perf_counter() - t0)
    return out


def scan_rate(uri: str, plain: bool = False, runs: int = 5) -> dict[str, float]:
    """Live rows/s of a full scan of three columns, medians of ``runs`` scans: by fresh
    readers (SSTables opened and read as a new reader would; the OS page cache is warm for
    every table alike), in wall-clock time and in the process's CPU time (every thread's:
    on a machine shared with other work CPU time is the steadier measure of the work), and
    by one long-lived reader (its SSTable cache warm, as a serving process's is)."""
    wall, cpu, warm = [], [], []

    def one(reader) -> int:
        if plain:
            return lance.dataset(uri).to_table(columns=["id", "val", "name"]).num_rows
        return reader.scan(columns=["id", "val", "name"]).num_rows

    kept = None if plain else readers.open(uri, refresh_interval_ms=None)
    for _ in range(runs):
        t0, c0 = time.perf_counter(), time.process_time()
        rows = one(None if plain else readers.open(uri, refresh_interval_ms=None))
        wall.append(rows / (time.perf_counter() - t0))
        cpu.append(rows / (time.process_time() - c0))
        t0 = time.perf_counter()
        one(kept)
        warm.append(rows / (time.perf_counter() - t0))
    return {"fresh": pct(wall, 50), "fresh_cpu": pct(cpu, 50), "warm": pct(warm, 50)}


def get_many_ms(reader, plain, base_rows: int, rng: np.random.Generator, calls: int = 15) -> dict[str, float]:
    """p50 ms of reading 1,000 random keys: memwal's get_many, plain Lance's filter and take."""
    out: dict[str, list[float]] = {"memwal": [], "plain_in": [], "plain_take": []}
    cols = ["id", "val", "name"]
    for _ in range(calls):
        keys = np.sort(rng.choice(base_rows, 1000, replace=False))
        for name, fn in (("memwal", lambda k=keys: reader.get_many(k.tolist(), columns=cols)),
                         ("plain_in", lambda k=keys: plain.to_table(columns=cols, filter=f"id IN ({', '.join(map(str, k))})")),
                         ("plain_take", lambda k=keys: plain.take(k, columns=cols))):
            t0 = time.perf_counter()
            fn()
            out[name].append(time.perf_counter() - t0)
    return {k: pct(v, 50) * 1000 for k, v in out.items()}


def vector_search(work: str, rows: int, queries: int) -> dict:
    """Part 3: recall@10 and p50 of memwal's search at its defaults against plain Lance with the
    same index on the same live rows compacted, and exact NumPy, on real embeddings."""
    import embeddings

    from memwal import IndexConfig
    from memwal.core.indexes import IndexMaintainer, vector_index_params
    from memwal.readers import ReadConfig

    data = embeddings.load()
    real = embeddings.vectors(data)
    rng = np.random.default_rng(1)
    qs = real[len(real) - queries:]  # held out: in no table
    pool = real[: len(real) - queries]
    need = rows + rows // 10
    if need <= len(pool):
        vecs, texts = pool, data.column("text")
    else:  # synthesized from the real ones, as the module says
        source = np.arange(need) % len(pool)
        noisy = pool[source] + rng.normal(0, 0.02, (need, pool.shape[1])).astype(np.float32)
        vecs = noisy / np.linalg.norm(noisy, axis=1, keepdims=True)
        texts = data.column("text").take(pa.array(source))
        print(f"{need:,} vectors: {len(pool):,} real ones and copies of them with noise (sigma 0.02)")
    schema = pa.schema([("id", pa.int64()), ("text", pa.string()), ("vec", pa.list_(pa.float32(), embeddings.DIM))])

    def table(ids: np.ndarray, source: np.ndarray) -> pa.Table:
        return pa.table({"id": pa.array(ids, pa.int64()), "text": texts.take(pa.array(source)),
                         "vec": pa.FixedSizeListArray.from_arrays(pa.array(vecs[source].reshape(-1)), embeddings.DIM)}, schema=schema)

    nb, nnew, nupd, ndel = int(0.7 * rows), int(0.2 * rows), int(0.05 * rows), int(0.02 * rows)
    uri = os.path.join(work, "embeddings")
    t = Table.create(uri, schema, ["id"], "bucket(id, 4)", initial_data=table(np.arange(nb), np.arange(nb)),
                     indexes=IndexConfig(vector_column="vec"), bounds=Bounds.unbounded())
    t0 = time.perf_counter()
    IndexMaintainer(t.state).ensure_indexes()
    build = time.perf_counter() - t0
    for part in np.array_split(np.arange(nb, nb + nnew), 4):  # new rows: four flushes
        t.write(table(part, part))
        t.flush()
    updated = rng.choice(nb, nupd, replace=False)
    t.write(table(updated, np.arange(nb + nnew, nb + nnew + nupd)))  # another text's vector
    t.delete({"id": rng.choice(np.setdiff1d(np.arange(nb), updated), ndel, replace=False).tolist()})
    t.flush()
    tail = np.arange(nb + nnew + nupd, nb + nnew + nupd + rows // 100)  # unflushed: the WAL tail
    t.write(table(np.arange(10**9, 10**9 + len(tail)), tail))
    r = readers.open(uri, consistency="strong")
    live = r.scan(columns=["id", "vec"])
    ids = live.column("id").to_numpy()
    mat = embeddings.vectors(live)
    truth = [set(ids[np.argsort(((mat - q) ** 2).sum(1))[:10]].tolist()) for q in qs]
    cfg = ReadConfig()
    params = vector_index_params(len(ids))
    plain_uri = os.path.join(work, "embeddings-plain")
    lance.write_dataset(live, plain_uri)
    lance.dataset(plain_uri).create_index("vec", **params)
    plain = lance.dataset(plain_uri)

    def measure(fns: dict) -> dict[str, dict[str, float]]:
        # Interleaved, query by query: on a shared machine the load moves within a run, and
        # variants measured one after the other each got a different share of it.
        # The order rotates query by query: a variant run right after NumPy's exact search
        # (hundreds of MB of temporaries) finds the caches cold, and a fixed order gave that
        # to memwal on every query (9.6 ms against 4.0 ms measured alone, reads.md).
        lat: dict[str, list[float]] = {name: [] for name in fns}
        recall: dict[str, list[float]] = {name: [] for name in fns}
        names = list(fns)
        for i, (q, want) in enumerate(zip(qs, truth)):
            for name in names[i % len(names):] + names[: i % len(names)]:
                fn = fns[name]
                t1 = time.perf_counter()
                got = fn(q)
                lat[name].append(time.perf_counter() - t1)
                recall[name].append(len(set(got) & want) / 10)
        return {name: {"recall_at_10": float(np.mean(recall[name])), "p50_ms": pct(lat[name], 50) * 1000,
                       "p99_ms": pct(lat[name], 99) * 1000} for name in fns}

    nearest = {"column": "vec", "k": 10, "nprobes": cfg.vector_nprobes, "refine_factor": cfg.vector_refine_factor}
    variants = {
        "memwal": lambda q: r.search(q, k=10, columns=["id"]).column("id").to_pylist(),
        "plain": lambda q: plain.to_table(nearest={**nearest, "q": q}, columns=["id", "_distance"]).column("id").to_pylist(),
        "numpy": lambda q: ids[np.argpartition(((mat - q) ** 2).sum(1), 10)[:10]].tolist(),
    }
    for fn in variants.values():  # warm: first reads, the snapshot's SSTable vectors
        fn(qs[0])
    got = measure(variants)
    snap = r.snapshot
    print(f"\nvector search on real embeddings (all-MiniLM-L6-v2, 384-d): {len(ids):,} live rows, {snap.num_live_sstables} SSTables, "
          f"a WAL tail of {len(tail)}; {params['index_type']} with {params['num_partitions']} partition(s) built in {build:.1f} s; "
          f"nprobes {cfg.vector_nprobes}, refine {cfg.vector_refine_factor}; {queries} held-out queries")
    labels = {"memwal": "memwal reader.search(q) at its defaults", "plain": "plain Lance, same index, same live rows compacted",
              "numpy": "exact search in NumPy over the live rows"}
    for name, m in got.items():
        print(f"  {labels[name]:52} recall@10 {m['recall_at_10']:.3f}  p50 {m['p50_ms']:6.2f} ms  p99 {m['p99_ms']:6.2f} ms")
    print(f"  memwal p50 / plain Lance p50: {got['memwal']['p50_ms'] / got['plain']['p50_ms']:.2f}x (target <= 1.5x); "
          f"/ NumPy: {got['memwal']['p50_ms'] / got['numpy']['p50_ms']:.2f}x")
    t.close()
    return {"rows": len(ids), "sstables": snap.num_live_sstables, "wal_tail": len(tail), "index": params, "build_s": build,
            "nprobes": cfg.vector_nprobes, "refine_factor": cfg.vector_refine_factor, **got}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-rows", type=int, default=1_000_000)
    p.add_argument("--lookups", type=int, default=500)
    p.add_argument("--sstable-rows", type=int, default=2_000)
    p.add_argument("--vector-rows", type=int, default=18_800, help="rows of the real-embedding table (part 3)")
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--scans-only", action="store_true", help="parts 1 and 2 only (lookups and scans)")
    p.add_argument("--vectors-only", action="store_true", help="part 3 only (vector search)")
    p.add_argument("--workdir")
    p.add_argument("--json")
    args = p.parse_args()
    results: dict = {"date": today(), "machine": machine(), "commit": git_rev(), "args": vars(args)}
    rng = np.random.default_rng(0)
    with work_dir(args.workdir, "memwal-bench-read-") as work:
        base = None if args.vectors_only else base_rows(args.base_rows)
        # No maintenance runs here: lift the write stall so 100 SSTables can pile up.
        no_stall = Bounds(slowdown_sstables=10**6, stop_sstables=10**6)
        if not args.vectors_only:
            plain_uri = os.path.join(work, "plain")
            plain = lance.write_dataset(base, plain_uri)
            plain.create_scalar_index("id", "BTREE")
            plain = lance.dataset(plain_uri)
            uri = os.path.join(work, "memwal")
            table = Table.create(uri, SCHEMA, ["id"], "unsharded", initial_data=base, bounds=no_stall,
                                 writer=WriterConfig(max_memtable_rows=100_000))
            keys = [int(k) for k in rng.integers(0, args.base_rows, args.lookups)]

            # 1 + 2: lookups and scans
            plain_lookup = lambda k: plain.to_table(filter=f"id = {k}", columns=["id", "val", "name"])  # noqa: E731
            plain_lat = time_calls(plain_lookup, keys)
            plain_scan = scan_rate(plain_uri, plain=True)
            results["plain"] = {"lookup_p50_ms": pct(plain_lat, 50) * 1000, "lookup_p99_ms": pct(plain_lat, 99) * 1000,
                                "scan_rows_per_s": plain_scan["fresh"]}
            print(f"{'table':36} {'lookup p50 / p99 ms':>20} {'x plain p50':>12} {'scan rows/s':>14}"
                  f"   compacted / this: fresh, CPU, warm")
            print(f"{'plain Lance + BTREE (no MemWAL)':36} {pct(plain_lat, 50) * 1000:9.2f} / {pct(plain_lat, 99) * 1000:6.2f} "
                  f"{1.0:12.2f} {plain_scan['fresh']:14,.0f}")
            results["memwal"] = []
            made = 0
            compacted_scan: dict[str, float] = {}
            for sstables in (0, 10, 100):
                add_sstables(table, sstables - made, args.sstable_rows, args.base_rows, rng)
                made = sstables
                reader = readers.open(uri, refresh_interval_ms=None)
                assert reader.snapshot.num_live_sstables == sstables
                reader.get(keys[0])  # warm the planner
                # Interleaved key by key with plain Lance's lookup: on a shared machine the load
                # moves within a run, and sub-millisecond lookups measured one table after the
                # other moved by 30% between runs (docs/bench-log/reads.md, "Issue 45").
                lat, plain_now = [], []
                for k in keys:
                    lat += time_calls(lambda key, r=reader: r.get(key, columns=["id", "val", "name"]), [k])
                    plain_now += time_calls(plain_lookup, [k])
                scan = scan_rate(uri)
                ratio = pct(lat, 50) / pct(plain_now, 50)
                compacted_scan = scan if sstables == 0 else compacted_scan
                # The scan target: within 1.5x of the compacted table's rows/s at 10 SSTables.
                slower = {k: compacted_scan[k] / scan[k] for k in scan}
                print(f"{f'memwal, {sstables} SSTables':36} {pct(lat, 50) * 1000:9.2f} / {pct(lat, 99) * 1000:6.2f} {ratio:12.2f} "
                      f"{scan['fresh']:14,.0f}   {slower['fresh']:.2f}, {slower['fresh_cpu']:.2f}, {slower['warm']:.2f}")
                results["memwal"].append({"sstables": sstables, "lookup_p50_ms": pct(lat, 50) * 1000, "lookup_p99_ms": pct(lat, 99) * 1000,
                                          "x_plain_p50": ratio, "scan_rows_per_s": scan["fresh"], "scan": scan, "scan_x_compacted": slower})
                many = get_many_ms(reader, plain, args.base_rows, rng)
                results["memwal"][-1]["get_many_1000"] = many
                print(f"{'':36} get_many(1,000 keys) p50 {many['memwal']:.1f} ms: {many['memwal'] / many['plain_in']:.2f}x plain Lance "
                      f"id IN (...) ({many['plain_in']:.1f} ms), {many['memwal'] / many['plain_take']:.2f}x its take ({many['plain_take']:.1f} ms)")

        if args.scans_only:
            report(results, args.json)
            return

        results["vector"] = vector_search(work, args.vector_rows, args.queries)
    report(results, args.json)


if __name__ == "__main__":
    main()
