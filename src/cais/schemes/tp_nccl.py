"""TP-NCCL: Megatron basic tensor parallelism (Shoeybi et al.) with whatever NCCL
chooses per call, what Megatron-LM gets with no NCCL setting (no ``NCCL_ALGO``,
no ``NCCL_PROTO``).

Mechanism: as ``tp-nvls`` and ``tp-ring`` (every GEMM whole on all SMs, the row-wise
ops replicated on all T token rows, nothing overlaps), but each AllReduce runs the
algorithm and protocol NCCL's tuning model picks for its size (kernels/tuning.py):
on 8 x H100, Ring/LL up to about 1 MiB (decode), NVLS from 2 MiB (prefill). NVLS
calls reach the user's buffers as ``collective.nvls_buffers`` says (staged on the
as-sold presets, as without registration). It runs NCCL's choice on every preset,
whatever ``collective.layer_choice`` says: that setting picks the protocol of the
schemes that name an algorithm (tp-ring, tp-nvls, ...), which NCCL runs as
``NCCL_ALGO`` forces it. It is also the run a production all-reduce kernel's NCCL
fallback is (``Scheme.NCCL_RUN``). Not in the paper's comparison."""

from cais.schemes.base import NCCL_CHOICE, Scheme


class TpNccl(Scheme):
    """Basic TP, bulk synchronous, NCCL's own AllReduce algorithm and protocol by size."""

    name = "tp-nccl"
    sp = False
    algo = NCCL_CHOICE
    summary = "basic TP: GEMM -> NCCL AllReduce (NCCL's algorithm and protocol by size) -> replicated LN -> GEMM"
