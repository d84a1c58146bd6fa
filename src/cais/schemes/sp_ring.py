"""SP-Ring: Megatron tensor + sequence parallelism (Korthikanti et al.) with NCCL's
ring ReduceScatter and AllGather, no overlap.

Mechanism: GEMM (all SMs) -> ring ReduceScatter (n-1 steps; each GPU adds the
incoming chunk to its own partial sum on its SMs and forwards it) -> dropout +
residual + norm on the GPU's token shard -> ring AllGather (n-1 steps of forwarding)
-> GEMM. Both link directions of a GPU carry 1/n of the tensor per step, so unlike
NVLS RS/AG the two directions are used evenly. Kernel boundaries and the ring's
flags serialise everything; this is Megatron-LM's default with
``--sequence-parallel`` and the sequential baseline of T3 and Flux."""

from cais.schemes.base import Scheme


class SpRing(Scheme):
    """TP with sequence parallelism, bulk synchronous, ring RS and AG."""

    name = "sp-ring"
    sp = True
    algo = "ring"
    summary = "TP+SP: GEMM -> ring ReduceScatter -> LN on the shard -> ring AllGather -> GEMM, no overlap (plain Megatron)"
