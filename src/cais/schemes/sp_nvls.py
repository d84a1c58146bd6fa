"""SP-NVLS: Megatron tensor + sequence parallelism (Korthikanti et al.) with NCCL's
NVLS ReduceScatter and AllGather.

Mechanism: GEMM (all SMs) -> NVLS ReduceScatter (``multimem.ld_reduce`` of the
GPU's token shard; S up, S/n down per GPU) -> dropout + residual + LayerNorm on the
shard -> NVLS AllGather (``multimem.st``; S/n up, S down) -> GEMM. Each collective
uses one link direction far more than the other, and kernel boundaries plus the
NVLS barriers serialise everything (paper §IV-C (a), §V-A.3)."""

from cais.schemes.base import Scheme


class SpNvls(Scheme):
    """TP with sequence parallelism, bulk synchronous, NVLS RS and AG."""

    name = "sp-nvls"
    sp = True
    algo = "nvls"
    summary = "TP+SP: GEMM -> NVLS ReduceScatter -> LN on the shard -> NVLS AllGather -> GEMM, no overlap"
