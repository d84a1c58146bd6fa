"""Synchronisation between GPUs as packets on the wire, following NCCL's kernels.

* NVLS barrier: every GPU issues ``multimem.red`` of +1 on a barrier flag; the
  switch adds it into every GPU's copy (a multicast of 8 B flags); each GPU polls its
  own copy and passes when it reads n. A GPU therefore leaves the barrier one
  GPU -> switch -> GPU trip after the last GPU arrived, and the barrier costs n flag
  packets up and n x n down.
* Point-to-point flags (ring slot flags and credits): a flag store to the peer,
  which polls it locally (``Isa.flag``); data behind a flag is fenced first (the
  stores' write responses are back) so that the peer never sees the flag before the
  data.

Local polling costs no link time and is not modelled beyond the flag's arrival.
"""

from __future__ import annotations

from collections.abc import Sequence

from cais.engine import Countdown, Signal
from cais.machine import Machine


def barrier(m: Machine, arrive: Sequence[Signal], name: str = "barrier") -> list[Signal]:
    """An NVLS barrier over all GPUs: GPU g arrives when ``arrive[g]`` fires; the
    returned signal of GPU g fires when g has seen every GPU's arrival."""
    n = m.n
    if len(arrive) != n:
        raise ValueError(f"a barrier needs one arrival per GPU ({n}), got {len(arrive)}")
    key = m.flag_key()
    seen = [Countdown(n) for _ in range(n)]
    sim = m.sim
    first: list[int | None] = [None]

    def landed(h: int) -> None:
        seen[h].arrive(sim)
        if seen[h].fired:
            m.mark(h, "sync", name, first[0] if first[0] is not None else sim.now, sim.now)

    def go(g: int) -> None:
        if first[0] is None:
            first[0] = sim.now
        m.isa.flag_multicast(g, key, landed)

    # Mirror mode: GPU 0 alone arrives; the copies of its flag that land on it stand
    # for every GPU's flag.
    for g, sig in enumerate(arrive[:1] if m.fabric.mirror else arrive):
        sig.on_fire(lambda _v, g=g: go(g))
    return list(seen)


def notify(m: Machine, arrive: Sequence[Signal], owner: int, name: str = "flags") -> Signal:
    """Completion flags to one GPU: GPU g stores a flag on ``owner`` when
    ``arrive[g]`` fires (the owner's own is local); the returned signal fires when
    the owner has seen all of them."""
    n = len(arrive)
    key = m.flag_key()
    seen = Countdown(n)
    sim = m.sim

    def landed() -> None:
        seen.arrive(sim)
        if seen.fired:
            m.mark(owner, "sync", name, sim.now, sim.now)

    for g, sig in enumerate(arrive):
        sig.on_fire(lambda _v, g=g: m.isa.flag(g, owner, key, landed))
    return seen
