"""NVLink packetisation: how many wire bytes a transfer of a given kind costs.

A transfer of ``payload`` bytes is cut into packets of at most ``max_payload_bytes``;
each packet carries whole 16 B data flits plus a header flit and, depending on its
kind, extra flits (address extension on requests, byte enables on writes).
"""

from __future__ import annotations

from enum import IntEnum

from cais.hw.config import PacketFormat


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
    SYNC = 10           # empty control packet (flags, barriers, TB-group sync)


REQUEST_KINDS = frozenset({Kind.READ_REQ, Kind.MC_LDRED_REQ, Kind.MC_PULL_REQ})
WRITE_KINDS = frozenset({Kind.WRITE, Kind.RED, Kind.MC_STORE, Kind.MC_RED})


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

    def _overhead_flits(self, kind: int) -> int:
        fmt = self.fmt
        if kind in REQUEST_KINDS:
            return fmt.header_flits + fmt.request_extra_flits
        if kind in WRITE_KINDS:
            return fmt.header_flits + fmt.write_extra_flits
        return fmt.header_flits

    def wire(self, kind: int, nbytes: int) -> tuple[int, int]:
        """(wire bytes of the whole train, wire bytes of its last packet) for a transfer
        of ``nbytes`` of data (for a request: the bytes it asks for)."""
        key = (kind, nbytes)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        flit, maxp = self.flit, self.maxp
        npk = self.packets(nbytes)
        over = self._overhead_flits(kind)
        if kind in REQUEST_KINDS or kind == Kind.SYNC:
            total, last = npk * over * flit, over * flit
        else:
            full, rem = divmod(nbytes, maxp)
            data_flits = full * (maxp // flit) + -(-rem // flit)
            total = (data_flits + npk * over) * flit
            last_data = rem if rem else min(nbytes, maxp)
            last = (-(-last_data // flit) + over) * flit
        self._cache[key] = (total, last)
        return total, last

    def ack_wire(self, nbytes: int) -> int:
        """Wire bytes of the write responses for a write of ``nbytes`` (0 if posted)."""
        return self.packets(nbytes) * self.fmt.write_ack_flits * self.flit
