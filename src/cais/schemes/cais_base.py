"""CAIS-Base (paper §IV-C): the CAIS ISA and the switch merge unit, and nothing else:
no merging-aware TB coordination, no graph-level optimizer. Kernels run in the order
sequence-parallel TP runs them (GEMM -> row-wise op -> GEMM per sub-layer), with no
collective kernels: the GEMMs communicate themselves.

* **GEMM-RS** (GEMM1, row-parallel partial sums): each output tile's epilogue sends
  its partial rows to the GPU that owns those token rows with ``red.cais`` (the
  owner's own rows are added locally). The merge unit of the owner's switch port
  sums the N-1 contributions and writes the sum home once.
* **Row-wise op** on the owner: it starts when its GEMM1 has finished and its signal
  word says that every GPU's contribution to its rows has landed (each reduction
  that lands adds contributions x bytes to it, after its data; the owner's own
  partials count as they are added): no global barrier, no fence.
* **AG-GEMM** (GEMM2, and the weight gradients that read token-sharded activations):
  each TB loads its tile's A rows from their owner with ``ld.cais``, walking K as its
  mainloop does; the merge unit fetches each address from the owner once and
  answers every GPU that asks for it. The loads may start only when every owner has
  written its rows: an NVLS barrier on the wire after the row-wise op (a kernel-level
  dependency; CAIS's TB-level ones come with the graph optimizer).

The GEMM kernels, tile order (CUTLASS's heuristic, the same on every GPU) and store
and load windows are LADM's (schemes/ladm.py); what differs is the ISA (mergeable
accesses), the switch (merge units) and the synchronisation (signals instead of a
barrier after every kernel). ``unit``: bytes of one ``red.cais``/``ld.cais`` before
the ISA stripes it over the chips (32 KiB: one K-slice stage of a 256-row tile, two
of a 128-row tile; its share of one chip, 57-72 lines of 128 B, is one merge
session), see docs/cais.md.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cais.engine import Signal
from cais.hw.gpu import Kernel
from cais.hw.memory import Region
from cais.isa import SmPort
from cais.schemes.base import Deps, LayerRun, all_of
from cais.schemes.ladm import Ladm
from cais.workload.graph import Chain, Local


class CaisBase(Ladm):
    """GEMM -> ``red.cais`` into the row owner | row-wise op | GEMM with ``ld.cais`` of
    remote A rows; merging in the switch, no TB coordination, no graph optimizer."""

    name = "cais-base"
    switch = "cais"
    ablation = True
    load_bytes = 32 * 1024
    summary = "CAIS ISA + switch merge unit only: GEMM -> red.cais | LN | GEMM with ld.cais; no TB coordination"

    def run(self, r: LayerRun) -> None:
        self._signals: dict[str, int] = {}
        super().run(r)

    # ---- sub-layers -----------------------------------------------------------------
    def chain(self, r: LayerRun, c: Chain, deps: Deps) -> Deps:
        n, over, sim = r.m.n, r.cm.kernel_overhead_ps, r.m.sim
        key = self._signals[c.name] = r.m.flag_key()
        expected = n * r.d.rows_l * c.gemm1.n * r.model.dtype_bytes  # every GPU's partial rows, its own too
        rows = []
        for g in range(n):
            kernel, _ = self._red_gemm(r, g, c)
            done = r.submit(g, kernel, [deps[g]], over, c.name)
            landed = Signal()
            r.m.gpus[g].wait_signal(key, expected, lambda s=landed: s.fire(sim))
            rows.append(r.submit(g, r.rowop_kernel(g, c.rowop), [all_of(sim, [done, landed])], r.cm_mem_overhead_ps,
                                 c.name))
        normed = r.barrier(rows, f"{c.name} rows ready")
        ops = self._operands(c.gemm2)
        return [r.submit(g, self._load_gemm(r, g, c.gemm2, ops), [normed[g]], over, c.name) for g in range(n)]

    def local(self, r: LayerRun, seg: Local, deps: Deps) -> Deps:
        """Attention, activations and weight gradients, in order on each GPU; a weight
        gradient loads its token-sharded operands with ``ld.cais`` (their owners wrote
        them before an earlier barrier)."""
        out = []
        for g in range(r.m.n):
            if seg.gemm is not None:
                k, over = self._load_gemm(r, g, seg.gemm, self._operands(seg.gemm)), r.cm.kernel_overhead_ps
            else:
                k, over = r.local_kernel(g, seg)
            out.append(r.submit(g, k, [deps[g]], over, seg.name))
        return out

    # ---- the mergeable accesses ------------------------------------------------------
    def _drain(self, r: LayerRun, g: int, kernel: Kernel) -> None:  # type: ignore[override]
        return None  # the owner counts what lands; nothing to fence

    def _reduce(self, r: LayerRun, g: int, c: Chain, owner: int, region: Region, data: np.ndarray | None,
                done: Callable[[], None], port: SmPort, drain: object) -> None:
        r.m.isa.red_cais(g, owner, region, data, self._signals[c.name], done, port, unit=self._red_unit(r))

    def _add_own(self, r: LayerRun, g: int, c: Chain, region: Region, data: np.ndarray | None) -> None:
        r.m.isa.red_cais(g, g, region, data, self._signals[c.name])  # a local add that signals

    def _load(self, r: LayerRun, g: int, home: int, region: Region, done: Callable[[np.ndarray | None], None],
              unit: int) -> None:
        r.m.isa.ld_cais(g, home, region, done, unit=unit)

    def _red_unit(self, r: LayerRun) -> int:
        return round(r.m.cfg.cais.request_kB * 1024)

    def _load_unit(self, r: LayerRun, biggest: int) -> int:
        return self._red_unit(r)
