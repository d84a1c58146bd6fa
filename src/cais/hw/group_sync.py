"""A CAIS GPU's TB-group synchroniser at dispatch (paper §III-B.2): it registers a
kernel's thread blocks with their TB groups at the switch *before* the GPU's TB
scheduler dispatches them, and a TB stays pending, holding no SM, until its group's
release comes back.

The paper says that the TB registers before it is dispatched and stays pending; it
does not say how far ahead of dispatch the synchroniser registers. We decide: in
launch order, at most ``window`` TBs of a kernel registered and not yet released at
once (one wave of the kernel's SMs: the TBs the scheduler would dispatch next), each
once its own data gates (the flags its first step waits for) have opened. Launch
order keeps the GPUs' registrations in one order, so the lowest unreleased group is
always complete on every GPU and the window never deadlocks; one wave ahead keeps a
kernel's open registrations well inside the switch's Group Sync Table
(``cais.sync_entries`` per chip), as the paper's 256 entries are sized for.

A released TB is ready to be placed once the TB before it is: every GPU then places
a kernel's coordinated TBs in launch order. A placed TB still waits on its SM for its
pre-access group; if GPUs placed them in different orders, each GPU's SMs could fill
with TBs whose partners the other GPUs' SMs keep out (measured: a deadlock with
every SM of a GPU held). In one order, the earliest unfinished group's members are
placed on every GPU before any later one, so it always completes. (Kernels sharing
one SM pool are ordered as well: ``Kernel.placed``, schemes/cais.py.)
"""

from __future__ import annotations

from collections.abc import Callable

from cais.engine import Signal, Simulator, all_of

# registers TB group ``group`` of ``members`` GPUs from this GPU; its release's signal
Register = Callable[[int, int], Signal]


class TbGroupRegistrar:
    """One kernel's pre-launch registrations on one GPU (module doc): TB ``t`` of
    ``len(data)`` registers with group ``base + t * per`` of ``members`` GPUs through
    ``register`` once its ``data`` gates have fired and fewer than ``window`` earlier
    registrations are unreleased; :attr:`gates` are what each TB waits for before it is
    placed: its release (which comes after its data)."""

    def __init__(self, sim: Simulator, register: Register, base: int, per: int, members: int,
                 data: list[list[Signal]], window: int) -> None:
        if window < 1:
            raise ValueError(f"a registrar's window must be at least 1 TB, got {window}")
        self.sim, self.register = sim, register
        self.base, self.per, self.members, self.window = base, per, members, window
        self.released = [Signal() for _ in data]
        self.ready: list[Signal] = [all_of(sim, sigs) for sigs in data]
        # TB t is ready to be placed once released and TB t - 1 is ready
        self.ready_in_order: list[Signal] = []
        for t, sig in enumerate(self.released):
            self.ready_in_order.append(sig if t == 0 else all_of(sim, [sig, self.ready_in_order[-1]]))
        self.next = 0  # the next TB to register, in launch order
        self.open = 0  # registered, not yet released
        for sig in self.ready:
            if not sig.fired:
                sig.on_fire(self._pump)
        self._pump(None)

    @property
    def gates(self) -> list[list[Signal]]:
        """Per TB, one signal: its release, once the TB before it in launch order is
        ready too. The TBs become ready in launch order, so every GPU places a kernel's
        coordinated TBs in one order, and a TB waiting for its group on its SM never
        waits for a member that another GPU's TBs keep off its SMs (module doc)."""
        return [[s] for s in self.ready_in_order]

    def _pump(self, _value: object) -> None:
        """Register the next TBs in launch order while their data are in and the window has room."""
        while self.next < len(self.ready) and self.open < self.window and self.ready[self.next].fired:
            t = self.next
            self.next += 1
            self.open += 1
            self.register(self.base + t * self.per, self.members).on_fire(lambda _v, t=t: self._released(t))

    def _released(self, t: int) -> None:
        self.open -= 1
        self.released[t].fire(self.sim)
        self._pump(None)
