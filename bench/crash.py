"""Crash trials: SIGKILL writers (and maintenance) at random moments; nothing acknowledged may be lost.

One table lives across all trials. Each trial starts a writer process (and, in some trials, a
maintenance process running cycles: flush-stranded, compaction, GC with short grace periods),
lets it run for a random time and SIGKILLs it; the next trial's writer recovers the previous
one's state by claiming its shards and replaying their WAL. The writer uses
``durability="fsync"`` and keeps an acknowledgement log that it fsyncs itself:

    {"intent": n, "op": "put"|"del", ...}   fsynced before the write starts
    {"ack": n}                              fsynced only after the write returned

After each trial a strong reader (base + SSTables + WAL tails) is compared with the model,
key by key. A key touched by the one batch in flight when the writer died (an intent with no
ack) may hold its old or its new value; the model then takes what the table holds. Counted:

* lost: an acknowledged value absent, or replaced by an older one (a stale value);
* duplicated: a key appearing more than once in the scan;
* resurrected: a key whose deletion was acknowledged, present again.

Every ``--maintain-every`` trials (and at the end) the driver runs a full maintenance cycle
itself (nobody killed) and checks that the converged table still equals the model.

Processes come from a fork server that imported memwal once (multiprocessing "forkserver"),
so a trial costs a fork, not an interpreter start. Run::

    python bench/crash.py --trials 1000 [--seed N] [--dir /tmp/crash]

Exit status 0 when lost, duplicated and resurrected are all 0. ``--seed`` replays a run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from memwal.core.runtime import configure_process  # noqa: E402

configure_process()  # Lance's log filter, before lance is imported here or in the fork server

KEYS = 400
SHARDING = "bucket(id, 2)"


# -- child processes (run in forks of the fork server) ----------------------------------------


def _gc_config():
    from memwal.maintain.gc import GcConfig

    # Short grace periods so GC removes compacted SSTables, covered WAL and old manifests, and
    # drains (which fence the writer) while the writer writes.
    return GcConfig(
        reader_grace_seconds=0.5, manifest_versions_kept=2, manifest_retention_seconds=1.0,
        drain_interval_seconds=1.0, min_sstables_to_drain=2,
    )


def writer_main(uri: str, ack_path: str, seed: int, tag: str) -> None:
    """Write random upserts and deletes until killed, logging intents and acks (fsynced)."""
    import pyarrow as pa

    from memwal import Table

    rng = random.Random(seed)
    table = Table.open(uri)
    table.writers.durability = "fsync"
    fd = os.open(ack_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def log(record: dict) -> None:
        os.write(fd, (json.dumps(record) + "\n").encode())
        os.fsync(fd)

    n = 0
    while True:
        n += 1
        keys = sorted(rng.sample(range(KEYS), rng.randint(1, 40)))
        if rng.random() < 0.25:
            log({"intent": n, "op": "del", "keys": keys})
            table.delete({"id": keys})
        else:
            values = [f"{tag}.{n}.{k}" for k in keys]
            log({"intent": n, "op": "put", "keys": keys, "values": values})
            table.write(pa.table({"id": pa.array(keys, pa.int64()), "v": values}))
        log({"ack": n})
        if rng.random() < 0.08:
            table.flush()  # MemTables -> SSTables, so kills also land in flushes


def maintenance_main(uri: str, seed: int) -> None:
    """Run maintenance cycles (flush-stranded, compaction, GC) until killed."""
    from memwal.maintain.maintenance import Maintenance, MaintenanceConfig

    rng = random.Random(seed)
    m = Maintenance(uri, MaintenanceConfig(
        indexes=False, views=False, flush_stranded_after_seconds=0.0, gc_config=_gc_config(),
        max_generations_per_commit=rng.choice((1, 2, 8)),
    ))
    while True:
        m.run_cycle()


# -- the driver --------------------------------------------------------------------------------


@dataclass
class Totals:
    trials: int = 0
    maintenance_kills: int = 0
    acked_batches: int = 0
    acked_rows: int = 0
    inflight_batches: int = 0
    lost: int = 0
    duplicated: int = 0
    resurrected: int = 0
    #: Children that exited by themselves (an error, printed on stderr) instead of being killed.
    child_errors: int = 0
    failures: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"trials {self.trials} (maintenance killed in {self.maintenance_kills}), acknowledged batches "
            f"{self.acked_batches}, rows {self.acked_rows}, in-flight at kill {self.inflight_batches}; "
            f"lost {self.lost}, duplicated {self.duplicated}, resurrected {self.resurrected}; "
            f"children that failed by themselves {self.child_errors}"
        )


def read_acks(path: Path) -> tuple[list[dict], dict | None]:
    """(acknowledged intents in order, the intent in flight or None). A torn last line was never fsynced
    whole, so its write never started (intent) or was never acknowledged (ack)."""
    acked: list[dict] = []
    pending: dict | None = None
    if not path.exists():
        return acked, None
    for line in path.read_text().split("\n"):
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # torn (or empty) last line
        if "intent" in rec:
            pending = rec
        elif pending is not None and rec.get("ack") == pending["intent"]:
            acked.append(pending)
            pending = None
    return acked, pending


def apply(model: dict[int, str | None], rec: dict) -> None:
    if rec["op"] == "put":
        model.update(zip(rec["keys"], rec["values"]))
    else:
        model.update((k, None) for k in rec["keys"])


def observe(uri: str) -> tuple[dict[int, str], int]:
    """(key -> value, duplicated keys) as a strong reader sees the table."""
    from memwal import readers

    rows = readers.open(uri, consistency="strong", refresh_interval_ms=None).scan().to_pydict()
    seen: dict[int, str] = {}
    dups = 0
    for k, v in zip(rows["id"], rows["v"]):
        if k in seen:
            dups += 1
        seen[k] = v
    return seen, dups


def check(uri: str, model: dict[int, str | None], pending: dict | None, totals: Totals, where: str) -> None:
    """Compare the table with the model; resolve the in-flight batch's keys to what the table holds."""
    seen, dups = observe(uri)
    totals.duplicated += dups
    if dups:
        totals.failures.append(f"{where}: {dups} duplicated keys")
    maybe: dict[int, str | None] = {}
    if pending is not None:
        values = pending.get("values") or [None] * len(pending["keys"])
        maybe = dict(zip(pending["keys"], values))
    for k in range(KEYS):
        want, got = model.get(k), seen.get(k)
        if got == want or (k in maybe and got == maybe[k]):
            model[k] = got
            continue
        if want is None:
            totals.resurrected += 1
            totals.failures.append(f"{where}: key {k} deleted (acknowledged) but present as {got!r}")
        else:
            totals.lost += 1
            totals.failures.append(f"{where}: key {k} should be {want!r}, is {got!r}")
        model[k] = got  # report each divergence once


def maintain_fully(uri: str) -> None:
    from memwal.maintain.maintenance import Maintenance, MaintenanceConfig

    m = Maintenance(uri, MaintenanceConfig(indexes=False, views=False, flush_stranded_after_seconds=0.0, gc_config=_gc_config()))
    for _ in range(2):
        m.run_cycle()


def expire_leases(uri: str) -> None:
    """A SIGKILLed writer's lease stays live for its full term; the driver knows it is dead."""
    from memwal.core import paths
    from memwal.core.io import LocalFileIO
    from memwal.write.lease import WriterLease

    io = LocalFileIO()
    root = os.path.dirname(paths.writer_lease(uri, "x"))
    for name in io.list_dir(root):
        if name.endswith(".json"):
            io.write(os.path.join(root, name), WriterLease("killed", 0.0).to_json())


def run(trials: int, seed: int, workdir: Path, maintain_every: int = 25, max_run_seconds: float = 1.5,
        maintenance_share: float = 0.3, progress: bool = True) -> Totals:
    import pyarrow as pa

    from memwal import Table, WriterConfig

    # The fork server imports lance but never starts its runtime, so its forks are safe; lance warns anyway.
    os.environ["PYTHONWARNINGS"] = "ignore:lance is not fork-safe"
    rng = random.Random(seed)
    uri = str(workdir / "table")
    acks = workdir / "acks"
    shutil.rmtree(workdir, ignore_errors=True)
    acks.mkdir(parents=True)
    Table.create(uri, pa.schema([("id", pa.int64()), ("v", pa.string())]), ["id"], SHARDING,
                 writer=WriterConfig(durability="fsync", max_memtable_rows=2_000)).close()
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["memwal.table", "memwal.maintain.maintenance", "memwal.readers", "pyarrow"])
    model: dict[int, str | None] = {}
    totals = Totals()
    t0 = time.monotonic()
    for trial in range(trials):
        trial_seed = rng.randrange(1 << 30)
        ack_path = acks / f"{trial}.log"
        procs = [ctx.Process(target=writer_main, args=(uri, str(ack_path), trial_seed, f"t{trial}"))]
        with_maintenance = rng.random() < maintenance_share
        if with_maintenance:
            procs.append(ctx.Process(target=maintenance_main, args=(uri, trial_seed + 1)))
        for p in procs:
            p.start()
        # Kill each at its own random moment: during open/replay, a write, a flush, a cycle.
        deadlines = sorted((rng.uniform(0.05, max_run_seconds), p) for p in procs)
        start = time.monotonic()
        for at, p in deadlines:
            time.sleep(max(0.0, start + at - time.monotonic()))
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
            p.join()
        totals.child_errors += sum(p.exitcode != -signal.SIGKILL for p in procs)
        acked, pending = read_acks(ack_path)
        for rec in acked:
            apply(model, rec)
            totals.acked_batches += 1
            totals.acked_rows += len(rec["keys"])
        totals.inflight_batches += pending is not None
        totals.trials += 1
        totals.maintenance_kills += with_maintenance
        check(uri, model, pending, totals, f"trial {trial} (run seed {seed})")
        ack_path.unlink(missing_ok=True)  # a writer killed while opening the table wrote none
        if (trial + 1) % maintain_every == 0 or trial == trials - 1:
            expire_leases(uri)
            maintain_fully(uri)
            check(uri, model, None, totals, f"after maintenance at trial {trial} (run seed {seed})")
        if progress and (trial + 1) % 50 == 0:
            print(f"[{time.monotonic() - t0:.0f}s] {totals.line()}", flush=True)
    return totals


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=1000)
    p.add_argument("--seed", type=int, default=None, help="replay a run (default: random, printed)")
    p.add_argument("--dir", help="working directory (default: a fresh temporary one, removed afterwards)")
    p.add_argument("--maintain-every", type=int, default=25, help="full maintenance cycle and check every N trials")
    p.add_argument("--max-run-seconds", type=float, default=1.5, help="each child is killed at a uniform random moment up to this")
    args = p.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    workdir = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="memwal-crash-"))
    print(f"crash trials: {args.trials}, seed {seed}, table {workdir / 'table'}", flush=True)
    t0 = time.monotonic()
    totals = run(args.trials, seed, workdir, maintain_every=args.maintain_every, max_run_seconds=args.max_run_seconds)
    print(f"{totals.line()}; {time.monotonic() - t0:.0f}s")
    for f in totals.failures[:50]:
        print("FAIL", f)
    ok = not (totals.lost or totals.duplicated or totals.resurrected or totals.failures)
    if ok and not args.dir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
