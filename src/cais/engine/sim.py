"""The event loop: integer picosecond time, a heap of timed callbacks, and the two
synchronisation objects programs wait on (Signal, Countdown)."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Generator
from typing import Any


class Simulator:
    """A discrete-event simulator. Time is an integer number of picoseconds.

    Events scheduled for the same time run in the order they were scheduled, so a
    run is deterministic.
    """

    __slots__ = ("now", "_queue", "_seq", "events", "tick", "tick_every")

    TICK_EVERY = 4096

    def __init__(self) -> None:
        self.now: int = 0
        self._queue: list[tuple[int, int, Callable[..., None], tuple]] = []
        self._seq = 0
        self.events = 0
        # Called as tick(now, events) every ``tick_every`` events (a progress report);
        # None: the loop does not look.
        self.tick: Callable[[int, int], None] | None = None
        self.tick_every = self.TICK_EVERY

    def at(self, time: int, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` at absolute time ``time`` (not before now)."""
        if time < self.now:
            raise ValueError(f"event scheduled in the past: {time} < {self.now}")
        self._seq += 1
        heapq.heappush(self._queue, (time, self._seq, fn, args))

    def after(self, delay: int, fn: Callable[..., None], *args: Any) -> None:
        self.at(self.now + delay, fn, *args)

    def next_time(self) -> int | None:
        """Time of the next event, None when nothing is scheduled."""
        return self._queue[0][0] if self._queue else None

    def run(self, until: int | None = None) -> int:
        """Process events until the queue is empty (or past ``until``); return now."""
        queue = self._queue
        pop = heapq.heappop
        count = 0
        tick = self.tick
        if tick is None:
            if until is None:
                while queue:
                    time, _, fn, args = pop(queue)
                    self.now = time
                    fn(*args)
                    count += 1
            else:
                while queue and queue[0][0] <= until:
                    time, _, fn, args = pop(queue)
                    self.now = time
                    fn(*args)
                    count += 1
        else:
            every = self.tick_every
            try:
                while queue:
                    if until is not None and queue[0][0] > until:
                        break
                    time, _, fn, args = pop(queue)
                    self.now = time
                    fn(*args)
                    count += 1
                    if count % every == 0:
                        tick(time, self.events + count)
            finally:
                self.events += count
            return self.now
        self.events += count
        return self.now


class Signal:
    """A one-shot event: programs and callbacks wait on it until it fires once."""

    __slots__ = ("fired", "value", "time", "_waiters")

    def __init__(self) -> None:
        self.fired = False
        self.value: Any = None
        self.time: int | None = None
        self._waiters: list[Callable[[Any], None]] = []

    def on_fire(self, fn: Callable[[Any], None]) -> None:
        if self.fired:
            fn(self.value)
        else:
            self._waiters.append(fn)

    def fire(self, sim: Simulator, value: Any = None) -> None:
        if self.fired:
            raise RuntimeError("signal fired twice")
        self.fired, self.value, self.time = True, value, sim.now
        waiters, self._waiters = self._waiters, []
        for fn in waiters:
            fn(value)


class Countdown(Signal):
    """A signal that fires when ``count`` arrivals have been reported (a completion
    counter, like a TB-done counter or an NVLS reduction's response counter)."""

    __slots__ = ("remaining",)

    def __init__(self, count: int) -> None:
        super().__init__()
        self.remaining = count

    def arrive(self, sim: Simulator, n: int = 1) -> None:
        self.remaining -= n
        if self.remaining < 0:
            raise RuntimeError("countdown went below zero")
        if self.remaining == 0:
            self.fire(sim)


ProgramGen = Generator[Any, Any, None]


class Process:
    """Runs a generator as a simulated program (a thread block's control flow).

    The generator yields an ``int`` (sleep that many picoseconds) or a :class:`Signal`
    (wait until it fires; the signal's value is sent back into the generator).
    ``done`` fires when the generator returns.
    """

    __slots__ = ("sim", "_gen", "done")

    def __init__(self, sim: Simulator, gen: ProgramGen, start: bool = True) -> None:
        self.sim = sim
        self._gen = gen
        self.done = Signal()
        if start:
            sim.after(0, self._step, None)

    def _step(self, value: Any) -> None:
        try:
            waited = self._gen.send(value)
        except StopIteration:
            self.done.fire(self.sim)
            return
        while True:
            if isinstance(waited, Signal):
                if waited.fired:
                    try:
                        waited = self._gen.send(waited.value)
                    except StopIteration:
                        self.done.fire(self.sim)
                        return
                    continue
                waited.on_fire(self._resume)
            elif isinstance(waited, int):
                self.sim.after(waited, self._step, None)
            else:
                raise TypeError(f"a program may yield an int delay or a Signal, not {type(waited).__name__}")
            return

    def _resume(self, value: Any) -> None:
        self._step(value)
