"""Calibrated compute-time model of one Hopper GPU: GEMM tiles, memory-bound kernels and
attention, all in integer picoseconds.

The coefficients are fitted by ``scripts/fit_compute.py`` to H200 measurements
(``cais/data/calibration/h200/*.csv``) and shipped as ``fit.json``; docs/compute-model.md
gives the equations, fitted values and errors.  H100 SXM has the same die and clocks
(132 SMs, 989 TFLOP/s dense bf16) and only a slower HBM (3350 vs 4800 GB/s peak), so one
fit serves both: pass ``hbm_bandwidth_GBps`` to :meth:`ComputeModel.load` and every
memory-bound time is rescaled on the assumption that a kernel reaches the same *fraction*
of peak HBM bandwidth on either GPU.  GEMM tiles (L2/SM bound) are not rescaled.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from importlib import resources
from typing import Any

from cais.errors import UserError

PS_PER_NS = 1_000
REF_TILE = (128, 256)  # the tile whose overhead `tile_overhead_ns` is quoted for
TILE_CANDIDATES: tuple[tuple[int, int], ...] = ((128, 256), (256, 128), (128, 128))
TILE_TIE = 1e-3  # relative time difference below which the earlier (larger) tile is kept
ATTENTION_PASSES = ("fwd", "bwd", "fwd+bwd")
BWD_FLOP_RATIO = 2.5  # FlashAttention backward: 5 matmuls vs the forward's 2
BF16 = 2  # bytes
#: CUTLASS's Hopper stream-K tile scheduler (NVIDIA/cutlass
#: include/cutlass/gemm/kernel/tile_scheduler_params.h, commit 7107b05535f8977f5ecb9d01ee203205b1fd9bc4,
#: PersistentTileSchedulerSm90StreamKParams): the depth of one k-tile of a bf16 128xN tile, and
#: the fewest k-tiles one stream-K unit may get (its ``min_iters_per_sk_unit_``)
SPLIT_K_TILE = 64
SPLIT_MIN_ITERS = 8


def _positive(**values: int) -> None:
    for name, v in values.items():
        if v <= 0:
            raise ValueError(f"{name} must be positive, got {v}")


@dataclass(frozen=True)
class ComputeModel:
    """Compute side of one NVIDIA Hopper GPU (H200 SXM as calibrated; H100 SXM via a
    different ``hbm_bandwidth_GBps``): per-SM GEMM tile times that slow down as more SMs
    are busy, HBM-bound kernels, and FlashAttention-style attention."""

    name: str
    sms: int  # SMs of the calibrated GPU
    peak_tflops: float  # dense bf16 tensor-core peak of the whole GPU
    # GEMM tile: overhead + K * smooth-max(MMA time per k * droop(busy), L2 time per k(busy))
    mma_efficiency: float  # mainloop MMA rate / peak, one SM busy
    droop: float  # MMA-rate loss with all SMs busy (clock/power), linear in busy / sms
    l2_bandwidth_GBps: float  # L2 -> SMs bandwidth shared by the busy SMs
    roofline_exp: float  # q of the smooth max (mma^q + l2^q)^(1/q)
    tile_overhead_ns: float  # prologue + epilogue of one 128x256 tile (scales with BM*BN)
    gemm_overhead_ns: float  # per GEMM kernel: launch, first-wave ramp, tail
    # memory-bound kernels
    hbm_peak_GBps: float  # peak HBM bandwidth of the calibrated GPU
    hbm_efficiency: float  # effective / peak, from the 2 GiB device copy
    mem_overhead_ns: float  # per memory-bound kernel
    mem_saturation_fraction: float  # ASSUMED: HBM saturates with this fraction of SMs
    elementwise_bytes: dict[str, float] = field(hash=False)  # nominal bytes/element (CSV bytes_moved)
    elementwise_traffic: dict[str, float] = field(hash=False)  # fitted effective / nominal traffic
    # attention: overhead + max(FLOPs / (efficiency * peak * SM share), bytes / HBM)
    attn_efficiency_fwd: float
    attn_efficiency_bwd: float
    attn_overhead_fwd_ns: float
    attn_overhead_bwd_ns: float
    hbm_bandwidth_GBps: float  # peak HBM of the GPU being simulated
    # split-K / stream-K fix-up (scripts/fit_split.py, split.json): the final CTA of a split
    # tile waits for its peers' flags, then reads and adds each peer's fp32 partial tile
    split_fixup_ns: float = 0.0  # the wait: flag round trip and the peers' skew, once per tile
    split_peer_ns: float = 0.0  # one peer's 128x128 fp32 partial written, read and added (x BM*BN)
    split_gemms: bool = True  # False: every GEMM data-parallel, one CTA per tile (the model before splits)

    @classmethod
    def load(cls, name: str = "h200", hbm_bandwidth_GBps: float | None = None) -> "ComputeModel":
        """Read ``cais/data/calibration/<name>/fit.json``; ``hbm_bandwidth_GBps`` is the
        simulated GPU's peak HBM bandwidth (default: the calibrated GPU's)."""
        path = resources.files("cais") / "data" / "calibration" / name / "fit.json"
        if not path.is_file():
            raise UserError(f"field 'gpu.compute_model': no compute calibration '{name}' (missing {name}/fit.json)")
        fit = json.loads(path.read_text())
        split = resources.files("cais") / "data" / "calibration" / name / "split.json"
        if split.is_file():  # the split-K fix-up, fitted on published skinny GEMMs (scripts/fit_split.py)
            fit = {**fit, "coefficients": {**fit["coefficients"], **json.loads(split.read_text())["coefficients"]}}
        return cls.from_fit(fit, hbm_bandwidth_GBps)

    @classmethod
    def for_gpu(cls, gpu: Any) -> "ComputeModel":
        """The model of a system's GPU config (``gpu.compute_model``, its HBM bandwidth,
        and ``gpu.split_gemms``)."""
        cm = cls.load(gpu.compute_model, gpu.hbm_bandwidth_GBps)
        return cm if gpu.split_gemms else replace(cm, split_gemms=False)

    @classmethod
    def from_fit(cls, fit: dict[str, Any], hbm_bandwidth_GBps: float | None = None) -> "ComputeModel":
        c = dict(fit["coefficients"])
        c["hbm_bandwidth_GBps"] = c["hbm_peak_GBps"] if hbm_bandwidth_GBps is None else hbm_bandwidth_GBps
        if c["hbm_bandwidth_GBps"] <= 0:
            raise ValueError(f"hbm_bandwidth_GBps must be positive, got {hbm_bandwidth_GBps}")
        return cls(name=fit["name"], **c)

    # ---- GEMM ---------------------------------------------------------------------
    @property
    def kernel_overhead_ps(self) -> int:
        """Fixed cost of one GEMM kernel, added once to the tiles' makespan."""
        return round(self.gemm_overhead_ns * PS_PER_NS)

    @cached_property
    def _tile_times(self) -> dict[tuple[int, int, int, int], int]:
        """The tile times asked for so far: a layer's TBs ask for a few shapes many times."""
        return {}

    def tile_time_ps(self, bm: int, bn: int, k: int, busy_sms: int) -> int:
        """Time one SM spends on one bm x bn output tile of depth k while ``busy_sms``
        SMs run tiles: a fixed prologue/epilogue plus, per step of k, a smooth max of the
        SM's MMA time (slowed by clock droop as more SMs are busy) and the time to pull
        its A/B slices through its 1/busy share of L2 bandwidth."""
        key = (bm, bn, k, busy_sms)
        hit = self._tile_times.get(key)
        if hit is None:
            hit = self._tile_times[key] = self._tile_time_ps(bm, bn, k, busy_sms)
        return hit

    def _tile_time_ps(self, bm: int, bn: int, k: int, busy_sms: int) -> int:
        _positive(bm=bm, bn=bn, k=k, busy_sms=busy_sms)
        flop_per_ps = self.peak_tflops / self.sms * self.mma_efficiency  # 1e12 flop/s == 1 flop/ps
        mma = 2 * bm * bn / flop_per_ps * (1 + self.droop * busy_sms / self.sms)
        l2 = busy_sms * BF16 * (bm + bn) / (self.l2_bandwidth_GBps / PS_PER_NS)
        overhead = self.tile_overhead_ns * PS_PER_NS * bm * bn / (REF_TILE[0] * REF_TILE[1])
        q = self.roofline_exp
        return round(overhead + k * (mma ** q + l2 ** q) ** (1 / q))

    # ---- split-K and stream-K (CUTLASS's Hopper stream-K heuristic) ----------------
    def split_units(self, tiles: int, k: int, sms: int) -> int:
        """How many CTAs share the ``tiles`` output tiles of depth ``k`` on ``sms`` SMs
        (0: none, data-parallel: one CTA per tile over the whole K).

        CUTLASS's Hopper stream-K scheduler in its heuristic mode (tile_scheduler_params.h,
        ``get_num_sk_tiles``, ``get_num_sk_units``, ``heuristic``; commit in SPLIT_K_TILE's
        comment), read for the case of less than one wave: when 2 x tiles < CTAs per wave
        (the tail wave less than half full) and a tile has more than ``SPLIT_MIN_ITERS``
        k-tiles, every tile becomes stream-K work; the units are min(CTAs per wave,
        all k-tiles / SPLIT_MIN_ITERS); where they divide evenly among the tiles it is a
        split-K of units / tiles per tile, else stream-K (each unit an equal share of all
        the k-tiles, crossing tile boundaries). The scheduler also streams the last two
        waves of a multi-wave GEMM whose tail is less than half full; that case is not
        modelled (the cuBLAS fit of fit.json was made with data-parallel waves)."""
        k_tiles = -(-k // SPLIT_K_TILE)
        if not self.split_gemms or 2 * tiles >= sms or k_tiles <= SPLIT_MIN_ITERS:
            return 0
        units = min(sms, tiles * k_tiles // SPLIT_MIN_ITERS)
        return units if units > tiles else 0

    def split_tile_time_ps(self, bm: int, bn: int, k: int, tiles: int, units: int, busy_sms: int) -> int:
        """One output tile of a GEMM whose ``tiles`` tiles are shared by ``units`` CTAs
        (:meth:`split_units`), from the first unit's start to the tile's epilogue: each
        unit runs ``k * tiles / units`` of the depth (with its own prologue/epilogue) while
        ``busy_sms`` - tiles + units SMs are busy (at most the GPU's); then the tile's final CTA waits for its
        peers (``split_fixup_ns``) and reads and adds each peer's fp32 partial tile from
        the workspace (``split_peer_ns`` per peer, for 128x128; scaled by BM*BN). Its
        epilogue then sees the whole tile."""
        _positive(tiles=tiles, units=units)
        depth = max(1, round(k * tiles / units))
        busy = max(units, min(self.sms, busy_sms + units - tiles))
        peers = -(-units // tiles)  # CTAs covering one tile (stream-K: some tiles one more)
        fixup = self.split_fixup_ns + (peers - 1) * self.split_peer_ns * bm * bn / (128 * 128)
        return self.tile_time_ps(bm, bn, depth, busy) + round(fixup * PS_PER_NS)

    def work_tile_ps(self, bm: int, bn: int, k: int, tiles: int, units: int, busy_sms: int) -> int:
        """One output tile's time as the kernel runs it: :meth:`tile_time_ps` (whole K on
        one SM) or, for a split GEMM (``units`` > 0), :meth:`split_tile_time_ps`."""
        if units:
            return self.split_tile_time_ps(bm, bn, k, tiles, units, busy_sms)
        return self.tile_time_ps(bm, bn, k, busy_sms)

    def tiled_gemm_ps(self, m: int, n: int, k: int, sms: int, bm: int, bn: int) -> int:
        """Kernel overhead + the tiles run in waves on ``sms`` SMs (each wave's tiles take
        tile_time_ps with busy = min(remaining tiles, sms)): exactly what a greedy
        TB dispatcher gives, since the tiles of one wave start and end together. Less
        than half a wave of tiles is split (:meth:`split_units`): one wave of units."""
        _positive(m=m, n=n, k=k, sms=sms)
        tiles = math.ceil(m / bm) * math.ceil(n / bn)
        units = self.split_units(tiles, k, sms)
        if units:
            return self.kernel_overhead_ps + self.split_tile_time_ps(bm, bn, k, tiles, units, tiles)
        full, rest = divmod(tiles, sms)
        t = self.kernel_overhead_ps + full * self.tile_time_ps(bm, bn, k, sms)
        return t + (self.tile_time_ps(bm, bn, k, rest) if rest else 0)

    def tile_shape(self, m: int, n: int, k: int, sms: int) -> tuple[int, int]:
        """The output tile a cuBLAS-like heuristic picks: of 128x256, 256x128 and 128x128
        (in that order), the one with the smallest modeled time on ``sms`` SMs; a later
        candidate must be faster by more than TILE_TIE so that rounding does not decide.
        Large GEMMs get 128x256; 128x128 wins when the big tile leaves SMs idle."""
        best, best_t = TILE_CANDIDATES[0], self.tiled_gemm_ps(m, n, k, sms, *TILE_CANDIDATES[0])
        for tile in TILE_CANDIDATES[1:]:
            t = self.tiled_gemm_ps(m, n, k, sms, *tile)
            if t < best_t * (1 - TILE_TIE):
                best, best_t = tile, t
        return best

    def gemm_time_ps(self, m: int, n: int, k: int, sms: int) -> int:
        """C[m,n] = A[m,k] @ B[k,n] (bf16) on ``sms`` SMs."""
        return self.tiled_gemm_ps(m, n, k, sms, *self.tile_shape(m, n, k, sms))

    # ---- memory-bound kernels -----------------------------------------------------
    def _hbm_bytes_per_ps(self, sms: int, total_sms: int) -> float:
        _positive(sms=sms, total_sms=total_sms)
        full = self.hbm_efficiency * self.hbm_bandwidth_GBps / PS_PER_NS
        return full * min(1.0, sms / (total_sms * self.mem_saturation_fraction))

    def hbm_bytes_per_ps(self, sms: int, total_sms: int) -> float:
        """The HBM bandwidth (bytes per ps) a streaming kernel on ``sms`` of
        ``total_sms`` SMs reaches with the HBM to itself."""
        return self._hbm_bytes_per_ps(sms, total_sms)

    def memory_time_ps(self, bytes_moved: int, sms: int, total_sms: int) -> int:
        """A streaming kernel moving ``bytes_moved`` (reads + writes) on ``sms`` of
        ``total_sms`` SMs.  Bandwidth is the calibrated effective HBM bandwidth when at
        least ``mem_saturation_fraction`` of the SMs take part and falls linearly below
        (an assumption: the data have no SM sweep)."""
        if bytes_moved < 0:
            raise ValueError(f"bytes_moved must be >= 0, got {bytes_moved}")
        return round(self.mem_overhead_ns * PS_PER_NS + bytes_moved / self._hbm_bytes_per_ps(sms, total_sms))

    def elementwise_time_ps(self, op: str, m: int, n: int, sms: int, total_sms: int) -> int:
        """A memory-bound op on a bf16 [m, n] tensor: layernorm, rmsnorm, gelu, add, dropout."""
        if op not in self.elementwise_bytes:
            raise ValueError(f"unknown elementwise op '{op}'; valid: {', '.join(self.elementwise_bytes)}")
        _positive(m=m, n=n)
        traffic = m * n * self.elementwise_bytes[op] * self.elementwise_traffic[op]
        return self.memory_time_ps(round(traffic), sms, total_sms)

    # ---- attention ----------------------------------------------------------------
    def attention_time_ps(self, heads: int, kv_heads: int, head_dim: int, batch: int, seq: int,
                          passes: str, sms: int, total_sms: int, causal: bool = True,
                          v_dim: int | None = None) -> int:
        """FlashAttention-style prefill/training attention of one GPU's heads (GQA: ``kv_heads``
        K/V heads).  Compute scales with ``sms`` SMs; HBM traffic is a floor. ``v_dim``: the
        value (and output) width where it differs from the score width ``head_dim`` (MLA's
        prefill form: 192 and 128); the score product costs ``head_dim``, the value product
        ``v_dim`` per key."""
        if passes not in ATTENTION_PASSES:
            raise ValueError(f"unknown attention passes '{passes}'; valid: {', '.join(ATTENTION_PASSES)}")
        vd = head_dim if v_dim is None else v_dim
        _positive(heads=heads, kv_heads=kv_heads, head_dim=head_dim, batch=batch, seq=seq, v_dim=vd)
        flops = 2 * batch * heads * seq * seq * (head_dim + vd) * (0.5 if causal else 1.0)
        flop_per_ps = self.peak_tflops * sms / self.sms
        bw = self._hbm_bytes_per_ps(sms, total_sms)
        t = 0.0
        if passes in ("fwd", "fwd+bwd"):  # read Q K V, write O
            t += self.attn_overhead_fwd_ns * PS_PER_NS + max(
                flops / (self.attn_efficiency_fwd * flop_per_ps),
                self.attention_hbm_bytes(heads, kv_heads, head_dim, batch, seq, "fwd", v_dim) / bw)
        if passes in ("bwd", "fwd+bwd"):  # read Q K V O dO, write dQ dK dV
            t += self.attn_overhead_bwd_ns * PS_PER_NS + max(
                BWD_FLOP_RATIO * flops / (self.attn_efficiency_bwd * flop_per_ps),
                self.attention_hbm_bytes(heads, kv_heads, head_dim, batch, seq, "bwd", v_dim) / bw)
        return round(t)

    @staticmethod
    def _qkvo(heads: int, kv_heads: int, head_dim: int, batch: int, seq: int,
              v_dim: int) -> tuple[int, int, int, int]:
        """Bytes of Q, K (score width ``head_dim``), V and O (``v_dim``)."""
        rows = BF16 * batch * seq
        return rows * heads * head_dim, rows * kv_heads * head_dim, rows * kv_heads * v_dim, rows * heads * v_dim

    def attention_hbm_bytes(self, heads: int, kv_heads: int, head_dim: int, batch: int, seq: int,
                            passes: str, v_dim: int | None = None) -> int:
        """HBM bytes of the attention passes: fwd reads Q K V and writes O; bwd reads
        Q K V O dO and writes dQ dK dV (the floor :meth:`attention_time_ps` uses);
        ``v_dim``: V's and O's width where not ``head_dim``."""
        q, k, v, o = self._qkvo(heads, kv_heads, head_dim, batch, seq, head_dim if v_dim is None else v_dim)
        return (q + k + v + o if passes in ("fwd", "fwd+bwd") else 0) + \
            (2 * (q + k + v + o) if passes in ("bwd", "fwd+bwd") else 0)

    @staticmethod
    def mla_decode_bytes(heads: int, latent: int, kv_lora: int, batch: int, kv_len: int) -> int:
        """HBM bytes of one decode step's absorbed MLA attention (MQA over the latent
        cache, as FlashMLA runs it): each sequence's ``kv_len`` x ``latent`` cache (the
        KV latent and the shared RoPE key) read once for all ``heads``, the absorbed
        query (``heads`` x ``latent``) read and the output (``heads`` x ``kv_lora``) written."""
        return BF16 * batch * (kv_len * latent + heads * latent + heads * kv_lora)

    @staticmethod
    def mla_decode_flops(heads: int, latent: int, kv_lora: int, batch: int, kv_len: int) -> int:
        """FLOPs of one decode step's absorbed MLA attention: per sequence and head, the
        scores over ``kv_len`` keys of width ``latent`` and the values of width ``kv_lora``."""
        return 2 * batch * heads * kv_len * (latent + kv_lora)

    @staticmethod
    def attention_decode_bytes(heads: int, kv_heads: int, head_dim: int, batch: int, kv_len: int) -> int:
        """HBM bytes of one decode step's attention: the K/V cache read, Q read, O written."""
        return 2 * BF16 * batch * kv_len * kv_heads * head_dim + 2 * BF16 * batch * heads * head_dim

    def attention_decode_time_ps(self, heads: int, kv_heads: int, head_dim: int, batch: int,
                                 kv_len: int, sms: int, total_sms: int) -> int:
        """One decode step's attention: reading the K/V cache (plus Q, O) from HBM.  Not
        measured; modeled as memory-bound with the calibrated HBM bandwidth."""
        _positive(heads=heads, kv_heads=kv_heads, head_dim=head_dim, batch=batch, kv_len=kv_len)
        return self.memory_time_ps(self.attention_decode_bytes(heads, kv_heads, head_dim, batch, kv_len), sms,
                                   total_sms)
