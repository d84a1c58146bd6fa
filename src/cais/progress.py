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
        self._bar: Any = None
        self._task: Any = None
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
        info = f"sim {now_ps / 1e6:,.1f} us | {events:,} events"
        eta = self.eta(events)
        if eta is not None:
            info += f" | {self.rate / 1e3:,.0f} k/s | {eta}"
        if not self._tty():  # a log file: a plain line now and then
            self._next = t + self.log_every_s
            print(f"cais: progress: {self.what}: {info} ({elapsed:.0f} s)", file=self.stream, flush=True)
            return
        self._next = t + self.every_s
        if self._bar is None:
            self._start_bar()
        self._bar.update(self._task, completed=min(events, self.estimate), info=info)

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
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self._bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"),
                             TimeElapsedColumn(), console=Console(file=self.stream), transient=True)
        self._bar.start()
        self._task = self._bar.add_task(self.what, total=self.estimate, info="")

    def end(self) -> None:
        """The run is over (or interrupted): remove the bar."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __enter__(self) -> "RunProgress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.end()
