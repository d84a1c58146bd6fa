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

from cais.engine.credits import Credits
from cais.engine.sim import Simulator


class Train:
    """A train of packets (a transfer unit) in flight.

    ``payload`` is the data bytes it carries, ``wire`` the bytes it occupies on a link
    (payload plus headers and extra flits), ``packet_wire`` the wire size of its last
    packet. ``head``/``tail`` are the times its first and last packet are available at
    its current position; ``vc`` its virtual channel. ``fp``/``credits`` are the
    buffer bytes it holds at its current position and whose credits they are (set by
    the channel that carried it there).

    The remaining fields are the packet's typed descriptor, which the engine does not
    read: ``kind`` (a registered packet kind), ``cls`` (traffic class), ``src``,
    ``dst``, ``chip``, ``addr``, ``data``; ``done`` (the issuer's completion, called
    with the train where the packet completes), ``fence`` (called when a write's
    acknowledgement is back at its issuer), ``want`` (bytes a request asks for),
    ``tag`` (an id the hardware that created it uses), ``parent`` (the train it
    was copied from in a switch), ``count`` (how many requests it stands for: a
    merged reduction carries the number it sums), ``expect`` (how many requests
    a mergeable access expects to merge with) and ``quorum`` (TB-aware throttling:
    how many of them must have arrived before it is acknowledged; 0: at once).
    """

    __slots__ = ("payload", "wire", "packet_wire", "head", "tail", "vc", "fp", "credits",
                 "kind", "cls", "src", "dst", "chip", "addr", "data", "done", "fence", "want", "tag",
                 "parent", "left", "dep0", "dep1", "count", "expect", "quorum")

    def __init__(self, payload: int, wire: int, packet_wire: int, kind: int, src: int, dst: int,
                 chip: int = -1, addr: Any = None, data: Any = None, done: Callable[["Train"], None] | None = None,
                 vc: int = 0, cls: int = 0, want: int = 0, tag: int = -1, count: int = 1,
                 expect: int = 0, quorum: int = 0) -> None:
        self.payload = payload
        self.wire = wire
        self.packet_wire = packet_wire
        self.head = 0
        self.tail = 0
        self.vc = vc
        self.fp = 0
        self.credits: Credits | None = None
        self.kind = kind
        self.cls = cls
        self.src = src
        self.dst = dst
        self.chip = chip
        self.addr = addr
        self.data = data
        self.done = done
        self.fence: Callable[["Train"], None] | None = None
        self.want = want
        self.tag = tag
        self.parent: Train | None = None
        self.count = count
        self.expect = expect
        self.quorum = quorum


Deliver = Callable[[Train], None]
OnStart = Callable[[Train, int, int], None]
_UNKNOWN = -1
_BLOCKED = 1 << 62


class Channel:
    """One direction of a port: trains are serialised onto the wire one at a time at
    ``ps_per_byte``, then arrive ``latency_ps`` later. Trains waiting for the wire
    sit in one FIFO per virtual channel; the arbiter serves the VCs round-robin,
    skipping a VC whose head train has no credits at the receiving buffer
    (``credits``; None: an infinite buffer). A VC whose buffer is far too small for
    the credit round trip cannot stream faster than its capacity per round trip
    (``credit_rtt_ps``), as with flit-level credits.

    ``send(train, deliver, on_start)``: ``on_start(train, start, finish)`` runs when
    the train is put on the wire (its first and last byte leave at those times);
    ``deliver(train)`` when its tail reaches the far end.

    Statistics: trains, payload and wire bytes sent, and busy time, for utilisation.
    """

    __slots__ = ("sim", "name", "ps_per_byte", "latency_ps", "free_at", "queues", "_rr", "_active",
                 "_queued", "_gen", "_armed_at", "trains", "payload_bytes", "wire_bytes", "busy_ps",
                 "delivered_payload", "timeline", "credits", "credit_rtt_ps", "_ready", "_ser_ps_per_byte")

    def __init__(self, sim: Simulator, name: str, ps_per_byte: float, latency_ps: int, vcs: int = 1,
                 record_timeline: bool = False, credits: Credits | None = None, credit_rtt_ps: int = 0) -> None:
        self.sim = sim
        self.name = name
        self.ps_per_byte = ps_per_byte
        self.latency_ps = latency_ps
        self.free_at = 0
        self.queues: list[deque[tuple[Train, Deliver, OnStart | None, int]]] = [deque() for _ in range(vcs)]
        self._rr = 0
        self._active: list[int] = []  # VCs with waiting trains, ascending
        self._queued = 0
        self._gen = 0  # generation of the one pending arbitration (older ones are stale)
        self._armed_at = -1  # when the pending arbitration runs (-1: none pending)
        self.trains = 0
        self.payload_bytes = 0
        self.wire_bytes = 0
        self.busy_ps = 0
        self.delivered_payload = 0
        self.timeline: list[tuple[int, int, int]] | None = [] if record_timeline else None
        self.credits = credits
        self.credit_rtt_ps = credit_rtt_ps
        # Per VC: when its head train has credits (_UNKNOWN: not computed since the
        # head or the credits changed; _BLOCKED: not before more credits come back).
        self._ready = [_UNKNOWN] * vcs
        # Serialisation time per byte: the wire's, or, if the buffer is smaller than
        # the credit round trip needs, at most its capacity per round trip.
        self._ser_ps_per_byte = ps_per_byte
        if credits is not None and credit_rtt_ps / credits.capacity > ps_per_byte:
            self._ser_ps_per_byte = credit_rtt_ps / credits.capacity
        if credits is not None:
            credits.on_return(self._credits_back)

    def send(self, train: Train, deliver: Deliver, on_start: OnStart | None = None) -> None:
        """Offer a train whose head is available at ``train.head`` and tail at
        ``train.tail``."""
        now = self.sim.now
        vc = train.vc
        ser = int(train.wire * self._ser_ps_per_byte + 0.5)
        if self._queued == 0 and self.free_at <= now:
            cr = self.credits
            if cr is None:
                self._start(train, deliver, on_start, ser, 0)
                return
            wire = train.wire
            fp = wire if wire < cr.capacity else cr.capacity
            if cr.free[vc] >= fp:
                self._start(train, deliver, on_start, ser, 0)
                return
            lower = self.free_at if self.free_at > train.head else train.head
            t = cr.earliest(vc, fp, ser, lower)
            if t is not None and t <= now:
                self._start(train, deliver, on_start, ser, t)
                return
        q = self.queues[vc]
        if not q:
            insort(self._active, vc)
            self._ready[vc] = _UNKNOWN
        q.append((train, deliver, on_start, ser))
        self._queued += 1
        if len(q) == 1:
            self._arm_next(now)

    def _arm(self, at: int) -> None:
        """Arbitrate at ``at``, unless an arbitration is already due by then."""
        if 0 <= self._armed_at <= at:
            return
        self._armed_at = at
        self._gen += 1
        self.sim.at(at, self._arbitrate, self._gen)

    def _credits_back(self, vc: int) -> None:
        """Credits are coming back to VC ``vc`` of the receiving buffer: its head
        train may go sooner."""
        q = self.queues[vc]
        if not q:
            return
        free_at = self.free_at
        known = self._ready[vc]
        if known != _UNKNOWN and known <= free_at:
            return  # it goes when the wire is free; more credits change nothing
        now = self.sim.now
        if 0 <= self._armed_at <= (free_at if free_at > now else now):
            self._ready[vc] = _UNKNOWN  # an arbitration is due when the wire frees: it will look
            return
        t = self._when_ready(vc, q[0])
        if t < _BLOCKED:
            t = t if t > free_at else free_at
            self._arm(t if t > now else now)

    def _when_ready(self, vc: int, head: tuple[Train, Deliver, OnStart | None, int]) -> int:
        """The earliest start the credits allow the VC's head train (no earlier than
        the wire is free and its head is there; possibly in the past: a train is cut
        through as soon as it could have gone), or _BLOCKED."""
        cr = self.credits
        assert cr is not None
        train = head[0]
        wire = train.wire
        fp = wire if wire < cr.capacity else cr.capacity
        if cr.free[vc] >= fp:
            t = 0
        else:
            lower = self.free_at if self.free_at > train.head else train.head
            e = cr.earliest(vc, fp, head[3], lower)
            t = _BLOCKED if e is None else e
        self._ready[vc] = t
        return t

    def _arbitrate(self, gen: int) -> None:
        """The wire is free: serve the first VC at or after the round-robin pointer
        whose head train has credits, then move the pointer past it."""
        if gen != self._gen:
            return
        self._armed_at = -1
        now = self.sim.now
        if self.free_at > now:
            self._arm(self.free_at)
            return
        active = self._active
        ready = self._ready
        pick = -1
        credit_t = 0
        n_active = len(active)
        if n_active == 1:
            order = active
        else:
            i = bisect_left(active, self._rr)
            order = active[i:] + active[:i]
        for vc in order:
            if self.credits is None:
                pick = vc
                break
            t = ready[vc]
            if t == _UNKNOWN:
                t = self._when_ready(vc, self.queues[vc][0])
            if t <= now:
                pick, credit_t = vc, t
                break
        if pick < 0:
            self._arm_next(now)
            return
        q = self.queues[pick]
        train, deliver, on_start, ser = q.popleft()
        ready[pick] = _UNKNOWN
        if not q:
            active.remove(pick)
        self._rr = (pick + 1) % len(self.queues)
        self._queued -= 1
        self._start(train, deliver, on_start, ser, credit_t)
        if self._queued:
            self._arm_next(now)

    def _arm_next(self, now: int) -> None:
        """Arbitrate again when the wire is free and some VC's head has credits (if
        none can have them before more come back, ``_credits_back`` arms it)."""
        free_at = self.free_at
        if self.credits is None:
            self._arm(free_at if free_at > now else now)
            return
        ready = self._ready
        soonest = _BLOCKED
        for vc in self._active:
            t = ready[vc]
            if t == _UNKNOWN:
                t = self._when_ready(vc, self.queues[vc][0])
            if t < soonest:
                soonest = t
                if t <= free_at:
                    break
        if soonest < _BLOCKED:
            t = soonest if soonest > free_at else free_at
            self._arm(t if t > now else now)

    def _start(self, train: Train, deliver: Deliver, on_start: OnStart | None, ser: int, not_before: int) -> None:
        """Put the train on the wire: at the earliest when the wire is free, its head
        is there and (``not_before``) its credits allow."""
        sim = self.sim
        start = self.free_at
        head = train.head
        if head > start:
            start = head
        if not_before > start:
            start = not_before
        pkt = int(train.packet_wire * self.ps_per_byte + 0.5)
        finish = start + ser
        tail = train.tail + pkt
        if tail > finish:
            finish = tail
        if finish < sim.now:  # cannot finish in the past: everything is known only from now on
            finish = sim.now
        self.free_at = finish
        wire = train.wire
        self.trains += 1
        self.payload_bytes += train.payload
        self.wire_bytes += wire
        self.busy_ps += ser
        if self.timeline is not None:
            self.timeline.append((start, finish, wire))
        if on_start is not None:
            on_start(train, start, finish)  # before the train's buffer fields change hands
        lat = self.latency_ps
        cr = self.credits
        if cr is not None:
            fp = wire if wire < cr.capacity else cr.capacity
            if cr.drains or train.kind in cr.drain_kinds:  # consumed as it arrives: schedule the return now
                cr.stream(train.vc, fp, start + lat, finish + lat)
            else:
                cr.take(train.vc, fp, start + lat)
            train.fp = fp
        train.credits = cr
        train.head = start + pkt + lat
        arrive = finish + lat
        train.tail = arrive
        sim._seq += 1
        heappush(sim._queue, (arrive, sim._seq, self._arrive, (train, deliver)))

    def _arrive(self, train: Train, deliver: Deliver) -> None:
        self.delivered_payload += train.payload
        deliver(train)

    def waiting(self) -> list[tuple[int, int, bool]]:
        """(vc, trains waiting, waiting for credits) for every VC with trains queued."""
        return [(vc, len(self.queues[vc]), self._ready[vc] == _BLOCKED) for vc in self._active]

    def utilisation(self, span_ps: int) -> float:
        """Fraction of ``span_ps`` the wire was busy."""
        return self.busy_ps / span_ps if span_ps > 0 else 0.0
