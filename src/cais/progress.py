"""Progress of one long run, on stderr: a bar with simulated time, events done, the
measured event rate and an ETA, and a one-line notice before a run estimated to take
minutes.

The simulator calls :meth:`RunProgress.tick` every few thousand events
(``Simulator.tick``); a tick reads the wall clock and redraws at most a few times a
second, so a run pays well under 1 % for it. Nothing is drawn during the first
``after_s`` seconds: short runs stay silent.

The ETA comes from a **measured** rate: events per wall second, counted from the
first tick (so building the machine, which can take seconds on a large system, is
not mistaken for slow simulation) and smoothed over the run so far (an exponential
average whose time constant grows with the run). No ETA is shown until the rate has
been measured over ``measure_s`` seconds. The work left is the run's event estimate
(``cais.limits``) less the events done; that estimate is an upper-ish count (the
measured runs take 0.1 to 0.97 of it, docs/errors.md "Size limits"), so the ETA is
shown as a bound, ``ETA <= ...``, and once the run passes the estimate as
``past the estimate``.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

# Events per second of wall time on the 2-core development machine with the compiled
# core (docs/validation.md section 15, seventh part: about 350-750 k/s for a layer on
# 72 GPUs, 1.0-1.6 M/s for a CAIS layer on 8, 2.5 M/s for an 8-GPU collective); only
# used for the notice's estimate, so the low end of those.
EVENTS_PER_S = 500_000
# A run estimated longer than this (seconds) is announced before it starts.
NOTICE_S = 120.0
# The rate is measured over at least this much wall time (from the first tick) before
# an ETA is shown.
MEASURE_S = 1.0
# The smoothing's time constant: at least this many seconds, and at least a third of
# the measured span, so a long run's rate follows its slow drift, not its jitter.
SMOOTH_S = 10.0


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _clock(seconds: float) -> str:
    """Elapsed wall time as h:mm:ss."""
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class BarView:
    """What the bar shows, laid out for the terminal's width when drawn: the run's
    name on its own line (wrapped, never cut), then the bar and ``parts`` (the ETA
    first) joined by ``|``; where the line is too narrow for them all and a bar of
    :attr:`MIN_BAR` cells, the last parts are left out, the first (the ETA, once
    measured) never."""

    MIN_BAR = 10
    MAX_BAR = 40

    def __init__(self, what: str, total: float) -> None:
        self.what = what
        self.total = total
        self.completed = 0.0
        self.parts: list[str] = []

    def update(self, completed: float, parts: list[str]) -> None:
        self.completed, self.parts = completed, parts

    def line(self, width: int) -> tuple[int, str]:
        """The bar's width and the text beside it on a line of ``width`` cells (bar
        width 0: no room for a bar)."""
        parts = list(self.parts)
        while len(parts) > 1 and len(" | ".join(parts)) + 1 + self.MIN_BAR > width:
            parts.pop()
        text = " | ".join(parts)
        bar = width - len(text) - 1
        return (bar, text) if bar >= self.MIN_BAR else (0, text)

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        width = options.max_width
        yield Text(self.what, overflow="fold")
        bar, text = self.line(width)
        bar = min(bar, self.MAX_BAR)
        if not bar:
            yield Text(text, overflow="fold")
            return
        grid = Table.grid(padding=(0, 1))
        grid.add_column(width=bar, no_wrap=True)
        grid.add_column(no_wrap=True)
        grid.add_row(ProgressBar(total=self.total, completed=self.completed, width=bar), Text(text))
        yield grid


def fitted_progress(parts: Callable[[Any], list[str]], **kwargs: Any) -> Any:
    """A rich ``Progress`` (its ``kwargs``: console, disable, ...) that draws each task
    as a :class:`BarView`: its description, then the bar and ``parts(task)`` (most
    important first), fitted to the terminal's width."""
    from rich.progress import Progress

    class Fitted(Progress):
        def get_renderables(self) -> Any:
            for task in self.tasks:
                view = BarView(task.description, task.total or 0)
                view.update(task.completed, parts(task))
                yield view

    return Fitted(**kwargs)


def clock_text(seconds: float | None) -> str:
    """A time as h:mm:ss (``-:--:--`` if unknown)."""
    return "-:--:--" if seconds is None else _clock(seconds)


class RunProgress:
    """Reports one run's progress on ``stream`` (stderr): ``show`` draws the bar,
    ``notice`` prints the one-line estimate of a run of minutes before it starts, ending
    with ``hint`` (the caller's advice for a faster run, if any)."""

    def __init__(self, show: bool, notice: bool = True, after_s: float = 2.0, every_s: float = 0.25,
                 stream: TextIO | None = None, hint: str = "", measure_s: float = MEASURE_S,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.show = show
        self.measure_s = measure_s
        self.clock = clock
        self.notice = notice
        self.hint = hint
        self.after_s = after_s
        self.every_s = every_s
        self.log_every_s = 10.0
        self.stream = stream if stream is not None else sys.stderr
        self.estimate = 0.0
        self.what = ""
        self.ticks = 0
        self._t0 = 0.0
        self._next = 0.0
        self._bar: Any = None  # rich's Live display of :attr:`view` while the bar is shown
        self.view: BarView | None = None
        self._first: tuple[float, int] | None = None  # (wall, events) at the first tick: the rate's origin
        self._last: tuple[float, int] | None = None  # (wall, events) the rate was last updated at
        self.rate = 0.0  # events per wall second, smoothed; 0 until measured

    def begin(self, estimate_events: float, what: str) -> None:
        """A run of about ``estimate_events`` events (``what``: its one-line name) starts."""
        self.estimate = max(1.0, estimate_events)
        self.what = what
        self._t0 = self.clock()
        self._first = self._last = None
        self.rate = 0.0
        self._next = self._t0 + self.after_s
        seconds = self.estimate / EVENTS_PER_S
        if self.notice and seconds > NOTICE_S:
            print(f"cais: {what} is estimated at {self.estimate:,.3g} events, about {_duration(seconds)} of wall "
                  f"time here; Ctrl-C stops it{self.hint}", file=self.stream, flush=True)

    def tick(self, now_ps: int, events: int) -> None:
        """Called by the simulator every few thousand events."""
        self.ticks += 1
        if not self.show:
            return
        t = self.clock()
        self._measure(t, events)
        if t < self._next:
            return
        elapsed = t - self._t0
        sim, done = f"sim {now_ps / 1e6:,.1f} us", f"{events:,} events"
        eta = self.eta(events)
        rate = f"{self.rate / 1e3:,.0f} k/s"
        if not self._tty():  # a log file: a plain line now and then, never cut
            self._next = t + self.log_every_s
            info = " | ".join([sim, done, *((rate, eta) if eta is not None else ())])
            print(f"cais: progress: {self.what}: {info} ({elapsed:.0f} s)", file=self.stream, flush=True)
            return
        self._next = t + self.every_s
        if self._bar is None:
            self._start_bar()
        # the bar's line keeps its first parts where the terminal is narrow: the ETA first
        assert self.view is not None
        self.view.update(min(events, self.estimate), [*((eta,) if eta is not None else ()), sim, done,
                                                      *((rate,) if eta is not None else ()), _clock(elapsed)])
        self._bar.refresh()

    def _measure(self, t: float, events: int) -> None:
        """Update the smoothed rate with the events done since the last update."""
        if self._first is None:
            self._first = self._last = (t, events)
            return
        assert self._last is not None
        t_last, e_last = self._last
        dt = t - t_last
        if dt <= 0:
            return
        self._last = (t, events)
        span = t - self._first[0]
        if span < self.measure_s and not self.rate:
            return  # not yet measured over long enough
        if not self.rate:  # the first measurement: the mean since the first tick
            self.rate = (events - self._first[1]) / span
            return
        tau = max(SMOOTH_S, span / 3)
        weight = 1 - math.exp(-dt / tau)
        self.rate += weight * ((events - e_last) / dt - self.rate)

    def eta(self, events: int) -> str | None:
        """The ETA text, or None while the rate is not yet measured."""
        if self.rate <= 0:
            return None
        left = self.estimate - events
        if left <= 0:
            return "ETA: past the estimate"
        return f"ETA <= {_duration(left / self.rate)}"

    def _tty(self) -> bool:
        isatty = getattr(self.stream, "isatty", None)
        return bool(isatty and isatty())

    def _start_bar(self) -> None:
        from rich.console import Console
        from rich.live import Live

        self.view = BarView(self.what, self.estimate)
        self._bar = Live(self.view, console=Console(file=self.stream), auto_refresh=False, transient=True)
        self._bar.start()

    def end(self) -> None:
        """The run is over (or interrupted): remove the bar."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __enter__(self) -> "RunProgress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.end()
