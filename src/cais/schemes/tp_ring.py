"""TP-Ring: Megatron basic tensor parallelism (Shoeybi et al.) with NCCL's ring
AllReduce, what most users run on one node today (NCCL picks ring, or NVLS where the
switch supports it and the user enables it).

Mechanism: as ``tp-nvls`` (every GEMM whole on all SMs, row-wise ops replicated on
all T token rows), but the row-parallel GEMMs' partial sums are summed by a ring
AllReduce kernel (``ring_channels`` TBs per GPU, 2n-2 steps of P2P stores into the
next GPU's staging slots, reductions done by the SMs; kernels/collectives.py). No
overlap: kernel boundaries separate compute from communication, and the ring's
flags order its steps. It is the sequential baseline that overlap systems (T3, Flux)
report their speedups against."""

from cais.schemes.base import Scheme


class TpRing(Scheme):
    """Basic TP, bulk synchronous, ring AllReduce."""

    name = "tp-ring"
    sp = False
    algo = "ring"
    summary = "basic TP: GEMM -> ring AllReduce -> replicated LN -> GEMM, no overlap (plain Megatron)"
