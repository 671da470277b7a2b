"""docs/architecture.md's module table, made from the tree: one row per package folder, in the
order of the layers contract in pyproject.toml (top layer first), and under it one row per
module, each with the first sentence of its docstring. The code is the one source: a module
added, moved or renamed changes the table, and ``--check`` (run by the tests) fails while the
page lags behind.

    python tools/module_table.py          # rewrite the table in docs/architecture.md
    python tools/module_table.py --check  # exit 1 if the page's table is not the tree's
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "architecture.md"
START = "### Module table\n"


def first_sentence(path: Path) -> str:
    """The first sentence (or first paragraph, if shorter) of the file's docstring, on one line."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    para = " ".join(doc.split("\n\n")[0].split())
    m = re.match(r"(.+?[.!?])(\s|$)", para)
    text = m.group(1) if m else para
    return text.replace("|", "\\|")


def folders() -> list[str]:
    """The packages of the layers contract, top layer first (dotted names)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]
    return [name.strip() for layer in config["layers"] for name in layer.split("|")]


def rows() -> list[str]:
    out = ["| module | what it holds |", "|---|---|"]
    for dotted in ["pyspark_memwal", *folders()]:
        path = ROOT / dotted.replace(".", "/")
        if path.with_suffix(".py").is_file():  # a single module placed in the layers (memwal.table)
            out.append(f"| `{path.with_suffix('.py').relative_to(ROOT)}` | {first_sentence(path.with_suffix('.py'))} |")
            continue
        init = path / "__init__.py"
        out.append(f"| **`{path.relative_to(ROOT)}/`** | {first_sentence(init) if init.is_file() else ''} |")
        for module in sorted(path.rglob("*.py")):
            if module.name == "__init__.py" and module.parent == path:
                continue
            if module.name.endswith("_pb2.py"):
                out.append(f"| `{module.relative_to(ROOT)}` | generated from `proto/lance_table.proto` by `proto/build.py` |")
                continue
            out.append(f"| `{module.relative_to(ROOT)}` | {first_sentence(module)} |")
    return out


def render(page: str) -> str:
    head, rest = page.split(START, 1)
    nxt = rest.find("\n## ")
    tail = rest[nxt:] if nxt >= 0 else "\n"
    intro = "\nMade from the tree by `python tools/module_table.py` (each row: a module docstring's first sentence).\n\n"
    return head + START + intro + "\n".join(rows()) + "\n" + tail


def main(argv: list[str]) -> int:
    page = PAGE.read_text()
    want = render(page)
    if "--check" in argv:
        if want != page:
            print("docs/architecture.md's module table is not the tree's: run python tools/module_table.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(want)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
