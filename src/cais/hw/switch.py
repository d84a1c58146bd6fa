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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from cais.engine import Channel, Credits, Simulator, Train
from cais.hw.config import MergeConfig
from cais.hw.packets import Kind, Packetizer, VcMap

if TYPE_CHECKING:
    from cais.hw.gpu import Gpu

_NEVER = 1 << 62


class SwitchLedger:
    """Byte accounting of a switch chip, for the conservation check:
    bytes in + bytes created by multicast = bytes out + bytes absorbed by reduction."""

    __slots__ = ("bytes_in", "bytes_out", "multicast_created", "reduction_absorbed")

    def __init__(self) -> None:
        self.bytes_in = 0
        self.bytes_out = 0
        self.multicast_created = 0
        self.reduction_absorbed = 0

    def balanced(self) -> bool:
        return self.bytes_in + self.multicast_created == self.bytes_out + self.reduction_absorbed


class Switch:
    """A switch chip with one port per GPU (the GPU's links to this chip, taken
    together): per-VC input FIFOs and a crossbar that forwards unicast packets to
    their destination port. Subclasses add in-switch units by registering handlers
    for the packet kinds they serve; ``absorbs`` names the kinds a unit consumes as
    they arrive (their credits go back without waiting for an output)."""

    absorbs: frozenset[int] = frozenset()

    def __init__(self, sim: Simulator, chip: int, down: list[Channel], gpus: list["Gpu"],
                 packetizer: Packetizer, vcmap: VcMap, vcs: int, pipeline_ps: int, reduce_ps: int,
                 merge: MergeConfig | None = None, sync_entries: int = 256,
                 reduce_GBps: float | None = None) -> None:
        self.sim = sim
        self.chip = chip
        self.down = down
        self.gpus = gpus
        self.pk = packetizer
        self.vcmap = vcmap
        self.pipeline_ps = pipeline_ps
        self.reduce_ps = reduce_ps
        # the NVLS reduction engine: admits ld_reduces in order at its operand rate (None: unlimited)
        self.reduce_ps_per_byte = 1000.0 / reduce_GBps if reduce_GBps else 0.0
        self.engine_free_at = 0
        self.ledger = SwitchLedger()
        self.held: list[list[int]] = [[0] * vcs for _ in gpus]  # trains in each input buffer
        self.handlers: dict[int, Callable[[Train], None]] = {}
        self.merge_cfg = merge or MergeConfig()
        self.sync_entries = sync_entries
        # Mirror mode (``Fabric``'s ``mirror``): only GPU 0 runs; a train for GPU g
        # stands for the train GPU -g sends to GPU 0 (its image under the GPUs'
        # rotation), so every output goes to GPU 0's port.
        self.mirror = False

    # ---- input buffers -----------------------------------------------------------
    def receive(self, train: Train) -> None:
        """A train's tail has arrived on the input port of GPU ``train.src``."""
        self.ledger.bytes_in += train.payload
        self.held[train.src][train.vc] += 1
        train.left, train.dep0, train.dep1 = 1, _NEVER, 0  # 1: held until the handler has emitted all
        credits, fp = train.credits, train.fp  # the input buffer's, before a departure hands them on
        handler = self.handlers.get(train.kind)
        if handler is None:
            self.emit(train, train.dst, train)
        else:
            handler(train)
        if train.left > 0:  # not absorbed
            train.left -= 1
            if train.left == 0:
                self.retire(train, train.dep0, train.dep1, credits, fp)

    def emit(self, out: Train, dst: int, entry: Train | None,
             on_start: Callable[[Train, int, int], None] | None = None) -> None:
        """Send ``out`` to GPU ``dst``; ``entry`` is the input train it comes from (it
        leaves its buffer once all its outputs are on the wire), None for a train the
        switch made itself (a reduction's result; ``on_start`` runs when it goes on
        the wire)."""
        self.ledger.bytes_out += out.payload
        out.head += self.pipeline_ps
        out.tail += self.pipeline_ps
        if self.mirror:  # the image: the train another GPU sends to GPU 0
            dst = out.dst = 0
        if entry is None:
            self.down[dst].send(out, self.gpus[dst].receive, on_start)
            return
        entry.left += 1
        if out is not entry:
            out.parent = entry
        self.down[dst].send(out, self.gpus[dst].receive, self._departed)

    def _departed(self, out: Train, start: int, finish: int) -> None:
        entry = out.parent if out.parent is not None else out
        if start < entry.dep0:
            entry.dep0 = start
        if finish > entry.dep1:
            entry.dep1 = finish
        entry.left -= 1
        if entry.left == 0:  # called before the departing train's credit fields change hands
            self.retire(entry, entry.dep0, entry.dep1, entry.credits, entry.fp)

    def retire(self, entry: Train, t0: int, t1: int, credits: Credits | None, fp: int) -> None:
        """``entry`` has left its input buffer between ``t0`` and ``t1``: return its
        ``fp`` bytes of ``credits``."""
        if credits is not None:
            credits.give_back(entry.vc, fp, t0, t1)
        self.held[entry.src][entry.vc] -= 1

    def consume(self, entry: Train) -> None:
        """``entry`` is taken off its input buffer by a unit of the switch as it
        arrives (it streamed through the buffer): its credits go back now."""
        entry.left = 0
        now = self.sim.now
        t0, t1 = (entry.head, entry.tail) if entry.tail >= now else (now, now)  # held a while: leaves now
        self.retire(entry, t0, t1, entry.credits, entry.fp)

    def absorb(self, entry: Train) -> None:
        """``entry`` (of a kind in ``absorbs``: its sender already scheduled its
        credits' return) is consumed by a unit of the switch as it arrives."""
        self.ledger.reduction_absorbed += entry.payload
        entry.left = 0
        self.retire(entry, entry.head, max(entry.tail, self.sim.now), None, 0)

    def stuck(self) -> list[str]:
        """Input buffers holding trains (for the forward-progress watchdog)."""
        out = []
        for g, port in enumerate(self.held):
            for vc, count in enumerate(port):
                if count:
                    out.append(f"sw{self.chip} input from gpu{g} VC {vc}: {count} train(s) waiting for an output")
        return out


class _Reduction:
    """State of one in-flight ``multimem.ld_reduce``: responses still expected, the
    running sum, and the latest head time among the responses."""

    __slots__ = ("issuer", "remaining", "acc", "head", "nbytes", "addr", "done")

    def __init__(self, req: Train, replicas: int) -> None:
        self.issuer = req.src
        self.remaining = replicas
        self.acc = None
        self.head = 0
        self.nbytes = req.want
        self.addr = req.addr
        self.done = req.done


class NvlsSwitch(Switch):
    """An NVSwitch chip with NVLS: multicast of ``multimem.st``/``multimem.red`` (and
    of barrier flags) to every replica, and ``multimem.ld_reduce`` as pulls from
    every replica summed in the switch, as NVIDIA's NVLS (Klenk et al., ISCA'20)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._pending: dict[int, _Reduction] = {}
        self._next_id = 0
        self.handlers.update({
            Kind.MC_STORE: self._multicast, Kind.MC_RED: self._multicast, Kind.MC_FLAG: self._multicast,
            Kind.MC_LDRED_REQ: self._ld_reduce_request, Kind.MC_PULL_RESP: self._ld_reduce_response,
        })

    _COPY = {Kind.MC_STORE: Kind.WRITE, Kind.MC_RED: Kind.RED, Kind.MC_FLAG: Kind.FLAG}
    absorbs = frozenset({Kind.MC_PULL_RESP})

    def _multicast(self, train: Train) -> None:
        """multimem.st / multimem.red: one copy to every replica, the issuer included."""
        n = len(self.gpus)
        self.ledger.multicast_created += (n - 1) * train.payload
        kind = self._COPY[train.kind]
        wire, last = train.wire, train.packet_wire
        if kind != Kind.FLAG:
            wire, last = self.pk.wire(kind, train.payload)
        for g in range(n):
            copy = Train(train.payload, wire, last, kind=kind, src=train.src, dst=g, chip=self.chip,
                         addr=train.addr, data=train.data, done=train.done, vc=train.vc, cls=train.cls)
            copy.head, copy.tail = train.head, train.tail
            self.emit(copy, g, train)

    def _ld_reduce_request(self, req: Train) -> None:
        """multimem.ld_reduce: read the address from every replica (the issuer's too)."""
        n = len(self.gpus)
        rid = self._next_id
        self._next_id += 1
        self._pending[rid] = _Reduction(req, n)
        wire, last = self.pk.wire(Kind.MC_PULL_REQ, req.want)
        head, tail = req.head, req.tail
        if self.reduce_ps_per_byte:  # the engine admits a reduction when it has room for its n operands
            # mirror mode: this reduction stands for the n GPUs' images, each as large
            work = req.want * n * (n if self.mirror else 1)
            start = max(self.sim.now, self.engine_free_at)
            self.engine_free_at = start + round(work * self.reduce_ps_per_byte)
            head, tail = max(head, start), max(tail, start)
        for g in range(n):
            pull = Train(0, wire, last, kind=Kind.MC_PULL_REQ, src=req.src, dst=g, chip=self.chip,
                         addr=req.addr, vc=req.vc, cls=req.cls, want=req.want, tag=rid)
            pull.head, pull.tail = head, tail
            self.emit(pull, g, req)

    def _ld_reduce_response(self, resp: Train) -> None:
        red = self._pending[resp.tag]
        if resp.data is not None:
            red.acc = resp.data.copy() if red.acc is None else red.acc + resp.data
        red.head = max(red.head, resp.head)
        red.remaining -= 1
        self.absorb(resp)
        if red.remaining:
            return
        del self._pending[resp.tag]
        self.ledger.reduction_absorbed -= resp.payload  # the last one leaves as the sum
        kind = Kind.MC_LDRED_RESP
        out = Train(red.nbytes, *self.pk.wire(kind, red.nbytes), kind=kind, src=-1, dst=red.issuer,
                    chip=self.chip, addr=red.addr, data=red.acc, done=red.done, vc=self.vcmap.vc(kind))
        out.head = red.head + self.reduce_ps
        out.tail = self.sim.now + self.reduce_ps
        self.emit(out, red.issuer, None)

    def stuck(self) -> list[str]:
        out = super().stuck()
        if self._pending:
            out.append(f"sw{self.chip}: {len(self._pending)} ld_reduce(s) waiting for replica responses")
        return out
