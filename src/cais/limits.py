"""Work estimates: how many discrete events a run will take, computed from its sizes
before anything is built, so a run the simulator cannot finish is refused at once
with one line instead of running without end.

The estimates are deliberately simple upper-ish counts, fitted to measured runs
(docs/errors.md, "Size limits"): a collective moves its bytes in packet trains
(a transfer unit striped over the switch chips), and each train costs a handful of
events; a GEMM, attention or row-wise kernel costs a few events per thread block.
The simulator runs roughly 350,000 (a layer on 72 GPUs) to 2,500,000 (a collective on
8) events per second with the compiled core (docs/validation.md section 15), so
:data:`MAX_EVENTS` is a run of half a minute to a few minutes; the largest shipped run,
the 16 GiB ring AllReduce of ``scripts/validate_fabric.py``, is about 22 million events.
Set the environment variable ``CAIS_MAX_EVENTS`` to move the limit.
"""

from __future__ import annotations

import math
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
# A staged NVLS AllReduce's step on one TB beyond its data (kernels/nvls_staged.py):
# two polls, the fence's probes and the counter stores, each fanned out over the GPUs;
# measured 644 on dgx-h100 (8 GPUs, 4 chips) at 16 MiB.
EVENTS_PER_STAGED_STEP = 700
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
# The longest one step of the machine may take, in simulated picoseconds: the range of
# a 64-bit picosecond clock (about 107 days). A slow link or a long latency only
# stretches simulated time (the events, and so the wall time, stay the same), but a
# step past this is no machine anyone simulates, and past about 1e308 ps the times
# are no longer numbers (check_times).
MAX_STEP_PS = 2**63 - 1
_PS_PER = {"_ps": 1, "_ns": 1_000, "_us": 1_000_000}


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


class TooBig(UserError):
    """A run estimated beyond the event limit: one line, as any UserError; it also
    carries the estimate and the limit, so a caller that knows a cheaper way to run
    the same thing (mirror mode for a symmetric run) can say so."""

    def __init__(self, message: str, estimate: float = 0.0, limit: int = 0) -> None:
        super().__init__(message)
        self.estimate = estimate
        self.limit = limit

    def __reduce__(self) -> tuple:  # whole across processes (sweep workers)
        return (type(self), (str(self), self.estimate, self.limit))


def check_events(estimate: float, what: str, hint: str) -> None:
    """Raise a one-line :class:`TooBig` (a UserError) if ``estimate`` events exceed
    the limit; ``what`` names the run's size and the argument that sets it, ``hint``
    what to do."""
    limit = max_events()
    if estimate > limit:
        raise TooBig(f"{what} is estimated at {estimate:,.3g} simulated events, beyond the limit of "
                     f"{limit:,} (a run of minutes; CAIS_MAX_EVENTS moves it); {hint}", estimate, limit)


def mirror_hint(exc: TooBig, gpus: int) -> str:
    """The words that offer mirror mode to a symmetric run ``exc`` refused (it
    simulates GPU 0 only: about ``gpus`` times fewer events), or "" where even that
    is beyond the limit. Library words: ``sim='mirror'`` (the command shows
    ``--sim mirror``)."""
    mirrored = exc.estimate / max(1, gpus)
    if mirrored > exc.limit:
        return ""
    return (f", or sim='mirror' (this run is symmetric: GPU 0 is simulated, the other GPUs are its images), "
            f"estimated at {mirrored:,.3g} events")


def trains(cfg: SystemConfig, nbytes: float, unit: int) -> float:
    """Packet trains that carry ``nbytes`` cut into ``unit``-byte units, each striped
    over the switch chips (at least one packet per chip)."""
    units = -(-nbytes // max(1, unit))
    packets = -(-unit // cfg.packet.max_payload_bytes)
    return units * min(cfg.switch.chips, packets)


def _human(ps: float) -> str:
    """A span of simulated time in words: 3.2 h, 107 days, 3.4e+05 years."""
    s = ps / 1e12
    for unit, size in (("years", 365.25 * 86400), ("days", 86400), ("h", 3600), ("min", 60)):
        if s >= size:
            return f"{s / size:,.3g} {unit}"
    return f"{s:.3g} s"


def _steps(cfg: SystemConfig) -> list[tuple[str, float, str, float, float]]:
    """(field, value, what one step of it is, that step in ps, the bound on the value)
    for every time and bandwidth field of ``cfg`` that is set: a time (``*_ns``,
    ``*_us``) is its own step and may be at most the bound, a bandwidth (``*_GBps``)
    moves one transfer unit and must be at least it, a ``gpu_slowdown`` factor
    stretches 1 us of a GPU's work and may be at most it."""
    unit = max(cfg.transfer_unit_bytes, cfg.collective_unit_bytes)
    out: list[tuple[str, float, str, float, float]] = []

    def walk(data: dict, prefix: str) -> None:
        for key, value in data.items():
            name = prefix + key
            if key == "gpu_slowdown":
                for g, factor in value.items():
                    f = float(factor)
                    out.append((f"gpu_slowdown.{g}", f, "1 us of GPU work", f * 1e6, MAX_STEP_PS / 1e6))
            elif isinstance(value, dict):
                walk(value, name + ".")
            elif isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            elif key.endswith("_GBps"):  # GB/s == bytes per ns
                ps = unit * 1_000 / value if value > 0 else math.inf
                out.append((name, float(value), f"one transfer unit ({size_text(unit)} bytes)", ps,
                            unit * 1_000 / MAX_STEP_PS))
            elif key[-3:] in _PS_PER:
                per = _PS_PER[key[-3:]]
                out.append((name, float(value), "one step", float(value) * per, MAX_STEP_PS / per))
    walk(cfg.model_dump(), "")
    return out


def check_times(cfg: SystemConfig) -> None:
    """UserError (one line) naming the field if one step of ``cfg``'s machine (a
    latency, a timeout, a transfer unit on a link, a GPU slowed down) is not a
    finite time or takes longer than :data:`MAX_STEP_PS`. A slow machine is not a
    stalled one: its run takes as many events (and wall time) as a fast one and only
    ends later in simulated time, so anything within the bound runs."""
    for name, value, what, ps, bound in _steps(cfg):
        if not math.isfinite(value) or not math.isfinite(ps) or ps > MAX_STEP_PS:
            took = f"{ps:.3g} ps ({_human(ps)})" if math.isfinite(ps) else "longer than any number of ps"
            side = "at least" if name.endswith("_GBps") else "at most"
            raise UserError(f"{name}: {value:.3g} makes {what} take {took} of simulated time, beyond the "
                            f"{MAX_STEP_PS:.3g} ps ({_human(MAX_STEP_PS)}) one step of the machine may take "
                            f"(such a run would be slow, not stuck); use {side} {bound:.3g}")


def check_machine(cfg: SystemConfig) -> None:
    """UserError (one line) if building ``cfg``'s machine alone (its SMs and the VCs of
    its switch ports) is beyond the limit, or one of its steps takes longer than the
    simulated clock counts (check_times)."""
    check_times(cfg)
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
    events = n * (per_train * trains(cfg, nbytes * factor, unit) + EVENTS_PER_TB * channels)
    if algo == "nvls" and op == "allreduce" and cfg.collective.nvls_buffers == "staged":
        from cais.kernels.nvls_staged import chunk_bytes
        chunk = chunk_bytes(nbytes, channels, n, cfg.collective.nvls_chunk_bytes)
        steps = -(-nbytes // (channels * n * chunk))
        events += n * channels * steps * EVENTS_PER_STAGED_STEP * cfg.switch.chips / 4
    return events


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
