"""TP-NVLS: Megatron basic tensor parallelism (Shoeybi et al.) with NCCL's NVLS
AllReduce.

Mechanism: every GEMM runs whole on all SMs; the row-parallel GEMMs' partial sums
are summed by an NVLS AllReduce kernel (``multimem.ld_reduce`` + ``multimem.st``,
reduction in the switch) launched after the GEMM; the row-wise ops (dropout,
residual, LayerNorm) then run on all T token rows on every GPU (replicated), and the
next GEMM reads them locally. Nothing overlaps: kernel boundaries and the NVLS
kernels' barriers separate compute from communication (paper §IV-C (a))."""

from cais.schemes.base import Scheme


class TpNvls(Scheme):
    """Basic TP, bulk synchronous, NVLS AllReduce."""

    name = "tp-nvls"
    sp = False
    algo = "nvls"
    summary = "basic TP: GEMM -> NVLS AllReduce -> replicated LN -> GEMM, no overlap"
