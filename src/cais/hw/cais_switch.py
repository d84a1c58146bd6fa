"""The CAIS switch chip: an NVLS switch with a merge unit in the data path of every
GPU-facing port (paper §III-A.2, Fig. 5). The unit of port ``h`` merges the
mergeable requests whose home GPU is ``h``: ``ld.cais`` requests (whose responses
it replicates or serves from its cache) and ``red.cais`` contributions (which it sums
and writes home once). The address hash of the fabric (``Fabric.stripe``) sends every
GPU's request for one address to the same chip, so they meet in one unit."""

from __future__ import annotations

from typing import Any

from cais.engine import Train
from cais.hw.group_sync import GroupSyncTable
from cais.hw.merge import MergeUnit, PortSpread, Session
from cais.hw.packets import Kind
from cais.hw.switch import NvlsSwitch


class CaisSwitch(NvlsSwitch):
    """NVSwitch chip with NVLS, the CAIS merge units (one per port) and the Group
    Sync Table of merging-aware TB coordination."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        n = len(self.gpus)
        self.spread = PortSpread()  # how many of its ports hold sessions at once
        self.units = [MergeUnit(self, h, self.merge_cfg, n, self.spread) for h in range(n)]
        self.sync = GroupSyncTable(self, self.sync_entries)
        self.handlers.update({
            Kind.LD_CAIS_REQ: self._ld_cais, Kind.LD_CAIS_RESP: self._ld_cais_data, Kind.RED_CAIS: self._red_cais,
            Kind.GROUP_SYNC: self.sync.register,
        })

    # ---- handlers ------------------------------------------------------------------
    def _ld_cais(self, req: Train) -> None:
        self.units[req.dst].load(req)

    def _ld_cais_data(self, resp: Train) -> None:
        if resp.tag < 0 or not self.units[resp.src].load_data(resp):
            self.emit(resp, resp.dst, resp)  # an unmerged (bypassed) load's data

    def _red_cais(self, red: Train) -> None:
        self.units[red.dst].reduce(red)

    # ---- what the merge units ask of the switch -----------------------------------
    def forward(self, train: Train) -> None:
        self.emit(train, train.dst, train)

    def take(self, train: Train, absorbed: int) -> None:
        self.ledger.reduction_absorbed += absorbed
        self.consume(train)

    def answer(self, reqs: list[Train], data: Any, head: int, tail: int, source: Train | None) -> None:
        kind = Kind.LD_CAIS_RESP
        wire_of = self.pk.wire
        vc = self.vcmap.vc(kind)
        chip = self.chip
        ledger = self.ledger
        emit = self.emit
        for i, req in enumerate(reqs):
            nbytes = req.want
            wire, last = wire_of(kind, nbytes)
            resp = Train(nbytes, wire, last, kind, req.dst, req.src, chip, req.addr, data, req.done, vc, 0, nbytes)
            resp.head, resp.tail = head, tail
            if source is None or i > 0:  # made from the table's data
                ledger.multicast_created += nbytes
            emit(resp, req.src, source)

    def write_home(self, home: int, session: Session, head: int, on_start: Any) -> None:
        kind = Kind.RED_CAIS
        nbytes = session.addr.nbytes
        out = Train(nbytes, *self.pk.wire(kind, nbytes), kind=kind, src=-1, dst=home, chip=self.chip,
                    addr=session.addr, data=session.data, vc=session.vc, cls=session.cls, tag=session.signal,
                    count=session.count)
        out.head = head + self.reduce_ps
        out.tail = self.sim.now + self.reduce_ps
        self.ledger.reduction_absorbed -= nbytes  # the sum leaves the table
        self.emit(out, home, None, on_start)

    def release(self, group: int, members: list[Train]) -> None:
        kind = Kind.GROUP_RELEASE
        wire, last = self.pk.wire(kind, 0)
        for req in members:
            out = Train(0, wire, last, kind=kind, src=-1, dst=req.src, chip=self.chip, vc=self.vcmap.vc(kind),
                        tag=group, done=req.done)
            out.head = out.tail = self.sim.now
            self.emit(out, req.src, None)

    def stuck(self) -> list[str]:
        out = super().stuck() + self.sync.stuck()
        for unit in self.units:
            out.extend(unit.stuck())
        return out
