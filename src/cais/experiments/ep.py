"""Run one expert-parallel (EP) dispatch or combine on a simulated system and report it
as DeepEP's tests would (``cais ep``), and check in functional mode that a tiny MoE
layer run through it equals the unsharded layer.

Bytes counted (``algbw_GBps``), as DeepEP's tests count them on rank 0
(deepseek-ai/DeepEP@dd758caf, tests/legacy/):

* ``deepep``, ``nccl``, ``allgather`` (``test_intranode.py``): the rows rank 0
  receives at dispatch (combine: sends), one per (token, rank) it holds experts of,
  times the row's bytes (FP8: ``hidden * (1 + 4/128)``; BF16: ``2 * hidden``), over
  the time. The same count for every kernel, so that their algbw compare; a kernel
  that moves more (NCCL: a row per expert; all-gather: every row) shows a lower one.
  ``own_bytes`` is what the kernel itself moves from rank 0.
* ``deepep-ll`` (``test_low_latency.py``): rank 0's valid (token, expert) selections
  times the message's bytes (FP8: ``hidden + hidden/128 * 4 + 16``; BF16:
  ``2 * hidden``).

Capacity ``pad`` (``nccl``, ``allgather``; cais.kernels.ep_registry ``CAPACITY_PAD``):
padding rows are not counted in ``algbw_GBps`` (they carry no token: the count stays
the real rows', so padding shows as a lower algbw); ``own_bytes`` includes the ones
the kernel sends, and ``pad_bytes`` is what every GPU sent of them (0 for
``allgather``, whose padding is made after the exchange).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from cais.config import PS_PER_US, SystemConfig
from cais.engine.sim import fewer_collections
from cais.errors import UserError
from cais.limits import EVENTS_PER_TRAIN, check_events
from cais.kernels import ep_deepep, ep_deepep_ll, ep_nccl, ep_switch
from cais.kernels.collectives import CollectiveSpec, build
from cais.kernels.ep_common import EP_DTYPES, EP_OPS, EpCall, EpConstants, ep_constants
from cais.kernels.ep_registry import EP_KERNELS, EpKernels, capacity_pad, check_capacity, expert_tp_form, on_switch
from cais.machine import Machine
from cais.workload.moe import MoeSpec
from cais.workload.numerics import swiglu
from cais.workload.reference import _grid
from cais.workload.routing import GENERATORS, Routing, generate, imbalance

__all__ = ["EP_KERNELS", "EpResult", "check_args", "check_ep_size", "expert_block_check", "functional_check", "on_switch", "run_ep",
           "run_ep_tuned"]


@dataclass(frozen=True)
class EpResult:
    """One EP call's time, its bandwidth as DeepEP's tests count it, what the kernel
    itself moved, the routing's per-rank matrix and imbalance, its padding rows
    (capacity ``pad``: ``padded`` over every rank, ``pad_bytes`` the kernel sent of them
    between GPUs), and (functional) whether the data arrived right."""

    kernel: str
    op: str
    gpus: int
    tokens: int
    hidden: int
    topk: int
    experts: int
    dtype: str
    time_us: float
    algbw_GBps: float
    bytes_counted: int
    counted_as: str
    own_bytes: int
    send_matrix: list[list[int]]
    imbalance: float
    dropped: int
    events: int
    wall_s: float
    correct: bool | None = None
    padded: int = 0
    pad_bytes: int = 0

    def as_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def check_args(kernel: str, op: str, dtype: str) -> EpKernels:
    """The kernel module; a one-line UserError naming a bad field and its allowed values."""
    if kernel not in EP_KERNELS:
        raise UserError(f"kernel: unknown '{kernel}'; valid: {', '.join(EP_KERNELS)}")
    if op not in EP_OPS:
        raise UserError(f"op: unknown '{op}'; valid: {', '.join(EP_OPS)}")
    if dtype not in EP_DTYPES:
        raise UserError(f"dtype: unknown '{dtype}'; valid: {', '.join(EP_DTYPES)}")
    return EP_KERNELS[kernel]


def _counted(kernel: str, call: EpCall) -> tuple[int, str]:
    rt, h = call.routing, call.hidden
    if kernel == "deepep-ll":
        sel = int((rt.topk_idx[0] >= 0).sum())
        per = (h + h // 128 * 4 + 16) if call.fp8 else 2 * h
        return sel * per, "DeepEP test_low_latency.py: rank 0's (token, expert) selections x message bytes"
    rows = int(rt.in_rank()[:, :, 0].sum()) if call.op == "dispatch" else int(rt.in_rank()[0].sum())
    per_row: float = h * (1 + 4 / 128) if call.fp8 else 2 * h
    return int(rows * per_row), "DeepEP test_intranode.py: rank 0's rows, one per (token, rank), x row bytes"


def own_bytes(kernel: str, call: EpCall) -> int:
    """Payload bytes rank 0 sends to other ranks in ``call`` (FP8: its elements plus
    their scales, ``EpCall.row_bytes``): the kernel's own count where it has one
    (``own_bytes``), every token to every peer for ``allgather``, else a row per
    (token, rank) for ``deepep`` and per (token, expert) for the others (capacity
    ``pad``: the padding rows included, ``Routing.matrix``)."""
    rt = call.routing
    own = getattr(EP_KERNELS[kernel], "own_bytes", None)
    if own is not None:
        return int(own(call))
    if kernel == "allgather":
        return (rt.ranks - 1) * rt.tokens * call.hidden * call.elem_bytes
    per = "rank" if kernel == "deepep" else "expert"
    mat = rt.matrix(per)
    rows = int(mat[0].sum() - mat[0, 0]) if call.op == "dispatch" else int(mat[:, 0].sum() - mat[0, 0])
    return rows * call.row_bytes


def check_ep_size(cfg: SystemConfig, tokens: int, topk: int) -> None:
    """A one-line TooBig (a UserError) naming ``tokens`` for a call whose (token, expert)
    rows alone exceed the event limit: at least one packet train per selection of every
    rank. Checked before the routing is drawn."""
    check_events(EVENTS_PER_TRAIN * cfg.gpus * tokens * topk,
                 f"tokens: {tokens} per rank x topk {topk} on {cfg.gpus} GPUs", "use fewer tokens per rank")


def run_ep(cfg: SystemConfig, kernel: str, op: str, tokens: int, hidden: int, topk: int, experts: int,
           dtype: str = "bf16", sms: int | None = None, routing: str = "uniform", seed: int = 0,
           alpha: float = 1.0, sigma: float = 1.0, trace: str | None = None, capacity_factor: float | None = None,
           capacity: str = "none", n_group: int = 1, topk_group: int = 1, host_sync: bool = False,
           constants: EpConstants | None = None, functional: bool = False, chunk: int | None = None,
           drawn: Routing | None = None) -> EpResult:
    """Simulate one EP ``op`` with ``kernel`` on ``cfg``'s GPUs (module doc). ``drawn``:
    the routing these arguments draw, drawn already by the caller (a dispatch and its
    combine share one), used as given."""
    mod = check_args(kernel, op, dtype)
    cfg = on_switch(cfg, mod)
    check_ep_size(cfg, tokens, topk)
    if routing not in GENERATORS:
        raise UserError(f"routing: unknown '{routing}'; valid: {', '.join(GENERATORS)}")
    check_capacity(mod, capacity, kernel)
    rows = tokens * topk  # the (token, expert) rows a rank holds at most, padding included
    if capacity == "pad" and capacity_factor is not None and capacity_factor > 0:
        rows = max(rows, experts * padded_capacity(capacity_factor, tokens, topk, experts))
        if capacity_pad(mod) == "exchanged":
            check_events(EVENTS_PER_TRAIN * cfg.gpus * rows, f"capacity_factor: {capacity_factor} pads every rank "
                         f"to {rows:,} rows", "use a smaller capacity_factor or fewer tokens per rank")
    if functional:
        _check_functional_size(cfg.gpus, tokens, hidden, rows, experts)
    rt = drawn if drawn is not None else generate(routing, cfg.gpus, tokens, experts, topk, seed, alpha, sigma,
                                                  n_group, topk_group, trace, capacity_factor, capacity)
    call = EpCall(op, rt, hidden, dtype, sms, host_sync, constants or ep_constants(), chunk)
    t0 = time.perf_counter()
    correct = None
    if functional:
        rt = _exact_weights(rt, seed)
        call = EpCall(op, rt, hidden, dtype, sms, host_sync, call.constants, chunk)
        correct = bool(functional_check(cfg, kernel, call))
    with fewer_collections():
        m = Machine(cfg)
        ks = mod.kernels(m, call)
        for gpu, k in zip(m.gpus, ks):
            gpu.launch(k, m.launch_ps)
        m.run()
    end = max(k.finished_at or 0 for k in ks)
    nbytes, how = _counted(kernel, call)
    mat = rt.matrix(getattr(mod, "per", None) or ("rank" if kernel in ("deepep", "allgather") else "expert"))
    t_us = end / PS_PER_US
    return EpResult(kernel, op, cfg.gpus, tokens, hidden, topk, experts, dtype, t_us,
                    nbytes / (end / 1e12) / 1e9, nbytes, how, own_bytes(kernel, call), mat.tolist(),
                    imbalance(mat), rt.dropped(), m.sim.events, time.perf_counter() - t0, correct,
                    int(rt.pad_rows.sum()) if rt.pad_rows.size else 0, pad_bytes(mod, call))


def pad_bytes(mod: EpKernels, call: EpCall) -> int:
    """Bytes of capacity padding rows ``call``'s kernel sends from one GPU to another, over
    every GPU: the routing's padding rows to other ranks' experts when its stack pads
    before the exchange (``CAPACITY_PAD`` ``exchanged``), else 0."""
    rt = call.routing
    if not rt.pad_rows.size or capacity_pad(mod) != "exchanged":
        return 0
    owners = np.arange(rt.experts) // rt.per_rank
    remote = owners[None, :] != np.arange(rt.ranks)[:, None]
    return int(rt.pad_rows[remote].sum()) * call.row_bytes


def padded_capacity(capacity_factor: float, tokens: int, topk: int, experts: int) -> int:
    """The rows capacity ``pad`` fills each (rank, expert) to: ``ceil(cf x tokens x
    top-k / experts)``, as cais.workload.routing.generate draws it."""
    return math.ceil(capacity_factor * tokens * topk / experts)


def _check_functional_size(ranks: int, tokens: int, hidden: int, rows: int, experts: int) -> None:
    """A one-line UserError for a functional run too large to hold in numpy: its experts'
    matrices (``experts x hidden x hidden``) or its rows (``ranks x rows x hidden``,
    ``rows`` a rank's (token, expert) rows, padding included: what the layouts hold at
    most) past :data:`FUNCTIONAL_EXPERT_ELEMS`."""
    weights, elems = experts * hidden * hidden, ranks * max(1, rows) * hidden
    if weights > FUNCTIONAL_EXPERT_ELEMS:
        raise UserError(f"hidden: functional mode's {experts} experts of {hidden} x {hidden} hold {weights:,} "
                        f"values, over {FUNCTIONAL_EXPERT_ELEMS:,}; use a smaller hidden or fewer experts")
    if elems > FUNCTIONAL_EXPERT_ELEMS:
        raise UserError(f"tokens: functional mode's rows ({ranks} ranks x {tokens} tokens, {rows} (token, expert) "
                        f"rows each with padding, x hidden {hidden}) hold {elems:,} values, over "
                        f"{FUNCTIONAL_EXPERT_ELEMS:,}; use fewer tokens")


def run_ep_tuned(cfg: SystemConfig, kernel: str, op: str, tokens: int, hidden: int, topk: int, experts: int,
                 dtype: str = "bf16", sms: int | None = None, **kwargs: Any) -> EpResult:
    """:func:`run_ep` as DeepEP's tests report it: for ``deepep``, the best over the NVL
    chunk sizes tests/legacy/test_intranode.py tunes (4..32 by 2); other kernels as run."""
    if kernel != "deepep":
        return run_ep(cfg, kernel, op, tokens, hidden, topk, experts, dtype, sms, **kwargs)
    runs = [run_ep(cfg, kernel, op, tokens, hidden, topk, experts, dtype, sms, chunk=c, **kwargs)
            for c in ep_deepep.TUNED_CHUNKS]
    return min(runs, key=lambda r: r.time_us)


def _exact_weights(rt: Routing, seed: int) -> Routing:
    """The routing with gate weights that are multiples of 1/4 (sums exact in float64)."""
    rng = np.random.default_rng(seed + 1)
    w = rng.integers(1, 5, size=rt.weights.shape) / 4.0
    w = np.where(rt.topk_idx >= 0, w, 0.0)
    return Routing(rt.topk_idx, w, rt.experts, rt.pad_rows, rt.source)


# ---------------------------------------------------------------------------------------
# Functional mode: a tiny MoE layer through the kernel equals the unsharded layer

def _run(cfg: SystemConfig, mod: EpKernels, call: EpCall, fill: dict[str, list[np.ndarray]]) -> Machine:
    m = Machine(cfg, functional=True)
    ks = mod.kernels(m, call)
    for name, per_gpu in fill.items():
        for g, data in enumerate(per_gpu):
            m.gpus[g].memory.buffers[name][:data.size] = data.reshape(-1)
    for gpu, k in zip(m.gpus, ks):
        gpu.launch(k, m.launch_ps)
    m.run()
    return m


def functional_check(cfg: SystemConfig, kernel: str, call: EpCall, seed: int = 0, x: np.ndarray | None = None,
                     expert: Callable[[int, np.ndarray], np.ndarray] | None = None,
                     reference: np.ndarray | None = None, expert_tp: int = 1,
                     partial: Callable[[int, int, np.ndarray], np.ndarray] | None = None) -> bool:
    """Dispatch ``x`` ([ranks, tokens, hidden]; default integer-valued) with ``kernel``,
    apply each rank's experts (``expert(e, row)``; default ``row @ A_e``, integer-valued,
    so every sum is exact) to what arrived, combine, and compare every rank's output
    with ``reference`` (default: the layer's ``sum_k w_k expert(e_k, x)`` over the
    call's routing); also that every (token, rank) or (token, expert) row arrived once
    (conservation). With ``expert_tp`` > 1 under ``nccl`` (the routing over expert-TP
    slots, cais.workload.routing ``group`` form), the rows arrived at each expert-TP
    group go through the group's ring AllGather, each GPU's slot of the experts
    (``partial(slot, e, rows)``) and the ring ReduceScatter (:func:`expert_tp_rows`)."""
    mod = check_args(kernel, call.op, call.dtype)
    cfg = on_switch(cfg, mod)
    rt, n, T, K, h = call.routing, cfg.gpus, call.routing.tokens, call.routing.topk, call.hidden
    rng = np.random.default_rng(seed)
    if x is None:
        x = rng.integers(-4, 5, size=(n, T, h)).astype(np.float64)
    if expert is None:
        A = rng.integers(-2, 3, size=(rt.experts, h, h)).astype(np.float64)

        def expert(e: int, row: np.ndarray) -> np.ndarray:
            return row @ A[e]
    ref = reference
    if ref is None:
        ref = np.zeros((n, T, h))
        for g in range(n):
            for t in range(T):
                for k in range(K):
                    e = rt.topk_idx[g, t, k]
                    if e >= 0:
                        ref[g, t] += rt.weights[g, t, k] * expert(int(e), x[g, t])
    d = EpCall("dispatch", rt, h, call.dtype, call.sms, call.host_sync, call.constants)
    c = EpCall("combine", rt, h, "bf16", call.sms, call.host_sync, call.constants)
    m1 = _run(cfg, mod, d, {"x": list(x)})
    recv = [m1.gpus[r].memory.buffers["recv_x"].reshape(-1, h) for r in range(n)]
    per = rt.per_rank

    def expert_sum(r: int, g: int, t: int, row: np.ndarray) -> np.ndarray:
        out = np.zeros(h)
        for k in range(K):
            e = rt.topk_idx[g, t, k]
            if e >= 0 and e // per == r:
                out += rt.weights[g, t, k] * expert(int(e), row)
        return out

    outs: list[np.ndarray] = []
    ok = True
    if kernel == "nccl":
        ok &= nccl_rows_conserved(d)
    if expert_tp > 1 and rt.pad_rows.size and rt.pad_rows.any():
        raise ValueError("capacity pad with expert TP: functional mode does not run it")
    if expert_tp > 1 and kernel == "nccl":
        assert partial is not None
        layouts = ep_nccl.recv_layout(d)
        for r in range(n):
            ok &= all(np.array_equal(recv[r][i], x[g, t]) for i, (g, t, _) in enumerate(layouts[r]))
        rows = [recv[r][:len(layouts[r])] for r in range(n)]
        experts = [[int(rt.topk_idx[g, t, k]) for g, t, k in layouts[r]] for r in range(n)]
        full = expert_tp_rows(cfg, rows, experts, expert_tp, partial)
        outs = [np.array([rt.weights[g, t, k] * full[r][i] for i, (g, t, k) in enumerate(layouts[r])]).reshape(-1)
                for r in range(n)]
    elif expert_tp > 1:
        raise ValueError(f"expert_tp {expert_tp}: only the nccl kernel runs the expert-TP group's collectives")
    for r in range(n if not outs else 0):
        if kernel == "deepep":
            layout = ep_deepep.recv_layout(d)[r]
            ok &= all(np.array_equal(recv[r][i], x[g, t]) for i, (g, t) in enumerate(layout))
            outs.append(np.array([expert_sum(r, g, t, recv[r][i]) for i, (g, t) in enumerate(layout)]).reshape(-1))
        elif kernel == "nccl":  # a padding row (token T: capacity pad) arrives zero and weighs 0
            rows_in = ep_nccl.recv_layout(d)[r]
            ok &= all(np.array_equal(recv[r][i], x[g, t] if t < T else np.zeros(h))
                      for i, (g, t, _) in enumerate(rows_in))
            outs.append(np.array([rt.weights[g, t, k] * expert(int(rt.topk_idx[g, t, k]), recv[r][i]) if t < T
                                  else np.zeros(h) for i, (g, t, k) in enumerate(rows_in)]).reshape(-1))
        elif kernel == "deepep-ll":
            rows_in = ep_deepep_ll.recv_layout(d)[r]
            ok &= all(np.array_equal(recv[r][i], x[g, t]) for i, (g, t, _) in enumerate(rows_in))
            outs.append(np.array([expert(int(rt.topk_idx[g, t, k]), recv[r][i])
                                  for i, (g, t, k) in enumerate(rows_in)]).reshape(-1))
        elif kernel in ep_switch.VARIANTS:  # a slot per (source, token) on every rank; the others stay empty
            slots = np.zeros((n * T, h))
            filled = np.zeros(n * T, dtype=bool)
            for g, t in ep_switch.recv_layout(d)[r]:
                ok &= np.array_equal(recv[r][g * T + t], x[g, t])
                slots[g * T + t] = expert_sum(r, g, t, recv[r][g * T + t])
                filled[g * T + t] = True
            ok &= not recv[r][:n * T][~filled].any()
            outs.append(slots.reshape(-1))
        else:  # allgather: every token on every rank
            ok &= np.array_equal(recv[r][:n * T], x.reshape(-1, h))
            outs.append(np.array([expert_sum(r, g, t, recv[r][g * T + t]) for g in range(n)
                                  for t in range(T)]).reshape(-1))
    m2 = _run(cfg, mod, c, {"expert_out": outs})
    for g in range(n):
        mem = m2.gpus[g].memory.buffers
        if kernel == "nccl":  # the stack's unpermute: sum each token's rows (padding rows: token T, dropped)
            back = mem["a2a_back"].reshape(-1, h)
            got = np.zeros((T + 1, h))
            for i, (t, _k) in enumerate(ep_nccl.send_layout(d)[g]):
                got[t] += back[i]
            got = got[:T]
        else:
            got = mem["combined"].reshape(-1, h)[:T]
        ok &= bool(np.array_equal(got, ref[g]))
    return ok


def nccl_rows_conserved(call: EpCall) -> bool:
    """Whether the nccl kernel's receive layouts (cais.kernels.ep_nccl.recv_layout) hold
    every valid (token, expert) selection of ``call``'s routing once, on its expert's
    rank, and, from each source rank, exactly the padding rows the routing gives that
    rank's experts (capacity ``pad``; none otherwise)."""
    rt = call.routing
    T, owners = rt.tokens, np.arange(rt.experts) // rt.per_rank
    pads = rt.pad_rows if rt.pad_rows.size else np.zeros((rt.ranks, rt.experts), dtype=np.int64)
    real: list[tuple[int, int, int]] = []
    for r, layout in enumerate(ep_nccl.recv_layout(call)):
        for g, t, k in layout:
            if t < T:
                if rt.topk_idx[g, t, k] < 0 or owners[rt.topk_idx[g, t, k]] != r:
                    return False
                real.append((g, t, k))
        for g in range(rt.ranks):
            if sum(1 for s, t, _ in layout if s == g and t == T) != int(pads[g, owners == r].sum()):
                return False
    want = sorted(zip(*(a.tolist() for a in np.nonzero(rt.topk_idx >= 0))))
    return sorted(real) == want


def expert_tp_rows(cfg: SystemConfig, rows: list[np.ndarray], experts: list[list[int]], tp: int,
                   partial: Callable[[int, int, np.ndarray], np.ndarray]) -> list[np.ndarray]:
    """Expert TP's part of a functional run (Megatron-Core's all-to-all dispatcher,
    module cais.workload.moe_dataflow): every GPU's received ``rows`` (its ``experts``,
    one per row) all-gathered over its expert-TP group (``tp`` consecutive GPUs) by
    NCCL's ring, each GPU's slot ``g % tp`` of every gathered row's expert
    (``partial(slot, e, row)``: a partial sum), and the ring ReduceScatter of those
    back to the GPU that received the row: each GPU's rows, summed over the slots. The
    collectives are the layer's (kernels/collectives.py ring over ``groups``), every
    shard padded to the most rows a GPU received."""
    n = len(rows)
    h = rows[0].shape[1] if rows and rows[0].ndim == 2 else 0
    most = max(1, max(len(r) for r in rows))
    groups = tuple(tuple(range(first, first + tp)) for first in range(0, n, tp))

    def ring(op: str, fill: list[np.ndarray], out_elems: int) -> list[np.ndarray]:
        m = Machine(cfg, functional=True)
        count = tp * most * h
        for g in range(n):
            m.gpus[g].memory.alloc("tp_in", fill[g].size, fill=fill[g])
            m.gpus[g].memory.alloc("tp_out", out_elems)
        spec = CollectiveSpec(op, "ring", count, 2, "tp_in", "tp_out", groups=groups)
        for gpu, k in zip(m.gpus, build(m, spec)):
            gpu.launch(k, m.launch_ps)
        m.run()
        return [m.gpus[g].memory.buffers["tp_out"].reshape(-1, h) for g in range(n)]

    padded = [np.vstack([r.reshape(-1, h), np.zeros((most - len(r), h))]) for r in rows]
    gathered = ring("allgather", padded, tp * most * h)
    partials = []
    for g in range(n):
        first = g - g % tp
        out = np.zeros((tp * most, h))
        for member in range(tp):
            for i, e in enumerate(experts[first + member]):
                out[member * most + i] = partial(g % tp, e, gathered[g][member * most + i])
        partials.append(out)
    reduced = ring("reducescatter", partials, most * h)
    return [reduced[g][:len(rows[g])] for g in range(n)]


#: the largest expert block (experts x hidden x expert FFN) functional mode runs: real
#: data for every expert's weights
FUNCTIONAL_EXPERT_ELEMS = 1 << 22


def expert_block_check(cfg: SystemConfig, kernel: str, moe: MoeSpec, routing: Routing, seed: int = 0,
                       expert_tp: int = 1) -> bool:
    """Functional mode of a MoE layer's expert block under ``kernel``: every GPU's
    routed rows (``routing``, the layer period's: tokens, top-k, group-limited experts;
    gate weights made multiples of 1/4) on the Q10 grid of the dense path's functional
    mode (cais.workload.numerics) go through the kernel's dispatch, each rank's SwiGLU
    experts (gate/up GEMM, ``swiglu`` rounded to the grid, down GEMM, weights on the
    grid) and the combine; every GPU's output must equal the unsharded block's
    ``sum_k w_k expert_k(x)`` bit for bit (the shared experts are local: no exchange),
    every row arriving once (:func:`functional_check`). With ``expert_tp`` > 1 the
    routing is over expert-TP slots (cais.workload.routing.expert_tp_routing) and each
    slot computes its share of the expert's FFN (gate/up columns, down rows: a partial
    sum), reduced by the expert-TP group's ReduceScatter or by the combine as the
    kernel's stack does it; the output must still equal the unsharded block's. A
    UserError for a block too large to hold in numpy (:data:`FUNCTIONAL_EXPERT_ELEMS`)."""
    h, f = moe.hidden, moe.expert_ffn_hidden
    if moe.experts * h * f > FUNCTIONAL_EXPERT_ELEMS:
        raise UserError(f"functional: {moe.name}'s experts hold {moe.experts * h * f:,} weights of each kind, over "
                        f"{FUNCTIONAL_EXPERT_ELEMS:,}; functional mode is for small MoE models (a MoE model JSON)")
    rng = np.random.default_rng(seed + 7)
    rt = _exact_weights(routing, seed)
    w1 = _grid(rng, (moe.experts, h, 2 * f), 128)
    w2 = _grid(rng, (moe.experts, f, h), 128)
    x = _grid(rng, (rt.ranks, rt.tokens, h), 1024)

    def expert(e: int, row: np.ndarray) -> np.ndarray:
        gu = row @ w1[e]
        return swiglu(gu[:f], gu[f:]) @ w2[e]
    call = EpCall("dispatch", rt, h, "bf16")
    if expert_tp == 1:
        return functional_check(cfg, kernel, call, seed, x, expert)
    fl, per = f // expert_tp, rt.per_rank  # one slot's FFN width; local experts per GPU (as per EP rank)
    group = expert_tp_form(EP_KERNELS[kernel], expert_tp, kernel) == "group"  # else the combine adds the slots
    if not group and rt.topk % expert_tp == 0:  # a token's slots of one expert carry its one gate weight
        w = rt.weights.reshape(rt.ranks, rt.tokens, -1, expert_tp)[..., :1]
        w = np.repeat(w, expert_tp, axis=3).reshape(rt.weights.shape)
        rt = Routing(rt.topk_idx, w, rt.experts, rt.pad_rows, rt.source)
        call = EpCall("dispatch", rt, h, "bf16")

    def real(v: int) -> int:  # virtual expert (EP rank r's slot j, local l) -> its expert
        return v // per // expert_tp * per + v % per

    def partial(j: int, e: int, row: np.ndarray) -> np.ndarray:  # slot j of expert e: its FFN units j*fl..
        cols = slice(j * fl, (j + 1) * fl)
        gu = row @ w1[e]
        return swiglu(gu[:f][cols], gu[f:][cols]) @ w2[e][cols]
    ref = np.zeros((rt.ranks, rt.tokens, h))  # the unsharded block over the tokens' experts
    seen = np.zeros((rt.ranks, rt.tokens, moe.experts), dtype=bool)
    for g, t, k in zip(*np.nonzero(rt.topk_idx >= 0)):
        e = real(int(rt.topk_idx[g, t, k]))
        if not seen[g, t, e]:  # the all form lists each expert once per slot, with the same weight
            seen[g, t, e] = True
            ref[g, t] += rt.weights[g, t, k] * expert(e, x[g, t])
    return functional_check(cfg, kernel, call, seed, x, lambda v, row: partial(v // per % expert_tp, real(v), row),
                            ref, expert_tp if group else 1, lambda j, v, row: partial(j, real(v), row))
