"""The in-switch EP ladder at the kernel level: one MoE layer's dispatch, expert GEMM
and combine, run on a simulated system with each rung's kernels, on the same routing
(docs/moe.md, "In-switch expert parallelism").

* Software baselines (DeepEP's normal and low-latency kernels, part 1): the dispatch
  and the combine each simulated as ``cais ep`` runs them, with their default
  configuration, and between them the experts' grouped GEMM (DeepGEMM's FP8 kernel,
  kernels/grouped_gemm.py) on every SM of the busiest rank: one after the other, as a
  stack runs them without overlap.
* The in-switch family (kernels/ep_switch.py): ``layer_kernels`` runs the three in one
  kernel per GPU (fused per block of tokens, or unfused), simulated end to end.

Each row also reports the dynamic multicast table's peak entries per port and its
overflows, and the merge unit's peak lines (the combine's reductions)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from cais.config import PS_PER_US, SystemConfig
from cais.engine.sim import fewer_collections
from cais.errors import UserError
from cais.hw.compute import ComputeModel
from cais.kernels import ep_switch
from cais.kernels.ep_common import EpCall, EpConstants, ep_constants
from cais.kernels.grouped_gemm import grouped_gemm_ps, groups_of
from cais.machine import Machine
from cais.experiments.ep import on_switch, run_ep
from cais.workload.routing import Routing, generate

#: the rungs, software first
LADDER = ("deepep", "deepep-ll", "ep-switch-sw", "ep-switch-mcast", "ep-switch-red", "ep-switch-unfused", "ep-switch")
BASELINES = ("deepep", "deepep-ll")


@dataclass(frozen=True)
class MoeBlock:
    """One MoE layer's EP shape: ``tokens`` per rank of ``hidden`` elements, top-``topk``
    of ``experts`` experts of FFN width ``ffn``; FP8 dispatch and GEMMs, BF16 combine."""

    tokens: int
    hidden: int = 7168
    topk: int = 8
    experts: int = 256
    ffn: int = 2048


@dataclass(frozen=True)
class RungResult:
    """One rung on one routing: its time (and, for the baselines, its phases), the
    group table's peak entries per port and overflows, the merge unit's peak lines, and
    the reductions it merged and evicted (all chips)."""

    kernel: str
    routing: str
    tokens: int
    time_us: float
    dispatch_us: float | None
    gemm_us: float | None
    combine_us: float | None
    group_peak: int
    overflows: int
    merge_peak_lines: int
    wall_s: float
    merged: int = 0
    evicted: int = 0


def routing_of(kind: str, ranks: int, b: MoeBlock, seed: int = 0, alpha: float = 1.2, sigma: float = 1.0) -> Routing:
    return generate(kind, ranks, b.tokens, b.experts, b.topk, seed, alpha, sigma)


def gemm_ps(cfg: SystemConfig, rt: Routing, b: MoeBlock, layout: str = "contiguous") -> int:
    """The busiest rank's grouped GEMMs (gate/up, down; FP8) on all its SMs."""
    cm = ComputeModel.load(cfg.gpu.compute_model, cfg.gpu.hbm_bandwidth_GBps)
    per = rt.per_rank
    idx = rt.topk_idx.reshape(-1)
    idx = idx[idx >= 0]
    worst = 0
    for g in range(rt.ranks):
        counts = np.bincount(idx[idx // per == g] - g * per, minlength=per)
        if counts.sum():
            t = (grouped_gemm_ps(cm, groups_of(counts.tolist(), 2 * b.ffn, b.hidden, "fp8", layout), cfg.gpu.sms)
                 + grouped_gemm_ps(cm, groups_of(counts.tolist(), b.hidden, b.ffn, "fp8", layout), cfg.gpu.sms))
            worst = max(worst, t)
    return worst


def run_rung(cfg: SystemConfig, kernel: str, b: MoeBlock, routing: str = "uniform", seed: int = 0,
             alpha: float = 1.2, sigma: float = 1.0, constants: EpConstants | None = None,
             **knobs: Any) -> RungResult:
    """One rung of :data:`LADDER` on ``cfg`` (module doc); ``knobs`` set an in-switch
    kernel's fields (:class:`~cais.kernels.ep_switch.EpSwitchKernel`: ``table_bytes``,
    ``lookup_ns``, ``block_tokens``, ``red_window_bytes``, ...); ``constants``: the EP
    constants (default: the fitted ones)."""
    if kernel not in LADDER:
        raise UserError(f"kernel: unknown '{kernel}'; valid: {', '.join(LADDER)}")
    t0 = time.perf_counter()
    rt = routing_of(routing, cfg.gpus, b, seed, alpha, sigma)
    if kernel in BASELINES:
        kw = dict(routing=routing, seed=seed, alpha=alpha, sigma=sigma, constants=constants)
        d = run_ep(cfg, kernel, "dispatch", b.tokens, b.hidden, b.topk, b.experts, "fp8", **kw)  # type: ignore[arg-type]
        c = run_ep(cfg, kernel, "combine", b.tokens, b.hidden, b.topk, b.experts, "bf16", **kw)  # type: ignore[arg-type]
        g = gemm_ps(cfg, rt, b, "masked" if kernel == "deepep-ll" else "contiguous") / PS_PER_US
        return RungResult(kernel, routing, b.tokens, d.time_us + g + c.time_us, d.time_us, g, c.time_us, 0, 0, 0,
                          time.perf_counter() - t0)
    k = ep_switch.VARIANTS[kernel].with_(**knobs)
    cfg = on_switch(cfg, k)
    call = EpCall("dispatch", rt, b.hidden, "fp8", None, False, constants or ep_constants())
    with fewer_collections():
        m = Machine(cfg)
        ks = k.layer_kernels(m, call, ep_switch.ExpertFfn(b.ffn, "fp8"))
        for gpu, kern in zip(m.gpus, ks):
            gpu.launch(kern, m.launch_ps)
        m.run()
    end = max(kern.finished_at or 0 for kern in ks)
    peak = over = lines = merged = evicted = 0
    for sw in m.fabric.switches:
        for table in getattr(sw, "tables", ()):
            peak = max(peak, table.stats.peak)
            over += table.stats.overflows
        for u in getattr(sw, "units", ()):
            lines = max(lines, u.stats.peak_lines)
            merged += u.stats.merged
            evicted += u.stats.evicted
    return RungResult(kernel, routing, b.tokens, end / PS_PER_US, None, None, None, peak, over, lines,
                      time.perf_counter() - t0, merged, evicted)
