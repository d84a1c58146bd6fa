"""NVLink packets: the kinds of packet the hardware knows, their wire size, their
traffic class and which virtual channel (VC) they travel on.

A transfer of ``payload`` bytes is cut into packets of at most ``max_payload_bytes``;
each packet carries whole 16 B data flits plus a header flit and, depending on its
kind, extra flits (address extension on requests, byte enables on writes).

Every packet kind is described once, by a :class:`PacketKind` in :data:`KINDS`: its
name, whether it is a request or a response (the two never share a VC), its traffic
class, and the overhead rule of its wire size. A new kind (a CAIS mergeable load,
say) is one more entry here, plus handlers in the switch or GPU that receive it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from cais.config import LinkConfig, PacketFormat


class Kind(IntEnum):
    """What a train is, as the switch and the GPUs see it."""

    READ_REQ = 0        # ld: request to a home GPU (header only)
    READ_RESP = 1       # data returned for a READ_REQ
    WRITE = 2           # st: posted write
    RED = 3             # red: posted reduction (add into destination)
    MC_STORE = 4        # multimem.st: multicast to every replica
    MC_LDRED_REQ = 5    # multimem.ld_reduce request (issuer -> switch)
    MC_PULL_REQ = 6     # switch -> every replica: read for an ld_reduce
    MC_PULL_RESP = 7    # replica -> switch: data for an ld_reduce
    MC_LDRED_RESP = 8   # switch -> issuer: the reduced data
    MC_RED = 9          # multimem.red: reduction into every replica
    WRITE_ACK = 10      # write response: a fenced write has landed (back to its issuer)
    FLAG = 11           # st of a synchronisation flag (ring slot flags, credits)
    MC_FLAG = 12        # multimem.red on a flag: the switch multicasts it as FLAGs (NVLS barrier)
    LD_CAIS_REQ = 13    # ld.cais: mergeable read request to a home GPU (the CAIS bit set)
    LD_CAIS_RESP = 14   # data for an LD_CAIS_REQ (from the home, or from a merge unit)
    RED_CAIS = 15       # red.cais: mergeable reduction into a home GPU (a sum of ``count`` contributions)
    GROUP_SYNC = 16     # a TB's registration with its group at the switch's Group Sync Table (empty packet)
    GROUP_RELEASE = 17  # the switch -> every GPU of the group: all have registered (empty packet)
    MC_DYN_STORE = 18   # st.mc.dyn: a store to a dynamic multicast group (the switch copies it to the members)


class Traffic(IntEnum):
    """Traffic classes: what the VC policy ``class`` separates."""

    LOAD = 0
    STORE = 1
    REDUCTION = 2
    SYNC = 3


@dataclass(frozen=True)
class PacketKind:
    """One kind of packet: ``response`` (travels on response VCs), ``traffic`` (its
    class), ``overhead`` (``request``: header + address extension, no data;
    ``write``: header + byte enables + data; ``response``: header + data; ``ack``:
    the per-packet write-response flits, or one header flit for a whole train when
    writes are posted), and a short description."""

    kind: Kind
    response: bool
    traffic: Traffic
    overhead: str
    description: str


KINDS: dict[int, PacketKind] = {k.kind: k for k in (
    PacketKind(Kind.READ_REQ, False, Traffic.LOAD, "request", "ld: read request to a home GPU"),
    PacketKind(Kind.READ_RESP, True, Traffic.LOAD, "response", "data for a READ_REQ"),
    PacketKind(Kind.WRITE, False, Traffic.STORE, "write", "st: posted write"),
    PacketKind(Kind.RED, False, Traffic.REDUCTION, "write", "red: posted add into the destination"),
    PacketKind(Kind.MC_STORE, False, Traffic.STORE, "write", "multimem.st: multicast store"),
    PacketKind(Kind.MC_LDRED_REQ, False, Traffic.LOAD, "request", "multimem.ld_reduce request to the switch"),
    PacketKind(Kind.MC_PULL_REQ, False, Traffic.LOAD, "request", "switch -> replica read for an ld_reduce"),
    PacketKind(Kind.MC_PULL_RESP, True, Traffic.LOAD, "response", "replica -> switch data for an ld_reduce"),
    PacketKind(Kind.MC_LDRED_RESP, True, Traffic.LOAD, "response", "switch -> issuer: the reduced data"),
    PacketKind(Kind.MC_RED, False, Traffic.REDUCTION, "write", "multimem.red: reduction into every replica"),
    PacketKind(Kind.WRITE_ACK, True, Traffic.SYNC, "ack", "write response of a fenced write"),
    PacketKind(Kind.FLAG, False, Traffic.SYNC, "write", "flag store (ring flags and credits)"),
    PacketKind(Kind.MC_FLAG, False, Traffic.SYNC, "write", "multimem.red on a flag (NVLS barrier)"),
    PacketKind(Kind.LD_CAIS_REQ, False, Traffic.LOAD, "request", "ld.cais: mergeable read request to a home GPU"),
    PacketKind(Kind.LD_CAIS_RESP, True, Traffic.LOAD, "response", "data for an ld.cais (home or merge unit)"),
    PacketKind(Kind.RED_CAIS, False, Traffic.REDUCTION, "write", "red.cais: mergeable reduction into a home GPU"),
    PacketKind(Kind.GROUP_SYNC, False, Traffic.SYNC, "request", "a TB registers with its TB group (CAIS sync)"),
    PacketKind(Kind.GROUP_RELEASE, True, Traffic.SYNC, "response", "switch -> GPU: the TB group may go"),
    PacketKind(Kind.MC_DYN_STORE, False, Traffic.STORE, "write", "st.mc.dyn: store to a dynamic multicast group"),
)}



class VcMap:
    """Which VC a packet takes. Requests use VCs ``[0, vcs/2)``, responses
    ``[vcs/2, vcs)`` (so a full request buffer never blocks the responses that
    would drain it), except under ``shared``, which puts everything on VC 0 (for
    experiments: it can deadlock). Within a set, ``class`` gives each traffic class
    its own VC (load, store, reduction, sync), ``one`` puts all on the set's first,
    ``kernel`` picks the VC by the issuing kernel's ``stream`` number (untagged
    traffic is stream 0). Under ``class``, a stream shifts the VC inside the class's
    share when the set has more VCs than classes.

    ``destination`` gives every switch input a queue per output, as far as the VCs
    go, for the bulk requests (stores, reductions and the release flags and fences that
    must follow them): such a packet's VC is picked by its destination's place among
    the sender's peers, ``(dst - src - 1) mod n``, modulo the request VCs left once read
    requests and synchronisation (flags) keep a VC each, as under ``class`` (so loads
    never wait behind stores or reductions, CAIS's traffic control, and a flag never
    waits behind bulk data it does not follow). Responses use the whole response set
    by destination. A multicast (no one destination) keeps its class's VC."""

    __slots__ = ("policy", "half", "by_destination", "load_vc", "sync_vc", "bulk_vcs", "_table")

    def __init__(self, link: LinkConfig) -> None:
        self.policy = link.vc_policy
        self.half = max(1, link.vcs // 2)
        self.by_destination = self.policy == "destination"  # the core asks :meth:`at` only then
        # under ``destination``: the request VCs loads and flags keep, and the rest, per destination
        self.load_vc = int(Traffic.LOAD) % self.half
        self.sync_vc = int(Traffic.SYNC) % self.half
        kept = {self.load_vc, self.sync_vc}
        self.bulk_vcs = tuple(v for v in range(self.half) if v not in kept) or (self.half - 1,)
        self._table: dict[tuple[int, int], int] = {}

    def at(self, vc: int, src: int, dst: int, n: int) -> int:
        """The VC of a packet from GPU ``src`` to GPU ``dst`` (of ``n``) whose kind,
        class and stream give VC ``vc``: under ``destination`` its destination's (see
        the class), under other policies ``vc``."""
        if not self.by_destination or dst < 0 or src < 0:
            return vc
        peer = (dst - src - 1) % n
        if vc >= self.half:  # a response
            return self.half + peer % self.half
        if vc in (self.load_vc, self.sync_vc):  # read requests and flags keep their VCs
            return vc
        return self.bulk_vcs[peer % len(self.bulk_vcs)]

    def vc(self, kind: int, traffic: int | None = None, stream: int = 0, src: int = -1, dst: int = -1,
           n: int = 1) -> int:
        return self.at(self._vc(kind, traffic, stream), src, dst, n)

    def _vc(self, kind: int, traffic: int | None, stream: int) -> int:
        key = (kind, traffic if traffic is not None else -1)
        base = self._table.get(key)
        if base is None:
            spec = KINDS[kind]
            cls = spec.traffic if traffic is None else traffic
            if self.policy == "shared":
                base = 0
            else:
                off = int(cls) % self.half if self.policy in ("class", "destination") else 0
                base = (self.half if spec.response else 0) + off
            self._table[key] = base
        if stream:
            if self.policy == "kernel":
                return base + stream % self.half
            if self.policy == "class" and self.half > len(Traffic):
                base += len(Traffic) * (stream % (self.half // len(Traffic)))
        return base


class Packetizer:
    """Wire-byte calculator for one :class:`PacketFormat`."""

    __slots__ = ("fmt", "flit", "maxp", "_cache")

    def __init__(self, fmt: PacketFormat) -> None:
        self.fmt = fmt
        self.flit = fmt.flit_bytes
        self.maxp = fmt.max_payload_bytes
        self._cache: dict[tuple[int, int], tuple[int, int]] = {}

    def packets(self, nbytes: int) -> int:
        return max(1, -(-nbytes // self.maxp))

    def _overhead_flits(self, rule: str) -> int:
        fmt = self.fmt
        if rule == "request":
            return fmt.header_flits + fmt.request_extra_flits
        if rule == "write":
            return fmt.header_flits + fmt.write_extra_flits
        return fmt.header_flits

    def wire(self, kind: int, nbytes: int) -> tuple[int, int]:
        """(wire bytes of the whole train, wire bytes of its last packet) for a transfer
        of ``nbytes`` of data (for a request or an acknowledgement: the bytes it asks
        for or acknowledges)."""
        key = (kind, nbytes)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        flit, maxp = self.flit, self.maxp
        npk = self.packets(nbytes)
        rule = KINDS[kind].overhead
        over = self._overhead_flits(rule)
        if rule == "ack":  # per-packet write responses, or (posted writes) one fence response
            per = self.fmt.write_ack_flits
            total, last = (npk * per * flit, per * flit) if per else (over * flit, over * flit)
        elif rule == "request":
            total, last = npk * over * flit, over * flit
        else:
            full, rem = divmod(nbytes, maxp)
            data_flits = full * (maxp // flit) + -(-rem // flit)
            total = (data_flits + npk * over) * flit
            last_data = rem if rem else min(nbytes, maxp)
            last = (-(-last_data // flit) + over) * flit
        self._cache[key] = (total, last)
        return total, last
