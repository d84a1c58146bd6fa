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
"""

from __future__ import annotations

from cais.config import PS_PER_US
from cais.errors import UserError
from cais.hw.gpu import Kernel, TbProgram
from cais.kernels.ep_common import EpCall, Move, alloc_rows, copy_tb
from cais.machine import Machine


#: Megatron permutes the tokens by expert before the all-to-all (module doc)
PERMUTE = "sender"
#: Megatron-Core overlaps the shared experts with the all-to-all dispatcher's communication
#: (``moe_shared_expert_overlap``)
SHARED_OVERLAP = True

def send_layout(call: EpCall) -> list[list[tuple[int, int]]]:
    """Each rank's permuted send rows as (token, top-k slot), by expert then token."""
    rt = call.routing
    out = []
    for g in range(rt.ranks):
        rows = [(int(rt.topk_idx[g, t, k]), t, k) for t in range(rt.tokens) for k in range(rt.topk)
                if rt.topk_idx[g, t, k] >= 0]
        rows.sort()
        out.append([(t, k) for _, t, k in rows])
    return out


def recv_layout(call: EpCall) -> list[list[tuple[int, int, int]]]:
    """Each rank's received rows as (source rank, token, top-k slot): by source, then
    expert, then token (before Megatron's local ``sort_chunks_by_idxs``)."""
    rt = call.routing
    sends = send_layout(call)
    out: list[list[tuple[int, int, int]]] = [[] for _ in range(rt.ranks)]
    for g in range(rt.ranks):
        for t, k in sends[g]:
            out[int(rt.topk_idx[g, t, k]) // rt.per_rank].append((g, t, k))
    return out


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


def kernels(m: Machine, call: EpCall) -> list[Kernel]:
    """One NCCL all-to-all kernel per GPU. Dispatch: ``x`` rows (gathered by the
    permute) -> ``recv_x`` (:func:`recv_layout`); combine: ``expert_out`` (that layout)
    -> ``a2a_back`` (:func:`send_layout`'s order) on the tokens' ranks."""
    rt, n = call.routing, m.n
    if rt.ranks != n:
        raise UserError(f"gpus: the routing has {rt.ranks} ranks, the system {n} GPUs")
    if call.sms is not None:
        raise UserError("sms: NCCL chooses its own channels; leave sms unset (EpConstants.nccl_channels)")
    sends, recvs = send_layout(call), recv_layout(call)
    spos = [{(t, k): i for i, (t, k) in enumerate(rows)} for rows in sends]
    rpos = [{key: i for i, key in enumerate(rows)} for rows in recvs]
    for g in range(n):
        alloc_rows(m, g, "x", rt.tokens, call)
        alloc_rows(m, g, "recv_x", len(recvs[g]), call)
        alloc_rows(m, g, "expert_out", len(recvs[g]), call)
        alloc_rows(m, g, "a2a_back", len(sends[g]), call)
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
            if call.op == "dispatch":
                pairs = [(g, t, k) for g2, t, k in recvs[peer] if g2 == g]
                rows = [t for _, t, _ in pairs]
                dst0 = rpos[peer][pairs[0]] if pairs else 0
                src_buf, dst_buf = "x", "recv_x"
            else:  # rows g holds for peer's tokens -> peer's a2a_back
                pairs = [(g2, t, k) for g2, t, k in recvs[g] if g2 == peer]
                rows = [rpos[g][p] for p in pairs]
                dst0 = spos[peer][(pairs[0][1], pairs[0][2])] if pairs else 0
                src_buf, dst_buf = "expert_out", "a2a_back"
            proto = p2p_protocol(len(rows) * call.row_bytes, n, chans, m.cfg.collective.ring_step_bytes)
            for a in range(0, len(rows), step_rows):
                per_chan[j % chans].append(Move(g, peer, src_buf, rows[a:a + step_rows], dst_buf, dst0 + a,
                                                protocol=proto if peer != g else ""))
                j += 1
        rate = m.cfg.gpu.sm_copy_bandwidth_GBps  # an NCCL channel's loop, as the dense path's (module doc)
        tbs: list[TbProgram | None] = [copy_tb(m, g, call, mv, (), None, host_ps, rate_GBps=rate) for mv in per_chan]
        out.append(Kernel(f"nccl-alltoall-{call.op}", tbs, None, role="communication"))
    return out
