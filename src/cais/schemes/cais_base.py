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

The GEMM kernels (kernels/remote_gemm.py), tile order (CUTLASS's heuristic, the
same on every GPU) and store and load windows are LADM's; what differs is the ISA
(mergeable accesses, :class:`~cais.kernels.remote_gemm.MergeableAccess`), the
switch (merge units) and the synchronisation (signals instead of a barrier after
every kernel). ``unit``: bytes of one ``red.cais``/``ld.cais`` before
the ISA stripes it over the chips (32 KiB: one K-slice stage of a 256-row tile, two
of a 128-row tile; its share of one chip, 57-72 lines of 128 B, is one merge
session), see docs/cais.md.
"""

from __future__ import annotations

from cais.engine import Signal, all_of
from cais.kernels.remote_gemm import MergeableAccess, remote_operands, sharded_activations
from cais.schemes.base import Deps, LayerRun
from cais.schemes.remote_wgrad import RemoteLoadScheme
from cais.workload.graph import Chain


class CaisBase(RemoteLoadScheme):
    """GEMM -> ``red.cais`` into the row owner | row-wise op | GEMM with ``ld.cais`` of
    remote A rows; merging in the switch, no TB coordination, no graph optimizer."""

    name = "cais-base"
    sp = True
    algo = "p2p"
    switch = "cais"
    family = "ablation"
    summary = "CAIS ISA + switch merge unit only: GEMM -> red.cais | LN | GEMM with ld.cais; no TB coordination"

    def run(self, r: LayerRun) -> None:
        self._sharded = sharded_activations(r.period)
        # a weight gradient loads its token-sharded operands with ld.cais (their owners
        # wrote them before an earlier barrier), after its sub-layer
        self._loads = self._wgrad_access = MergeableAccess(r.m)
        super().run(r)

    def chain(self, r: LayerRun, c: Chain, deps: Deps) -> Deps:
        n, over, sim = r.m.n, r.cm.kernel_overhead_ps, r.m.sim
        key = r.m.flag_key()
        reductions = MergeableAccess(r.m, signal=key)
        expected = n * r.d.rows_l * c.gemm1.n * r.model.dtype_bytes  # every GPU's partial rows, its own too
        rows = []
        for g in range(n):
            kernel, _ = r.reduce_gemm(g, c.gemm1, c.reduced, reductions)
            done = r.submit(g, kernel, [deps[g]], over, c.name)
            landed = Signal()
            r.m.isa.wait_signal(g, key, expected, lambda s=landed: s.fire(sim))
            rows.append(r.submit(g, r.rowop_kernel(g, c.rowop), [all_of(sim, [done, landed])], r.cm_mem_overhead_ps,
                                 c.name))
        normed = r.barrier(rows, f"{c.name} rows ready")
        ops = remote_operands(c.gemm2, self._sharded)
        return [r.submit(g, r.load_gemm(g, c.gemm2, ops, self._loads, keep=self.keeps(c)), [normed[g]], over, c.name) for g in range(n)]
