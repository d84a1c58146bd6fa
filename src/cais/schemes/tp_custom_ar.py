"""TP-Custom-AR: basic tensor parallelism with vLLM's custom all-reduce, the kernel
vLLM and SGLang run by default for a TP all-reduce on one NVLink node.

Mechanism: as ``tp-nvls`` (every GEMM whole on all SMs, nothing overlaps, the
row-wise ops replicated on all T token rows), but the row-parallel GEMMs' partial
sums are summed by vLLM's custom all-reduce (kernels/production_ar.py): 36 blocks of
512 threads at most, per-block flags in IPC-registered signal pads, P2P loads of the
peers' registered buffers; one-shot (every GPU loads the whole buffer from every
peer) for S < 256 KiB on 8 GPUs (< 512 KiB on 4; always on 2), two-shot
(reduce-scatter then all-gather, both by loads) above, up to vLLM's ``max_size`` of
8 MiB; at or above it, or on a world size other than 2, 4, 6 or 8, vLLM calls NCCL,
and so does this scheme (NCCL's own algorithm and protocol by size, as ``tp-nccl``
runs it).

Choices: ``registered`` = False, vLLM's default out of a CUDA graph (the input is
first copied into the registered buffer, at HBM bandwidth); under ``gpu.launch`` =
graph the buffers are registered at capture, so no copy (a subclass with True skips
it under every launch). ``max_size`` = 8 MiB, vLLM's default; with torch
symmetric memory enabled vLLM caps it on sm90 at 256 KiB for 8 GPUs (then
``tp-multimem``'s kernel takes the next sizes). Sources, block counts and what is
not modelled: docs/schemes/tp-custom-ar.md."""

from cais.kernels import production_ar as pa
from cais.schemes.base import NCCL_CHOICE, Deps, LayerRun, Scheme


class TpCustomAr(Scheme):
    """Basic TP, bulk synchronous, vLLM's custom all-reduce (NCCL above its max size)."""

    name = "tp-custom-ar"
    sp = False
    family = "production"
    algo = NCCL_CHOICE  # the NCCL fallback: NCCL's own algorithm and protocol by size (tp-nccl's run)
    summary = "basic TP: GEMM -> vLLM custom all-reduce (P2P loads, one-/two-shot by size) -> LN -> GEMM"
    registered = False
    max_size = pa.CUSTOM_MAX_SIZE

    def hands_to_nccl(self, n: int, nbytes: int) -> bool:
        return not pa.custom_runs(n, nbytes, self.max_size)

    def allreduce(self, r: LayerRun, src: str, dst: str, deps: Deps, segment: str) -> Deps:
        n, eb = r.m.n, r.model.dtype_bytes
        count = r.d.tokens * r.d.hidden
        nbytes = count * eb
        if self.hands_to_nccl(n, nbytes):
            return super().allreduce(r, src, dst, deps, segment)
        # a CUDA-graph replay runs on buffers vLLM registered at capture (no copy)
        registered = self.registered or r.m.cfg.gpu.launch == "graph"
        copy = 0 if registered else pa.copy_time_ps(r.m, nbytes)
        spec = pa.ProductionAr("custom", pa.custom_path(n, nbytes), count, eb, src, dst, pa.custom_blocks(nbytes),
                               copy)
        kernels = r.production_allreduce(spec)
        return [r.submit(g, k, [deps[g]], r.m.launch_ps, segment) for g, k in enumerate(kernels)]
