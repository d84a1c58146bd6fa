"""Grouped GEMMs of a MoE layer's experts: every expert's rows times its own weights, N
and K shared, as DeepGEMM runs them (deepseek-ai/DeepGEMM@55ab91f, README: "Grouped
GEMMs for MoE models"; M-axis grouping only).

* **contiguous** layout (prefill, training): the experts' rows concatenated, each
  expert's segment aligned to the M block; the tiles of every group are dealt over the
  SMs as one persistent grid.
* **masked** layout (decode after DeepEP's low-latency dispatch): ``groups`` slots of
  ``max_m`` rows, of which only each group's count is computed.

Either way the time is the compute model's tiled GEMM (hw/compute.py: per-SM tile time,
waves over the SMs, the kernel's fixed cost) over the groups' tiles,
``sum_g ceil(m_g / bm) * ceil(n / bn)``. BF16 is the compute model as fitted (its
cuBLAS-like tiles). FP8 is DeepGEMM's kernel: its block sizes (BLOCK_M 64 or 128,
BLOCK_N 16..256 by 8, the fastest), the LHS multicast over a 2-CTA cluster (README,
"TMA multicast (exclusive to the LHS matrix)": half the LHS bytes through L2); the
tensor cores' dense FP8 rate is twice BF16's
(NVIDIA H100 / H800 SXM datasheets: 1,979 vs 989 TFLOP/s), the operands half the bytes
through L2, and ``fp8_mma_efficiency`` (fitted, ``cais/data/calibration/grouped_gemm.json``:
DeepGEMM's dense table, the fit set) is the share of that doubled rate the FP8 mainloop
keeps (the scale promotion on the CUDA cores costs the rest).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

from cais.errors import UserError
from cais.hw.compute import REF_TILE, TILE_CANDIDATES, TILE_TIE, ComputeModel
from cais.hw.gpu import Kernel
from cais.kernels.local import even_kernel

LAYOUTS = ("contiguous", "masked")
DTYPES = ("bf16", "fp8")
FP8_RATE = 2.0  # dense FP8 over BF16 tensor-core peak on Hopper (datasheet)
#: DeepGEMM's block sizes (README: automatic selection, unaligned BLOCK_N such as 112):
#: BLOCK_M 64 or 128, BLOCK_N 16..256 by 8
DEEPGEMM_TILES: tuple[tuple[int, int], ...] = tuple((bm, bn) for bm in (128, 64) for bn in range(256, 15, -8))


def fp8_mma_efficiency() -> float:
    """The fitted share of the doubled FP8 rate (``grouped_gemm.json``)."""
    path = resources.files("cais") / "data" / "calibration" / "grouped_gemm.json"
    return float(json.loads(path.read_text())["constants"]["fp8_mma_efficiency"])


@dataclass(frozen=True)
class GroupedGemm:
    """``len(ms)`` GEMMs ``C_g[m_g, n] = A_g[m_g, k] @ B_g[k, n]`` in one kernel, in
    ``layout``, operands in ``dtype`` (outputs BF16)."""

    ms: tuple[int, ...]
    n: int
    k: int
    dtype: str = "bf16"
    layout: str = "contiguous"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise UserError(f"dtype: unknown '{self.dtype}'; valid: {', '.join(DTYPES)}")
        if self.layout not in LAYOUTS:
            raise UserError(f"layout: unknown '{self.layout}'; valid: {', '.join(LAYOUTS)}")
        if not self.ms or min(self.ms) < 0 or self.n <= 0 or self.k <= 0:
            raise UserError("ms, n, k: the groups' rows must be at least 0 and n, k positive")

    @property
    def flops(self) -> int:
        return 2 * sum(self.ms) * self.n * self.k


def _tile_ps(model: ComputeModel, bm: int, bn: int, k: int, busy: int, dtype: str, eff8: float) -> int:
    """One SM's bm x bn tile of depth k with ``busy`` SMs at work (hw/compute.py's tile
    time with FP8's rate and bytes)."""
    rate, eb = (FP8_RATE * eff8, 1) if dtype == "fp8" else (1.0, 2)
    flop_per_ps = model.peak_tflops / model.sms * model.mma_efficiency * rate
    mma = 2 * bm * bn / flop_per_ps * (1 + model.droop * busy / model.sms)
    lhs = bm / 2 if dtype == "fp8" else bm  # DeepGEMM: TMA multicast of the LHS over a 2-CTA cluster
    l2 = busy * eb * (lhs + bn) / (model.l2_bandwidth_GBps / 1000)
    overhead = model.tile_overhead_ns * 1000 * bm * bn / (REF_TILE[0] * REF_TILE[1])
    q = model.roofline_exp
    return round(overhead + k * (mma ** q + l2 ** q) ** (1 / q))


def _tiled_ps(model: ComputeModel, g: GroupedGemm, sms: int, bm: int, bn: int, eff8: float) -> int:
    tiles = sum(math.ceil(m / bm) for m in g.ms) * math.ceil(g.n / bn)
    full, rest = divmod(tiles, sms)
    t = model.kernel_overhead_ps + full * _tile_ps(model, bm, bn, g.k, sms, g.dtype, eff8)
    return t + (_tile_ps(model, bm, bn, g.k, rest, g.dtype, eff8) if rest else 0)


def grouped_gemm_ps(model: ComputeModel, g: GroupedGemm, sms: int, eff8: float | None = None) -> int:
    """The grouped GEMM's time on ``sms`` SMs: the tile (of the compute model's
    candidates) that runs it fastest, as hw/compute.py's heuristic picks for one GEMM."""
    if sms <= 0:
        raise UserError(f"sms: must be positive, got {sms}")
    e8 = fp8_mma_efficiency() if eff8 is None else eff8
    tiles = DEEPGEMM_TILES if g.dtype == "fp8" else TILE_CANDIDATES
    best = _tiled_ps(model, g, sms, *tiles[0], e8)
    for tile in tiles[1:]:
        t = _tiled_ps(model, g, sms, *tile, e8)
        if t < best * (1 - TILE_TIE):
            best = t
    return best


def grouped_tflops(model: ComputeModel, g: GroupedGemm, sms: int, eff8: float | None = None) -> float:
    """The grouped GEMM's throughput as DeepGEMM's tests report it (its FLOPs over the time)."""
    return g.flops / grouped_gemm_ps(model, g, sms, eff8)  # flop/ps == TFLOP/s


def groups_of(counts: Sequence[int], n: int, k: int, dtype: str = "bf16", layout: str = "contiguous") -> GroupedGemm:
    """The grouped GEMM of experts that received ``counts`` rows each."""
    return GroupedGemm(tuple(int(c) for c in counts), n, k, dtype, layout)


def kgrouped_gemm_ps(model: ComputeModel, m: int, n: int, ks: Sequence[int], sms: int, dtype: str = "bf16",
                     eff8: float | None = None) -> int:
    """A weight-gradient grouped GEMM (grouped over K, as DeepGEMM's k-grouped kernel
    runs the experts' ``dW_g[m, n] = X_g^T @ dY_g`` with ``ks[g]`` rows each) on ``sms``
    SMs: every group's ``ceil(m / bm) * ceil(n / bn)`` tiles, each of its own depth, dealt
    over the SMs as one persistent grid (their summed tile time over the SMs, at least
    the longest tile), for the compute model's tile that runs it fastest."""
    if sms <= 0:
        raise UserError(f"sms: must be positive, got {sms}")
    e8 = fp8_mma_efficiency() if eff8 is None and dtype == "fp8" else (eff8 or 1.0)
    live = [int(k) for k in ks if k > 0]
    if not live:
        return model.kernel_overhead_ps
    best = 0
    for i, (bm, bn) in enumerate(TILE_CANDIDATES):
        per = math.ceil(m / bm) * math.ceil(n / bn)
        busy = min(sms, per * len(live))
        tiles = [_tile_ps(model, bm, bn, k, busy, dtype, e8) for k in live]
        t = model.kernel_overhead_ps + max(max(tiles), math.ceil(per * sum(tiles) / sms))
        if i == 0 or t < best * (1 - TILE_TIE):
            best = t
    return best


def grouped_kernel(model: ComputeModel, name: str, work_ps: int, nbytes: float, total_sms: int,
                   sm_set: frozenset[int] | None = None) -> tuple[Kernel, int]:
    """(kernel, its fixed overhead) of a grouped GEMM that takes ``work_ps`` beyond that
    overhead and moves ``nbytes`` through HBM: a persistent grid of one TB per SM
    (``sm_set``, default all ``total_sms``). Timing only: it moves no data."""
    sms = len(sm_set) if sm_set else total_sms
    return even_kernel(name, max(0, work_ps), sms, sms, None, sm_set, nbytes), model.kernel_overhead_ps


def grouped_bytes(ms: Sequence[int], n: int, k: int, dtype: str = "bf16") -> int:
    """HBM bytes of a grouped GEMM: its groups' A rows and the B of every group with rows
    (``dtype``), C in BF16."""
    eb = 1 if dtype == "fp8" else 2
    rows = sum(ms)
    return eb * (rows * k + sum(1 for m in ms if m > 0) * k * n) + 2 * rows * n
