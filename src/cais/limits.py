"""Work estimates: how many discrete events a run will take, computed from its sizes
before anything is built, so a run the simulator cannot finish is refused at once
with one line instead of running without end.

The estimates are deliberately simple upper-ish counts, fitted to measured runs
(docs/errors.md, "Size limits"): a collective moves its bytes in packet trains
(a transfer unit striped over the switch chips), and each train costs a handful of
events; a GEMM, attention or row-wise kernel costs a few events per thread block.
The simulator runs roughly 40,000-200,000 events per second (fewer on systems with
many GPUs), so :data:`MAX_EVENTS` is a run of minutes; the largest shipped run, the
16 GiB ring AllReduce of ``scripts/validate_fabric.py``, is about 22 million events.
Set the environment variable ``CAIS_MAX_EVENTS`` to move the limit.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from cais.errors import UserError

if TYPE_CHECKING:
    from cais.hw.config import SystemConfig
    from cais.workload.graph import Period

DEFAULT_MAX_EVENTS = 50_000_000

# Measured cost per unit of work, in events (docs/errors.md, "Size limits"): a packet
# train of a collective costs 3.7-4.6 (NVLS) or 3.2-6.0 (ring) events; a GEMM tile 2
# events, but its TB costs as much time as about 4 events.
EVENTS_PER_TRAIN = 7
EVENTS_PER_TRAIN_NVLS = 5
EVENTS_PER_TB = 4
# A layer period's events over the count of its TBs and trains (period_events): at
# most about 3.1 for the bulk-synchronous and overlap baselines, 11-20.5 for the CAIS
# schemes, whose GEMMs load their operands tile by tile through the switch.
LAYER_FACTOR = 4
LAYER_FACTOR_CAIS = 21
# Building the machine: an input-buffer VC costs about 5 us and 2 kB, an SM about 5 us
# (measured with 100,000 of each); weighted so that 50 M allows about 2 M VCs (4 GB).
EVENTS_PER_VC = 25
EVENTS_PER_SM = 5
# cuBLAS takes 32-bit GEMM dimensions.
MAX_GEMM_DIM = 2**31 - 1


def max_events() -> int:
    """The events a run may be estimated at: ``CAIS_MAX_EVENTS`` or 50 million."""
    text = os.environ.get("CAIS_MAX_EVENTS", "")
    try:
        value = int(float(text)) if text.strip() else DEFAULT_MAX_EVENTS
    except ValueError:
        raise UserError(f"CAIS_MAX_EVENTS: expected a number of events, got '{text}'") from None
    if value <= 0:
        raise UserError(f"CAIS_MAX_EVENTS: expected a positive number of events, got '{text}'")
    return value


def check_events(estimate: float, what: str, hint: str) -> None:
    """Raise a one-line UserError if ``estimate`` events exceed the limit; ``what``
    names the run's size and the argument that sets it, ``hint`` what to do."""
    limit = max_events()
    if estimate > limit:
        raise UserError(f"{what} is estimated at {estimate:,.3g} simulated events, beyond the limit of "
                        f"{limit:,} (a run of minutes; CAIS_MAX_EVENTS moves it); {hint}")


def trains(cfg: SystemConfig, nbytes: float, unit: int) -> float:
    """Packet trains that carry ``nbytes`` cut into ``unit``-byte units, each striped
    over the switch chips (at least one packet per chip)."""
    units = -(-nbytes // max(1, unit))
    packets = -(-unit // cfg.packet.max_payload_bytes)
    return units * min(cfg.switch.chips, packets)


def check_machine(cfg: SystemConfig) -> None:
    """UserError (one line) if building ``cfg``'s machine alone (its SMs and the VCs of
    its switch ports) is beyond the limit."""
    ports = 2 * cfg.gpus * cfg.switch.chips
    estimate = cfg.gpus * EVENTS_PER_SM * cfg.gpu.sms + ports * EVENTS_PER_VC * cfg.link.vcs
    check_events(estimate, f"the system {cfg.name} ({cfg.gpus:,} GPUs x {cfg.gpu.sms:,} SMs, {ports:,} port "
                           f"directions x {cfg.link.vcs:,} VCs)", "use fewer GPUs, SMs (gpu.sms) or VCs (link.vcs)")


def collective_events(cfg: SystemConfig, op: str, algo: str, nbytes: int) -> float:
    """Estimated events of one collective of ``nbytes`` (nccl-tests size) on ``cfg``:
    every GPU sends its bus bytes (nccl-tests' busbw factor) in the transfer unit the
    kernels pick, plus a few events per TB."""
    n = cfg.gpus
    if algo == "nvls":
        channels = cfg.collective.nvls_channels
        stream = nbytes / n / channels
    else:
        channels = cfg.collective.ring_channels
        stream = min(cfg.collective.ring_step_bytes, nbytes / n / channels)
    unit = cfg.unit_for(max(1, int(stream)))
    factor = 2 * (n - 1) / n if op == "allreduce" else (n - 1) / n
    per_train = EVENTS_PER_TRAIN_NVLS if algo == "nvls" else EVENTS_PER_TRAIN
    return n * (per_train * trains(cfg, nbytes * factor, unit) + EVENTS_PER_TB * channels)


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
    from cais.kernels.attention import Q_BLOCK
    from cais.kernels.local import ROWS_PER_TB
    from cais.workload.graph import Chain, Gather, Gemm, Local

    d = period.dims

    def tiles(g: Gemm) -> int:
        return -(-g.m // 128) * -(-g.n // 128)

    tbs = 0
    moved = 0.0
    act = d.tokens * d.hidden * dtype_bytes
    for seg in period.segments:
        if isinstance(seg, Chain):
            tbs += tiles(seg.gemm1) + tiles(seg.gemm2) + -(-seg.rowop.rows // ROWS_PER_TB)
            moved += 2 * act
        elif isinstance(seg, Gather):
            moved += act
        elif isinstance(seg, Local) and seg.gemm is not None:
            tbs += tiles(seg.gemm)
        elif isinstance(seg, Local) and seg.kind.startswith("attention"):
            tbs += d.batch * d.heads_l * max(1, -(-d.seq // Q_BLOCK))
        else:
            tbs += -(-d.tokens // ROWS_PER_TB)
    unit = min(cfg.transfer_unit_bytes, cfg.collective_unit_bytes)
    factor = LAYER_FACTOR_CAIS if switch == "cais" else LAYER_FACTOR
    return factor * cfg.gpus * (EVENTS_PER_TB * tbs + EVENTS_PER_TRAIN * trains(cfg, moved, unit))


def size_text(nbytes: float) -> str:
    """``nbytes`` as the CLI writes sizes: 64K, 16M, 1.5G (binary units)."""
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):.3g}{unit}"
    return f"{int(nbytes)}"
