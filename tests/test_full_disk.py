"""A full local disk: tables on a small tmpfs this test mounts, filled while memwal writes,
flushes and compacts. Each operation fails with one clear error (StorageFullError; exit 3
from the CLI), the table is never damaged (``memwal check`` is clean, no half-written file is
left beside the manifests), and the writes go on, from the same handle, once space returns.

The disk fills during the operation, not before it: all but a few hundred KB are taken by a
ballast file, and the operation's own writes use up the rest.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import os
import random
import subprocess
import sys
import uuid
from pathlib import Path

import pyarrow as pa
import pytest

from memwal import FencedError, StorageFullError, Table, readers
from memwal.maintain.check import check_table
from memwal.core.state import TableState

SCHEMA = pa.schema(
    [
        pa.field("region", pa.string()),
        pa.field("order_id", pa.int64()),
        pa.field("placed", pa.date32()),
        pa.field("amount", pa.decimal128(12, 2)),
        pa.field("note", pa.string()),
    ]
)
KEY = ["region", "order_id"]


def orders(ids, tag: str, seed: int = 0) -> pa.Table:
    """Orders with a composite key, a date, a decimal and a ~1.3 KB note of random text (Lance
    compresses repeated text to nothing, which would never fill a disk)."""
    rng = random.Random(hash((tag, seed)))
    ids = list(ids)
    return pa.table(
        {
            "region": ["eu" if i % 3 else "us" for i in ids],
            "order_id": ids,
            "placed": [datetime.date(2026, 1, 1) + datetime.timedelta(days=i % 365) for i in ids],
            "amount": [decimal.Decimal(rng.randrange(100, 10**7)) / 100 for _ in ids],
            "note": [f"{tag}:" + base64.b64encode(rng.randbytes(1000)).decode() for _ in ids],
        },
        schema=SCHEMA,
    )


@pytest.fixture
def small_disk(tmp_path):
    """A 48 MiB tmpfs mounted for the test. Needs the privilege to mount (root here)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mount)], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {p.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


class Ballast:
    """Fills the disk but for ``leave`` bytes; :meth:`free` gives the space back."""

    def __init__(self, disk: Path) -> None:
        self.disk = disk
        self.files: list[Path] = []

    def available(self) -> int:
        st = os.statvfs(self.disk)
        return st.f_bavail * st.f_frsize

    def fill(self, leave: int) -> None:
        path = self.disk / f"ballast-{uuid.uuid4().hex}"
        with open(path, "wb") as f:
            os.posix_fallocate(f.fileno(), 0, max(self.available() - leave, 1))
        self.files.append(path)
        assert self.available() <= leave + 65536

    def free(self) -> None:
        for f in self.files:
            f.unlink()
        self.files.clear()


def stored(uri: str, consistency: str = "strong") -> dict[tuple[str, int], str]:
    reader = readers.Reader(TableState.load(uri), consistency=consistency)
    table = reader.scan()
    out = {(r["region"], r["order_id"]): r["note"] for r in table.to_pylist()}
    assert len(out) == table.num_rows, "a key appears twice"
    return out


def model_of(*tables: pa.Table) -> dict[tuple[str, int], str]:
    out: dict[tuple[str, int], str] = {}
    for t in tables:
        out.update({(r["region"], r["order_id"]): r["note"] for r in t.to_pylist()})
    return out


def assert_undamaged(uri: str) -> None:
    report = check_table(TableState.load(uri))
    assert report.clean, report.to_json()
    leftovers = [p for p in Path(uri).rglob("*.tmp")]
    assert not leftovers, f"half-written files left behind: {leftovers}"


def test_writes_and_flushes_fail_clearly_on_a_full_disk_and_resume_when_space_returns(small_disk):
    uri = str(small_disk / "orders")
    ballast = Ballast(small_disk)
    Table.create(uri, SCHEMA, KEY, "bucket(order_id, 2)").close()
    t = Table.open(uri)
    first = orders(range(200), "a")
    t.write(first)
    acknowledged = [first]

    # a write that fills the disk: one clear error (before: FencedError "another writer keeps
    # claiming this shard", Lance words a failed WAL write "Writer fenced (persistence failure)")
    ballast.fill(leave=150_000)
    second = orders(range(100, 500), "b")
    with pytest.raises(StorageFullError) as failed:
        t.write(second)
    assert not isinstance(failed.value, FencedError)
    assert "no space" in str(failed.value).lower() and "\n" not in str(failed.value)
    assert_undamaged(uri)
    seen = stored(uri)
    for key, note in model_of(*acknowledged).items():  # the unacknowledged write may have landed in part
        assert seen[key] == note or seen[key] == model_of(second)[key]

    # space returns: the same handle writes on
    ballast.free()
    t.write(second)
    acknowledged.append(second)
    assert stored(uri) == model_of(*acknowledged)

    # a flush that fills the disk
    ballast.fill(leave=200_000)
    with pytest.raises(StorageFullError):
        t.flush()
    assert_undamaged(uri)
    assert stored(uri) == model_of(*acknowledged)  # flushed or not, every acknowledged row is readable
    ballast.free()
    third = orders(range(450, 600), "c")
    t.write(third)
    acknowledged.append(third)
    t.close()
    assert_undamaged(uri)
    assert stored(uri, "eventual") == model_of(*acknowledged)


def _memwal(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memwal", *args], capture_output=True, text=True, timeout=600)


def test_the_cli_exits_3_on_a_full_disk_during_put_and_compaction(small_disk, tmp_path):
    uri = str(small_disk / "orders")
    ballast = Ballast(small_disk)
    Table.create(uri, SCHEMA, KEY, "bucket(order_id, 2)").close()
    batches = [orders(range(i * 300, i * 300 + 400), f"w{i}") for i in range(4)]
    with Table.open(uri) as t:  # four flushed generations per shard, ~2 MB to compact
        for b in batches:
            t.write(b)
            t.flush()
    acknowledged = model_of(*batches)

    # compaction (and the index catch-up, GC...) on a full disk: exit 3, one line
    ballast.fill(leave=300_000)
    p = _memwal("maintain", uri, "--once", "--nice", "0")
    assert p.returncode == 3, p.stderr
    lines = [line for line in p.stderr.splitlines() if line.startswith("memwal: error:")]
    assert len(lines) == 1 and "no space" in lines[0].lower(), p.stderr
    assert "damaged" not in p.stderr and "Traceback" not in p.stderr
    assert_undamaged(uri)  # in process: each CLI start costs seconds, and only its exit codes are tested here
    assert stored(uri) == acknowledged

    # a put on a full disk: exit 3, the rows it applied (if any) durable
    data = tmp_path / "more.parquet"
    more = orders(range(2000, 2600), "p")
    import pyarrow.parquet as pq

    pq.write_table(more, data)
    p = _memwal("put", uri, str(data))
    assert p.returncode == 3 and "no space" in p.stderr.lower(), p.stderr
    assert_undamaged(uri)

    # space returns: both commands work
    ballast.free()
    p = _memwal("put", uri, str(data))
    assert p.returncode == 0, p.stderr
    acknowledged.update(model_of(more))
    p = _memwal("maintain", uri, "--once", "--nice", "0")
    assert p.returncode == 0, p.stderr
    assert_undamaged(uri)
    assert stored(uri, "eventual") == acknowledged
