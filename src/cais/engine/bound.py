"""A strict bound on bytes in flight, granted in request order.

Real memory systems bound what an issuer keeps outstanding by a fixed number of
tracking entries (MSHRs, request tables): a request that finds them full waits, and
waiting requests are served first come, first served. :class:`Bound` is that, in
bytes: nothing is ever admitted past the limit, not even a first request, so a
caller must cut its requests to at most ``limit`` bytes each."""

from __future__ import annotations

from collections import deque

from cais.engine.sim import Signal, Simulator


class Bound:
    """At most ``limit`` bytes outstanding; :meth:`acquire` grants in FIFO order."""

    __slots__ = ("sim", "limit", "used", "peak", "waited", "_queue")

    def __init__(self, sim: Simulator, limit: int) -> None:
        if limit <= 0:
            raise ValueError(f"bound limit must be positive, got {limit}")
        self.sim = sim
        self.limit = limit
        self.used = 0
        self.peak = 0
        self.waited = 0  # requests that had to queue
        self._queue: deque[tuple[int, Signal]] = deque()

    def acquire(self, nbytes: int) -> Signal | None:
        """Take ``nbytes``: None when granted now, else a signal that fires once they
        are granted (and taken). Requests larger than the limit are a caller's bug."""
        if nbytes > self.limit:
            raise ValueError(f"a request of {nbytes} B exceeds its bound of {self.limit} B: cut it first")
        if not self._queue and self.used + nbytes <= self.limit:
            self._take(nbytes)
            return None
        self.waited += 1
        sig = Signal()
        self._queue.append((nbytes, sig))
        return sig

    def release(self, nbytes: int) -> None:
        self.used -= nbytes
        if self.used < 0:
            raise RuntimeError("bound released more than was taken")
        queue = self._queue
        while queue and self.used + queue[0][0] <= self.limit:
            n, sig = queue.popleft()
            self._take(n)
            sig.fire(self.sim)

    def _take(self, nbytes: int) -> None:
        self.used += nbytes
        if self.used > self.peak:
            self.peak = self.used
