"""Regenerate ``memwal/proto/lance_table_pb2.py`` from ``proto/lance_table.proto``.

Run from a source checkout: ``python proto/build.py``. Needs ``grpcio-tools`` (the ``dev``
extra), which bundles ``protoc``. The schema lives here, at the top of the repository; the
generated module lives inside the package, so an installed memwal needs no compiler.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO = HERE / "lance_table.proto"
PACKAGE_DIR = HERE.parent / "memwal" / "proto"


def generate(out_dir: Path) -> Path:
    """Compile the .proto into ``out_dir`` and return the generated module's path."""
    from grpc_tools import protoc  # imported here: only needed to regenerate

    rc = protoc.main(["protoc", f"-I{HERE}", f"--python_out={out_dir}", str(PROTO)])
    if rc != 0:
        raise SystemExit(f"protoc failed with exit code {rc}")
    return out_dir / "lance_table_pb2.py"


def main() -> None:
    path = generate(PACKAGE_DIR)
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
