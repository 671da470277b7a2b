"""What a long-lived table handle saves by keeping its caches warm (issue 15).

Two costs that grew with a streaming table's age, each measured against its cold baseline in
the same process, on a copy of a given table (a soaked one: an hour of retained shard manifest
versions, a large base with many fragments):

* **shard listing**: a snapshot (each reader refresh) lists the shards. Listing each shard's
  manifest directory (what memwal did: it holds every retained manifest version) against
  :meth:`ManifestStore.list_shards` (one listing of ``_mem_wal/``, a hint per new shard);
* **compaction commits**: ``--commits`` ``merge_insert`` calls of ``--rows`` rows each (half
  updates of keys drawn from the whole table, half new keys), each on a freshly opened base:
  with a new Lance session per open (cold caches, what memwal does) against one shared
  ``lance.Session`` whose index cache is bounded at each ``--index-cache-mib``. The first commit
  warms the session, so the report gives the steady commits (all but the first) apart.

Run: ``python bench/warm_caches.py TABLE_URI [--rows 25000] [--commits 6]`` (TABLE_URI: a
memwal table's directory; it is copied, never written).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import lance

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from commit_size import fold, rows_to_fold  # noqa: E402
from common import git_rev, machine, report, today  # noqa: E402

from memwal.core import paths  # noqa: E402
from memwal.core.manifest import ManifestStore  # noqa: E402
from memwal.core.state import TableState  # noqa: E402


def listing_every_manifest_dir(store: ManifestStore) -> list[str]:
    """The shards as memwal listed them before: every manifest directory, listed whole."""
    root = paths.mem_wal_root(store.table_uri)
    return [n for n in store.io.list_dir(root) if store.io.list_dir(paths.shard_manifest_dir(store.table_uri, n))]


def per_call_ms(fn, repeat: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - t0) / repeat * 1000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("table", help="a memwal table with an id key (copied, never written)")
    p.add_argument("--rows", type=int, default=25_000, help="rows per compaction commit")
    p.add_argument("--commits", type=int, default=6)
    p.add_argument("--index-cache-mib", type=int, nargs="+", default=[2048, 512, 64], help="shared sessions' index cache bounds")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    state = TableState.load(args.table)
    versions = [len(state.manifests.retained_versions(s)) for s in state.manifests.list_shards()]
    ds = state.dataset()
    print(f"table: {ds.count_rows():,} rows in {len(ds.get_fragments())} fragments, {len(versions)} shards "
          f"with {min(versions)}-{max(versions)} retained manifest versions each")

    cold_list = per_call_ms(lambda: listing_every_manifest_dir(state.manifests), 20)
    warm_list = per_call_ms(lambda: ManifestStore(state.uri, state.io).list_shards(), 20)  # a new store: no shard known yet
    print(f"shard listing: every manifest directory {cold_list:.2f} ms, list_shards {warm_list:.2f} ms  x{warm_list / cold_list:.3f}")

    rows = rows_to_fold(ds, args.rows * args.commits)
    results = {}
    with tempfile.TemporaryDirectory(prefix="memwal-bench-caches-", dir=os.path.dirname(os.path.abspath(args.table))) as tmp:
        sessions = [("cold", None)] + [
            (f"session {mib} MiB", lance.Session(index_cache_size_bytes=mib << 20, metadata_cache_size_bytes=64 << 20))
            for mib in args.index_cache_mib
        ]
        for name, session in sessions:
            work = os.path.join(tmp, name.replace(" ", "-"))
            shutil.copytree(args.table, work)
            took = fold(work, rows, args.commits, args.rows, session)
            shutil.rmtree(work)
            results[name] = {"seconds": took, "steady_median": statistics.median(took[1:]),
                             "cache_bytes": session.size_bytes() if session is not None else 0}
            print(f"{args.commits} commits of {args.rows:,} rows, {name:>14}: " + " ".join(f"{s:.2f}" for s in took) + " s", flush=True)
    cold = results["cold"]["steady_median"]
    for name, r in results.items():
        print(f"steady commit (median of all but the first), {name:>16}: {r['steady_median']:.2f} s  x{r['steady_median'] / cold:.2f}; "
              f"cached {r['cache_bytes'] / 2**20:.0f} MiB")
    report({"date": today(), "machine": machine(), "commit": git_rev(), "listing_ms": {"every_manifest_dir": cold_list, "list_shards": warm_list},
            "retained_manifest_versions": versions, "commits": results}, args.json)


if __name__ == "__main__":
    main()
