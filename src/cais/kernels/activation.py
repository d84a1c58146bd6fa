"""The activation kernel between FC1 and FC2 (and its backward): GELU over
``f`` [T, ffn], or SwiGLU over its gate and up halves [T, 2 ffn], into ``g`` [T, ffn].

It stands for the elementwise kernel (Megatron's fused bias-GELU / SwiGLU): one TB
per row block, memory bound. Its time is the compute model's elementwise GELU cost
over [T, fc1 width] (SwiGLU reads gate and up: costed as GELU on that width), twice
that for the backward; in functional mode each TB computes its rows with the shared
numerics (``workload/numerics.py``).
"""

from __future__ import annotations

from cais.hw.compute import ComputeModel
from cais.hw.gpu import Kernel
from cais.hw.memory import Memory
from cais.kernels.local import even_kernel, row_blocks
from cais.workload import numerics as nx
from cais.workload.graph import Dims

KINDS = ("act", "act_bwd")


def activation_apply(mem: Memory, kind: str, d: Dims, r0: int, nr: int) -> None:
    """What one TB of the activation kernel computes on rows ``[r0, r0 + nr)`` in
    ``mem`` (a functional GPU memory): ``act`` writes ``g`` from ``f``; ``act_bwd``
    writes ``df`` from ``dg`` and ``f``. Gated (SwiGLU) when ``d.gated``."""
    f = mem.matrix("f", d.fc1_l)[r0:r0 + nr]
    if kind == "act":
        out = mem.matrix("g", d.ffn_l)[r0:r0 + nr]
        out[:] = nx.gelu(f) if not d.gated else nx.swiglu(f[:, :d.ffn_l], f[:, d.ffn_l:])
        return
    dg = mem.matrix("dg", d.ffn_l)[r0:r0 + nr]
    df = mem.matrix("df", d.fc1_l)[r0:r0 + nr]
    if d.gated:
        dgate, dup = nx.swiglu_bwd(dg, f[:, :d.ffn_l], f[:, d.ffn_l:])
        df[:, :d.ffn_l], df[:, d.ffn_l:] = dgate, dup
    else:
        df[:] = nx.gelu_bwd(dg, f)


def activation_kernel(cm: ComputeModel, mem: Memory, name: str, kind: str, d: Dims, total_sms: int,
                      sm_set: frozenset[int] | None = None, small_ps: int = 0) -> tuple[Kernel, int]:
    """(kernel, its fixed overhead in ps) of the activation (``kind`` ``act``) or its
    backward (``act_bwd``) over all ``d.tokens`` rows on one GPU, on ``sm_set``
    (default all ``total_sms`` SMs). The overhead is the memory-bound kernel's; the
    caller charges it as the launch delay; ``small_ps``: the small-kernel floor added to
    its own work (decode under the graph and eager launches, ``gpu.small_kernel_us``)."""
    sms = len(sm_set) if sm_set else total_sms
    over = cm.memory_time_ps(0, sms, total_sms)
    blocks = row_blocks(d.tokens)
    # GELU over [T, ffn]; SwiGLU reads gate and up ([T, 2 ffn]): costed as GELU on that width.
    t = cm.elementwise_time_ps("gelu", d.tokens, d.fc1_l, sms, total_sms) - over
    if kind == "act_bwd":
        t *= 2
    nbytes = t * cm.hbm_bytes_per_ps(sms, total_sms)
    t += small_ps
    body = (lambda i: activation_apply(mem, kind, d, *blocks[i])) if mem.functional else None
    # memory bound: it streams at the kernel's own bandwidth for its whole time
    return even_kernel(name, t, len(blocks), sms, body, sm_set, nbytes), over


def rows_activation_kernel(cm: ComputeModel, name: str, kind: str, rows: int, fc1_width: int, total_sms: int,
                           sm_set: frozenset[int] | None = None) -> tuple[Kernel, int]:
    """(kernel, its fixed overhead) of an activation (``act``) or its backward
    (``act_bwd``) over ``rows`` rows of FC1 width ``fc1_width`` (SwiGLU: gate and up),
    costed as :func:`activation_kernel` costs the layer's: a MoE layer's experts, whose
    rows the routing decides. Timing only: it moves no data."""
    sms = len(sm_set) if sm_set else total_sms
    over = cm.memory_time_ps(0, sms, total_sms)
    if rows <= 0:
        return even_kernel(name, 0, 1, sms, None, sm_set), over
    t = cm.elementwise_time_ps("gelu", rows, fc1_width, sms, total_sms) - over
    if kind == "act_bwd":
        t *= 2
    nbytes = t * cm.hbm_bytes_per_ps(sms, total_sms)
    return even_kernel(name, t, len(row_blocks(rows)), sms, None, sm_set, nbytes), over
