"""What a GEMM pays for sharing its GPU with a collective: the measurements behind
docs/validation.md §9.

Every GPU of the system launches the collective kernel first (a ring collective of
``channels`` TBs, as an NCCL kernel already resident when the GEMM arrives), then,
``gap_us`` later, a GEMM on all SMs; the GEMM's time is its first TB start to its
last TB end on GPU 0 (its launch overhead excluded, as a CUDA-event or profiler
kernel time would count it; the fixed GEMM overhead is added, as in an isolated
kernel time). The collective is sized to outlast the GEMM, so the GEMM is overlapped
from start to end. Alone, the same GEMM runs on an idle GPU.

    .venv/bin/python scripts/interference.py            # the tables
"""

from __future__ import annotations

from dataclasses import dataclass

from cais.hw.compute import ComputeModel
from cais.config import PS_PER_US, SystemConfig
from cais.kernels.collectives import CollectiveSpec, build
from cais.kernels.gemm import gemm_kernel, gemm_shape
from cais.machine import Machine


@dataclass(frozen=True)
class Corun:
    """One GEMM alone and beside a collective."""

    m: int
    n: int
    k: int
    op: str
    channels: int
    alone_us: float
    overlapped_us: float
    comm_us: float

    @property
    def slowdown(self) -> float:
        return self.overlapped_us / self.alone_us - 1.0


def _gemm_us(cfg: SystemConfig, m: int, n: int, k: int, comm: tuple[str, int, int] | None, gap_us: float) -> tuple[
        float, float]:
    """(GEMM time, collective time) on GPU 0 in us; ``comm`` = (op, bytes, channels) or None."""
    mach = Machine(cfg)
    cm = ComputeModel.for_gpu(cfg.gpu)
    comm_kernels = []
    if comm is not None:
        op, nbytes, channels = comm
        comm_kernels = build(mach, CollectiveSpec(op, "ring", nbytes // 2, 2, channels=channels))
    gemms = []
    for g, gpu in enumerate(mach.gpus):
        if comm_kernels:
            gpu.launch(comm_kernels[g])
        kernel = gemm_kernel(cm, gemm_shape(cm, m, n, k, cfg.gpu.sms), "gemm")
        gpu.launch(kernel, round(gap_us * PS_PER_US))
        gemms.append(kernel)
    mach.run()
    k0 = gemms[0]
    gemm = (k0.finished_at - k0.started_at + cm.kernel_overhead_ps) / PS_PER_US
    c = comm_kernels[0] if comm_kernels else None
    return gemm, ((c.finished_at - c.started_at) / PS_PER_US if c else 0.0)


def corun(cfg: SystemConfig, m: int, n: int, k: int, op: str = "allreduce", channels: int | None = None,
          gap_us: float = 5.0) -> Corun:
    """The GEMM alone and next to a ring ``op`` on ``channels`` SMs that outlasts it."""
    channels = channels or cfg.collective.ring_channels
    alone, _ = _gemm_us(cfg, m, n, k, None, 0.0)
    # enough bytes to keep the ring busy for ~1.5 GEMMs at ~200 GB/s of algbw
    nbytes = max(8 << 20, int((alone + gap_us) * 1.5 * 200e3)) // (cfg.gpus * 4096) * (cfg.gpus * 4096)
    over, comm = _gemm_us(cfg, m, n, k, (op, nbytes, channels), gap_us)
    return Corun(m, n, k, op, channels, alone, over, comm)


# GEMMs of one tensor-parallel layer (4 GPUs, 4096 tokens): GPT-style (hidden 4096,
# ffn 16384) and LLaMA-7B-style (hidden 4096, ffn 11008), forward and backward shapes.
PAIRS = [
    (4096, 3072, 4096), (4096, 4096, 1024), (4096, 4096, 4096), (4096, 1024, 4096),
    (4096, 2752, 4096), (4096, 4096, 2752), (4096, 5504, 4096), (8192, 4096, 4096),
]
