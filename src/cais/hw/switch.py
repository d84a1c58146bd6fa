"""One NVSwitch chip: input buffers, a crossbar that forwards packets between its GPU
ports, and (in :class:`NvlsSwitch`) the NVLS engine that multicasts stores and
reduces loads and reductions in the switch.

Each input port (one per GPU) has one buffer per virtual channel, sized and
flow-controlled by the credits of the channel that feeds it. A train is handed to
its output port(s) as it arrives (virtual output queues: a train for a free output
does not wait behind one for a busy output) and holds its input buffer until its
last copy is on the wire. Head-of-line blocking comes from the shared buffer: when
trains for a congested output fill a VC's buffer, the sender has no credits left
for anything else on that VC, whatever its output; other VCs are not affected. A
packet kind is served by the handler registered for it in ``handlers``; a kind with
no handler is forwarded to its destination GPU.

The crossbar and the NVLS engine are compiled (:class:`cais._core.SwitchChip`,
``rust/src/hw/switch.rs``), and so are the CAIS chip's merge units and Group Sync
Table (``rust/src/hw/merge.rs``, ``rust/src/hw/group_sync.rs``): a train crosses the
chip without entering the interpreter unless a Python handler was registered for its
kind in ``handlers`` (as a test does).
"""

from __future__ import annotations

from cais._core import SwitchChip, SwitchLedger
from cais.hw.packets import Kind

__all__ = ["NvlsSwitch", "Switch", "SwitchLedger"]


class Switch(SwitchChip):
    """A switch chip with one port per GPU (the GPU's links to this chip, taken
    together): per-VC input FIFOs and a crossbar that forwards unicast packets to
    their destination port. Subclasses add in-switch units by registering handlers
    for the packet kinds they serve; ``absorbs`` names the kinds a unit consumes as
    they arrive (their credits go back without waiting for an output).

    Built as ``Switch(sim, chip, down, gpus, packetizer, vcmap, cfg)``: the chip reads
    what it needs of the system config ``cfg`` by the fields' own names (``link.vcs``,
    ``switch.pipeline_latency_ns``, ``switch.reduce_latency_ns``, ``switch.reduce_GBps``,
    ``switch.merge``, ``cais.sync_entries``; ``rust/src/hw/params.rs``); what it does
    with a train is in :class:`cais._core.SwitchChip`."""

    absorbs: frozenset[int] = frozenset()
    has = "unicast forwarding"  # what it offers the programs, in a few words (a refusal names it)


class NvlsSwitch(Switch):
    """An NVSwitch chip with NVLS: multicast of ``multimem.st``/``multimem.red`` (and
    of barrier flags) to every replica, and ``multimem.ld_reduce`` as pulls from
    every replica summed in the switch, as NVIDIA's NVLS (Klenk et al., ISCA'20)."""

    absorbs = frozenset({Kind.MC_PULL_RESP})
    has = "NVLS multicast and in-switch reduction"

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.nvls = True
