"""The row-wise kernel between a sub-layer's reduction and its next GEMM: fused
dropout + residual add + norm (LayerNorm or RMSNorm) in the forward, and its
backward (norm backward + residual gradient add + dropout backward).

It stands for the fused, memory-bound kernels Megatron runs there (bias-dropout-add
followed by its LayerNorm kernel): one TB per block of rows, each row read and
written once. The time comes from the calibrated compute model's memory-bound cost
for the bytes of every tensor it reads and writes; in functional mode each TB
computes its rows with the shared numerics (``workload/numerics.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import numpy as np

from cais.engine import Countdown, Signal, TbPlan
from cais.hw.compute import ComputeModel
from cais.hw.gpu import Kernel
from cais.hw.hbm import HbmPhase
from cais.hw.memory import Memory
from cais.kernels.local import even_kernel, row_blocks
from cais.machine import Machine
from cais.workload import numerics as nx
from cais.workload.graph import Dims, RowOp


def row_offset(d: Dims, g: int) -> int:
    """Global index of GPU ``g``'s first row of the row-wise ops: its token shard's
    start with sequence parallelism, 0 without (every GPU holds all rows)."""
    return g * d.rows_l if d.sp else 0


def rowop_bytes(op: RowOp, dtype_bytes: int, rows: int) -> int:
    """HBM bytes the fused row-wise kernel reads and writes over ``rows`` rows
    (forward: x, z in; x, n out; backward: dres, dz, x in; dx, dzo out)."""
    return (len(op.inputs) + len(op.outputs)) * rows * op.cols * dtype_bytes


def rowop_work_ps(cm: ComputeModel, op: RowOp, dtype_bytes: int, rows: int, sms: int, total_sms: int) -> int:
    """Time of the fused row-wise kernel over ``rows`` rows on ``sms`` of the GPU's
    ``total_sms`` SMs, without its fixed overhead: memory bound on :func:`rowop_bytes`."""
    nbytes = rowop_bytes(op, dtype_bytes, rows)
    return cm.memory_time_ps(nbytes, sms, total_sms) - cm.memory_time_ps(0, sms, total_sms)


def rowop_apply(mem: Memory, op: RowOp, r0: int, nr: int, norm: str, p_drop: float, row0: int = 0) -> None:
    """What one TB of the row-wise kernel computes: rows ``[r0, r0 + nr)`` of ``op``
    in ``mem`` (a functional GPU memory). ``norm`` is the model's norm
    (``layernorm`` or ``rmsnorm``), ``p_drop`` the dropout probability and ``row0``
    the global index of the GPU's first row (:func:`row_offset`), which seeds the
    dropout mask. The backward also accumulates the norm's weight gradients."""
    h = op.cols

    def rows_of(name: str) -> np.ndarray:
        return mem.matrix(name, h)[r0:r0 + nr]

    grows = np.arange(r0, r0 + nr) + row0
    gamma = mem.buffers[f"{op.norm}_g"]
    beta = mem.buffers.get(f"{op.norm}_b")
    if op.kind == "residual_norm":
        x = rows_of(op.inputs["x"]) + nx.dropout(rows_of(op.inputs["z"]), grows, p_drop, op.seed)
        rows_of(op.outputs["x"])[:] = x
        rows_of(op.outputs["n"])[:] = nx.norm(norm, x, gamma, beta)
    else:
        dx_n, dgamma, dbeta = nx.norm_bwd(norm, rows_of(op.inputs["dz"]), rows_of(op.inputs["x"]), gamma)
        dx = rows_of(op.inputs["dres"]) + dx_n
        rows_of(op.outputs["dx"])[:] = dx
        rows_of(op.outputs["dzo"])[:] = nx.dropout_bwd(dx, grows, p_drop, op.seed)
        mem.buffers[f"d{op.norm}_g"] += dgamma
        if dbeta is not None:
            mem.buffers[f"d{op.norm}_b"] += dbeta


def rowop_kernel(cm: ComputeModel, mem: Memory, op: RowOp, dtype_bytes: int, norm: str, p_drop: float,
                 row0: int, total_sms: int, sm_set: frozenset[int] | None = None,
                 rows: Sequence[tuple[int, int]] | None = None, small_ps: int = 0) -> Kernel:
    """The fused dropout + residual + norm kernel (or its backward) on one GPU: one TB
    per row block of ``rows`` ((first row, count) pairs; default all ``op.rows`` rows
    in :func:`row_blocks`), on ``sm_set`` (default all ``total_sms`` SMs). The
    kernel time (:func:`rowop_work_ps`, fixed overhead excluded) is spread evenly
    over its waves; in functional mode (``mem.functional``) each TB runs
    :func:`rowop_apply` on its rows. ``small_ps``: the small-kernel floor added to its
    work (decode under the graph and eager launches, ``gpu.small_kernel_us``)."""
    blocks = list(rows) if rows is not None else row_blocks(op.rows)
    sms = len(sm_set) if sm_set else total_sms
    nrows = sum(c for _, c in blocks)
    work = rowop_work_ps(cm, op, dtype_bytes, nrows, sms, total_sms) + small_ps
    body = (lambda i: rowop_apply(mem, op, *blocks[i], norm, p_drop, row0)) if mem.functional else None
    return even_kernel(op.name, work, len(blocks), sms, body, sm_set, rowop_bytes(op, dtype_bytes, nrows))


def signalled_rowop_kernel(m: Machine, cm: ComputeModel, g: int, mem: Memory, op: RowOp, dtype_bytes: int,
                           norm: str, p_drop: float, row0: int, total_sms: int, blocks: Sequence[tuple[int, int]],
                           expected: Sequence[int], keys: Sequence[int], flags: Sequence[int],
                           ready: Sequence[dict[tuple[int, int], Countdown]], sm_set: frozenset[int]) -> Kernel:
    """The row-wise op on GPU ``g`` as row-block TBs driven by TB-level dependencies
    (CAIS's fused sub-layer): TB ``b`` (rows ``blocks[b]``) waits until its GPU's
    signal word ``keys[b]`` reaches ``expected[b]`` bytes (every GPU's ``red.cais``
    partial of the rows fed to it has landed), normalises its rows, and multicasts
    the flag ``flags[b]`` that they are ready; as it lands on each GPU ``h``,
    ``ready[h][(g, b)]`` (a countdown of one) fires. The kernel time over ``op.rows`` rows on ``sm_set``
    (:func:`rowop_work_ps`) is spread evenly over its waves; in functional mode each
    TB runs :func:`rowop_apply` on its rows."""
    sms = len(sm_set)
    waves = -(-len(blocks) // sms)
    tb_ps = rowop_work_ps(cm, op, dtype_bytes, op.rows, sms, total_sms) // max(1, waves)

    def finish(b: int) -> None:
        """Block ``b``'s rows normalised (functional mode); its flag multicast, each copy
        counted into its GPU's ``ready`` in the core as it lands."""
        if mem.functional:
            r0, nr = blocks[b]
            rowop_apply(mem, op, r0, nr, norm, p_drop, row0)
        m.isa.flag_multicast_counts(g, flags[b], [per_gpu[(g, b)] for per_gpu in ready])

    # block b's signal word at its expected bytes: every partial of its rows is in
    landed = [Signal() for _ in blocks]
    for b, sig in enumerate(landed):
        m.isa.wait_signal(g, keys[b], expected[b], partial(sig.fire, m.sim))

    def planned(b: int, sm: int, busy: int) -> TbPlan:
        """TB ``b`` as a plan the core executes: it waits for its signal word, runs
        its phase, then finishes its block."""
        plan = TbPlan()
        plan.wait(landed[b])
        plan.phase(HbmPhase(tb_ps, rowop_bytes(op, dtype_bytes, blocks[b][1])))
        plan.call(partial(finish, b))
        return plan

    kernel = Kernel(op.name, [partial(planned, b) for b in range(len(blocks))], sm_set, hbm_phases=True)
    kernel.gates = lambda: [[sig] for sig in landed]  # launch on ready: a block's TB once its rows are in
    return kernel
