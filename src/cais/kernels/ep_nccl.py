"""NCCL all-to-all(v) as Megatron-Core's all-to-all token dispatcher runs it, modelled
from NVIDIA/Megatron-LM@0014f13713bfa38a8bab4ae11edd6917d35165ce,
``megatron/core/transformer/moe/token_dispatcher.py`` (``MoEAlltoAllTokenDispatcher``:
permute, then ``all_to_all`` with ``input_splits``/``output_splits``, after a
device-to-host sync for the splits) and NCCL's all-to-all, which is a group of
``ncclSend``/``ncclRecv`` to and from every peer (NVIDIA/nccl, ``src/collectives.cc``
``ncclAllToAll``... as nccl-tests' ``alltoall`` issues it: point-to-point per peer).

* **One copy per (token, expert).** Megatron permutes the tokens by expert before the
  all-to-all (``num_out_tokens = tokens x topk``), so a token travels once per expert,
  not once per rank.
* **Point-to-point per peer.** Each peer's rows (contiguous after the permute) go
  as one send; the sends are cut into ``collective.ring_step_bytes`` chunks dealt over
  ``EpConstants.nccl_channels`` channels (one TB each), peers in NCCL's p2p order
  (``g + 1``, ``g + 2``, ...), each channel an SM copy loop (kernels/ep_common.py) at
  the GPU's SM copy rate, as the dense path's NCCL kernels run their channels (not
  DeepEP's fitted loop rate: checked on nccl-tests' ``alltoall_perf``, docs/moe.md).
* **Its protocol by size** (NVIDIA/nccl@5d3ab08b, ``src/enqueue.cc``, ``addP2pToPlan``):
  a send is LL when its bytes are at most ``P2P_LL_THRESHOLD`` (16 KiB) per channel it
  spreads over (:func:`p2p_protocol`), else Simple; p2p never runs LL128. Simple: the
  stores, a system fence, then the step's flag (a chunk lands when its flag does); LL:
  8 B of data and a flag in every 16 B line, at the LL loop's rate
  (``collective.ll_channel_GBps``), no fence.
* **Host costs.** ``collective.host_us`` per NCCL call; with ``host_sync`` (Megatron's
  ``cuda_sync_point`` before the all-to-all, needed for the splits) also
  ``EpConstants.host_sync_us`` and a launch.

Combine is the same all-to-all backwards (expert outputs to their tokens' ranks,
one row per (token, expert)); the weighted unpermute after it is the stack's local op.

**Capacity ``pad``** (Megatron-Core's ``moe_pad_expert_input_to_capacity``,
NVIDIA/Megatron-LM@d98e8a64, ``moe_utils.py`` ``apply_router_token_dropping`` and
``token_dispatcher.py`` ``MoEAlltoAllTokenDispatcher.preprocess``): every source rank
fills each expert's segment of its permuted rows up to the capacity its own tokens
give (``Routing.pad_rows``), and the all-to-all sends equal splits of ``capacity x
local experts`` rows to every rank, so the padding rows cross the wire both ways.
Here a padding row is a zero row (``x``'s row ``tokens``, after the real ones) with
gate weight 0, after the expert's real rows; Megatron's padding rows are other tokens
the router picked with probability 0, which move the same bytes and add nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cais.config import PS_PER_US, SystemConfig
from cais.errors import UserError
from cais.hw.gpu import Kernel, TbProgram
from cais.kernels.ep_common import EpCall, Move, alloc_rows, copy_tb
from cais.machine import Machine


#: Megatron permutes the tokens by expert before the all-to-all (module doc)
PERMUTE = "sender"
#: expert TP > 1 as Megatron-Core's all-to-all dispatcher runs it
#: (NVIDIA/Megatron-LM@d98e8a64, ``MoEAlltoAllTokenDispatcher``): the all-to-all among the
#: EP ranks of one expert-TP slot, then the expert-TP group's AllGather and
#: ReduceScatter (cais.workload.routing.expert_tp_routing)
EXPERT_TP = "group"
#: Megatron-Core overlaps the shared experts with the all-to-all dispatcher's communication
#: (``moe_shared_expert_overlap``)
SHARED_OVERLAP = True

#: Megatron-Core pads each (source rank, expert) up to capacity before its all-to-all, and
#: the padding rows are sent (module doc): ``exchanged`` (cais.kernels.ep_registry)
CAPACITY_PAD = "exchanged"


def pad_flat(call: EpCall) -> int:
    """The flat index a padding row has in :func:`send_order`: ``tokens x top-k``, whose
    token is ``tokens`` (the zero row after ``x``'s real rows) and slot 0."""
    return call.routing.tokens * call.routing.topk


def _permuted(call: EpCall, g: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank ``g``'s permuted send rows: (flat indices, their experts), by expert, each
    expert's real rows in token order and then its padding rows (:func:`pad_flat`)."""
    rt = call.routing
    idx = rt.topk_idx[g].reshape(-1)
    valid = np.flatnonzero(idx >= 0)
    flat, experts = valid, idx[valid]
    if rt.pad_rows.size and rt.pad_rows[g].any():
        pads = np.repeat(np.arange(rt.experts), rt.pad_rows[g])
        flat = np.concatenate([flat, np.full(pads.size, pad_flat(call), dtype=np.int64)])
        experts = np.concatenate([experts, pads])
    by = np.argsort(experts, kind="stable")
    return flat[by], experts[by]


def send_order(call: EpCall) -> list[np.ndarray]:
    """Each rank's permuted send rows as flat (token x top-k + slot) indices, by expert
    then token (a stable sort of the valid selections by expert: token order within
    one expert), each expert's padding rows (capacity ``pad``: :func:`pad_flat`) last."""
    return [_permuted(call, g)[0] for g in range(call.routing.ranks)]


def send_counts(call: EpCall) -> np.ndarray:
    """[ranks, ranks]: rows rank g sends rank r (one per (token, expert), padding rows
    included); rank g's rows for r are the ``[g, r]``-th contiguous segment of its
    :func:`send_order` (owners rise with the expert)."""
    rt = call.routing
    out = np.zeros((rt.ranks, rt.ranks), dtype=np.int64)
    for g in range(rt.ranks):
        out[g] = np.bincount(_permuted(call, g)[1] // rt.per_rank, minlength=rt.ranks)
    return out


def send_layout(call: EpCall) -> list[list[tuple[int, int]]]:
    """Each rank's permuted send rows as (token, top-k slot), by expert then token; a
    padding row is (``tokens``, 0)."""
    K = call.routing.topk
    return [[(int(f) // K, int(f) % K) for f in order] for order in send_order(call)]


def recv_layout(call: EpCall) -> list[list[tuple[int, int, int]]]:
    """Each rank's received rows as (source rank, token, top-k slot): by source, then
    expert, then token (before Megatron's local ``sort_chunks_by_idxs``); a padding row
    is (source, ``tokens``, 0)."""
    rt, K = call.routing, call.routing.topk
    order = send_order(call)
    counts = send_counts(call)
    start = np.cumsum(counts, axis=1) - counts  # [g, r]: first row of g's segment for r
    return [[(g, int(f) // K, int(f) % K) for g in range(rt.ranks)
             for f in order[g][start[g, r]:start[g, r] + counts[g, r]]] for r in range(rt.ranks)]


#: NCCL_P2P_LL_THRESHOLD's default: bytes of a p2p send per channel that still run LL
P2P_LL_THRESHOLD = 16384


def p2p_channels(nbytes: int, ranks: int, channels: int, step_bytes: int) -> int:
    """The channels NCCL spreads one p2p send of ``nbytes`` over (``addP2pToPlan`` on one
    node): the per-peer channels (``channels``, halved while their total over the
    ``ranks`` exceeds ``channels``), at most one per ``step_bytes / 8``."""
    per_peer = channels
    while per_peer * ranks > channels and per_peer > 1:
        per_peer //= 2
    return max(1, min(per_peer, -(-nbytes // max(1, step_bytes // 8))))


def p2p_protocol(nbytes: int, ranks: int, channels: int, step_bytes: int) -> str:
    """NCCL's protocol of one p2p send: ``ll`` up to :data:`P2P_LL_THRESHOLD` bytes per
    channel of the send (:func:`p2p_channels`), else ``simple``."""
    return "ll" if nbytes <= p2p_channels(nbytes, ranks, channels, step_bytes) * P2P_LL_THRESHOLD else "simple"


def messages(cfg: SystemConfig, call: EpCall) -> list[tuple[int, int, int, bool]]:
    """The stores one call puts on the fabric, over all GPUs, as (how many, bytes each,
    transfer unit, fenced: its write responses come back), for the event estimate
    (cais.experiments.estimates): each remote (token, expert) row, a peer's rows in
    ``collective.ring_step_bytes`` chunks, each chunk fenced with its flag (Simple; LL
    doubles the bytes instead)."""
    rt = call.routing
    mat = rt.matrix("expert")
    step_rows = max(1, cfg.collective.ring_step_bytes // call.row_bytes)
    out = []
    for g in range(rt.ranks):
        for r in range(rt.ranks):
            rows = int(mat[g, r])
            if r == g or not rows:
                continue
            chunks = -(-rows // step_rows)
            nbytes = rows * call.row_bytes
            ll = p2p_protocol(nbytes, call.comm_ranks or rt.ranks, call.consts.nccl_channels,
                              cfg.collective.ring_step_bytes) == "ll"
            each = (2 if ll else 1) * nbytes // chunks
            out += [(chunks, each, cfg.unit_for(each), not ll), (0 if ll else chunks, 8, 8, False)]
    return out


def kernels(m: Machine, call: EpCall) -> list[Kernel]:
    """One NCCL all-to-all kernel per GPU. Dispatch: ``x`` rows (gathered by the
    permute) -> ``recv_x`` (:func:`recv_layout`); combine: ``expert_out`` (that layout)
    -> ``a2a_back`` (:func:`send_layout`'s order) on the tokens' ranks."""
    rt, n = call.routing, m.n
    if rt.ranks != n:
        raise UserError(f"gpus: the routing has {rt.ranks} ranks, the system {n} GPUs")
    if call.sms is not None:
        raise UserError("sms: NCCL chooses its own channels; leave sms unset (EpConstants.nccl_channels)")
    K = rt.topk
    order = send_order(call)
    counts = send_counts(call)
    seg = np.cumsum(counts, axis=1) - counts  # [g, r]: g's rows for r start here in its send order
    recv_at = np.cumsum(counts, axis=0) - counts  # [g, r]: g's rows start here in r's receive order
    tokens_of = [(o // K).tolist() for o in order]  # each send row's token
    pad_row = 1 if rt.pad_rows.size and rt.pad_rows.any() else 0  # the zero row padding rows are sent from
    for g in range(n):
        alloc_rows(m, g, "x", rt.tokens + pad_row, call)
        alloc_rows(m, g, "recv_x", int(counts[:, g].sum()), call)
        alloc_rows(m, g, "expert_out", int(counts[:, g].sum()), call)
        alloc_rows(m, g, "a2a_back", int(counts[g].sum()), call)
    chans = call.consts.nccl_channels
    step_rows = max(1, m.cfg.collective.ring_step_bytes // call.row_bytes)
    host_ps = round(m.cfg.collective.host_us * PS_PER_US)
    if call.host_sync:
        host_ps += round(call.consts.host_sync_us * PS_PER_US) + m.launch_ps
    out = []
    for g in range(n):
        per_chan: list[list[Move]] = [[] for _ in range(chans)]
        j = 0
        for d in range(n):
            peer = (g + d) % n
            if call.op == "dispatch":  # g's rows for peer, in its send order -> after the earlier sources'
                a0 = int(seg[g, peer])
                rows: Sequence[int] = tokens_of[g][a0:a0 + int(counts[g, peer])]
                dst0 = int(recv_at[g, peer]) if len(rows) else 0
                src_buf, dst_buf = "x", "recv_x"
            else:  # rows g holds for peer's tokens (peer's segment of its receive order) -> peer's a2a_back
                r0 = int(recv_at[peer, g])
                rows = range(r0, r0 + int(counts[peer, g]))
                dst0 = int(seg[peer, g]) if len(rows) else 0
                src_buf, dst_buf = "expert_out", "a2a_back"
            proto = p2p_protocol(len(rows) * call.row_bytes, call.comm_ranks or n, chans,
                                 m.cfg.collective.ring_step_bytes)
            for a in range(0, len(rows), step_rows):
                per_chan[j % chans].append(Move(g, peer, src_buf, rows[a:a + step_rows], dst_buf, dst0 + a,
                                                protocol=proto if peer != g else ""))
                j += 1
        rate = m.cfg.gpu.sm_copy_bandwidth_GBps  # an NCCL channel's loop, as the dense path's (module doc)
        tbs: list[TbProgram | None] = [copy_tb(m, g, call, mv, (), None, host_ps, rate_GBps=rate) for mv in per_chan]
        out.append(Kernel(f"nccl-alltoall-{call.op}", tbs, None, role="communication"))
    return out
