"""Run one collective on a simulated system and report it as nccl-tests would."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from cais.errors import UserError
from cais.config import PS_PER_US, SystemConfig
from cais.engine.sim import fewer_collections
from cais.machine import Conservation, Machine
from cais.kernels.algorithms import algorithm, names
from cais.kernels.collectives import OPS, CollectiveSpec, build, shard_bounds
from cais.kernels.protocols import PROTOCOL_CHOICES
from cais.kernels.tuning import choose_for
from cais.experiments.estimates import collective_events
from cais.limits import check_events, check_machine, max_events, size_text
from cais.results import LinkUtil, Recorder, RunMetrics, run_metrics
from cais.results.metrics import mirrored

if TYPE_CHECKING:
    from cais.progress import RunProgress


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw / algbw factor."""
    return 2 * (n - 1) / n if op == "allreduce" else (n - 1) / n


@dataclass(frozen=True)
class CollectiveResult:
    """Timing of one collective: nccl-tests' time, algbw and busbw, the fabric metrics
    over the interval from its launch to its end (link utilisation, wire bytes, buffer
    peaks), and simulator statistics."""

    op: str
    algo: str
    gpus: int
    nbytes: int
    time_us: float
    algbw_GBps: float
    busbw_GBps: float
    metrics: RunMetrics
    events: int
    wall_s: float
    correct: bool | None
    conservation: Conservation
    sim: str = "full"  # "full": every GPU simulated; "mirror": GPU 0 only (SIM_MODES)
    protocol: str = "simple"  # the wire protocol (kernels/protocols.py)
    chosen_by: str = "asked"  # "asked": as given; "nccl": NCCL's choice by size (kernels/tuning.py);
    # "nccl-protocol": the algorithm as given, its protocol NCCL's choice by size
    nvls_buffers: str | None = None  # NVLS: "staged" (kernels/nvls_staged.py) or "registered" (zero-copy)
    provenance: Provenance | None = None  # what made it (CollectiveRunSpec.run sets it; cais.provenance)

    @property
    def link_util(self) -> LinkUtil:
        return self.metrics.link_util

    @property
    def wire_util(self) -> float:
        """The busiest port direction's wire-busy time over the span (``link_util.max``)."""
        return self.metrics.link_util.max

    def as_json(self) -> dict[str, object]:
        return {"op": self.op, "algo": self.algo, "protocol": self.protocol, "chosen_by": self.chosen_by,
                "nvls_buffers": self.nvls_buffers, "gpus": self.gpus, "bytes": self.nbytes,
                "time_us": self.time_us, "algbw_GBps": self.algbw_GBps, "busbw_GBps": self.busbw_GBps,
                "wire_util": self.wire_util, **self.metrics.as_json(), "events": self.events, "wall_s": self.wall_s,
                "sim": self.sim, **({"provenance": self.provenance.flat()} if self.provenance is not None else {})}


def _fill(m: Machine, spec: CollectiveSpec, rng: np.random.Generator) -> list[np.ndarray]:
    """Random integer-valued inputs (sums are exact in float64); returns the expected
    recv buffer of every GPU."""
    n, count = m.n, spec.count
    bounds = shard_bounds(count, n)
    full = [rng.integers(-1000, 1000, size=count).astype(np.float64) for _ in range(n)]
    total = np.sum(full, axis=0)
    expected = []
    for g, gpu in enumerate(m.gpus):
        s, c = bounds[g]
        if spec.op == "allgather":
            gpu.memory.alloc("send", c, fill=full[g][s:s + c])
            expected.append(np.concatenate([full[k][bounds[k][0]:sum(bounds[k])] for k in range(n)]))
            gpu.memory.alloc("recv", count)
        elif spec.op == "reducescatter":
            gpu.memory.alloc("send", count, fill=full[g])
            gpu.memory.alloc("recv", c)
            expected.append(total[s:s + c])
        else:
            gpu.memory.alloc("send", count, fill=full[g])
            gpu.memory.alloc("recv", count)
            expected.append(total)
    return expected


def check_collective(cfg: SystemConfig, op: str, algo: str, nbytes: int, elem_bytes: int = 2,
                     mirror: bool = False) -> int:
    """The element count of a collective of ``nbytes`` (nccl-tests size); UserError
    (one line) for an unknown op or algorithm, a size that is not whole elements or
    too small to shard, or a run too big to simulate (cais.limits)."""
    if op not in OPS:
        raise UserError(f"op: unknown collective '{op}'; valid: {', '.join(OPS)}")
    algorithm(algo).check(op)
    if nbytes <= 0 or nbytes % elem_bytes:
        raise UserError(f"bytes: must be a positive multiple of {elem_bytes} (bf16 elements), got {nbytes}")
    count = nbytes // elem_bytes
    if op != "allreduce" and count % cfg.gpus:
        count -= count % cfg.gpus  # nccl-tests rounds AllGather/ReduceScatter sizes to n equal shards
        if count == 0:
            raise UserError(f"bytes: {op} needs at least {cfg.gpus * elem_bytes} bytes on {cfg.gpus} GPUs")
    per = cfg.gpus if mirror else 1  # mirror mode simulates one GPU's share
    estimate = collective_events(cfg, op, algo, count * elem_bytes) / per
    check_machine(cfg, estimate)
    fixed = collective_events(cfg, op, algo, 0) / per  # the TBs alone, whatever the size
    hint = ("its TBs alone come near the limit: use fewer GPUs or channels (collective.*_channels)"
            if 2 * fixed > max_events() else
            f"use bytes of at most about {size_text(nbytes * (max_events() - fixed) / (estimate - fixed))}")
    check_events(estimate, f"bytes {nbytes:,}: a {algo} {op} on {cfg.gpus} GPUs", hint)
    return count


SIM_MODES = ("full", "mirror")


def mirror_misfit(cfg: SystemConfig, functional: bool = False) -> str:
    """Why a collective cannot be simulated in mirror mode ("" if it can): every GPU
    must run the same program shifted by its index, on GPUs and ports that are alike.
    Detected from the run, not assumed."""
    # Shards may differ by one element (nccl-tests sizes): GPU 0, the one simulated,
    # holds the largest, so its image is the slowest GPU.
    if cfg.gpu_slowdown:
        return "gpu_slowdown makes GPUs unlike"
    if cfg.switch.model not in ("auto", "nvls"):
        return f"switch model '{cfg.switch.model}' is not the NVLS switch"
    if functional:
        return "functional mode needs every GPU's data"
    return ""


# Mirror mode holds while at most this fraction of the packets striped travel in
# units smaller than one packet per link (a shard's remainder tail does; a small
# message's all do).
MIRROR_UNEVEN_SHARE = 0.01


def check_mirror(m: Machine) -> None:
    """UserError (one line) if more than 1 % of a mirror-mode run's packets went in
    units too small to reach every link: then GPUs load the switch chips unlike (by address),
    GPU 0's image does not stand for them, and the error against the full model grew
    to 3 % in the checks (docs/validation.md section 10)."""
    fab = m.fabric
    if fab.mirror and fab.uneven_packets > MIRROR_UNEVEN_SHARE * fab.mirror_packets:
        links = len(fab.link_chip)
        share = 100 * fab.uneven_packets / fab.mirror_packets
        raise UserError(f"sim mirror: {share:.0f} % of the packets went in transfer units smaller than one packet "
                        f"per link ({links} links x {m.cfg.packet.max_payload_bytes} B), where GPUs "
                        "load the switch chips unlike and mirror mode does not hold; use sim='full' (small "
                        "messages are cheap in full)")


def buffers_of(spec: CollectiveSpec) -> str | None:
    """How an NVLS collective reaches the buffers (None for a ring): staged
    through NCCL's own (AllReduce only) or registered, zero-copy."""
    if spec.algo != "nvls":
        return None
    return "staged" if spec.staged and spec.op == "allreduce" else "registered"


def resolve_choice(cfg: SystemConfig, op: str, algo: str, protocol: str, nbytes: int) -> tuple[str, str, str]:
    """(algorithm, protocol, chosen_by) to run: as asked, or where either is "auto",
    NCCL's choice by size (kernels/tuning.py) among what the other allows. chosen_by:
    "asked" (both given), "nccl" (the algorithm chosen, and the protocol unless
    given), "nccl-protocol" (the algorithm given, forced as ``NCCL_ALGO`` forces it;
    the protocol NCCL's choice by size for it)."""
    if protocol not in PROTOCOL_CHOICES:
        raise UserError(f"protocol: unknown '{protocol}'; valid: {', '.join(PROTOCOL_CHOICES)}")
    if algo not in ("auto", *names()):
        raise UserError(f"algo: unknown algorithm '{algo}'; valid: auto, {', '.join(names())}")
    a = algorithm(algo) if algo != "auto" else None
    if a is not None and protocol != "auto":
        a.check(a.ops[0], protocol)
    if a is not None and not a.nccl:  # not NCCL's: nothing to choose
        return algo, protocol if protocol != "auto" else a.protocols[0], "asked"
    if a is not None and protocol != "auto":
        return algo, protocol, "asked"
    c = choose_for(cfg, op, nbytes, algo, protocol)
    return c.algo, c.protocol, "nccl" if algo == "auto" else "nccl-protocol"


def run_collective(cfg: SystemConfig, op: str, algo: str, nbytes: int, functional: bool = False,
                   seed: int = 0, elem_bytes: int = 2, recorder: Recorder | None = None,
                   progress: RunProgress | None = None, sim: str = "full",
                   protocol: str = "simple") -> CollectiveResult:
    """Simulate ``op`` with ``algo`` and ``protocol`` on a ``nbytes`` buffer
    (nccl-tests size); either may be "auto" (NCCL's choice by size); a ``recorder``,
    if given, records the run (the collective kernel on each GPU is marked on its
    ``collective`` track)."""
    if sim not in SIM_MODES:
        raise UserError(f"sim: unknown mode '{sim}'; valid: {', '.join(SIM_MODES)}")
    algo, protocol, chosen_by = resolve_choice(cfg, op, algo, protocol, nbytes)
    mirror = sim == "mirror"
    misfit = mirror_misfit(cfg, functional) if mirror else ""
    if misfit:
        raise UserError(f"sim mirror: this collective is not symmetric: {misfit}; use sim='full'")
    count = check_collective(cfg, op, algo, nbytes, elem_bytes, mirror)
    spec = CollectiveSpec(op, algo, count, elem_bytes, protocol=protocol,
                          host_ps=round(cfg.collective.host_us * PS_PER_US),
                          staged=cfg.collective.nvls_buffers == "staged")
    if progress is not None:
        estimate = collective_events(cfg, op, algo, count * elem_bytes) / (cfg.gpus if mirror else 1)
        progress.begin(estimate, f"{algo} {op} of {size_text(count * elem_bytes)} on {cfg.gpus} GPUs")
    t0 = time.perf_counter()
    with fewer_collections():  # building the kernels makes many objects too
        m = Machine(cfg, functional=functional, recorder=recorder, progress=progress, mirror=mirror)
        expected = _fill(m, spec, np.random.default_rng(seed)) if functional else None
        kernels = build(m, spec)
        if mirror:  # GPU 0 alone; the others are its images
            kernels = kernels[:1]
        for gpu, k in zip(m.gpus, kernels):
            gpu.launch(k, m.launch_ps)
        m.run()
    check_mirror(m)
    end = max(k.finished_at or 0 for k in kernels)
    wall = time.perf_counter() - t0
    for g, k in enumerate(kernels):
        if k.started_at is not None and k.finished_at is not None:
            m.mark(g, "collective", "launch", 0, m.launch_ps)
            m.mark(g, "collective", f"{algo} {op}", k.started_at, k.finished_at)
    correct = None
    if expected is not None:
        correct = all(np.array_equal(gpu.memory.buffers["recv"], exp) for gpu, exp in zip(m.gpus, expected))
    t_us = end / PS_PER_US
    algbw = spec.nbytes / (end / 1e12) / 1e9
    metrics = run_metrics(m.record(max(1, end - m.launch_ps)))
    if mirror:
        metrics = mirrored(metrics, m.n)
    return CollectiveResult(op, algo, m.n, spec.nbytes, t_us, algbw, algbw * bus_factor(op, m.n), metrics,
                            m.sim.events, wall, correct, m.conservation(), sim, protocol, chosen_by,
                            buffers_of(spec))
