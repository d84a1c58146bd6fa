"""Link, buffer and HBM metrics of a finished run, from counters every channel and
GPU keeps (no recorder needed), and the one definition of link utilisation every
report uses (docs/fabric-model.md, "Link utilisation")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cais.machine import Machine
from cais.results.merging import MergeMetrics, merge_metrics
from cais.results.occupancy import level_steps
from cais.results.ports import port_direction

DIRECTIONS = ("up", "down")
BYTES_PER_KB = 1000


@dataclass(frozen=True)
class LinkUtil:
    """Link utilisation over a run span.

    ``per_gpu[g][d]``: wire bytes GPU ``g`` carried in direction ``d`` (``up``: GPU ->
    switches, ``down``: switches -> GPU) over its total NVLink bandwidth per direction
    x span (a link-count-weighted mean over its ports); ``mean``: the mean of all GPU
    directions; ``max``: the busiest single port direction's wire-busy time / span
    (``busiest`` names it)."""

    mean: float
    max: float
    busiest: str
    per_gpu: dict[int, dict[str, float]]

    def as_json(self) -> dict[str, Any]:
        return {"mean": self.mean, "max": self.max,
                "per_gpu": {str(g): dict(d) for g, d in sorted(self.per_gpu.items())}}


def wire_bytes_per_gpu(m: Machine) -> dict[int, dict[str, int]]:
    """Wire bytes (payload plus headers) each GPU sent (``up``) and received (``down``)."""
    out = {g: {d: 0 for d in DIRECTIONS} for g in range(m.n)}
    for ch in m.fabric.channels():
        port = port_direction(ch.name)
        if port is not None:
            out[port.gpu][port.direction] += ch.wire_bytes
    return out


def gpu_bandwidth_bytes_per_ps(m: Machine) -> float:
    """A GPU's total NVLink bandwidth per direction, bytes per picosecond."""
    return m.cfg.link.bandwidth_GBps * m.cfg.links_per_gpu / 1000  # GB/s == bytes/ns


def link_utilisation(m: Machine, span_ps: int) -> LinkUtil:
    """THE link utilisation of a run whose measured interval lasted ``span_ps`` (a
    collective: from its launch to its end; a layer: the period)."""
    chans = m.fabric.channels()
    if span_ps <= 0 or not chans:
        return LinkUtil(0.0, 0.0, "", {g: {d: 0.0 for d in DIRECTIONS} for g in range(m.n)})
    capacity = gpu_bandwidth_bytes_per_ps(m) * span_ps
    per_gpu = {g: {d: b / capacity for d, b in dirs.items()} for g, dirs in wire_bytes_per_gpu(m).items()}
    values = [u for dirs in per_gpu.values() for u in dirs.values()]
    busiest = max(chans, key=lambda ch: ch.busy_ps)
    return LinkUtil(sum(values) / len(values), busiest.busy_ps / span_ps, busiest.name, per_gpu)


def buffer_peaks_kB(m: Machine) -> dict[str, float]:
    """Peak input-buffer occupancy (kB = 1000 bytes; the fullest virtual channel) of every
    port direction with credit flow control: from the credit counter's own ``peak``
    (one entry per VC) when it keeps one, else from its ``log`` when a recorder set
    one. Ports without credits (or with neither) are left out."""
    out: dict[str, float] = {}
    for ch in m.fabric.channels():
        credits = getattr(ch, "credits", None)
        if credits is None:
            continue
        peak = getattr(credits, "peak", None)
        if peak is not None:
            out[ch.name] = max(peak, default=0) / BYTES_PER_KB
            continue
        log = getattr(credits, "log", None)
        if log is not None:
            levels = [level_steps(log, vc)[1] for vc in range(credits.vcs)]
            out[ch.name] = max((max(0, int(lv.max())) for lv in levels if len(lv)), default=0) / BYTES_PER_KB
    return out


@dataclass(frozen=True)
class HbmMetrics:
    """What shared HBM bandwidth did to the run (hw/hbm.py): per GPU, the TBs it ran,
    the compute phases timed against the share, how many took longer than alone, the time added
    to them (summed over phases, so concurrent phases each count), the fabric
    and copy traffic counted as streams, and the instants at which demand exceeded
    the supply with what asked for it there on average (phases starting, phases
    running, streams; in units of the supply)."""

    per_gpu: dict[int, dict[str, float]]

    def as_json(self) -> dict[str, Any]:
        tot = {k: sum(d[k] for d in self.per_gpu.values()) for k in ("tbs", "phases", "stretched", "saturated")}
        return {"hbm": {**tot, "added_us_max": max((d["added_us"] for d in self.per_gpu.values()), default=0.0),
                        "per_gpu": {str(g): dict(d) for g, d in sorted(self.per_gpu.items())}}}


def hbm_metrics(m: Machine) -> HbmMetrics:
    """:class:`HbmMetrics` of machine ``m`` after a run."""
    out = {}
    for g, gpu in enumerate(m.gpus):
        h = gpu.hbm
        at = {name: part / h.saturated if h.saturated else 0.0
              for name, part in zip(("starting", "running", "streams"), h.saturated_demand)}
        out[g] = {"tbs": gpu.tbs_finished, "phases": h.phases, "stretched": h.stretched, "added_us": h.added_ps / 1e6,
                  "stream_GB": h.stream_bytes / 1e9, "saturated": h.saturated,
                  **{f"saturated_{k}": v for k, v in at.items()}}
    return HbmMetrics(out)


@dataclass(frozen=True)
class RunMetrics:
    """The fabric metrics every run reports: link utilisation, wire bytes per GPU and
    direction, peak buffer occupancy per port (only ports with credits), and on CAIS
    switches the merge units' metrics (``merge``; None otherwise); and what shared HBM
    did (``hbm``)."""

    link_util: LinkUtil
    wire_bytes: dict[int, dict[str, int]]
    buffer_peak_kB: dict[str, float]
    merge: MergeMetrics | None = None
    hbm: HbmMetrics | None = None
    remote: dict[str, float] | None = None

    def as_json(self) -> dict[str, Any]:
        out = {"link_util": self.link_util.as_json(),
               "wire_bytes": {str(g): dict(d) for g, d in sorted(self.wire_bytes.items())},
               "buffer_peak_kB": dict(self.buffer_peak_kB)}
        if self.remote is not None:
            out["remote_requests"] = dict(self.remote)
        if self.merge is not None:
            out.update(self.merge.as_json())
        if self.hbm is not None:
            out.update(self.hbm.as_json())
        return out


def run_metrics(m: Machine, span_ps: int) -> RunMetrics:
    """:class:`RunMetrics` of machine ``m`` after a run whose measured interval lasted
    ``span_ps``."""
    return RunMetrics(link_utilisation(m, span_ps), wire_bytes_per_gpu(m), buffer_peaks_kB(m),
                      merge_metrics(m, span_ps), hbm_metrics(m), remote_requests(m))


def remote_requests(m: Machine) -> dict[str, float] | None:
    """Each GPU's bound on outstanding remote SM requests (``gpu.remote_outstanding_kB``):
    its limit, the most any GPU held at once, and how many requests waited for room;
    None when no TB used it."""
    bounds = [g.remote for g in m.gpus]
    if not any(b.peak for b in bounds):
        return None
    return {"limit_kB": bounds[0].limit / BYTES_PER_KB, "peak_kB": max(b.peak for b in bounds) / BYTES_PER_KB,
            "waited": sum(b.waited for b in bounds)}


def mirrored(metrics: RunMetrics, n: int) -> RunMetrics:
    """A mirror-mode run's metrics (only GPU 0 simulated, the other GPUs its images):
    GPU 0's stand for every GPU's; buffer peaks of GPU 0's ports only."""
    lu = metrics.link_util
    per_gpu = {g: dict(lu.per_gpu[0]) for g in range(n)}
    mean = sum(per_gpu[0].values()) / len(per_gpu[0])
    wire = {g: dict(metrics.wire_bytes[0]) for g in range(n)}
    peaks = {k: v for k, v in metrics.buffer_peak_kB.items() if k.startswith("gpu0->") or k.endswith("->gpu0")}
    hbm = None if metrics.hbm is None else HbmMetrics({g: dict(metrics.hbm.per_gpu[0]) for g in range(n)})
    return RunMetrics(LinkUtil(mean, lu.max, lu.busiest, per_gpu), wire, peaks, metrics.merge, hbm, metrics.remote)
