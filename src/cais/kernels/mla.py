"""The kernels of multi-head latent attention (MLA) that are not GEMMs, on one GPU
(cais.workload.mla): the attention itself (and its backward) and the two latent RMSNorms
(``q_a_layernorm``, ``kv_a_layernorm``) and their backwards. The GEMMs (``qkv_a``,
``q_b``, ``kv_b``, the absorbed ``q_absorb`` / ``v_absorb``, ``out_proj``) are the
tiled GEMM kernel's.

Attention in prefill and training is FlashAttention's MHA with score width nope + rope
and value width v (``ComputeModel.attention_time_ps`` with ``v_dim``); in decode it is
the absorbed form FlashMLA runs: MQA of ``heads_l`` query heads over the latent cache,
whose ``kv_len`` x (kv_lora + rope) entries per sequence are read once for all heads
(``ComputeModel.mla_decode_bytes``), timed as the decode attention is (its floor plus
the cache read at its rate) unless its FLOPs (``mla_decode_flops``: 128 query heads over
one latent make it compute-heavy at long caches) take longer at the compute model's
fitted forward attention efficiency, which then replace the read (an assumption:
FlashMLA's own rate is not calibrated here). None of them
carries data in functional mode (the MoE functional check is the expert block's).
"""

from __future__ import annotations

from cais.hw.compute import BF16, ComputeModel
from cais.hw.gpu import Kernel
from cais.kernels.attention import Q_BLOCK
from cais.kernels.local import even_kernel, row_blocks
from cais.workload.graph import Dims
from cais.workload.mla import MlaDims

#: the attention kernels' kinds (forward, backward)
KINDS = ("mla_attention", "mla_attention_bwd")
#: the latent RMSNorms' kinds, forward and backward, and which latent each normalises
NORM_KINDS = {"q_a_norm": "q", "kv_a_norm": "kv", "q_a_norm_bwd": "q", "kv_a_norm_bwd": "kv"}


def mla_attention_tbs(d: Dims, mla: MlaDims) -> int:
    """Thread blocks of one MLA attention kernel: one per sequence, local head and block
    of :data:`~cais.kernels.attention.Q_BLOCK` query rows (as the MHA kernel's grid)."""
    return d.batch * mla.heads_l * max(1, -(-d.seq // Q_BLOCK))


def mla_attention_kernel(cm: ComputeModel, name: str, kind: str, d: Dims, mla: MlaDims, mode: str,
                         total_sms: int, sm_set: frozenset[int] | None = None,
                         decode_floor: tuple[int, float] | None = None) -> tuple[Kernel, int]:
    """(kernel, its fixed overhead in ps) of MLA's attention (``kind`` ``mla_attention``)
    or its backward (``mla_attention_bwd``) on one GPU (module doc), the overheads and
    the decode floor (``decode_floor``: floor ps, HBM rate fraction) as
    :func:`cais.kernels.attention.attention_kernel` charges them. Timing only."""
    sms = len(sm_set) if sm_set else total_sms
    over = cm.memory_time_ps(0, sms, total_sms)
    if mode == "decode":
        nbytes = cm.mla_decode_bytes(mla.heads_l, mla.latent, mla.kv_lora, d.batch, d.kv_len)
        compute = round(cm.mla_decode_flops(mla.heads_l, mla.latent, mla.kv_lora, d.batch, d.kv_len)
                        / (cm.attn_efficiency_fwd * cm.peak_tflops * sms / cm.sms))
        if decode_floor is not None:
            floor_ps, frac = decode_floor
            t = over + floor_ps + max(compute, round(nbytes / (frac * cm.hbm_bytes_per_ps(sms, total_sms))))
        else:
            t = max(cm.memory_time_ps(nbytes, sms, total_sms), over + compute)
    else:
        passes = "fwd" if kind == "mla_attention" else "bwd"
        t = cm.attention_time_ps(mla.heads_l, mla.heads_l, mla.qk, d.batch, d.seq, passes, sms, total_sms,
                                 v_dim=mla.v)
        over = round((cm.attn_overhead_fwd_ns if passes == "fwd" else cm.attn_overhead_bwd_ns) * 1000)
        nbytes = cm.attention_hbm_bytes(mla.heads_l, mla.heads_l, mla.qk, d.batch, d.seq, passes, v_dim=mla.v)
    return even_kernel(name, max(0, t - over), mla_attention_tbs(d, mla), sms, None, sm_set, nbytes), over


def latent_width(kind: str, mla: MlaDims) -> int:
    """The width of the latent a norm kernel of ``kind`` (:data:`NORM_KINDS`) normalises."""
    return mla.q_lora if NORM_KINDS[kind] == "q" else mla.kv_lora


def latent_norm_bytes(kind: str, rows: int, mla: MlaDims) -> int:
    """HBM bytes of a latent RMSNorm (``kind`` in :data:`NORM_KINDS`) over ``rows`` token
    rows: the latent read and written (its backward: the gradient and the latent read,
    the gradient written, counted as twice the forward's, as the activation's backward)."""
    return (2 if kind.endswith("_bwd") else 1) * 2 * rows * latent_width(kind, mla) * BF16


def latent_norm_kernel(cm: ComputeModel, name: str, kind: str, rows: int, mla: MlaDims, total_sms: int,
                       sm_set: frozenset[int] | None = None) -> tuple[Kernel, int]:
    """(kernel, its fixed overhead in ps) of a latent RMSNorm (``kind`` in
    :data:`NORM_KINDS`) over ``rows`` token rows on one GPU, a memory-bound RMSNorm of
    the calibrated model (its backward twice its time, as the activation's). (In decode
    under the graph and eager launches it is instead a small kernel of the decode step:
    ``LayerRun.small_kernel`` of :func:`latent_norm_bytes`.) Timing only."""
    sms = len(sm_set) if sm_set else total_sms
    over = cm.memory_time_ps(0, sms, total_sms)
    t = (2 if kind.endswith("_bwd") else 1) * (cm.elementwise_time_ps("rmsnorm", rows, latent_width(kind, mla), sms,
                                                                      total_sms) - over)
    tbs = len(row_blocks(rows))
    return even_kernel(name, t, tbs, sms, None, sm_set, t * cm.hbm_bytes_per_ps(sms, total_sms)), over
