"""Helpers TB programs share: bounded in-flight windows and even splits."""

from __future__ import annotations

from cais.engine import Bound, Signal, Simulator
from cais.engine.sim import ProgramGen


class Window:
    """Bounds the bytes a TB keeps in flight (outstanding loads, or stores not yet
    delivered): the SM's memory-level parallelism and the backpressure of its port.

    Not the core's :class:`~cais.engine.Bound`, on purpose, and the two differ in
    three ways (issue 38 asked for one or the difference stated here):

    * **soft limit**: a request is admitted whenever nothing is in flight, however
      large (``full`` is ``used > 0 and used + nbytes > limit``), so a caller need not
      cut its transfers to the limit; a ``Bound`` refuses a request over its limit;
    * **one owner, no queue**: one program (a collective's TB, a DMA engine) takes and
      releases it, checking ``full`` between its own sends; a release wakes whoever
      waits and they look again. A ``Bound`` is shared by many TBs (a GPU's bound on
      outstanding remote requests) and grants in first-come, first-served order;
    * **Python**: its users are per-transfer loops in Python kernels (collectives,
      production AllReduces, DMA), whose results the goldens and the fitted
      collective constants rest on; a ``Bound`` lives in the core beside the
      ``LoadStream`` and ``RedStream`` that take it without entering the
      interpreter. The staged NVLS AllReduce's reduce warps keep this window's
      soft limit in the core (``Isa.ld_reduce_stream``).

    Folding it into ``Bound`` would change when those kernels' transfers start.
    """

    __slots__ = ("sim", "limit", "used", "_waiter")

    def __init__(self, sim: Simulator, limit: int) -> None:
        self.sim = sim
        self.limit = limit
        self.used = 0
        self._waiter: Signal | None = None

    def full(self, nbytes: int) -> bool:
        return self.used > 0 and self.used + nbytes > self.limit

    def wait(self) -> Signal:
        """A signal that fires at the next release."""
        if self._waiter is None:
            self._waiter = Signal()
        return self._waiter

    def take(self, nbytes: int) -> None:
        self.used += nbytes

    def acquire(self, nbytes: int) -> ProgramGen:
        """Wait (in a TB program: ``yield from``) until ``nbytes`` more fit, then take them."""
        while self.full(nbytes):
            yield self.wait()
        self.take(nbytes)

    def release(self, nbytes: int) -> None:
        self.used -= nbytes
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            waiter.fire(self.sim)


class RequestSlots:
    """Room for a TB's remote SM requests: its SM's window (the SM's memory-level
    parallelism) and, on top, its GPU's bound on outstanding remote requests
    (``gpu.remote_outstanding_kB``; the CAIS paper's section V-C). A request takes
    its bytes in both before it is issued and gives them back when it is
    acknowledged: a load when its data is back, a reduction when the switch (or,
    unmerged, the home) has taken it. Both are strict: callers cut requests to
    :attr:`piece` bytes at most. Only a piece that cannot be cut that far (one row
    of a block, against a bound set below a row) takes a whole bound: it waits
    until the bound is empty and is then the only request in flight."""

    __slots__ = ("sm", "gpu")

    def __init__(self, sm: Bound, gpu: Bound) -> None:
        self.sm = sm
        self.gpu = gpu

    @property
    def piece(self) -> int:
        """The largest request both bounds admit."""
        return min(self.sm.limit, self.gpu.limit)

    def acquire(self, nbytes: int) -> ProgramGen:
        """Wait (in a TB program) until ``nbytes`` are granted in both."""
        for bound in (self.sm, self.gpu):
            granted = bound.acquire(min(nbytes, bound.limit))
            if granted is not None:
                yield granted

    def release(self, nbytes: int) -> None:
        for bound in (self.sm, self.gpu):
            bound.release(min(nbytes, bound.limit))


def split(start: int, stop: int, parts: int) -> list[tuple[int, int]]:
    """Cut [start, stop) into ``parts`` contiguous (start, count) pieces whose sizes
    differ by at most one (the first ones are larger)."""
    total = stop - start
    base, extra = divmod(total, parts)
    out, pos = [], start
    for i in range(parts):
        cnt = base + (1 if i < extra else 0)
        out.append((pos, cnt))
        pos += cnt
    return out


def pause(sim: Simulator, ps: int) -> Signal:
    """A signal that fires ``ps`` from now: what a TB program yields to spend time
    doing nothing the fabric sees (a kernel's prologue)."""
    sig = Signal()
    sim.after(ps, sig.fire, sim)
    return sig
