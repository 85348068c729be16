"""A rich progress bar on stderr, fed by the simulator's ``progress(fraction, events)`` callback."""
from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

# Short runs finish before the bar would be readable; it appears only after this much wall time.
SHOW_AFTER_S = 1.0


class ProgressBar:
    """Use as ``with ProgressBar("demo") as bar: _core.simulate(spec, bar.update)``."""

    def __init__(self, label: str, console: Console | None = None):
        self.label = label
        self.console = console or Console(stderr=True)
        self.started = time.monotonic()
        self.progress: Progress | None = None
        self.task = None

    def __enter__(self) -> "ProgressBar":
        self.started = time.monotonic()
        return self

    def update(self, fraction: float, events: int) -> None:
        if self.progress is None:
            if time.monotonic() - self.started < SHOW_AFTER_S:
                return
            # auto_refresh off: the simulator holds the CPU, so refresh only when it reports.
            self.progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), TaskProgressColumn(),
                TextColumn("{task.fields[events]:,} events"), TimeElapsedColumn(),
                console=self.console, auto_refresh=False, transient=False,
            )
            self.progress.start()
            self.task = self.progress.add_task(self.label, total=1.0, events=0)
        self.progress.update(self.task, completed=min(max(fraction, 0.0), 1.0), events=events)
        self.progress.refresh()

    def __exit__(self, *exc) -> None:
        if self.progress is not None:
            self.progress.stop()
