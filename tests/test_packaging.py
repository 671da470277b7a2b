"""A plain (non-editable) install of memwal works, and so does running from the repository
root, where the source folder memwal/ (its layers' folders and memwal/proto) shadows the
installed copy: the folder tree is the import namespace. The wheel leaves the development
tooling (memwal_dev/) out, and no module loads under two names."""

from __future__ import annotations

import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

CHECK = """
import os, sys, tempfile
import memwal, memwal.streaming, memwal.readers, memwal.proto, memwal.spark, pyspark_memwal
from memwal.proto import pb
venv = sys.argv[1]
for mod in (memwal, memwal.streaming, memwal.readers, memwal.proto, memwal.spark, pyspark_memwal):
    assert mod.__file__.startswith(venv), (mod.__name__, mod.__file__)
assert os.path.exists(os.path.join(os.path.dirname(memwal.proto.__file__), "lance_table_pb2.py"))
assert os.path.exists(os.path.join(os.path.dirname(memwal.__file__), "jvm", "spark-kafka.pom.xml"))
import pkgutil
assert "pyspark_memwal" in {m.name for m in pkgutil.iter_modules()}  # what Spark's data source lookup scans
import pyarrow as pa
from memwal import Table, readers
uri = os.path.join(tempfile.mkdtemp(), "t")
with Table.create(uri, pa.schema([("id", pa.int64()), ("v", pa.string())]), ["id"], "bucket(id, 2)") as t:
    t.write({"id": [1, 2], "v": ["a", "b"]})
assert readers.open(uri).get(2) == {"id": 2, "v": "b"}
print("ok")
"""


@pytest.mark.slow
def test_wheel_installs_into_a_fresh_venv(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(ROOT)],
        check=True,
        cwd=tmp_path,
    )
    (wheel,) = dist.glob("memwal-*.whl")
    import zipfile

    shipped = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("memwal/core/") for n in shipped) and not any(n.startswith("memwal_dev/") for n in shipped)
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    # The dependencies are pinned and already installed here; reuse them instead of
    # downloading ~500 MB again, but install memwal itself from the wheel, not the source.
    purelib = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True, check=True
    ).stdout.strip()
    Path(purelib, "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    # --ignore-installed: the deps.pth makes a memwal installed beside the dependencies visible
    # too (a plain install of this checkout); this venv must get its own copy from the wheel.
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed", str(wheel)], check=True)
    out = subprocess.run(
        [str(py), "-c", CHECK, str(env_dir)], capture_output=True, text=True, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("ok")
    cli = subprocess.run([str(env_dir / "bin" / "memwal"), "--help"], capture_output=True, text=True)
    assert cli.returncode == 0 and "usage: memwal" in cli.stdout

    # From the repository root the checkout's memwal/ comes first on sys.path; it is the
    # same package tree, so every subpackage resolves there too.
    here = subprocess.run(
        [str(py), "-c", "import memwal, memwal.streaming, memwal.readers, memwal.proto; "
         "print(memwal.readers.__file__); print(memwal.streaming.__file__)"],
        capture_output=True, text=True, cwd=ROOT,
    )
    assert here.returncode == 0, here.stderr
    assert all(line.startswith(str(ROOT / "memwal")) for line in here.stdout.split()), here.stdout
    cli_here = subprocess.run([str(env_dir / "bin" / "memwal"), "--help"], capture_output=True, text=True, cwd=ROOT)
    assert cli_here.returncode == 0 and "usage: memwal" in cli_here.stdout


def test_every_module_loads_once_under_one_name():
    """Every module of memwal and memwal_dev imported, no file is loaded twice under two names
    (two copies of a module mean two of its caches and failing ``isinstance`` checks), and no
    top-level name at the repository root leads into the package tree a second way."""
    import importlib
    import importlib.util
    import pkgutil

    import memwal
    import memwal_dev

    for pkg in (memwal, memwal_dev):
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            if not info.name.endswith("__main__"):
                importlib.import_module(info.name)
    by_file: dict[str, list[str]] = {}
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if file and any(Path(file).resolve().is_relative_to(ROOT / tree) for tree in ("memwal", "memwal_dev", "pyspark_memwal")):
            by_file.setdefault(str(Path(file).resolve()), []).append(name)
    assert len(by_file) > 100
    twice = {f: names for f, names in by_file.items() if len(names) > 1}
    assert not twice, twice
    for entry in ROOT.iterdir():
        if entry.is_symlink():
            assert not entry.resolve().is_relative_to(ROOT / "memwal"), f"{entry.name} links into the package"


def test_the_architecture_page_lists_every_module_of_the_tree():
    """docs/architecture.md's module table is the one tools/module_table.py makes from the tree."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("module_table", ROOT / "tools" / "module_table.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.main(["--check"]) == 0
