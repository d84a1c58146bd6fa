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


class BlockFlags:
    """Per-block flag exchange over P2P stores, the barrier of the custom all-reduce
    kernels (vLLM's ``start_sync``/``end_sync``, PyTorch symmetric memory's
    ``sync_remote_blocks``, TensorRT-LLM's per-block ``Barrier``): block ``b`` of GPU
    ``g`` stores one flag into every peer's signal pad (slot [b][g]; n - 1 flag
    packets) and passes once every peer's block ``b`` has stored its flag into
    ``g``'s pad. Blocks with different indices never wait for each other, so a GPU's
    blocks leave the barrier at different times. One object is one use of the pads
    (one barrier); a kernel with two barriers makes two.

    Mirror mode: GPU 0 alone runs; its flags landing on its peers stand for the
    peers' flags landing on it (every GPU's program is GPU 0's, shifted)."""

    def __init__(self, m: Machine, blocks: int, name: str = "flags") -> None:
        n = m.n
        self.m = m
        self.name = name
        self.key = m.flag_key() * 1_000_003  # one flag address per block
        self.seen = [[Countdown(n - 1) for _ in range(blocks)] for _ in range(n)]

    def arrive(self, g: int, b: int) -> Signal:
        """Block ``b`` of GPU ``g`` stores its flags now; the signal fires when it has
        seen every peer's block ``b``."""
        m, n = self.m, self.m.n
        sim = m.sim
        mirror = m.fabric.mirror
        for k in range(1, n):
            peer = (g + k) % n
            seen = self.seen[0 if mirror else peer][b]
            m.isa.flag(g, peer, self.key + b, lambda s=seen: s.arrive(sim))
        return self.seen[g][b]
