"""TP-Multimem: basic tensor parallelism with PyTorch symmetric memory's multimem
all-reduce, as vLLM's ``SymmMemCommunicator`` runs it.

Mechanism: as ``tp-nvls`` (every GEMM whole on all SMs, nothing overlaps, the
row-wise ops replicated), but the partial sums are summed by
``torch.ops.symm_mem.multimem_all_reduce_`` (kernels/production_ar.py): at most 8
blocks of 1024 threads; each GPU ``multimem.ld_reduce``s its 1/n shard and
``multimem.st``s the sum to every replica, between two per-block flag exchanges
over the symmetric memory's signal pads (no NCCL: no host cost, no staging, no NVLS
barrier). vLLM copies the input into the symmetric buffer first and the result out
after (both timed at HBM bandwidth). vLLM uses it on sm90 for 4, 6 and 8 GPUs up to
32 MiB (4 GPUs) or 64 MiB (6, 8); outside those (and at 2 GPUs, where vLLM runs
PyTorch's P2P two-shot, not modelled) this scheme calls NCCL with no setting: NCCL's
own algorithm and protocol by size, as ``tp-nccl`` runs it. In vLLM the custom all-reduce (``tp-custom-ar``)
is tried first, capped at 256 KiB on 8 sm90 GPUs when symmetric memory is on; this
scheme isolates the multimem kernel. Sources: docs/schemes/tp-multimem.md."""

from cais.kernels import production_ar as pa
from cais.schemes.base import NCCL_CHOICE, Deps, LayerRun, Scheme


class TpMultimem(Scheme):
    """Basic TP, bulk synchronous, PyTorch symmetric memory's multimem all-reduce."""

    name = "tp-multimem"
    sp = False
    family = "production"
    algo = NCCL_CHOICE  # the NCCL fallback: NCCL's own algorithm and protocol by size (tp-nccl's run)
    summary = "basic TP: GEMM -> symmetric-memory multimem all-reduce (ld_reduce + multimem.st, no NCCL) -> LN -> GEMM"

    def hands_to_nccl(self, n: int, nbytes: int) -> bool:
        return not pa.multimem_runs(n, nbytes)

    def allreduce(self, r: LayerRun, src: str, dst: str, deps: Deps, segment: str) -> Deps:
        n, eb = r.m.n, r.model.dtype_bytes
        count = r.d.tokens * r.d.hidden
        nbytes = count * eb
        if self.hands_to_nccl(n, nbytes):
            return super().allreduce(r, src, dst, deps, segment)
        copy = pa.copy_time_ps(r.m, nbytes)
        spec = pa.ProductionAr("multimem", "twoshot", count, eb, src, dst, pa.multimem_blocks(nbytes, n), copy,
                               copy)
        kernels = r.production_allreduce(spec)
        return [r.submit(g, k, [deps[g]], r.m.launch_ps, segment) for g, k in enumerate(kernels)]
