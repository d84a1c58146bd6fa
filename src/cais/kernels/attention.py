"""The attention kernel of one GPU's heads (and its backward): FlashAttention-style
in prefill and training (causal, GQA), a decode kernel over the KV cache in decode.

Its time is the calibrated compute model's attention cost for the whole kernel
(``ComputeModel.attention_time_ps`` / ``attention_decode_time_ps``), spread evenly
over a grid of one TB per (sequence, head, 128-query block). In functional mode the
first ``batch`` TBs each compute one whole sequence, all heads, with the shared
numerics (``workload/numerics.py``) from the ``qkv`` buffer (and the KV cache in
decode), writing ``a`` (forward) or ``dqkv`` (backward).
"""

from __future__ import annotations

import numpy as np

from cais.hw.compute import ComputeModel
from cais.hw.gpu import Kernel
from cais.hw.memory import Memory
from cais.kernels.local import even_kernel
from cais.workload import numerics as nx
from cais.workload.graph import Dims

KINDS = ("attention", "attention_bwd")
Q_BLOCK = 128  # query rows per TB


def attention_tbs(d: Dims) -> int:
    """Thread blocks of one attention kernel over the period's sequences: one per
    sequence, local head and block of :data:`Q_BLOCK` query rows."""
    return d.batch * d.heads_l * max(1, -(-d.seq // Q_BLOCK))


def heads(buf: np.ndarray, d: Dims, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q [1, hq, s, d], k, v [1, hkv, s, d] of sequence ``b`` from a [T, qkv] buffer
    laid out as this GPU's q heads, then its k heads, then its v heads."""
    rows = buf[b * d.seq:(b + 1) * d.seq]
    hd = d.head_dim

    def split(c0: int, n_heads: int) -> np.ndarray:
        return rows[:, c0:c0 + n_heads * hd].reshape(d.seq, n_heads, hd).transpose(1, 0, 2)[None]
    return split(0, d.heads_l), split(d.q_l, d.kv_l), split(d.q_l + d.kv_l * hd, d.kv_l)


def attention_apply(mem: Memory, kind: str, d: Dims, mode: str, b: int) -> None:
    """What the attention kernel computes for sequence ``b`` in ``mem`` (a functional
    GPU memory): ``kind`` ``attention`` writes ``a`` from ``qkv`` (from the KV cache
    when ``mode`` is ``decode``); ``attention_bwd`` writes ``dqkv`` from ``da``."""
    q, k, v = heads(mem.matrix("qkv", d.qkv_l), d, b)
    rows = slice(b * d.seq, (b + 1) * d.seq)
    if mode == "decode":
        kc = mem.buffers["kcache"].reshape(d.batch, d.kv_l, d.kv_len, d.head_dim)[b:b + 1]
        vc = mem.buffers["vcache"].reshape(d.batch, d.kv_l, d.kv_len, d.head_dim)[b:b + 1]
        out = nx.attention_decode(q, kc, vc)
    else:
        out, _ = nx.attention(q, k, v)
    if kind == "attention":
        mem.matrix("a", d.q_l)[rows] = out[0].transpose(1, 0, 2).reshape(d.seq, d.q_l)
        return
    da = mem.matrix("da", d.q_l)[rows].reshape(d.seq, d.heads_l, d.head_dim).transpose(1, 0, 2)[None]
    dq, dk, dv = nx.attention_bwd(da, q, k, v)
    dqkv = mem.matrix("dqkv", d.qkv_l)[rows]
    hd = d.head_dim
    for c0, t, n_heads in ((0, dq, d.heads_l), (d.q_l, dk, d.kv_l), (d.q_l + d.kv_l * hd, dv, d.kv_l)):
        dqkv[:, c0:c0 + n_heads * hd] = t[0].transpose(1, 0, 2).reshape(d.seq, n_heads * hd)


def attention_kernel(cm: ComputeModel, mem: Memory, name: str, kind: str, d: Dims, mode: str, total_sms: int,
                     sm_set: frozenset[int] | None = None,
                     decode_floor: tuple[int, float] | None = None) -> tuple[Kernel, int]:
    """(kernel, its fixed overhead in ps) of the attention kernel (``kind``
    ``attention``) or its backward (``attention_bwd``) on one GPU, with period dims
    ``d`` and ``mode`` (prefill, decode, train), on ``sm_set`` (default all
    ``total_sms`` SMs). The overhead is the compute model's attention launch cost in
    prefill/training, the memory-bound kernel's in decode; the caller charges it as
    the launch delay. ``decode_floor`` = (floor ps, rate fraction): in decode under the
    graph and eager launches, the kernel's own time is a sourced floor plus the KV
    cache read at that fraction of the calibrated HBM rate (``gpu.attn_decode_floor_us``,
    ``gpu.attn_decode_bw_fraction``; docs/compute-model.md, "The decode step")."""
    sms = len(sm_set) if sm_set else total_sms
    over = cm.memory_time_ps(0, sms, total_sms)
    if mode == "decode" and decode_floor is not None:
        nbytes = cm.attention_decode_bytes(d.heads_l, d.kv_l, d.head_dim, d.batch, d.kv_len)
        floor_ps, frac = decode_floor
        t = over + floor_ps + round(nbytes / (frac * cm.hbm_bytes_per_ps(sms, total_sms)))
    elif mode == "decode":
        t = cm.attention_decode_time_ps(d.heads_l, d.kv_l, d.head_dim, d.batch, d.kv_len, sms, total_sms)
        nbytes = max(0, t - over) * cm.hbm_bytes_per_ps(sms, total_sms)  # the KV-cache read, memory bound
    else:
        passes = "fwd" if kind == "attention" else "bwd"
        t = cm.attention_time_ps(d.heads_l, d.kv_l, d.head_dim, d.batch, d.seq, passes, sms, total_sms)
        over = round((cm.attn_overhead_fwd_ns if passes == "fwd" else cm.attn_overhead_bwd_ns) * 1000)
        nbytes = cm.attention_hbm_bytes(d.heads_l, d.kv_l, d.head_dim, d.batch, d.seq, passes)
    n_tbs = d.batch * d.heads_l * max(1, -(-d.seq // Q_BLOCK))
    body = (lambda i: attention_apply(mem, kind, d, mode, i) if i < d.batch else None) if mem.functional else None
    return even_kernel(name, max(0, t - over), n_tbs, sms, body, sm_set, nbytes), over
