"""SP-NCCL: Megatron tensor + sequence parallelism (Korthikanti et al.) with whatever
NCCL chooses per call, what Megatron-LM's ``--sequence-parallel`` gets with no NCCL
setting.

Mechanism: as ``sp-nvls`` and ``sp-ring`` (GEMM -> ReduceScatter -> dropout +
residual + norm on the GPU's token shard -> AllGather -> GEMM, nothing overlaps),
but each ReduceScatter and AllGather runs the algorithm and protocol NCCL's tuning
model picks for its size (kernels/tuning.py), on every preset, whatever
``collective.layer_choice`` says (see ``tp-nccl``). Not in the paper's comparison."""

from cais.schemes.base import NCCL_CHOICE, Scheme


class SpNccl(Scheme):
    """TP with sequence parallelism, bulk synchronous, NCCL's own RS/AG algorithm and protocol by size."""

    name = "sp-nccl"
    sp = True
    algo = NCCL_CHOICE
    summary = "TP+SP: GEMM -> NCCL ReduceScatter -> LN on the shard -> NCCL AllGather -> GEMM (NCCL's choice by size)"
