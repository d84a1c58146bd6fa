"""Run one GEMM on one simulated GPU through the TB dispatcher."""

from __future__ import annotations

from dataclasses import dataclass

from cais.hw.compute import ComputeModel
from cais.errors import UserError
from cais.config import PS_PER_US, SystemConfig
from cais.machine import Machine
from cais.kernels.gemm import gemm_kernel, gemm_shape
from cais.experiments.estimates import gemm_events
from cais.limits import MAX_GEMM_DIM, check_events, check_machine


@dataclass(frozen=True)
class GemmResult:
    """Predicted time of one bf16 GEMM on ``sms`` SMs."""

    m: int
    n: int
    k: int
    sms: int
    tile: tuple[int, int]
    tiles: int
    time_us: float
    tflops: float
    units: int = 0  # CTAs sharing the tiles' K (split-K / stream-K); 0: one per tile
    launch: str = "fitted"  # what the time adds besides the tiles (gpu.launch)

    @property
    def split(self) -> str:
        """``data-parallel``, ``split-K x S`` or ``stream-K``, as CUTLASS's heuristic names them."""
        if not self.units:
            return "data-parallel"
        return f"split-K x {self.units // self.tiles}" if self.units % self.tiles == 0 else "stream-K"

    def as_json(self) -> dict[str, object]:
        return {"m": self.m, "n": self.n, "k": self.k, "sms": self.sms, "tile": list(self.tile),
                "tiles": self.tiles, "units": self.units, "split": self.split, "launch": self.launch,
                "time_us": self.time_us, "tflops": self.tflops}


def run_gemm(cfg: SystemConfig, m: int, n: int, k: int, sms: int | None = None) -> GemmResult:
    for name, v in (("m", m), ("n", n), ("k", k)):
        if not 0 < v <= MAX_GEMM_DIM:
            raise UserError(f"{name}: must be a positive integer of at most {MAX_GEMM_DIM:,} (cuBLAS's 32-bit "
                            f"dimensions), got {v:,}")
    sms = cfg.gpu.sms if sms is None else sms
    if not 1 <= sms <= cfg.gpu.sms:
        raise UserError(f"sms: must be between 1 and {cfg.gpu.sms} on {cfg.name}, got {sms}")
    model = ComputeModel.for_gpu(cfg.gpu)
    shape = gemm_shape(model, m, n, k, sms)
    check_machine(cfg.with_overrides(gpus=2), gemm_events(shape.tiles))
    check_events(gemm_events(shape.tiles), f"output {m:,} x {n:,} (m x n): {shape.tiles:,} output tiles of "
                 f"{shape.bm} x {shape.bn}", "use a smaller m or n (k sets only the time of a tile)")
    machine = Machine(cfg.with_overrides(gpus=2))  # one GPU is used; a fabric needs two
    # the least tile time: the operands' HBM bytes per wave, as every scheme's GEMM has it
    mem0 = model.memory_time_ps(0, sms, cfg.gpu.sms)
    floor = max(0, model.memory_time_ps(2 * (m * k + k * n + m * n), sms, cfg.gpu.sms) - mem0)
    floor //= -(-shape.tiles // sms)
    kernel = gemm_kernel(model, shape, sms=frozenset(range(sms)), floor_ps=floor)
    machine.gpus[0].launch(kernel)
    machine.run()
    launch = cfg.gpu.launch
    # fitted: the compute model's per-GEMM overhead; graph: the gap a dependent kernel waits in a
    # CUDA-graph replay; eager: the host's issue of one op, or that gap if longer (docs/compute-model.md)
    extra = {"fitted": model.kernel_overhead_ps, "graph": round(cfg.gpu.kernel_gap_us * PS_PER_US),
             "eager": round(max(cfg.gpu.kernel_gap_us, cfg.gpu.host_op_us) * PS_PER_US)}[launch]
    end = (kernel.finished_at or 0) + extra
    t_us = end / PS_PER_US
    return GemmResult(m, n, k, sms, (shape.bm, shape.bn), shape.tiles, t_us, shape.flops / (t_us * 1e6),
                      shape.units, launch)
