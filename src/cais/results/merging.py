"""Merge-unit metrics of a finished run (CAIS switches only), from its record
(``cais.record``): how full the merging tables got, how long requests for one address
took to all arrive, and what became of the mergeable requests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cais.config import PS_PER_US
from cais.record import MERGE_COUNTS, RunRecord, SwitchRecord

BYTES_PER_KB = 1000


@dataclass(frozen=True)
class MergeMetrics:
    """``peak_kB`` / ``mean_kB``: per port (``sw<chip>.port<gpu>``), the most table data
    held at once and its time average over the run span (lines x line bytes, kB =
    1000 B); ``skew_us``: per address, first-to-last arrival of the requests that one
    access expects from the GPUs (merged or not; mean and max); ``counts``: requests that
    merged into a session another had opened (``merged``), that went unmerged
    (``bypassed``; ``bypassed_loads`` of them loads), and sessions ended early by LRU
    eviction (``evicted``), by the idle timer (``timed_out``) or by the merge tracker
    once their address had no requester left to come (``tracked``); ``ports``: per chip,
    how concentrated its sessions were (:func:`port_concentration`); ``by_tensor_kB``:
    per tensor whose accesses merge (its buffer: a sub-layer's reduced rows or
    gathered shard), the most table data its sessions held at once on any port."""

    peak_kB: dict[str, float]
    mean_kB: dict[str, float]
    skew_mean_us: float
    skew_max_us: float
    counts: dict[str, int]
    sessions: int
    ports: dict[str, dict[str, float]]
    by_tensor_kB: dict[str, float]
    #: line lookups the units made (requests and the homes' load data, one per line) and
    #: the time they waited for a free lookup slot (``switch.merge.lookups_per_ns``), in
    #: all; not in :meth:`as_json` (the goldens' record), read by the cost experiment
    lookups: int = 0
    lookup_wait_us: float = 0.0
    #: TB groups the Group Sync Tables released by their timeout, not complete
    sync_timeouts: int = 0

    def as_json(self) -> dict[str, Any]:
        chips = self.ports.values()
        return {"merge_table_peak_kB": {"max": max(self.peak_kB.values(), default=0.0), "per_port": self.peak_kB},
                "merge_table_peak_kB_by_tensor": dict(self.by_tensor_kB),
                "merge_table_mean_kB": {"max": max(self.mean_kB.values(), default=0.0),
                                        "mean": sum(self.mean_kB.values()) / max(1, len(self.mean_kB)),
                                        "per_port": self.mean_kB},
                "arrival_skew_us": {"mean": self.skew_mean_us, "max": self.skew_max_us},
                "merge": dict(self.counts), "merge_sessions": self.sessions,
                **({"sync_timeouts": self.sync_timeouts} if self.sync_timeouts else {}),
                "merge_ports": {
                    "holding_sessions": sum(c["holding_sessions"] for c in chips) / max(1, len(chips)),
                    "busiest_share": sum(c["busiest_share"] for c in chips) / max(1, len(chips)),
                    "per_chip": {k: dict(v) for k, v in self.ports.items()}}}


def port_concentration(sw: SwitchRecord) -> dict[str, float]:
    """Of one chip's merge units over the run: how many held sessions at once while
    any did (``holding_sessions``, of its units), and the busiest unit's share of the
    chip's line-time (``busiest_share``: 1/units when even)."""
    line = [u.line_ps for u in sw.units]
    total = sum(line)
    return {"holding_sessions": sw.port_ps / sw.any_ps if sw.any_ps else 0.0,
            "busiest_share": max(line) / total if total else 0.0,
            "busiest_port": float(line.index(max(line))) if total else -1.0}


def merge_metrics(rec: RunRecord) -> MergeMetrics | None:
    """:class:`MergeMetrics` of a run over its span, None when its switches have no
    merge units."""
    units = [u for sw in rec.switches for u in sw.units]
    if not units:
        return None
    span_ps = rec.span_ps
    peak, mean = {}, {}
    counts = {key: 0 for key in MERGE_COUNTS}
    skew_n = skew_sum = skew_max = sessions = lookups = wait_ps = 0
    for u in units:
        peak[u.name] = u.peak_lines * u.line_bytes / BYTES_PER_KB
        mean[u.name] = u.line_ps / span_ps * u.line_bytes / BYTES_PER_KB if span_ps > 0 else 0.0
        for key in counts:
            counts[key] += u.counts[key]
        skew_n += u.skew_n
        skew_sum += u.skew_sum_ps
        skew_max = max(skew_max, u.skew_max_ps)
        sessions += u.sessions
        lookups += u.lookups
        wait_ps += u.lookup_wait_ps
    ports = {f"sw{sw.chip}": port_concentration(sw) for sw in rec.switches}
    tensors: dict[str, float] = {}
    for u in units:
        for tensor, lines in u.tensor_peak.items():
            tensors[tensor] = max(tensors.get(tensor, 0.0), lines * u.line_bytes / BYTES_PER_KB)
    return MergeMetrics(peak, mean, skew_sum / skew_n / PS_PER_US if skew_n else 0.0, skew_max / PS_PER_US, counts,
                        sessions, ports, dict(sorted(tensors.items())), lookups, wait_ps / PS_PER_US,
                        sum(sw.sync_timeouts for sw in rec.switches))
