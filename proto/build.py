"""Regenerate ``lance_table_pb2.py`` from ``lance_table.proto``: ``python -m memwal.proto.build``.

Run it from a source checkout (an editable install), where this file sits next to the
``.proto``. Needs ``grpcio-tools`` (the ``dev`` extra), which bundles ``protoc``.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO = "lance_table.proto"


def generate(out_dir: Path) -> Path:
    """Compile the .proto into ``out_dir`` and return the generated module's path."""
    from grpc_tools import protoc  # imported here: only needed to regenerate

    rc = protoc.main(["protoc", f"-I{HERE}", f"--python_out={out_dir}", str(HERE / PROTO)])
    if rc != 0:
        raise SystemExit(f"protoc failed with exit code {rc}")
    return out_dir / "lance_table_pb2.py"


def main() -> None:
    path = generate(HERE)
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
