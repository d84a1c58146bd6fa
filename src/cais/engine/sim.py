"""The event loop (compiled: :class:`cais._core.Simulator`, integer picosecond time
and a heap of timed actions), what programs wait on (compiled: :class:`Signal`, a
one-shot event with a value, and :class:`Countdown`, a signal that fires after a
number of arrivals), and :class:`Process`, a TB program run as a generator."""

from __future__ import annotations

import gc
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from typing import Any

from cais._core import Countdown, Signal, Simulator

__all__ = ["Countdown", "Process", "ProgramGen", "Signal", "Simulator", "fewer_collections"]

# Python's cyclic collector while a simulation runs: a run allocates millions of short-
# lived objects (trains, closures, TB frames), and each full collection walks the whole
# machine, so the default thresholds (700, 10, 10) spend a sixth of a CAIS layer's wall
# time collecting (docs/validation.md, section 15). Collecting less often finds the same
# garbage later; the run's peak memory did not change.
RUN_GC_THRESHOLDS = (50_000, 20, 100)


@contextmanager
def fewer_collections() -> Iterator[None]:
    """Run the cyclic garbage collector less often inside the ``with`` block, and give
    the thresholds found back on leaving it (they are the interpreter's, not ours)."""
    old = gc.get_threshold()
    gc.set_threshold(*RUN_GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*old)


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
