"""Live terminal views for the CLI (rich): progress bars, and ``memwal status --watch``.

CLI layer only, like :mod:`memwal.cli.render` (whose text this reuses): the library reports
progress as :class:`~memwal.core.progress.Progress` records and status as
:class:`~memwal.maintain.status.TableStatus`; this module decides how a terminal shows them. Bars go to
stderr so stdout keeps only a command's result; they are drawn only on a terminal, never into
a pipe or a log file, and never with ``--json`` or ``--quiet`` (:func:`bars_wanted`).
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, TextIO

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress import BarColumn, ProgressColumn, Task, TaskID, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress
from rich.table import Table
from rich.text import Text

from memwal.core.progress import Progress
from memwal.cli.render import bounds_lines, maintenance_lines, shard_cells
from memwal.maintain.status import TableStatus


def bars_wanted(stream: TextIO, *, json_output: bool = False, quiet: bool = False) -> bool:
    """Progress bars only for a person watching a terminal."""
    return not json_output and not quiet and stream.isatty()


class _Count(ProgressColumn):
    """``1,234/5,000 rows`` (or ``1,234 rows`` while the total is unknown)."""

    def render(self, task: Task) -> Text:
        unit = task.fields.get("unit", "")
        done = f"{int(task.completed):,}"
        return Text(f"{done}/{int(task.total):,} {unit}" if task.total is not None else f"{done} {unit}", style="progress.download")


class _Rate(ProgressColumn):
    """``12,345 rows/s`` over rich's recent samples."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("" if speed is None else f"{speed:,.0f} {task.fields.get('unit', '')}/s", style="progress.data.speed")


class ProgressBars:
    """A :data:`~memwal.core.progress.ProgressCallback` drawing one bar per task on ``console``
    (stderr): count, rate, ETA when the total is known, elapsed time. Disabled, it is a
    callback that does nothing. Use it as a context manager around the work."""

    def __init__(self, enabled: bool, console: Console | None = None) -> None:
        self.enabled = enabled
        self._tasks: dict[str, TaskID] = {}
        self._bars: RichProgress | None = None
        if enabled:
            self._bars = RichProgress(
                TextColumn("[bold]{task.description}"), BarColumn(), _Count(), _Rate(), TimeRemainingColumn(), TimeElapsedColumn(),
                console=console or Console(stderr=True), transient=False, refresh_per_second=4,
            )

    def __enter__(self) -> "ProgressBars":
        if self._bars is not None:
            self._bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bars is not None:
            self._bars.stop()

    def __call__(self, p: Progress) -> None:
        if self._bars is None:
            return
        task = self._tasks.get(p.task)
        if task is None:
            task = self._tasks[p.task] = self._bars.add_task(p.task, total=p.total, unit=p.unit)
        self._bars.update(task, completed=p.done, total=p.total)

    def spinner(self, task: str) -> None:
        """A task with no count (a maintenance cycle): its bar pulses and shows the elapsed time."""
        if self._bars is not None and task not in self._tasks:
            self._tasks[task] = self._bars.add_task(task, total=None, unit="")

    def finish(self, task: str) -> None:
        if self._bars is not None and task in self._tasks:
            t = self._tasks[task]
            done = self._bars.tasks[self._tasks[task]].completed
            self._bars.update(t, total=max(done, 1), completed=max(done, 1))


# -- memwal status --watch -----------------------------------------------------------------------


def status_view(status: TableStatus, *, interval: float, now: float | None = None) -> RenderableType:
    """The data of ``memwal status`` as a live view: the table, a table of shards whose pending
    SSTables are coloured by the writers' state (green ok, yellow slowed, red stalled), the
    bounds, the base indexes' lag and the maintenance service's last cycle."""
    now = time.time() if now is None else now
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    head.add_row("table", status.uri)
    head.add_row("primary key", ", ".join(status.primary_key))
    head.add_row("sharding", status.sharding)
    head.add_row("base table", f"version {status.base_version}, {status.base_rows:,} rows")
    head.add_row("shards", str(status.num_shards))
    parts: list[RenderableType] = [
        Text(f"memwal status --watch: every {interval:g}s, updated {time.strftime('%H:%M:%S', time.localtime(now))} (Ctrl-C to stop)",
             style="dim"),
        head,
    ]
    if status.shards:
        stop = status.bounds.stop_sstables if status.bounds is not None else None
        shards = Table(title=None, header_style="bold", expand=False, pad_edge=False)
        for name, justify in (("shard", "left"), ("values", "left"), ("epoch", "right"), ("manifest", "right"),
                              ("wal flushed/seen/tail", "right"), ("gen", "right"), ("sstables", "left"),
                              ("compacted", "right"), ("pending", "right"), ("writes", "left")):
            shards.add_column(name, justify=justify, no_wrap=name in ("shard", "wal flushed/seen/tail"))  # type: ignore[arg-type]
        for s in status.shards:
            style = "bold red" if s.stalled else "yellow" if s.slowed else "green"
            *cells, pending, state = shard_cells(s, stop)
            shards.add_row(*cells, Text(pending, style=style), Text(state, style=style))
        parts.append(shards)
    parts += [Text(line) for line in bounds_lines(status)[1:]]
    if status.index_lag_generations:
        parts.append(Text("base indexes (generations behind compaction): " + ", ".join(
            f"{name} {sum(per.values())}" for name, per in sorted(status.index_lag_generations.items()))))
    if status.maintenance is not None:
        lines = maintenance_lines(status.maintenance)
        failed = any("FAILED" in line for line in lines)
        parts += [Text(line, style="red" if failed and "FAILED" in line else "") for line in lines]
    else:
        parts.append(Text("maintenance: never ran on this table (memwal maintain)", style="yellow"))
    return Group(*parts)


def watch_status(load: Callable[[], TableStatus], interval: float, console: Console | None = None,
                 *, plain: Callable[[TableStatus], str] | None = None, out: Any = None) -> None:
    """Show ``load()`` every ``interval`` seconds until Ctrl-C: a live view on a terminal;
    elsewhere (a pipe, a log) ``plain``'s text once per interval, each after a blank line."""
    console = console or Console()
    if not console.is_terminal and plain is not None:
        stream = out or sys.stdout
        while True:
            print(plain(load()), file=stream, end="\n\n", flush=True)
            time.sleep(interval)
    with Live(status_view(load(), interval=interval), console=console, auto_refresh=False, screen=False) as live:
        while True:
            time.sleep(interval)
            live.update(status_view(load(), interval=interval), refresh=True)
