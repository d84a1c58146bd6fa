"""One direction of a link: a serialising server with virtual channels.

The network does not move flits one by one: it moves *trains*, a run of packets that
travel together (a transfer unit). A train is forwarded cut-through: the next hop may
start sending it as soon as its head has arrived, and cannot finish before its tail
has arrived. So a train of many packets costs one serialisation per link it crosses,
not one per hop, as for wormhole/virtual cut-through flit switching.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from heapq import heappush
from collections.abc import Callable
from typing import Any

from cais.engine.sim import Simulator


class Train:
    """A train of packets (a transfer unit) in flight.

    ``payload`` is the data bytes it carries, ``wire`` the bytes it occupies on a link
    (payload plus headers and extra flits), ``packet_wire`` the wire size of its last
    packet. ``head``/``tail`` are the times its first and last packet are available at
    its current position. The remaining fields describe what the train means to the
    hardware it reaches; the engine does not look at them.
    """

    __slots__ = ("payload", "wire", "packet_wire", "head", "tail", "vc",
                 "kind", "src", "dst", "chip", "addr", "data", "ctx")

    def __init__(self, payload: int, wire: int, packet_wire: int, kind: int, src: int, dst: int,
                 chip: int = -1, addr: Any = None, data: Any = None, ctx: Any = None, vc: int = 0) -> None:
        self.payload = payload
        self.wire = wire
        self.packet_wire = packet_wire
        self.head = 0
        self.tail = 0
        self.vc = vc
        self.kind = kind
        self.src = src
        self.dst = dst
        self.chip = chip
        self.addr = addr
        self.data = data
        self.ctx = ctx


Deliver = Callable[[Train], None]


class Channel:
    """One direction of a port: trains are serialised onto the wire one at a time at
    ``ps_per_byte``, then arrive ``latency_ps`` later. Trains waiting for the wire
    sit in one FIFO per virtual channel; the arbiter serves the VCs round-robin.

    Statistics: trains, payload and wire bytes sent, and busy time, for utilisation.
    """

    __slots__ = ("sim", "name", "ps_per_byte", "latency_ps", "free_at", "queues", "_rr", "_active",
                 "_queued", "_wakeup", "trains", "payload_bytes", "wire_bytes", "busy_ps",
                 "delivered_payload", "first_start", "last_finish", "timeline")

    def __init__(self, sim: Simulator, name: str, ps_per_byte: float, latency_ps: int, vcs: int = 1,
                 record_timeline: bool = False) -> None:
        self.sim = sim
        self.name = name
        self.ps_per_byte = ps_per_byte
        self.latency_ps = latency_ps
        self.free_at = 0
        self.queues: list[deque[tuple[Train, Deliver]]] = [deque() for _ in range(vcs)]
        self._rr = 0
        self._active: list[int] = []  # VCs with waiting trains, ascending
        self._queued = 0
        self._wakeup = False
        self.trains = 0
        self.payload_bytes = 0
        self.wire_bytes = 0
        self.busy_ps = 0
        self.delivered_payload = 0
        self.first_start: int | None = None
        self.last_finish = 0
        self.timeline: list[tuple[int, int, int]] | None = [] if record_timeline else None

    def send(self, train: Train, deliver: Deliver) -> None:
        """Offer a train whose head is available at ``train.head`` (<= now) and tail at
        ``train.tail``. ``deliver(train)`` runs when its tail reaches the far end."""
        if self._queued == 0 and self.free_at <= self.sim.now:
            self._start(train, deliver)
            return
        vc = train.vc % len(self.queues)
        q = self.queues[vc]
        if not q:
            insort(self._active, vc)
        q.append((train, deliver))
        self._queued += 1
        if not self._wakeup:
            self._wakeup = True
            self.sim.at(max(self.free_at, self.sim.now), self._arbitrate)

    def _arbitrate(self) -> None:
        """The wire is free: serve the first waiting VC at or after the round-robin
        pointer, then move the pointer past it."""
        self._wakeup = False
        active = self._active
        i = bisect_left(active, self._rr)
        vc = active[i] if i < len(active) else active[0]
        q = self.queues[vc]
        train, deliver = q.popleft()
        if not q:
            active.remove(vc)
        self._rr = (vc + 1) % len(self.queues)
        self._queued -= 1
        self._start(train, deliver)
        if self._queued:
            self._wakeup = True
            self.sim.at(self.free_at, self._arbitrate)

    def _start(self, train: Train, deliver: Deliver) -> None:
        sim = self.sim
        now = sim.now
        start = self.free_at
        if train.head > start:
            start = train.head
        ppb = self.ps_per_byte
        ser = int(train.wire * ppb + 0.5)
        pkt = int(train.packet_wire * ppb + 0.5)
        finish = start + ser
        if train.tail + pkt > finish:
            finish = train.tail + pkt
        if finish < now:  # cannot finish in the past: everything is known only from now on
            finish = now
        self.free_at = finish
        self.trains += 1
        self.payload_bytes += train.payload
        self.wire_bytes += train.wire
        self.busy_ps += ser
        if self.first_start is None:
            self.first_start = start
        self.last_finish = finish
        if self.timeline is not None:
            self.timeline.append((start, finish, train.wire))
        lat = self.latency_ps
        train.head = start + pkt + lat
        train.tail = finish + lat
        sim._seq += 1
        heappush(sim._queue, (train.tail, sim._seq, self._arrive, (train, deliver)))

    def _arrive(self, train: Train, deliver: Deliver) -> None:
        self.delivered_payload += train.payload
        deliver(train)

    def utilisation(self, span_ps: int) -> float:
        """Fraction of ``span_ps`` the wire was busy."""
        return self.busy_ps / span_ps if span_ps > 0 else 0.0
