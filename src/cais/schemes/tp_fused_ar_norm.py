"""TP-Fused-AR-Norm: basic tensor parallelism with the all-reduce fused with the
residual add and RMSNorm in one kernel, as TensorRT-LLM's ``AllReduceFusionOp``
(``kARResidualRMSNorm``) and FlashInfer's ``trtllm_allreduce_fusion`` run it.

Mechanism: as ``tp-nvls`` (every GEMM whole on all SMs, nothing overlaps), but the
row-parallel GEMM's partial sums go to one kernel per GPU that all-reduces them and
applies the row-wise op in the same TBs (kernels/production_ar.py, family
``fused``): up to 128 tokens the one-shot Lamport kernel (each block stores its
token rows into every peer's buffer; the data is its own flag), above it the
two-shot (barrier, P2P-load reduce-scatter of the GPU's token shard, P2P-store
all-gather of the sums, barrier). The grid is TensorRT-LLM's: clusters of up to 8
blocks per token (per shard token in the two-shot), at most the GPU's SMs, so a
decode step uses a few SMs and a prefill every SM. The separate row-wise kernel
after the all-reduce is gone: each block runs the residual add + norm on its rows
after its all-reduce, timed as the row-wise kernel's memory-bound work on the
kernel's blocks, without that kernel's launch and fixed overhead.

Where the source's fusion does not apply, the sub-layer runs as ``tp-nccl`` with
NCCL's all-reduce (its own choice by size) and the separate row-wise kernel: a model with LayerNorm
(TensorRT-LLM fuses RMSNorm), and the backward pass (the fusion is an inference
kernel). Dropout, part of the shared row-wise op, is applied as the other schemes
do (0 in inference). Sources: docs/schemes/tp-fused-ar-norm.md."""

from collections.abc import Callable, Sequence

from cais.engine.sim import ProgramGen
from cais.hw.hbm import HbmPhase
from cais.kernels import production_ar as pa
from cais.schemes.base import NCCL_CHOICE, Deps, LayerRun, Scheme
from cais.workload.graph import Chain



def fused_rowop(r: LayerRun, c: Chain, work: int) -> Callable[[int, Sequence[tuple[int, int]]], ProgramGen]:
    """The row-wise op a fused all-reduce + norm kernel's TB runs on GPU ``g`` over
    its reduced rows (first, count): applied to memory in functional mode, timed as
    ``work`` against the HBM share for the bytes of its rows."""
    def rowop(g: int, rows: Sequence[tuple[int, int]]) -> ProgramGen:
        nr = sum(k for _, k in rows)
        if not nr:
            return
        if r.m.gpus[g].memory.functional:
            for r0, k in rows:
                r.rowop_apply(g, c.rowop, r0, k)
        yield HbmPhase(work, r.rowop_bytes(c.rowop, nr))
    return rowop

class TpFusedArNorm(Scheme):
    """Basic TP, bulk synchronous, all-reduce + residual + RMSNorm in one kernel."""

    name = "tp-fused-ar-norm"
    sp = False
    family = "production"
    algo = NCCL_CHOICE  # the NCCL fallback: NCCL's own algorithm and protocol by size (tp-nccl's run)
    summary = "basic TP: GEMM -> all-reduce fused with residual + RMSNorm (TensorRT-LLM, one kernel) -> GEMM"

    def fuses(self, r: LayerRun, c: Chain) -> bool:
        return not r.d.sp and c.rowop.kind == "residual_norm" and r.model.norm == "rmsnorm"

    def chain(self, r: LayerRun, c: Chain, deps: Deps) -> Deps:
        if not self.fuses(r, c):
            return super().chain(r, c, deps)
        n, over, eb, h = r.m.n, r.cm.kernel_overhead_ps, r.model.dtype_bytes, r.d.hidden
        tokens = r.d.tokens
        path = pa.fused_path(tokens)
        blocks = pa.fused_grid(tokens, h, n, r.sms, eb, path == "oneshot")
        rowop = fused_rowop(r, c, r.rowop_work_ps(c.rowop, c.rowop.rows, blocks))

        spec = pa.ProductionAr("fused", path, tokens * h, eb, c.gemm1.ops.c, c.reduced, blocks, row_elems=h,
                               rowop=rowop)
        g1 = [r.submit(g, r.gemm_kernel(g, c.gemm1), [deps[g]], over, c.name) for g in range(n)]
        kernels = r.production_allreduce(spec)
        fused = [r.submit(g, k, [g1[g]], r.m.launch_ps, c.name) for g, k in enumerate(kernels)]
        return [r.submit(g, r.gemm_kernel(g, c.gemm2), [fused[g]], over, c.name) for g in range(n)]
