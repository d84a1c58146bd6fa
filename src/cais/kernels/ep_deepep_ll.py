"""DeepEP's low-latency dispatch and combine over NVLink, modelled from
deepseek-ai/DeepEP@dd758caf451848bd150e1046af3d0a73e5fff38d,
``csrc/kernels/legacy/internode_ll.cu`` (``dispatch``, ``combine`` and their launch
shape) and ``tests/legacy/test_low_latency.py`` (timing and bytes).

* **One copy per (token, expert).** Each of a token's top-k experts gets its own
  message (FP8: ``hidden`` bytes, its scales and 16 B of source info), into the
  expert's rank's receive buffer at [local expert][source rank][slot]; a warp per
  message (``UNROLLED_WARP_COPY`` to the peer's pointer from
  ``nvshmemi_get_p2p_ptr``, i.e. NVLink stores).
* **Launch shape.** ``num_warp_groups = ceil(experts / device SMs)`` and
  ``ceil(experts / num_warp_groups)`` blocks; block ``s`` sends tokens ``s, s + S, ...``
  and receives its ``num_warp_groups`` experts.
* **Counts, then the masked layout.** When a rank's messages to a peer have landed it
  stores the count there (one flag); an expert's receiving warp group waits for the
  counts of every source and copies its rows into ``packed_recv_x``
  ([local experts, ranks x tokens, hidden], rows of one expert packed, the rest masked
  off by ``packed_recv_count``). The copy is the block's SM loop (kernels/ep_common.py).
* **Combine** sends each expert output row (BF16) back to its token's rank, one
  message per (token, expert); the token's rank waits for every peer's count and
  sums its top-k rows with the gate weights.
* ``EpConstants.ll_fixed_us``: the per-call cost beyond the launch and the copies (the
  grid sync between the send and receive phases, the buffer clean, the atomics),
  fitted on DeepEP's published EP8 dispatch latency (docs/moe.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cais.config import PS_PER_US, SystemConfig
from cais.engine import Countdown, Signal
from cais.engine.sim import ProgramGen
from cais.errors import UserError
from cais.hw.gpu import Kernel, TbProgram
from cais.kernels.common import pause
from cais.kernels.ep_common import EpCall, Move, alloc_rows, copy_time_ps, copy_tb
from cais.machine import Machine

SRC_INFO_BYTES = 16  # per FP8 message: the source token index and padding
UNIT = 1024


#: the dispatch writes the masked (packed per expert) layout itself
PERMUTE = "none"
SHARED_OVERLAP = False
#: ``Buffer.low_latency_dispatch(..., use_fp8=True)`` casts each message to FP8 with its
#: scales in the kernel (DeepEP's default and SGLang's in decode); its combine sends BF16
DISPATCH_DTYPES = ("bf16", "fp8")

def launch_shape(experts: int, device_sms: int) -> tuple[int, int]:
    """(blocks, warp groups per block) as the source launches the kernels."""
    groups = math.ceil(experts / device_sms)
    return math.ceil(experts / groups), groups


@dataclass(frozen=True)
class Selections:
    """Every valid (source rank, token, top-k slot) selection of a routing as arrays, in
    the order the expert ranks' ``packed_recv_x`` holds them: by expert, then source,
    token and slot. ``row``: its row in its expert's rank's ``recv_x`` (the packed
    layout, experts in order)."""

    src: np.ndarray
    token: np.ndarray
    slot: np.ndarray
    expert: np.ndarray
    owner: np.ndarray
    local: np.ndarray
    row: np.ndarray

    @classmethod
    def of(cls, call: EpCall) -> Selections:
        rt = call.routing
        g, t, k = np.nonzero(rt.topk_idx >= 0)  # (source, token, slot) order
        e = rt.topk_idx[g, t, k]
        order = np.argsort(e, kind="stable")
        g, t, k, e = g[order], t[order], k[order], e[order]
        owner = e // rt.per_rank
        rank_rows = np.bincount(owner, minlength=rt.ranks)
        row = np.arange(len(e), dtype=np.int64) - (np.cumsum(rank_rows) - rank_rows)[owner]
        return cls(g, t, k, e, owner, e % rt.per_rank, row)


def slots(call: EpCall) -> list[list[list[tuple[int, int, int]]]]:
    """For each rank and local expert, its received rows as (source rank, token, top-k
    slot), by source then token: the rows ``packed_recv_x`` holds, in order."""
    rt, sel = call.routing, Selections.of(call)
    out: list[list[list[tuple[int, int, int]]]] = [[[] for _ in range(rt.per_rank)] for _ in range(rt.ranks)]
    for g, t, k, r, le in zip(sel.src.tolist(), sel.token.tolist(), sel.slot.tolist(), sel.owner.tolist(),
                              sel.local.tolist()):
        out[r][le].append((g, t, k))
    return out


def recv_layout(call: EpCall) -> list[list[tuple[int, int, int]]]:
    """Each rank's ``recv_x`` rows (the packed layout, experts in order), as
    (source rank, token, top-k slot)."""
    return [[row for rows in per_rank for row in rows] for per_rank in slots(call)]


def messages(cfg: SystemConfig, call: EpCall) -> list[tuple[int, int, int, bool]]:
    """The stores one call puts on the fabric, over all GPUs, as (how many, bytes each,
    transfer unit, fenced: its write responses come back), for the event estimate
    (cais.experiments.estimates): one row per remote (token, expert) selection, each
    its own store, and a count flag per pair of ranks."""
    rt = call.routing
    mat = rt.matrix("expert")
    remote = int(mat.sum() - np.trace(mat))
    return [(remote, call.row_bytes, cfg.unit_for(call.row_bytes), False), (rt.ranks * (rt.ranks - 1), 8, 8, False)]


def kernels(m: Machine, call: EpCall) -> list[Kernel]:
    """One DeepEP low-latency kernel per GPU (module doc). Dispatch: ``x`` ->
    ``recv_x`` (:func:`recv_layout`); combine: ``expert_out`` (that layout, unweighted
    expert outputs) -> ``combined`` (the weighted sum over the top-k)."""
    rt, n, T, K = call.routing, m.n, call.routing.tokens, call.routing.topk
    if rt.ranks != n:
        raise UserError(f"gpus: the routing has {rt.ranks} ranks, the system {n} GPUs")
    if call.sms is not None:
        raise UserError("sms: DeepEP's low-latency kernels take their SM count from the expert count "
                        "(ceil(experts / ceil(experts / SMs))); leave sms unset")
    blocks, groups = launch_shape(rt.experts, m.cfg.gpu.sms)
    per = rt.per_rank
    sel = Selections.of(call)
    block = _block(sel.src, sel.local, per, groups, blocks)  # each selection's serving block at combine
    rows_of = np.bincount(sel.owner, minlength=n)
    for g in range(n):
        rows = int(rows_of[g])
        alloc_rows(m, g, "x", T, call)
        alloc_rows(m, g, "recv_x", rows, call)
        alloc_rows(m, g, "ll_recv", rows, call)
        alloc_rows(m, g, "expert_out", rows, call)
        alloc_rows(m, g, "ll_comb", K * T, call)
        alloc_rows(m, g, "combined", T, call)
    moves: list[list[list[Move]]] = [[[] for _ in range(blocks)] for _ in range(n)]
    if call.op == "dispatch":
        counts = np.zeros((n, n), dtype=np.int64)
        np.add.at(counts, (sel.src, sel.owner), 1)
        # each source's messages in (token, slot) order, each to its block t % blocks
        by_source = np.lexsort((sel.slot, sel.token, sel.src))
        for g, t, r, row in zip(sel.src[by_source].tolist(), sel.token[by_source].tolist(),
                                sel.owner[by_source].tolist(), sel.row[by_source].tolist()):
            moves[g][t % blocks].append(Move(g, r, "x", [t], "ll_recv", row))
    else:  # expert rank r sends each (token, expert) output back: a warp group per (destination rank, local expert)
        counts = np.zeros((n, n), dtype=np.int64)
        np.add.at(counts, (sel.owner, sel.src), 1)
        for r, s, g, row, t, k in zip(sel.owner.tolist(), block.tolist(), sel.src.tolist(), sel.row.tolist(),
                                      sel.token.tolist(), sel.slot.tolist()):
            moves[r][s].append(Move(r, g, "expert_out", [row], "ll_comb", t * K + k))
    count = counts.tolist()
    pair = [[Countdown(count[a][b]) for b in range(n)] for a in range(n)]  # [src][dst]: messages landed
    ready = [Countdown(n) for _ in range(n)]  # every source's count has landed
    flag_base = m.flag_key() * 1_000_003
    for a in range(n):
        for b in range(n):
            def send_count(_v: object = None, a: int = a, b: int = b) -> None:
                m.isa.flag(a, b, flag_base + a * n + b, lambda: ready[b].arrive(m.sim))
            if count[a][b]:
                pair[a][b].on_fire(send_count)
            else:  # nothing to send: the count (0) goes at once
                m.sim.after(m.launch_ps, send_count)
        for blk in moves[a]:
            for mv in blk:
                mv.landed.append(pair[a][mv.dst])
    # the receive phase: block s of rank g copies the rows of the (source, local expert) pairs it serves
    mine = np.lexsort((block, sel.owner))
    cuts = np.searchsorted(sel.owner[mine] * blocks + block[mine], np.arange(n * blocks + 1))
    recv_rows = [[sel.row[mine[cuts[g * blocks + s]:cuts[g * blocks + s + 1]]] for s in range(blocks)]
                 for g in range(n)]
    fixed_ps = round(call.consts.ll_fixed_us * PS_PER_US)
    out = []
    for g in range(n):
        tbs: list[TbProgram | None] = [copy_tb(m, g, call, moves[g][s], (),
                                               _recv(m, g, call, s, blocks, ready[g], recv_rows[g][s]), fixed_ps)
                                       for s in range(blocks)]
        out.append(Kernel(f"deepep-ll-{call.op}", tbs, None, role="communication"))
    return out


def _block(rank: np.ndarray, local_expert: np.ndarray, per: int, groups: int, blocks: int) -> np.ndarray:
    """The block whose warp group serves (peer ``rank``, ``local_expert``): the source's
    ``responsible_expert_idx = sm_id * num_warp_groups + warp_group_id`` enumerates the
    (rank, local expert) pairs, rank-major."""
    return ((rank * per + local_expert) // groups) % blocks


def _recv(m: Machine, g: int, call: EpCall, s: int, blocks: int, ready: Signal, mine: np.ndarray):
    """Block ``s``'s receive phase on GPU ``g`` (a generator factory); ``mine``: the
    ``recv_x`` rows it copies into the packed layout at dispatch."""
    rt, T, K, h = call.routing, call.routing.tokens, call.routing.topk, call.hidden
    mem = m.gpus[g].memory

    def after() -> ProgramGen:
        yield ready
        if call.op == "dispatch":  # copy its experts' rows into the packed layout
            if len(mine):
                yield pause(m.sim, copy_time_ps(call, len(mine) * call.row_bytes))
            if mem.functional:
                for name, w in (("", h), (".scales", call.scale_elems)):
                    if w:
                        src = mem.buffers[f"ll_recv{name}"].reshape(-1, w)
                        mem.buffers[f"recv_x{name}"].reshape(-1, w)[mine] = src[mine]
        else:  # reduce its tokens' top-k rows with the gate weights
            toks = list(range(s, T, blocks))
            valid = int((rt.topk_idx[g, toks] >= 0).sum()) if toks else 0
            if valid:
                yield pause(m.sim, copy_time_ps(call, valid * call.row_bytes))
            if mem.functional and toks:
                comb = mem.buffers["ll_comb"].reshape(T, K, h)
                out = mem.buffers["combined"].reshape(-1, h)
                for t in toks:
                    for k in range(K):
                        if rt.topk_idx[g, t, k] >= 0:
                            out[t] += rt.weights[g, t, k] * comb[t, k]
    return after


__all__ = ["Selections", "kernels", "messages", "launch_shape", "recv_layout", "slots"]
