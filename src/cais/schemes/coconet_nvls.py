"""CoCoNet-NVLS: CoCoNet's schedule with its collective made of NVLS operations
("extended multimem instructions", CAIS paper §IV-C (c)).

Mechanism as modelled: as :mod:`cais.schemes.coconet`, but each ready chunk is
reduce-scattered with ``multimem.ld_reduce`` (the owner pulls the chunk's rows of
its shard, summed in the switch) and all-gathered with ``multimem.st`` (switch
multicast). Because ``ld_reduce`` reads every GPU's partial, a chunk can only start
when it is complete on all GPUs: a flag exchange (one switch round trip) precedes
and follows each chunk's collective. The communication kernel still occupies
``comm_sms`` SMs that the GEMM cannot use (the contention the paper mentions)."""

from cais.schemes.chunked import ChunkedOverlap


class CoCoNetNvls(ChunkedOverlap):
    """Chunked GEMM || NVLS RS + LN + AG per chunk on dedicated SMs."""

    name = "coconet-nvls"
    algo = "nvls"
    summary = "CoCoNet's chunked overlap with NVLS ld_reduce / multimem.st per chunk"
