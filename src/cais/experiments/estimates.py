"""How many discrete events a collective, a GEMM or a layer period will take,
computed from its sizes before anything is built (``cais.limits`` holds the limits and
each unit of work's cost in events): each kernel module says how many thread blocks it
makes of a size (``attention.attention_tbs``, ``local.row_tbs``, ``gemm.nominal_tiles``)
and the staged NVLS AllReduce how many steps (``nvls_staged.staged_steps``); the
packet trains are the bytes moved in the system's transfer unit."""

from __future__ import annotations

from typing import Any

import numpy as np

from cais.config import SystemConfig
from cais.kernels import mla
from cais.kernels.attention import attention_tbs
from cais.kernels.gemm import nominal_tiles
from cais.kernels.local import row_tbs
from cais.kernels.nvls_staged import staged_steps
from cais.kernels.algorithms import algorithm
from cais.kernels.collectives import ALGOS  # noqa: F401 - registers NCCL's and the production algorithms
from cais.kernels.ep_common import EpCall, ep_constants
from cais.limits import EVENTS_PER_TB, EVENTS_PER_TRAIN, trains
from cais.workload.graph import Chain, Gather, Local, MoeStep, Period, Reduce

# A staged NVLS AllReduce's step on one TB beyond its data (kernels/nvls_staged.py):
# two polls, the fence's probes and the counter stores, each fanned out over the GPUs;
# measured 644 on dgx-h100 (8 GPUs, 4 chips) at 16 MiB.
EVENTS_PER_STAGED_STEP = 700
# A layer period's events over the count of its TBs and trains (period_events): at
# most about 3.1 for the bulk-synchronous and overlap baselines, 11-20.5 for the CAIS
# schemes, whose GEMMs load their operands tile by tile through the switch.
LAYER_FACTOR = 4
LAYER_FACTOR_CAIS = 21
# An EP exchange (moe_period_events): each packet train of its stores costs about 3
# events (arbitration and arrival at each channel it crosses, the write responses of a
# fenced store counted as trains), each store about 6 more (its copy loop's steps in
# the interpreter: the window, the issue, the landing and its counters). Least squares
# on the relative error over 30 dispatches and combines of nccl, deepep and deepep-ll
# on dgx-h100 (EP 2 and 8, 16 to 1,024 tokens per rank) gave 3.06 and 5.6: rounded,
# 0.79-1.15 of the real counts; held out (gh200-nvl32 EP 32, nvl72 EP 72, hgx-h800
# EP 8; 30 runs) 0.49-1.15, DeepEP normal at 16 tokens per rank on the racks the
# lowest (docs/errors.md, "Size limits").
EVENTS_PER_EP_TRAIN = 3
EVENTS_PER_EP_STORE = 6
# A MoE period's other kernels (attention, GEMM tiles, row blocks, the grouped GEMMs'
# persistent TBs, the route and permute copies) cost about a quarter of the dense
# estimate's 4 events per TB (they are bulk-synchronous kernels, one phase per TB):
# fitted (least squares on the log of estimate over real) on 72 MoE layer runs on
# dgx-h100, 0.72-4.73 of the real counts there, 0.61-2.12 held out on gh200-nvl32 and
# nvl72 (docs/errors.md).
MOE_LAYER_FACTOR = 0.27


def collective_events(cfg: SystemConfig, op: str, algo: str, nbytes: int) -> float:
    """Estimated events of one collective of ``nbytes`` (nccl-tests size) on ``cfg``:
    every GPU sends its bus bytes (nccl-tests' busbw factor) in the transfer unit the
    kernels pick, plus a few events per TB."""
    n, a = cfg.gpus, algorithm(algo)
    channels = a.channels(cfg)
    stream = nbytes / n / channels if a.step_bytes is None else min(a.step_bytes(cfg), nbytes / n / channels)
    unit = cfg.unit_for(max(1, int(stream)))
    factor = 2 * (n - 1) / n if op == "allreduce" else (n - 1) / n
    events = n * (a.events_per_train * trains(cfg, nbytes * factor, unit) + EVENTS_PER_TB * channels)
    if algo == "nvls" and op == "allreduce" and cfg.collective.nvls_buffers == "staged":
        events += _staged_steps(cfg, nbytes, channels)
    return events


def _staged_steps(cfg: SystemConfig, nbytes: int, channels: int) -> float:
    """Events of a staged NVLS AllReduce's steps beyond its data (every GPU, channel
    and step)."""
    n = cfg.gpus
    steps = staged_steps(nbytes, channels, n, cfg.collective.nvls_chunk_bytes)
    return n * channels * steps * EVENTS_PER_STAGED_STEP * cfg.switch.chips / 4


def gemm_events(tiles: int) -> float:
    """Estimated events of a GEMM of ``tiles`` output tiles (one TB each)."""
    return EVENTS_PER_TB * tiles


def period_events(cfg: SystemConfig, period: Period, dtype_bytes: int,
                  switch: str = "nvls") -> float:
    """Estimated events of one layer period on ``cfg``: on every GPU, a few events per
    TB of its kernels (128 x 128 GEMM tiles, attention blocks, 64-row blocks) and the
    packet trains of the activation each sub-layer reduces and gathers, cut in the
    system's transfer unit; times the measured factor of the scheme family
    (``switch``: the switch model the scheme needs, ``cais`` for the CAIS schemes)."""
    d = period.dims
    tbs = 0
    moved = 0.0
    act = d.tokens * d.hidden * dtype_bytes
    for seg in period.segments:
        if isinstance(seg, Chain):
            tbs += (nominal_tiles(seg.gemm1.m, seg.gemm1.n) + nominal_tiles(seg.gemm2.m, seg.gemm2.n)
                    + row_tbs(seg.rowop.rows))
            moved += 2 * act
        elif isinstance(seg, Gather):
            moved += act
        elif isinstance(seg, Local) and seg.gemm is not None:
            tbs += nominal_tiles(seg.gemm.m, seg.gemm.n)
        elif isinstance(seg, Local) and seg.kind.startswith("attention"):
            tbs += attention_tbs(d)
        elif isinstance(seg, Reduce):
            moved += act
        elif isinstance(seg, MoeStep) and period.routing is not None:
            rows = period.routing.tokens * period.routing.topk  # the (token, expert) rows of one GPU
            if seg.kind == "exchange":
                moved += rows * d.hidden * dtype_bytes
            elif seg.kind == "grouped_gemm":
                tbs += nominal_tiles(seg.m or rows, seg.n)
            else:
                tbs += row_tbs(rows)
        else:
            tbs += row_tbs(d.tokens)
    unit = min(cfg.transfer_unit_bytes, cfg.collective_unit_bytes)
    factor = LAYER_FACTOR_CAIS if switch == "cais" else LAYER_FACTOR
    events = factor * cfg.gpus * (EVENTS_PER_TB * tbs + EVENTS_PER_TRAIN * trains(cfg, moved, unit))
    if switch != "cais" and cfg.collective.layer_choice == "nccl" and cfg.collective.nvls_buffers == "staged":
        # NCCL's own NVLS AllReduce on its own buffers: the steps' polls and fences, as standalone
        chains = sum(isinstance(seg, Chain) for seg in period.segments)
        events += chains * _staged_steps(cfg, int(act), cfg.collective.nvls_channels)
    return events


def exchange_events(cfg: SystemConfig, module: Any, call: EpCall) -> float:
    """Estimated events of one EP dispatch or combine (``call``) of the EP kernel
    ``module`` (cais.kernels.ep_registry) on ``cfg``: an NCCL collective (its
    ``collective``) as :func:`collective_events`; else the stores it lists
    (``messages``: how many, bytes, unit, fenced), each cut into packet trains (a
    fenced store's write responses, one per chip it crossed, counted as trains too);
    a kernel that lists none, one store per remote (token, expert) row."""
    coll = getattr(module, "collective", None)
    if coll is not None:
        op, choice, nbytes = coll(cfg, call)
        return collective_events(cfg, op, choice.algo, nbytes)
    lister = getattr(module, "messages", None)
    if lister is not None:
        stores = lister(cfg, call)
    else:
        mat = call.routing.matrix("expert")
        stores = [(int(mat.sum() - np.trace(mat)), call.row_bytes, cfg.unit_for(call.row_bytes), False)]
    events = 0.0
    for count, nbytes, unit, fenced in stores:
        t = trains(cfg, nbytes, unit)
        events += count * (EVENTS_PER_EP_TRAIN * (t + (min(cfg.switch.chips, t) if fenced else 0))
                           + EVENTS_PER_EP_STORE)
    return events


def moe_period_events(cfg: SystemConfig, period: Period, dtype_bytes: int, module: Any) -> float:
    """Estimated events of one MoE layer period (``period.routing`` set) whose
    exchanges run EP kernel ``module``: every GPU's TBs of its other kernels, as
    :func:`period_events` counts them but the grouped GEMMs (one persistent TB per SM),
    the row-wise expert steps (their routed rows) and the exchanges, each estimated as
    the kernel runs it (:func:`exchange_events`; the forward dispatch with the host's
    wait for the counts), the collectives of attention under TP in trains."""
    rt = period.routing
    assert rt is not None
    d = period.dims
    sms = cfg.gpu.sms
    tbs = 0
    moved = 0.0
    exchanges = 0.0
    act = d.tokens * d.hidden * dtype_bytes
    rows = int((rt.topk_idx >= 0).sum(axis=(1, 2)).max())  # the busiest GPU's (token, expert) rows
    for seg in period.segments:
        if isinstance(seg, MoeStep):
            if seg.kind == "exchange":
                call = EpCall(seg.kernel, rt, d.hidden, "bf16", None, seg.name == "dispatch", ep_constants())
                exchanges += exchange_events(cfg, module, call)
            elif seg.kind == "grouped_gemm":
                tbs += sms
            elif seg.kind == "expert_act":
                tbs += row_tbs(seg.m or rows)
            elif seg.kind == "expert_tp":  # a ring over the expert-TP group: the rows it gathers or reduces
                moved += period.expert_tp * rows * d.hidden * dtype_bytes
            else:  # route, permute: a copy on at most every SM
                tbs += sms
        elif isinstance(seg, Chain):
            tbs += (nominal_tiles(seg.gemm1.m, seg.gemm1.n) + nominal_tiles(seg.gemm2.m, seg.gemm2.n)
                    + row_tbs(seg.rowop.rows))
            moved += 2 * act
        elif isinstance(seg, (Gather, Reduce)):
            moved += act
        elif isinstance(seg, Local) and seg.gemm is not None:
            tbs += nominal_tiles(seg.gemm.m, seg.gemm.n)
        elif isinstance(seg, Local) and seg.kind.startswith("attention"):
            tbs += attention_tbs(d)
        elif isinstance(seg, Local) and seg.kind in mla.KINDS and period.mla is not None:
            tbs += mla.mla_attention_tbs(d, period.mla)
        else:
            tbs += row_tbs(d.tokens)
    unit = min(cfg.transfer_unit_bytes, cfg.collective_unit_bytes)
    return (MOE_LAYER_FACTOR * cfg.gpus * (EVENTS_PER_TB * tbs + EVENTS_PER_TRAIN * trains(cfg, moved, unit))
            + exchanges)
