"""Deep fusion and asymmetric kernel overlap of a sub-layer (paper §III-C): passes
over one chain of the layer's dataflow graph.

* :func:`fuse` turns GEMM-RS -> reduce -> LN -> gather -> AG-GEMM into one pipeline of
  three kernels launched together: the ``reduce`` becomes GEMM1's ``red.cais``
  epilogue and the ``gather`` GEMM2's ``ld.cais`` mainloop, so neither is a kernel;
  the TB-level dependencies (``tb_dependencies``) order their TBs instead.
* :func:`asymmetric_split` gives the up-link-heavy GEMM-RS and the down-link-heavy
  LN + AG-GEMM their own SM groups, sized so that both finish together, or none
  (both on every SM, the GEMM-RS's tiles dispatched first, LN and AG-GEMM TBs as
  their data are ready); :func:`choose_split` picks one per sub-layer.

The paper gives no split ratio. A split lets each link direction carry its GEMM's
traffic the whole time, but it costs a pipeline's fill and drain (the AG-GEMM's SMs
idle until the first row block is reduced and normalised, the GEMM-RS's once it is
done); with no split every SM computes all the time, but each GEMM's traffic is
confined to its own phase. :func:`choose_split` weighs the two from the calibrated
GEMM times and the least link time of each direction, as a compiler would.
"""

from __future__ import annotations

from dataclasses import dataclass

from cais.workload.dataflow import GraphChain, Op


@dataclass(frozen=True)
class FusedSubLayer:
    """One fused pipeline: ``kernels`` in launch order (GEMM-RS, LN, AG-GEMM), and
    the communication ops it absorbed (``absorbed``: the reduce into GEMM1's
    epilogue, the gather into GEMM2's mainloop)."""

    name: str
    kernels: tuple[Op, Op, Op]
    absorbed: tuple[Op, ...]


def fuse(chain: GraphChain) -> FusedSubLayer:
    """The fused pipeline of ``chain``."""
    absorbed = tuple(op for op in (chain.reduce, chain.gather) if op is not None)
    return FusedSubLayer(chain.name, (chain.gemm1, chain.rowop, chain.gemm2), absorbed)


@dataclass(frozen=True)
class SplitChoice:
    """The optimizer's SM split of one sub-layer: ``split`` (``"none"`` or the
    GEMM-RS's share of the SMs) and the two estimates it was chosen on (ps):
    ``none_ps`` = GEMM-RS then AG-GEMM on every SM, each at least its link time;
    ``split_ps`` = both at once, at least the busier direction's link time, plus
    the pipeline's fill and drain."""

    split: str | float
    none_ps: int
    split_ps: int


def choose_split(rs_time_ps: int, ag_time_ps: int, up_ps: int, down_ps: int, depth: int) -> SplitChoice:
    """The SM split for a sub-layer whose GEMM-RS and AG-GEMM take ``rs_time_ps`` and
    ``ag_time_ps`` on every SM, whose reductions need ``up_ps`` of the up-links and whose
    loads ``down_ps`` of the down-links, in a pipeline ``depth`` row blocks deep (module
    doc): the cheaper estimate; no split where they tie."""
    work = rs_time_ps + ag_time_ps
    none_ps = max(rs_time_ps, up_ps) + max(ag_time_ps, down_ps)
    split_ps = max(work, up_ps, down_ps) + work // max(1, depth)  # fill and drain: a row block's share each end
    split: str | float = "none" if none_ps <= split_ps else rs_time_ps / work
    return SplitChoice(split, none_ps, split_ps)


def asymmetric_split(rs_time_ps: int, ag_time_ps: int, sms: int,
                     split: str | float) -> tuple[frozenset[int], frozenset[int]]:
    """(GEMM-RS SMs, LN + AG-GEMM SMs). ``split`` = ``work``: in proportion to the two
    GEMMs' times on all SMs (calibrated, not FLOPs: a short-K GEMM-RS costs several
    times more per FLOP), so both finish together; a float: the GEMM-RS share (each
    group keeps at least one SM); ``none``: both on every SM."""
    if split == "none":
        every = frozenset(range(sms))
        return every, every
    share = rs_time_ps / (rs_time_ps + ag_time_ps) if split == "work" else float(split)
    first = min(sms - 1, max(1, round(sms * share)))
    return frozenset(range(first)), frozenset(range(first, sms))
