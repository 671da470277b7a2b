"""Render the README's picture of ``memwal status --watch`` (docs/images/status-watch.png).

Builds a small table in a temporary directory (four shards, a compacted base, then SSTables
pending again, one shard slowed by tight bounds), renders the live view exactly as
``memwal status --watch`` draws it (:func:`memwal.cli.terminal.status_view`) into rich's SVG export,
and converts that to PNG with cairosvg (``pip install -e ".[docs]"``; it needs the system's
libcairo). Run: ``python docs/render_screenshot.py``.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

import cairosvg
import pyarrow as pa
from rich.console import Console

from memwal import Table
from memwal.maintain.maintenance import Maintenance
from memwal.core.metadata import Bounds
from memwal.core.state import TableState
from memwal.maintain.status import table_status
from memwal.cli.terminal import status_view

OUT = Path(__file__).resolve().parent / "images" / "status-watch.png"
SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64())])
#: The monospace font the PNG is drawn with (rich's SVG asks for a web font it would download).
FONT = "DejaVu Sans Mono"


def rows(ids: range) -> pa.Table:
    return pa.table({"id": list(ids), "name": [f"user{i}" for i in ids], "score": [i / 7 for i in ids]}, schema=SCHEMA)


def build(uri: str) -> None:
    bounds = Bounds(max_sstables=4, slowdown_sstables=6, stop_sstables=10, max_slowdown_seconds=0.0)
    with Table.create(uri, SCHEMA, ["id"], "bucket(id, 4)", bounds=bounds) as table:
        table.write(rows(range(0, 40_000)))
        table.flush()
        Maintenance(uri).run_cycle()
        for i in range(3):
            table.write(rows(range(40_000 + i * 2_000, 42_000 + i * 2_000)))
            table.flush()
        # one hot key, flushed until its shard's writes are slowed
        for _ in range(4):
            table.write(rows(range(7, 8)))
            table.flush()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        uri = f"{tmp}/users"
        build(uri)
        status = table_status(TableState.load(uri))
    console = Console(record=True, width=150, force_terminal=True, color_system="truecolor")
    console.print(status_view(status, interval=2.0))
    svg = console.export_svg(title="memwal status /data/users --watch")
    svg = re.sub(r"@font-face\s*{[^}]*}", "", svg)
    svg = re.sub(r"font-family:\s*Fira Code[^;]*;", f"font-family: {FONT};", svg)
    svg = svg.replace(tmp, "/data")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    cairosvg.svg2png(bytestring=svg.encode(), write_to=str(OUT), output_width=1500)
    print(f"wrote {OUT} ({OUT.stat().st_size:,} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
