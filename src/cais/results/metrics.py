"""Link, buffer and HBM metrics of a finished run, from the run's record
(``cais.record.RunRecord``: the counters every channel and GPU keeps; no recorder
needed), and the one definition of link utilisation every report uses
(docs/fabric-model.md, "Link utilisation")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cais.record import RunRecord
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


def wire_bytes_per_gpu(rec: RunRecord) -> dict[int, dict[str, int]]:
    """Wire bytes (payload plus headers) each GPU sent (``up``) and received (``down``)."""
    out = {g: {d: 0 for d in DIRECTIONS} for g in range(rec.gpus)}
    for ch in rec.channels:
        port = port_direction(ch.name)
        if port is not None:
            out[port.gpu][port.direction] += ch.wire_bytes
    return out


def gpu_bandwidth_bytes_per_ps(rec: RunRecord) -> float:
    """A GPU's total NVLink bandwidth per direction, bytes per picosecond."""
    return rec.link_bandwidth_GBps * rec.links_per_gpu / 1000  # GB/s == bytes/ns


def link_utilisation(rec: RunRecord, span_ps: int | None = None) -> LinkUtil:
    """THE link utilisation of a run whose measured interval lasted ``span_ps`` (a
    collective: from its launch to its end; a layer: the period; default the record's)."""
    span_ps = rec.span_ps if span_ps is None else span_ps
    chans = rec.channels
    if span_ps <= 0 or not chans:
        return LinkUtil(0.0, 0.0, "", {g: {d: 0.0 for d in DIRECTIONS} for g in range(rec.gpus)})
    capacity = gpu_bandwidth_bytes_per_ps(rec) * span_ps
    per_gpu = {g: {d: b / capacity for d, b in dirs.items()} for g, dirs in wire_bytes_per_gpu(rec).items()}
    values = [u for dirs in per_gpu.values() for u in dirs.values()]
    busiest = max(chans, key=lambda ch: ch.busy_ps)
    return LinkUtil(sum(values) / len(values), busiest.busy_ps / span_ps, busiest.name, per_gpu)


def buffer_peaks_kB(rec: RunRecord) -> dict[str, float]:
    """Peak input-buffer occupancy (kB = 1000 bytes; the fullest virtual channel) of every
    port direction with credit flow control: from the credit counter's own peak (one
    entry per VC) when it keeps one, else from its log when a recorder set one. Ports
    without credits (or with neither) are left out."""
    out: dict[str, float] = {}
    for ch in rec.channels:
        if ch.credit_peak is not None:
            out[ch.name] = max(ch.credit_peak, default=0) / BYTES_PER_KB
        elif ch.credit_log is not None:
            levels = [level_steps(ch.credit_log, vc)[1] for vc in range(ch.vcs)]
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


def hbm_metrics(rec: RunRecord) -> HbmMetrics:
    """:class:`HbmMetrics` of a finished run."""
    out = {}
    for g, r in enumerate(rec.gpu):
        at = {name: part / r.hbm_saturated if r.hbm_saturated else 0.0
              for name, part in zip(("starting", "running", "streams"), r.hbm_saturated_demand)}
        out[g] = {"tbs": r.tbs, "phases": r.hbm_phases, "stretched": r.hbm_stretched, "added_us": r.hbm_added_ps / 1e6,
                  "stream_GB": r.hbm_stream_bytes / 1e9, "saturated": r.hbm_saturated,
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


def run_metrics(rec: RunRecord) -> RunMetrics:
    """:class:`RunMetrics` of a finished run, from its record (its span: the measured
    interval)."""
    return RunMetrics(link_utilisation(rec), wire_bytes_per_gpu(rec), buffer_peaks_kB(rec), merge_metrics(rec),
                      hbm_metrics(rec), remote_requests(rec))


def remote_requests(rec: RunRecord) -> dict[str, float] | None:
    """Each GPU's bound on outstanding remote SM requests (``gpu.remote_outstanding_kB``):
    its limit, the most any GPU held at once, and how many requests waited for room;
    None when no TB used it."""
    if not any(r.remote_peak for r in rec.gpu):
        return None
    return {"limit_kB": rec.gpu[0].remote_limit / BYTES_PER_KB,
            "peak_kB": max(r.remote_peak for r in rec.gpu) / BYTES_PER_KB,
            "waited": sum(r.remote_waited for r in rec.gpu)}


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
