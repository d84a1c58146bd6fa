"""Credit-based flow control for one input buffer, as its sender sees it.

The receiving end of a channel has one buffer per virtual channel (VC) of
``capacity`` bytes. The sender holds a credit per byte of free space: it may put a
train on the wire only if the credits cover it, and credits come back when the
receiver has passed the train on (its departure), one latency later.

Trains are coarser than flits, so two rules make train-level credits behave like
flit-level ones (docs/fabric-model.md, "Flow control"):

* A train *streams* through the buffer: it needs credits for its bytes as they go
  out on the wire, not all at once, and the credits of an earlier train come back
  progressively, as a linear *ramp* over that train's departure. A sender may start
  a train at time ``s`` when the credits returned by every ``t`` in its
  serialisation window cover the part of it sent by ``t``.
* A train holds at most ``capacity`` bytes of the buffer (its *footprint*): a train
  longer than the buffer streams through it cut-through.

Statistics: ``peak`` (bytes held per VC) and, when a recorder sets ``log`` to a
list, every occupancy change as ``(time_ps, vc, delta_bytes)``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable


class Credits:
    """The credit counters of one receiving input port (a switch port or a GPU's
    NVLink endpoint), per VC: free bytes, returns still in flight, and a wake-up for
    the channel that waits on them."""

    __slots__ = ("name", "vcs", "capacity", "return_ps", "drains", "drain_kinds", "free", "ramps", "ramped", "held", "peak",
                 "log", "_waiter")

    def __init__(self, name: str, vcs: int, capacity: int, return_ps: int, drains: bool = False,
                 drain_kinds: frozenset[int] = frozenset()) -> None:
        if capacity <= 0:
            raise ValueError(f"{name}: buffer capacity must be positive, got {capacity}")
        self.name = name
        self.vcs = vcs
        self.capacity = capacity
        self.return_ps = return_ps
        # A receiver that consumes every train (``drains``), or trains of some kinds
        # (``drain_kinds``), as they arrive lets the sender schedule the return when
        # it sends; if it must hold such a train after all, it reclaims the credits
        # (hold) and gives them back when it consumes it.
        self.drains = drains
        self.drain_kinds = drain_kinds
        self.free = [capacity] * vcs
        self.ramps: list[deque[tuple[int, int, int]]] = [deque() for _ in range(vcs)]
        self.held = [0] * vcs
        self.peak = [0] * vcs
        self.log: list[tuple[int, int, int]] | None = None
        self.ramped = [0] * vcs  # bytes in ramps, per VC
        self._waiter: Callable[[int], None] | None = None

    def footprint(self, wire: int) -> int:
        return wire if wire < self.capacity else self.capacity

    # ---- sender side -------------------------------------------------------------
    def earliest(self, vc: int, fp: int, ser_ps: int, now: int) -> int | None:
        """The earliest start time >= ``now`` (a lower bound, which may lie in the
        past) at which a train of footprint ``fp`` serialised over ``ser_ps`` has
        credits all along, or None if the returns scheduled so far can never cover
        it (wait for more)."""
        if self.free[vc] >= fp:
            return now
        ramps = self.ramps[vc]
        if ramps and ramps[0][1] <= now:
            self._fold(vc, now)
            if self.free[vc] >= fp:
                return now
        free = self.free[vc]
        if free + self.ramped[vc] < fp:
            return None
        return self._solve(vc, fp, ser_ps, now)

    def _solve(self, vc: int, fp: int, ser: int, lower: int) -> int:
        """Closed form of the earliest covered start. With A(t) the credits returned
        by t (non-decreasing, piecewise linear) and T the first time A reaches ``fp``,
        the train needs A(t) >= fp (t - s) / ser on its window, which holds wherever
        t >= T and otherwise reads s >= h(t) = t - A(t) ser / fp. So the start is
        max(lower, T - ser, max of h over [lower, T)), and h, piecewise linear, peaks
        at a breakpoint of A."""
        ramps = self.ramps[vc]
        free = self.free[vc]
        k = ser / fp if fp else 0.0
        if len(ramps) == 1:  # the common case, in closed form
            a, b, n = ramps[0]
            level = free + (n if lower >= b else n * (lower - a) / (b - a) if lower > a else 0)
            if level >= fp:
                return lower
            reach = a + (fp - free) * (b - a) / n
            start = max(float(lower), reach - ser, lower - level * k, a - free * k if a > lower else lower)
            return int(start) + (start > int(start))
        level = float(free)  # A(lower)
        for a, b, n in ramps:
            if lower >= b:
                level += n
            elif lower > a:
                level += n * (lower - a) / (b - a)
        if level >= fp:
            return lower
        slope = 0.0  # dA/dt just after lower
        changes: list[tuple[int, float]] = []  # (time, slope change) after lower
        for a, b, n in ramps:
            if lower < b:
                rate = n / (b - a)
                if lower > a:
                    slope += rate
                else:
                    changes.append((a, rate))
                changes.append((b, -rate))
        best = lower - level * k  # h(lower)
        changes.sort()
        t = lower
        reach = None
        for when, delta in changes:
            if slope > 0 and level + slope * (when - t) >= fp:
                reach = t + (fp - level) / slope  # T: A(T) = fp inside this segment
                break
            level += slope * (when - t)
            t = when
            h = t - level * k
            if h > best:
                best = h
            slope += delta
        if reach is None:  # reached at the last breakpoint (every ramp has ended)
            reach = float(t)
        start = max(float(lower), reach - ser, best)
        return int(start) + (start > int(start))  # integer picoseconds, rounded up

    def _fold(self, vc: int, now: int) -> None:
        """Move ramps that have fully returned by ``now`` into the free count. Ramps
        are kept in the order they were given back, which is nearly the order they
        end in; one that ends early behind a later one is folded a little late (its
        credits only count as they ramp, which is conservative)."""
        ramps = self.ramps[vc]
        got = 0
        while ramps and ramps[0][1] <= now:
            got += ramps.popleft()[2]
        self.free[vc] += got
        self.ramped[vc] -= got

    def take(self, vc: int, fp: int, arrive_ps: int) -> None:
        """A train of footprint ``fp`` starts on the wire; its head reaches the buffer
        at ``arrive_ps``."""
        self.free[vc] -= fp  # may go below zero: returns in flight cover it (earliest() checked)
        held = self.held[vc] + fp
        self.held[vc] = held
        if held > self.peak[vc]:
            self.peak[vc] = held
        if self.log is not None:
            self.log.append((arrive_ps, vc, fp))

    def stream(self, vc: int, fp: int, head_ps: int, tail_ps: int) -> None:
        """A train of footprint ``fp`` starts towards a receiver that drains it as it
        arrives (head at ``head_ps``, tail at ``tail_ps``): take its credits and
        schedule their return at once (``take`` + ``give_back`` in one step)."""
        if fp > self.peak[vc]:  # it is held on its own: what is held drains as it comes
            self.peak[vc] = fp
        self.free[vc] -= fp
        if self.log is not None:
            self.log.append((head_ps, vc, fp))
            self.log.append((tail_ps, vc, -fp))
        ret = self.return_ps
        a = head_ps + ret
        b = tail_ps + ret
        ramps = self.ramps[vc]
        ramps.append((a, b if b > a else a + 1, fp))
        self.ramped[vc] += fp
        if len(ramps) > 4 and ramps[0][1] <= head_ps:
            self._fold(vc, head_ps)

    # ---- receiver side -----------------------------------------------------------
    def hold(self, vc: int, fp: int, now: int) -> None:
        """A draining receiver keeps a train after all (from ``now``): take back the
        credits its sender scheduled to return (they come back with ``give_back``)."""
        self.take(vc, fp, now)

    def give_back(self, vc: int, fp: int, t0: int, t1: int, notify: bool = True) -> None:
        """The train holding ``fp`` bytes of VC ``vc`` left the buffer between ``t0``
        and ``t1``; its credits reach the sender ``return_ps`` later, progressively."""
        self.held[vc] -= fp
        if self.log is not None:
            self.log.append((t1, vc, -fp))
        a, b = t0 + self.return_ps, t1 + self.return_ps
        if b <= a:
            b = a + 1
        ramps = self.ramps[vc]
        ramps.append((a, b, fp))
        self.ramped[vc] += fp
        if len(ramps) > 4 and ramps[0][1] <= t0:  # keep the list short
            self._fold(vc, t0)
        if notify and self._waiter is not None:
            self._waiter(vc)

    def on_return(self, waiter: Callable[[int], None]) -> None:
        """Who to wake (with the VC) when credits are given back: the channel that
        sends here."""
        self._waiter = waiter
