"""Progress of a simulation on stderr, fed by the simulator's ``progress(fraction, events,
sim_time_s)`` callback (about every 0.1 s of wall time).

On a terminal it is a rich bar that redraws at most every :data:`REDRAW_S`; off a terminal
(nohup, CI, a cluster's log file) it is a plain line every :data:`PLAIN_EVERY_S`, so that a
long run shows it is alive. Both give the simulated time, the events and their rate, and an
estimate of the time left; the fraction is the simulator's estimate
(``inalab_sim::ProgressReport``), which moves within one long allreduce.
"""
from __future__ import annotations

import time
from typing import Optional

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

# Short runs finish before progress would be readable; it appears only after this much wall time.
SHOW_AFTER_S = 1.0
# A terminal's bar is redrawn at most this often, s.
REDRAW_S = 0.2
# Off a terminal, one line this often, s.
PLAIN_EVERY_S = 5.0


def sim_time(seconds: float) -> str:
    """A simulated time in the unit that reads best: 12.3 us, 4.56 ms, 1.23 s."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds * 1e9:.3g} ns"


def left(elapsed: float, fraction: float) -> Optional[float]:
    """Wall time left at the rate so far, s (None before there is a rate)."""
    if fraction <= 0.01 or elapsed <= 0:
        return None
    return elapsed * (1 - fraction) / fraction


def status_text(fraction: float, events: int, sim_time_s: float, elapsed: float) -> str:
    """The words after the bar: simulated time, events and their rate, time left."""
    rate = events / elapsed if elapsed > 0 else 0.0
    eta = left(elapsed, fraction)
    return (f"sim {sim_time(sim_time_s)}, {events:,} events ({rate / 1e6:.2g} M/s)"
            + ("" if eta is None else f", ~{eta:.0f} s left"))


class ProgressBar:
    """Use as ``with ProgressBar("demo") as bar: _core.simulate(spec, bar.update)``.

    ``plain`` forces the line-per-interval form (default: when stderr is not a terminal)."""

    def __init__(self, label: str, console: Console | None = None, plain: Optional[bool] = None):
        self.label = label
        self.console = console or Console(stderr=True)
        self.plain = (not self.console.is_terminal) if plain is None else plain
        self.started = time.monotonic()
        self.last_drawn = 0.0
        self.progress: Progress | None = None
        self.task = None
        self.last: tuple[float, int, float] | None = None
        self.lines = 0

    def __enter__(self) -> "ProgressBar":
        self.started = time.monotonic()
        return self

    def update(self, fraction: float, events: int, sim_time_s: float = 0.0) -> None:
        now = time.monotonic()
        elapsed = now - self.started
        fraction = min(max(fraction, 0.0), 1.0)
        self.last = (fraction, events, sim_time_s)
        if elapsed < SHOW_AFTER_S:
            return
        if self.plain:
            if now - self.last_drawn >= PLAIN_EVERY_S or (self.lines and fraction >= 1.0):
                self.last_drawn = now
                self.lines += 1
                self.console.print(f"{self.label}: {fraction:.0%}, {status_text(fraction, events, sim_time_s, elapsed)}, "
                                   f"{elapsed:.0f} s elapsed", markup=False, highlight=False, soft_wrap=True)
            return
        if self.progress is None:
            # auto_refresh off: the simulator holds the CPU, so refresh only when it reports.
            self.progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), TaskProgressColumn(),
                TextColumn("{task.fields[status]}"), TimeElapsedColumn(),
                console=self.console, auto_refresh=False, transient=False,
            )
            self.progress.start()
            self.task = self.progress.add_task(self.label, total=1.0, status="")
        if now - self.last_drawn >= REDRAW_S or fraction >= 1.0:
            self.last_drawn = now
            self.progress.update(self.task, completed=fraction, status=status_text(fraction, events, sim_time_s, elapsed))
            self.progress.refresh()

    def __exit__(self, *exc) -> None:
        if self.progress is not None:
            self.progress.stop()
