"""Helpers of the GPU-local kernels of a transformer layer (the row-wise kernel,
``rowop.py``; attention, ``attention.py``; activations, ``activation.py``): a kernel
as an even TB grid, and row blocks.

Their time comes from the calibrated compute model for the whole kernel; the kernel
is cut into TBs (row blocks, or (batch, head) blocks with query blocks), and the
kernel time minus its fixed overhead is spread evenly over its waves, so the TB grid
on all SMs reproduces the calibrated kernel time and a TB-level schedule sees the
same per-TB cost. In functional mode each TB computes its rows (or heads) with the
shared numerics, so any subset of TBs gives the bits the whole kernel would.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from cais._core import CoreTb
from cais.engine import TbPlan
from cais.hw.gpu import Kernel
from cais.hw.hbm import HbmPhase

ROWS_PER_TB = 64


def row_tbs(rows: int) -> int:
    """Thread blocks of a row-wise kernel over ``rows`` rows (:data:`ROWS_PER_TB` each)."""
    return -(-rows // ROWS_PER_TB)


def even_kernel(name: str, work_ps: int, n_tbs: int, sms: int, body: Callable[[int], None] | None,
                sm_set: frozenset[int] | None = None, hbm_bytes: float = 0.0) -> Kernel:
    """``n_tbs`` TBs sharing ``work_ps`` of kernel time (overhead excluded) evenly
    per wave on ``sms`` SMs; TB ``i`` runs ``body(i)`` when it finishes. The kernel
    moves ``hbm_bytes`` through HBM: each wave its 1/waves share, each TB of a full
    wave an equal part of that (an HBM phase each), so a full wave streams at the
    kernel's own rate, hbm_bytes / work_ps, as the calibrated time assumes."""
    waves = -(-n_tbs // sms)
    tb_ps = work_ps // max(1, waves)
    tb_bytes = hbm_bytes / max(1, waves) / max(1, min(n_tbs, sms))

    phase = HbmPhase(tb_ps, tb_bytes)  # the same for every TB
    if body is None:  # timing mode: a TB is its phase, planned in the core (one object for all)
        return Kernel(name, [CoreTb.phase(phase)] * n_tbs, sm_set, hbm_phases=True)

    def planned(i: int, sm: int, busy: int) -> TbPlan:
        """TB ``i`` as a plan the core executes: its phase, then its body."""
        plan = TbPlan()
        plan.phase(phase)
        plan.call(partial(body, i))
        return plan

    return Kernel(name, [partial(planned, i) for i in range(n_tbs)], sm_set, hbm_phases=True)


def row_blocks(rows: int, per_tb: int = ROWS_PER_TB) -> list[tuple[int, int]]:
    """(first row, row count) of each row-block TB."""
    return [(r, min(per_tb, rows - r)) for r in range(0, rows, per_tb)]
