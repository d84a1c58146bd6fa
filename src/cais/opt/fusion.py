"""Deep fusion and asymmetric kernel overlap of a sub-layer (paper §III-C): passes
over one chain of the layer's dataflow graph.

* :func:`fuse` turns GEMM-RS -> reduce -> LN -> gather -> AG-GEMM into one pipeline of
  three kernels launched together: the ``reduce`` becomes GEMM1's ``red.cais``
  epilogue and the ``gather`` GEMM2's ``ld.cais`` mainloop, so neither is a kernel;
  the TB-level dependencies (``tb_dependencies``) order their TBs instead.
* :func:`asymmetric_split` gives the up-link-heavy GEMM-RS and the down-link-heavy
  LN + AG-GEMM their own SM groups, sized so that both finish together.
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


def asymmetric_split(rs_time_ps: int, ag_time_ps: int, sms: int,
                     split: str | float) -> tuple[frozenset[int], frozenset[int]]:
    """(GEMM-RS SMs, LN + AG-GEMM SMs). ``split`` = ``work``: in proportion to the two
    GEMMs' times on all SMs (calibrated, not FLOPs: a short-K GEMM-RS costs several
    times more per FLOP), so both finish together; a float: the GEMM-RS share. Each
    group keeps at least one SM."""
    share = rs_time_ps / (rs_time_ps + ag_time_ps) if split == "work" else float(split)
    first = min(sms - 1, max(1, round(sms * share)))
    return frozenset(range(first)), frozenset(range(first, sms))
