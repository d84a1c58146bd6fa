"""What a finished run leaves behind: a plain record of the counters every channel,
GPU and merge unit kept, taken from the machine once the run is over
(``Machine.record``). ``cais.results`` computes its metrics from this record alone, so
it never reads the live machine; the record knows nothing of how the machine is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: what became of a merge unit's mergeable requests and sessions, counted per unit
MERGE_COUNTS = ("merged", "bypassed", "bypassed_loads", "evicted", "timed_out", "tracked")


@dataclass(frozen=True)
class ChannelRecord:
    """One port direction of the fabric (``gpu3->sw1``, ``sw1->gpu3``, ...): the bytes it
    carried on the wire (payload and headers), the time its wire was busy, and its
    input buffer's occupancy where it has credit flow control: the peak per VC its
    credit counter kept (``credit_peak``), or the log a recorder made it keep
    (``credit_log``: (time, vc, level) steps) over ``vcs`` VCs."""

    name: str
    wire_bytes: int
    busy_ps: int
    vcs: int = 0
    credit_peak: tuple[int, ...] | None = None
    credit_log: tuple[tuple[int, int, int], ...] | None = None


@dataclass(frozen=True)
class GpuRecord:
    """One GPU's counters: the TBs it finished; what its shared HBM did (compute phases
    timed against the share, how many took longer than alone and the time that added,
    the bytes of fabric and copy streams, the instants demand exceeded supply and the
    demand there of phases starting, running and streams); its bound on outstanding
    remote SM requests (limit, most held at once, requests that waited)."""

    tbs: int
    hbm_phases: int
    hbm_stretched: int
    hbm_added_ps: int
    hbm_stream_bytes: int
    hbm_saturated: int
    hbm_saturated_demand: tuple[float, float, float]
    remote_limit: int
    remote_peak: int
    remote_waited: int


@dataclass(frozen=True)
class MergeUnitRecord:
    """One CAIS merge unit (``sw<chip>.port<gpu>``) over the run's span: its line size,
    the most lines it held at once, its line-time (lines held x time), the counts of
    what became of the mergeable requests (merged, bypassed, ...), the arrival skew of
    the requests of one access (count, sum, max), the sessions it opened, per tensor
    the most lines that tensor's sessions held, and its line lookups with the time they
    waited for a free lookup slot (``switch.merge.lookups_per_ns``)."""

    name: str
    line_bytes: int
    peak_lines: int
    line_ps: int
    counts: dict[str, int]
    skew_n: int
    skew_sum_ps: int
    skew_max_ps: int
    sessions: int
    tensor_peak: dict[str, int] = field(default_factory=dict)
    lookups: int = 0
    lookup_wait_ps: int = 0


@dataclass(frozen=True)
class SwitchRecord:
    """One switch chip with merge units: the time any of its units held a session,
    the time summed over its units (how many held sessions at once), and its units."""

    chip: int
    any_ps: int
    port_ps: int
    units: tuple[MergeUnitRecord, ...]
    #: TB groups its Group Sync Table released by their timeout (``cais.sync_timeout_us``)
    sync_timeouts: int = 0


@dataclass(frozen=True)
class RunRecord:
    """A finished run over [0, ``span_ps``]: the GPUs and their NVLink bandwidth per
    direction (``link_bandwidth_GBps`` x ``links_per_gpu``), every channel, every GPU,
    and the switch chips that have merge units (none on an NVLS switch)."""

    span_ps: int
    gpus: int
    link_bandwidth_GBps: float
    links_per_gpu: int
    channels: tuple[ChannelRecord, ...]
    gpu: tuple[GpuRecord, ...]
    switches: tuple[SwitchRecord, ...] = ()
