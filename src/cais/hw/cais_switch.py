"""The CAIS switch chip: an NVLS switch with a merge unit in the data path of every
GPU-facing port (paper §III-A.2, Fig. 5). The unit of port ``h`` merges the
mergeable requests whose home GPU is ``h``: ``ld.cais`` requests (whose responses
it replicates or serves from its cache) and ``red.cais`` contributions (which it sums
and writes home once). The address hash of the fabric (``Fabric.stripe``) sends every
GPU's request for one address to the same chip, so they meet in one unit."""

from __future__ import annotations

from cais.engine import Train
from cais.hw.group_sync import GroupSyncTable
from cais.hw.merge import MergeUnit, PortSpread
from cais.hw.packets import Kind
from cais.hw.switch import NvlsSwitch


class CaisSwitch(NvlsSwitch):
    """NVSwitch chip with NVLS, the CAIS merge units (one per port) and the Group
    Sync Table of merging-aware TB coordination. The chip hands ``ld.cais`` requests
    and data and ``red.cais`` contributions to the merge unit of the home's port
    itself (compiled); the Group Sync Table is a Python handler."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        n = len(self.gpus)
        self.spread = PortSpread()  # how many of its ports hold sessions at once
        self.units = [MergeUnit(self, h, self.merge_cfg, n, self.spread) for h in range(n)]
        self.sync = GroupSyncTable(self, self.sync_entries)
        self.handlers[Kind.GROUP_SYNC] = self.sync.register

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
