"""One NVSwitch chip: a crossbar that forwards packets between its GPU ports, and the
NVLS engine that multicasts stores and reduces loads and reductions in the switch."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from cais.engine import Channel, Simulator, Train
from cais.hw.packets import Kind, Packetizer

if TYPE_CHECKING:
    from cais.hw.gpu import Gpu


class _Reduction:
    """State of one in-flight ``multimem.ld_reduce``: responses still expected, the
    running sum, and the latest head time among the responses."""

    __slots__ = ("issuer", "remaining", "acc", "head", "nbytes", "addr", "ctx", "vc")

    def __init__(self, req: Train, replicas: int) -> None:
        self.issuer = req.src
        self.remaining = replicas
        self.acc = None
        self.head = 0
        self.ctx, self.nbytes = req.ctx  # (issuer's completion callback, bytes asked for)
        self.addr = req.addr
        self.vc = req.vc


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
    """An NVSwitch chip with one port per GPU (the GPU's links to this chip, taken
    together). Unicast packets go to their destination port; NVLS packets are
    multicast or reduced here, as NVIDIA's NVLS (Klenk et al., ISCA'20) does."""

    def __init__(self, sim: Simulator, chip: int, down: list[Channel], gpus: list["Gpu"],
                 packetizer: Packetizer, pipeline_ps: int, reduce_ps: int) -> None:
        self.sim = sim
        self.chip = chip
        self.down = down
        self.gpus = gpus
        self.pk = packetizer
        self.pipeline_ps = pipeline_ps
        self.reduce_ps = reduce_ps
        self.ledger = SwitchLedger()
        self._pending: dict[int, _Reduction] = {}
        self._next_id = 0
        self.handlers: dict[int, Callable[[Train], None]] = {
            Kind.MC_STORE: self._multicast, Kind.MC_RED: self._multicast,
            Kind.MC_LDRED_REQ: self._ld_reduce_request, Kind.MC_PULL_RESP: self._ld_reduce_response,
        }

    def receive(self, train: Train) -> None:
        """A train's tail has arrived on one of this chip's input ports."""
        self.ledger.bytes_in += train.payload
        handler = self.handlers.get(train.kind)
        if handler is None:
            self._forward(train, train.dst)
        else:
            handler(train)

    def _forward(self, train: Train, dst: int) -> None:
        self.ledger.bytes_out += train.payload
        train.head += self.pipeline_ps
        train.tail += self.pipeline_ps
        self.down[dst].send(train, self.gpus[dst].receive)

    def _multicast(self, train: Train) -> None:
        """multimem.st / multimem.red: one copy to every replica, the issuer included."""
        n = len(self.gpus)
        self.ledger.multicast_created += (n - 1) * train.payload
        kind = Kind.WRITE if train.kind == Kind.MC_STORE else Kind.RED
        for g in range(n):
            copy = Train(train.payload, *self.pk.wire(kind, train.payload), kind=kind, src=train.src, dst=g,
                         chip=self.chip, addr=train.addr, data=train.data, ctx=train.ctx, vc=train.vc)
            copy.head, copy.tail = train.head, train.tail
            self._forward(copy, g)

    def _ld_reduce_request(self, req: Train) -> None:
        """multimem.ld_reduce: read the address from every replica (the issuer's too)."""
        n = len(self.gpus)
        red = _Reduction(req, n)
        rid = self._next_id
        self._next_id += 1
        self._pending[rid] = red
        wire, last = self.pk.wire(Kind.MC_PULL_REQ, red.nbytes)
        for g in range(n):
            pull = Train(0, wire, last, kind=Kind.MC_PULL_REQ, src=req.src, dst=g, chip=self.chip,
                         addr=req.addr, ctx=rid, vc=req.vc)
            pull.head, pull.tail = req.head, req.tail
            self._forward(pull, g)

    def _ld_reduce_response(self, resp: Train) -> None:
        red = self._pending[resp.ctx]
        if resp.data is not None:
            red.acc = resp.data.copy() if red.acc is None else red.acc + resp.data
        red.head = max(red.head, resp.head)
        red.remaining -= 1
        if red.remaining:
            self.ledger.reduction_absorbed += resp.payload
            return
        del self._pending[resp.ctx]
        out = Train(red.nbytes, *self.pk.wire(Kind.MC_LDRED_RESP, red.nbytes), kind=Kind.MC_LDRED_RESP,
                    src=-1, dst=red.issuer, chip=self.chip, addr=red.addr, data=red.acc, ctx=red.ctx,
                    vc=red.vc)
        out.head = red.head + self.reduce_ps
        out.tail = self.sim.now + self.reduce_ps
        self._forward(out, red.issuer)

    @property
    def inflight_reductions(self) -> int:
        return len(self._pending)
