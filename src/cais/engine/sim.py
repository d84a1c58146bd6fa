"""The event loop (:class:`Simulator`: integer picosecond time and a heap of timed
actions), :class:`Process`, which runs a TB program (a Python generator that yields
an ``int`` delay or a signal to wait on, or a :class:`TbPlan`, the same steps listed
once and executed by the core), and what programs wait on: :class:`Signal`, a
one-shot event with a value, and :class:`Countdown`, a signal that fires after a
number of arrivals. All five are compiled (``rust/src/engine/sim.rs``, ``wait.rs``);
generators stay Python."""

from __future__ import annotations

import gc
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from typing import Any

from cais._core import Countdown, Process, Signal, Simulator, TbPlan

__all__ = ["Countdown", "Process", "ProgramGen", "Signal", "Simulator", "TbPlan", "fewer_collections"]

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


def all_of(sim: Simulator, signals: list[Signal]) -> Signal:
    """A signal that fires once every one of ``signals`` has (at once if there are
    none; the one signal itself if there is one)."""
    if len(signals) == 1:
        return signals[0]
    done = Countdown(len(signals))
    if not signals:
        done.fire(sim)
    for s in signals:
        s.on_fire(lambda _v: done.arrive(sim))
    return done
