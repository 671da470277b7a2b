"""Install this checkout into a virtual environment for development (what ``make`` runs).

The pinned dependencies of ``pyproject.toml`` (and of the extras named) are installed with
pip; the checkout itself is put on the environment's path by a ``.pth`` file, and a
``memwal`` command is written beside the environment's Python. So the environment runs the
checkout as it is (no reinstall after an edit), and Spark's lookup of data sources, which
walks the path for top-level ``pyspark_*`` modules, finds ``pyspark_memwal``. An editable
install would do the first but not the second, unless in setuptools' transitional ``compat``
mode, which setuptools deprecates.

    python tools/dev_install.py .venv dev
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

COMMAND = """#!{python}
import sys

from memwal.cli import main

sys.exit(main())
"""


def requirements(extras: list[str]) -> list[str]:
    """The project's dependencies and those of ``extras`` (extras of this project expanded)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    optional = project.get("optional-dependencies", {})
    out: list[str] = list(project["dependencies"])
    todo, seen = list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for req in optional[extra]:
            own = re.fullmatch(rf"{re.escape(project['name'])}\[([^\]]+)\]", req.replace(" ", ""))
            if own:
                todo.extend(own.group(1).split(","))
            else:
                out.append(req)
    return sorted(set(out))


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    venv, extras = Path(argv[0]).resolve(), argv[1:]
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", *requirements(extras)], check=True)
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    (Path(purelib) / "memwal-checkout.pth").write_text(f"{ROOT}\n")
    command = venv / "bin" / "memwal"
    command.write_text(COMMAND.format(python=python))
    command.chmod(0o755)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
