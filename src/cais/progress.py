"""Progress of one long run, on stderr: a bar with simulated time, events done and
an ETA (from the run's event estimate, ``cais.limits``), and a one-line notice before
a run estimated to take minutes.

The simulator calls :meth:`RunProgress.tick` every few thousand events
(``Simulator.tick``); a tick reads the wall clock and redraws at most a few times a
second, so a run pays well under 1 % for it. Nothing is drawn during the first
``after_s`` seconds: short runs stay silent.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

# Events per second of wall time on the 2-core development machine (docs/validation.md
# section 10: 50-110 k/s depending on the run); only used for the notice's estimate.
EVENTS_PER_S = 60_000
# A run estimated longer than this (seconds) is announced before it starts.
NOTICE_S = 120.0


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
                 stream: TextIO | None = None, hint: str = "") -> None:
        self.show = show
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

    def begin(self, estimate_events: float, what: str) -> None:
        """A run of about ``estimate_events`` events (``what``: its one-line name) starts."""
        self.estimate = max(1.0, estimate_events)
        self.what = what
        self._t0 = time.perf_counter()
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
        t = time.perf_counter()
        if t < self._next:
            return
        elapsed = t - self._t0
        rate = events / elapsed if elapsed > 0 else 0.0
        left = max(0.0, self.estimate - events)
        eta = f"ETA ~{_duration(left / rate)}" if rate > 0 and left > 0 else "ETA: past the estimate"
        info = f"sim {now_ps / 1e6:,.1f} us | {events:,} events | {rate / 1e3:,.0f} k/s | {eta}"
        if not self._tty():  # a log file: a plain line now and then
            self._next = t + self.log_every_s
            print(f"cais: progress: {self.what}: {info} ({elapsed:.0f} s)", file=self.stream, flush=True)
            return
        self._next = t + self.every_s
        if self._bar is None:
            self._start_bar()
        self._bar.update(self._task, completed=min(events, self.estimate), info=info)

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
