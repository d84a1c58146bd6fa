"""The weight gradients of a remote-load scheme (LADM, CAIS-Base, CAIS and its
variants): schemes with no AllGather, whose GEMMs load token-sharded rows from their
owners. A weight gradient reads one gathered operand: a forward input (what QKV and
FC1 read) or an output gradient (what the output projection's and FC2's dgrad read
too). Per class, ``train.wgrad_inputs`` / ``train.wgrad_grads`` say how it gets it
(docs/schemes.md, "Weight gradients"):

* the source: ``keep``: the GEMM that first loaded the rows (the sub-layer's AG-GEMM)
  writes them to a local copy as they land (each remote row written to HBM once),
  and the weight gradient reads that copy, a plain local GEMM; ``refetch``: the
  weight-gradient GEMM loads them again itself;
* the placement: in program order, after the sub-layer with nothing beside it; or
  ``-overlap``: beside the work around it, on a low-priority stream so that the
  critical path's TBs go first (nothing in the period waits for a weight gradient).
  A forward input's weight gradient starts with the dgrad sub-layer before it (its
  operands are ready then: the input from the forward, the gradient from the layer
  above); an output gradient's with what follows its sub-layer. This is CAIS's
  asymmetric kernel overlap (§III-C.2: the optimizer runs kernels that are both
  ready side by side) applied past the sub-layer; with refetch, the weight
  gradient's loads run down the switch-to-GPU links while the dgrad's GEMM-RS pushes
  its reductions up.
"""

from __future__ import annotations

from cais.hw.gpu import Kernel
from cais.kernels.remote_gemm import RemoteAccess, Sharded, remote_operands
from cais.schemes.base import Deps, LayerRun, Scheme, WgradPlan, gathered_class
from cais.workload.graph import Chain, Gemm, Local

#: a weight gradient beside other work runs on a stream of lower priority than theirs
SIDE_PRIORITY = -1


class RemoteLoadScheme(Scheme):
    """A scheme whose GEMMs load token-sharded rows from their owners (no AllGather):
    how its weight gradients get their gathered operands. A subclass sets
    ``_sharded`` (the gathered tensors and where their rows live) and
    ``_wgrad_access`` (how a weight gradient's loads go out) before ``super().run``."""

    loads_remote = True
    wgrad_inputs = "refetch"
    wgrad_grads = "refetch"
    _sharded: dict[str, Sharded]
    _wgrad_access: RemoteAccess

    def run(self, r: LayerRun) -> None:
        plan = self.period_wgrad_plan(r)
        read = {t for seg in r.period.segments if isinstance(seg, Local) and seg.gemm is not None
                and seg.gemm.role == "wgrad" for t in (seg.gemm.ops.a, seg.gemm.ops.b)}
        # the gathered tensors a weight gradient reads from a local copy
        self._kept = {name for name in set(self._sharded) & read
                      if plan.of(gathered_class(r.period, name)).startswith("keep")}
        super().run(r)

    def keeps(self, c: Chain) -> bool:
        """Whether sub-layer ``c``'s AG-GEMM writes the rows it loads to a local copy
        (a weight gradient reads them there)."""
        return c.gather_dst in self._kept

    def gather(self, r: LayerRun, name: str, src: str, dst: str, deps: Deps) -> Deps:
        """No AllGather: the weight-gradient GEMM loads the rows where they live."""
        return deps

    def local_gemm(self, r: LayerRun, g: int, gemm: Gemm, beside: bool = False) -> Kernel:
        """A weight gradient loads its token-sharded operands that have no local copy
        (``beside``: it runs beside the work around it, on a side stream)."""
        loaded = {k: v for k, v in self._sharded.items() if k not in self._kept}
        return r.load_gemm(g, gemm, remote_operands(gemm, loaded), self._wgrad_access, beside=beside)

    def wgrad(self, r: LayerRun, seg: Local, deps: Deps, before: Deps, fetched: dict[str, Deps],
              plan: WgradPlan) -> Deps:
        """After ``deps``, or (``-overlap``) beside the work around it: a forward
        input's from ``before`` (what its dgrad sub-layer started after), an output
        gradient's from ``deps``; then the period goes on without it."""
        gemm = seg.gemm
        assert gemm is not None
        kinds = {gathered_class(r.period, t) for t in (gemm.ops.a, gemm.ops.b) if t in self._sharded}
        if not kinds or not all(plan.of(k).endswith("-overlap") for k in kinds):
            return self.local(r, seg, deps)
        after = before if kinds == {"input"} else deps
        for g in range(r.m.n):
            k = self.local_gemm(r, g, gemm, beside=True)
            k.priority = SIDE_PRIORITY
            r.submit(g, k, [after[g]], r.cm.kernel_overhead_ps, seg.name)
        return deps
