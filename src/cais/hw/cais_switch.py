"""The CAIS switch chip: an NVLS switch with a merge unit in the data path of every
GPU-facing port (paper §III-A.2, Fig. 5). The unit of port ``h`` merges the
mergeable requests whose home GPU is ``h``: ``ld.cais`` requests (whose responses
it replicates or serves from its cache) and ``red.cais`` contributions (which it sums
and writes home once). The address hash of the fabric (``Fabric.stripe``) sends every
GPU's request for one address to the same chip, so they meet in one unit."""

from __future__ import annotations

from cais.hw.merge import MergeUnit, PortSpread
from cais.hw.switch import NvlsSwitch


class CaisSwitch(NvlsSwitch):
    """NVSwitch chip with NVLS, the CAIS merge units (one per port) and the Group
    Sync Table of merging-aware TB coordination (paper §III-B.2, Fig. 8(b): it counts
    a TB group's registrations and releases every member once all have registered;
    ``cais.sync_entries`` groups at once, a registration for a new group waiting in
    its input buffer while the table is full). The chip hands ``ld.cais`` requests and
    data, ``red.cais`` contributions and the registrations to them itself (compiled)."""

    has = "NVLS plus a merge unit per port for ld.cais/red.cais and the Group Sync Table"

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        n = len(self.gpus)
        self.spread = PortSpread()  # how many of its ports hold sessions at once
        self.units = [MergeUnit(self, h, self.merge_cfg, n, self.spread) for h in range(n)]
        self.enable_group_sync()

    def stuck(self) -> list[str]:
        out = super().stuck()
        for unit in self.units:
            out.extend(unit.stuck())
        return out
