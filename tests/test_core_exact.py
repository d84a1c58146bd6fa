"""The compiled credit solver gives the same picoseconds as the Python model it
replaced: a seeded random sequence of takes, streams, returns and queries runs on
both, and every answer and counter must agree exactly. The reference below is the
pure-Python ``Credits`` of the last commit before the core (``ea63d9d``), kept here
as the oracle (its floats, in its order of operations, are the specification)."""

from __future__ import annotations

import random
from collections import deque

import pytest

from cais.engine import Credits


class ReferenceCredits:
    """The pure-Python model's arithmetic (``ea63d9d:src/cais/engine/credits.py``)."""

    def __init__(self, vcs: int, capacity: int, return_ps: int) -> None:
        self.capacity, self.return_ps = capacity, return_ps
        self.free = [capacity] * vcs
        self.ramps: list[deque[tuple[int, int, int]]] = [deque() for _ in range(vcs)]
        self.held = [0] * vcs
        self.ramped = [0] * vcs

    def earliest(self, vc: int, fp: int, ser_ps: int, now: int) -> int | None:
        if self.free[vc] >= fp:
            return now
        ramps = self.ramps[vc]
        if ramps and ramps[0][1] <= now:
            self._fold(vc, now)
            if self.free[vc] >= fp:
                return now
        if self.free[vc] + self.ramped[vc] < fp:
            return None
        return self._solve(vc, fp, ser_ps, now)

    def _solve(self, vc: int, fp: int, ser: int, lower: int) -> int:
        ramps = self.ramps[vc]
        free = self.free[vc]
        k = ser / fp if fp else 0.0
        if len(ramps) == 1:
            a, b, n = ramps[0]
            level = free + (n if lower >= b else n * (lower - a) / (b - a) if lower > a else 0)
            if level >= fp:
                return lower
            reach = a + (fp - free) * (b - a) / n
            start = max(float(lower), reach - ser, lower - level * k, a - free * k if a > lower else lower)
            return int(start) + (start > int(start))
        level = float(free)
        for a, b, n in ramps:
            if lower >= b:
                level += n
            elif lower > a:
                level += n * (lower - a) / (b - a)
        if level >= fp:
            return lower
        slope = 0.0
        changes: list[tuple[int, float]] = []
        for a, b, n in ramps:
            if lower < b:
                rate = n / (b - a)
                if lower > a:
                    slope += rate
                else:
                    changes.append((a, rate))
                changes.append((b, -rate))
        best = lower - level * k
        changes.sort()
        t = lower
        reach = None
        for when, delta in changes:
            if slope > 0 and level + slope * (when - t) >= fp:
                reach = t + (fp - level) / slope
                break
            level += slope * (when - t)
            t = when
            h = t - level * k
            if h > best:
                best = h
            slope += delta
        if reach is None:
            reach = float(t)
        start = max(float(lower), reach - ser, best)
        return int(start) + (start > int(start))

    def _fold(self, vc: int, now: int) -> None:
        ramps = self.ramps[vc]
        got = 0
        while ramps and ramps[0][1] <= now:
            got += ramps.popleft()[2]
        self.free[vc] += got
        self.ramped[vc] -= got

    def take(self, vc: int, fp: int) -> None:
        self.free[vc] -= fp
        self.held[vc] += fp

    def stream(self, vc: int, fp: int, head_ps: int, tail_ps: int) -> None:
        self.free[vc] -= fp
        a, b = head_ps + self.return_ps, tail_ps + self.return_ps
        self.ramps[vc].append((a, b if b > a else a + 1, fp))
        self.ramped[vc] += fp
        if len(self.ramps[vc]) > 4 and self.ramps[vc][0][1] <= head_ps:
            self._fold(vc, head_ps)

    def give_back(self, vc: int, fp: int, t0: int, t1: int) -> None:
        self.held[vc] -= fp
        a, b = t0 + self.return_ps, t1 + self.return_ps
        self.ramps[vc].append((a, b if b > a else a + 1, fp))
        self.ramped[vc] += fp
        if len(self.ramps[vc]) > 4 and self.ramps[vc][0][1] <= t0:
            self._fold(vc, t0)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_credit_traffic_gives_the_same_picoseconds(seed: int) -> None:
    rng = random.Random(seed)
    vcs, capacity, ret = 2, 4096, 700
    core, ref = Credits("b", vcs, capacity, ret), ReferenceCredits(vcs, capacity, ret)
    now, taken = 0, [deque(), deque()]
    solved = 0  # starts solved for over several returning ramps
    for _ in range(8000):
        now += rng.choice((0, 1, 7, 50, 130, 999))
        vc = rng.randrange(vcs)
        fp = rng.randint(1, capacity)
        op = rng.random()
        if op < 0.2:
            core.take(vc, fp, now)
            ref.take(vc, fp)
            taken[vc].append(fp)
        elif op < 0.5:
            tail = now + rng.randint(0, 20_000)
            core.stream(vc, fp, now, tail)
            ref.stream(vc, fp, now, tail)
        elif op < 0.7 and taken[vc]:
            back, t1 = taken[vc].popleft(), now + rng.randint(0, 20_000)
            core.give_back(vc, back, now, t1, False)
            ref.give_back(vc, back, now, t1)
        else:
            ser = rng.randint(1, 40_000)
            lower = now - rng.randint(0, 5_000)
            got, want = core.earliest(vc, fp, ser, lower), ref.earliest(vc, fp, ser, lower)
            assert got == want, (seed, vc, fp, ser, lower)
            solved += want is not None and want > lower and len(ref.ramps[vc]) > 1
        assert (core.free, core.ramped, core.held) == (ref.free, ref.ramped, ref.held)
    assert solved > 30  # the solver was compared over several ramps, not only free credits


def test_one_returning_ramp_gives_the_same_picoseconds() -> None:
    """The closed form for one ramp (the common case) on random buffers, ramps and trains."""
    rng = random.Random(7)
    solved = 0
    for _ in range(3000):
        capacity, ret = rng.randint(64, 1 << 20), rng.randint(0, 5_000)
        core, ref = Credits("b", 1, capacity, ret), ReferenceCredits(1, capacity, ret)
        fp0, t0 = rng.randint(1, capacity), rng.randint(0, 10**9)
        t1 = t0 + rng.randint(0, 10**6)
        core.take(0, fp0, t0)
        ref.take(0, fp0)
        core.give_back(0, fp0, t0, t1, False)
        ref.give_back(0, fp0, t0, t1)
        fp, ser = rng.randint(capacity - fp0 + 1, capacity), rng.randint(1, 10**6)  # more than is free
        lower = t0 + ret + rng.randint(-10**6, t1 - t0)  # before or while the ramp returns
        want = ref.earliest(0, fp, ser, lower)
        assert core.earliest(0, fp, ser, lower) == want, (capacity, ret, fp0, t0, t1, fp, ser, lower)
        solved += want is not None and want > lower
    assert solved > 500
