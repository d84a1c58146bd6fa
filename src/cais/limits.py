"""Work estimates: how many discrete events a run will take, computed from its sizes
before anything is built, so a run the simulator cannot finish is refused at once
with one line instead of running without end.

The limits and the cost of each unit of work live here; the estimates of a
collective, a GEMM and a layer period, which ask the kernels how many thread blocks
and packet trains they make, are ``cais.experiments.estimates``. They are
deliberately simple upper-ish counts, fitted to measured runs (docs/errors.md, "Size
limits"): a collective moves its bytes in packet trains (a transfer unit striped over
the switch chips), and each train costs a handful of events; a GEMM, attention or
row-wise kernel costs a few events per thread block.
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
    from cais.config import SystemConfig

DEFAULT_MAX_EVENTS = 50_000_000

# Measured cost per unit of work, in events (docs/errors.md, "Size limits"): a packet
# train of a layer's traffic about 7 (each collective algorithm states its own,
# kernels/algorithms.py); a GEMM tile 2 events, but its TB costs as much time as about 4.
EVENTS_PER_TRAIN = 7
EVENTS_PER_TB = 4
# Building the machine: an input-buffer VC costs about 5 us and 2 kB, an SM about 5 us
# (measured with 100,000 of each); weighted so that 50 M allows about 2 M VCs (4 GB).
EVENTS_PER_VC = 25
EVENTS_PER_SM = 5
# cuBLAS takes 32-bit GEMM dimensions.
MAX_GEMM_DIM = 2**31 - 1
# The simulated clock: integer picoseconds, a signed 64-bit count in the compiled core
# (about 107 days). A run's simulated time may reach half of it (MAX_TIME_PS, 53 days;
# cais.machine.CLOCK_GUARD_PS, where Machine.run stops a run that gets there), so that
# no sum formed on the way (an event's time plus one delay, the watchdog's look-ahead)
# passes the clock. A slow link or a long latency only stretches simulated time (the
# events, and so the wall time, stay the same), but a run's time is a sum of its
# steps along its longest chain of events, and that chain is at most all of the run's
# events: check_times refuses, before the run, a step that the run's estimated events
# could add up past MAX_TIME_PS.
MAX_TIME_PS = 2**62
# The most steps one event's delay adds up: a remote read's round trip is four link
# crossings, two switch pipelines and the home's memory latency; a credit's return one more.
STEPS_PER_DELAY = 8
# Fields that are no delay an event schedules: the watchdog's look-ahead is added once
# to the present time (and capped at the guard), so it is checked against MAX_TIME_PS alone.
ONCE_FIELDS = ("watchdog_horizon_us",)
_PS_PER = {"_ps": 1, "_ns": 1_000, "_us": 1_000_000}
# The most bytes one quantity of the machine may hold (a buffer's capacity, a bound on
# outstanding requests, a unit): half the core's signed 64-bit count, so that such a
# count plus one more quantity (a credit, a request) stays in range.
MAX_BYTES = 2**62


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


def _wire_bytes(cfg: SystemConfig, unit: int) -> int:
    """The most bytes ``unit`` payload bytes take on a link: its packets, each of whole
    flits with its header and the most extra flits any packet carries."""
    p = cfg.packet
    packets = -(-unit // p.max_payload_bytes)
    flits = -(-p.max_payload_bytes // p.flit_bytes) + p.header_flits + max(
        p.request_extra_flits, p.write_extra_flits, p.write_ack_flits)
    return packets * flits * p.flit_bytes


def _steps(cfg: SystemConfig) -> list[tuple[str, float, str, float, int]]:
    """(field, value, what one step of it is, that step in ps, the bytes a bandwidth's
    step moves or 0) for every time and bandwidth field of ``cfg`` that is set: a
    time (``*_ns``, ``*_us``) is its own step, a bandwidth (``*_GBps``) moves one
    transfer unit (the largest train; on a link with its packets' flits), a
    ``gpu_slowdown`` factor stretches 1 us of a GPU's work."""
    unit = max(cfg.transfer_unit_bytes, cfg.collective_unit_bytes)
    wire = _wire_bytes(cfg, unit)
    out: list[tuple[str, float, str, float, int]] = []

    def walk(data: dict, prefix: str) -> None:
        for key, value in data.items():
            name = prefix + key
            if key == "gpu_slowdown":
                for g, factor in value.items():
                    out.append((f"gpu_slowdown.{g}", float(factor), "1 us of GPU work", float(factor) * 1e6, 0))
            elif isinstance(value, dict):
                walk(value, name + ".")
            elif isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            elif key.endswith("_GBps"):  # GB/s == bytes per ns
                moved = wire if name == "link.bandwidth_GBps" else unit
                ps = moved * 1_000 / value if value > 0 else math.inf
                what = f"one transfer unit ({size_text(unit)} bytes" + (
                    f", {size_text(wire)} on the wire)" if moved == wire else ")")
                out.append((name, float(value), what, ps, moved))
            elif key[-3:] in _PS_PER:
                out.append((name, float(value), "one step", float(value) * _PS_PER[key[-3:]], 0))
    walk(cfg.model_dump(), "")
    return out


def _safe(x: float, down: bool) -> float:
    """``x`` to 3 significant digits, rounded toward the safe side (down for an upper
    bound, up for a lower one), so that the value a message offers passes the check."""
    r = float(f"{x:.3g}")
    if not math.isfinite(r) or r <= 0:
        return r
    step = 10.0 ** (math.floor(math.log10(r)) - 2)
    if down and r > x:
        r = float(f"{r - step:.3g}")
    elif not down and r < x:
        r = float(f"{r + step:.3g}")
    return r


def step_bound_ps(events: float) -> float:
    """The longest step a run of ``events`` (estimated) events may have: every event's
    delay is at most STEPS_PER_DELAY steps, so its time stays within MAX_TIME_PS."""
    return MAX_TIME_PS / (STEPS_PER_DELAY * max(1.0, events))


def check_times(cfg: SystemConfig, events: float) -> None:
    """UserError (one line) naming the field if one step of ``cfg``'s machine (a
    latency, a timeout, a transfer unit on a link, 1 us of a slowed GPU's work) is not
    a finite time, or is so long that a run of ``events`` (its estimate) could add its
    steps up past :data:`MAX_TIME_PS`: its time is a sum along its longest chain of
    events, at most every event, each at most :data:`STEPS_PER_DELAY` steps after the
    one it follows. The refusal offers the bound of this run (3 digits, on the safe
    side: that value passes). A slow machine is not a stalled one: its run takes as
    many events (and wall time) as a fast one and only ends later in simulated time,
    so anything within the bound runs."""
    # a run beyond the event limit is refused for its size (check_events); here only a step past the clock alone
    too_big = events > max_events()
    limit = step_bound_ps(events)
    for name, value, what, ps, moved in _steps(cfg):
        once = too_big or name in ONCE_FIELDS
        bound_ps = MAX_TIME_PS if once else limit
        if math.isfinite(value) and math.isfinite(ps) and ps <= bound_ps:
            continue
        took = f"{_human(ps)}" if math.isfinite(ps) else "longer than any time"
        if name.endswith("_GBps"):  # the bytes of one step within the bound: moved * 1000 / bound_ps
            side, bound = "at least", _safe(moved * 1_000 / bound_ps, down=False)
        else:
            per = 1e6 if name.startswith("gpu_slowdown.") else _PS_PER[name[-3:]]
            side, bound = "at most", _safe(bound_ps / per, down=True)
        unit = unit_of(name)
        clock = f"the {MAX_TIME_PS:.3g} ps ({_human(MAX_TIME_PS)}) a run's 64-bit picosecond clock may reach"
        why = (f"past {clock}" if once else
               f"and this run's {events:,.0f} estimated events could add such steps up past {clock}")
        raise UserError(f"{name}: {value:.3g} {unit} makes {what} take {took}, {why}; use {side} {bound:.3g} {unit}")


def unit_of(name: str) -> str:
    """The unit of a timing field by its name's suffix (a slowdown is a factor)."""
    if name.startswith("gpu_slowdown."):
        return "x"
    return {"_GBps": "GB/s", "_ps": "ps", "_ns": "ns", "_us": "us"}.get(
        next((k for k in ("_GBps", "_ps", "_ns", "_us") if name.endswith(k)), ""), "")


def _byte_fields(cfg: SystemConfig) -> list[tuple[str, float, float]]:
    """(field, value, the most bytes one quantity of the machine holds per unit of the
    field) for every size field of ``cfg`` that is set: ``*_bytes`` (1), ``*_kB``
    (1024), ``*_flits`` (packet.flit_bytes; a VC's depth times the links it spans where
    buffers are per link: a VC's capacity, blamed on packet.flit_bytes where a flit
    alone fills it past the bound)."""
    flit = cfg.packet.flit_bytes
    links = max(cfg.switch.links_per_gpu) if cfg.link.buffer_scope == "link" else 1
    depth = cfg.link.vc_depth_flits * links
    out: list[tuple[str, float, float]] = []

    def walk(data: dict, prefix: str) -> None:
        for key, value in data.items():
            if not isinstance(key, str):  # gpu_slowdown's GPU numbers: factors, no sizes
                continue
            name = prefix + key
            if isinstance(value, dict):
                walk(value, name + ".")
            elif isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            elif name == "link.vc_depth_flits" and flit * links * value > MAX_BYTES and flit * links > MAX_BYTES:
                out.append(("packet.flit_bytes", float(flit), float(depth)))  # the flit, not the depth, is too big
            elif name == "link.vc_depth_flits":
                out.append((name, float(value), float(flit * links)))
            elif key.endswith(("_bytes", "_kB", "_flits")):
                out.append((name, float(value), {"_kB": 1024.0, "_flits": float(flit)}.get(key[key.rfind("_"):], 1.0)))
    walk(cfg.model_dump(), "")
    return out


def check_bytes(cfg: SystemConfig) -> None:
    """UserError (one line) naming the field if a size of ``cfg`` (a buffer, a bound on
    outstanding requests, a unit; or the default outstanding bound, link bandwidth x
    a read's round trip) makes a quantity of the machine past :data:`MAX_BYTES`,
    beyond what the compiled core's 64-bit counts hold; with the bound to use (3
    digits, on the safe side: that value passes)."""
    for name, value, per in _byte_fields(cfg):
        if math.isfinite(value) and value * per <= MAX_BYTES:
            continue
        took = f"{value * per:.3g} bytes" if math.isfinite(value) else "no number of bytes"
        raise UserError(f"{name}: {value:.3g} makes a quantity of {took}, beyond the {MAX_BYTES:.3g} bytes (half "
                        f"a 64-bit count) the simulator's counters hold; use at most {_safe(MAX_BYTES / per, True):.3g}")
    if cfg.gpu.remote_outstanding_kB is None:
        rtt_ns = 4 * cfg.link.latency_ns + 2 * cfg.switch.pipeline_latency_ns + cfg.gpu.memory_latency_ns
        product = sum(cfg.switch.links_per_gpu) * cfg.link.bandwidth_GBps * rtt_ns
        if not product <= MAX_BYTES:
            raise UserError(f"gpu.remote_outstanding_kB: null takes the link bandwidth x a read's round trip, "
                            f"{product:.3g} bytes, beyond the {MAX_BYTES:.3g} bytes the simulator's counters hold; "
                            f"set gpu.remote_outstanding_kB (at most {_safe(MAX_BYTES / 1024, True):.3g}) or a "
                            "smaller link.bandwidth_GBps or link.latency_ns")


def check_machine(cfg: SystemConfig, events: float) -> None:
    """UserError (one line) if building ``cfg``'s machine alone (its SMs and the VCs of
    its switch ports) is beyond the limit, one of its sizes is past what the core's
    counts hold (check_bytes), or one of its steps is too long for a run of
    ``events`` estimated events (check_times)."""
    check_bytes(cfg)
    check_times(cfg, events)
    ports = 2 * cfg.gpus * cfg.switch.chips
    estimate = cfg.gpus * EVENTS_PER_SM * cfg.gpu.sms + ports * EVENTS_PER_VC * cfg.link.vcs
    check_events(estimate, f"the system {cfg.name} ({cfg.gpus:,} GPUs x {cfg.gpu.sms:,} SMs, {ports:,} port "
                           f"directions x {cfg.link.vcs:,} VCs)", "use fewer GPUs, SMs (gpu.sms) or VCs (link.vcs)")


def size_text(nbytes: float) -> str:
    """``nbytes`` as the CLI writes sizes: 64K, 16M, 1.5G (binary units)."""
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):.3g}{unit}"
    return f"{int(nbytes)}"
