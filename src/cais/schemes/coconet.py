"""CoCoNet (Jangda et al., ASPLOS'22): compiler-generated overlap of a GEMM with the
collective that consumes its output.

Mechanism as modelled: the GEMM computes its output tiles in the order the
collective consumes them, on the SMs the collective does not use; a fused
ReduceScatter + pointwise (dropout, residual, LayerNorm) + AllGather runs as an
NCCL-style **ring** kernel on ``comm_sms`` SMs, one chunk at a time, as soon as the
chunk's tiles are done; spin-waits on tile counters in global memory gate it. The
next GEMM waits for the whole collective (CoCoNet overlaps a collective with its
producer, not with its consumer). Choices the sources leave open: 16 communication
SMs (NCCL's channel count on H100 is 16-32), 4 chunks per shard, no launch gap
between chunks (one persistent kernel); see docs/schemes.md."""

from cais.schemes.chunked import ChunkedOverlap


class CoCoNet(ChunkedOverlap):
    """Chunked GEMM || ring RS + LN + AG on dedicated SMs."""

    name = "coconet"
    algo = "ring"
    summary = "GEMM in chunk order || ring RS+LN+AG per chunk on 16 SMs; next GEMM after the collective"
