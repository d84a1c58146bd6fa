"""NCCL's choice of algorithm and protocol by message size, as NCCL makes it.

NCCL does not measure: it estimates each (algorithm, protocol) pair's time as
``latency + bytes / bandwidth`` from a table of constants and the topology graph,
and runs the cheapest (NVIDIA/nccl ``src/graph/tuning.cc``, ``ncclTopoTuneModel``
and ``ncclTopoGetAlgoTime``; ``src/enqueue.cc``, ``topoGetAlgoInfo``). We make the
same estimate with the same constants to make the same *choice*; the time a run
reports is then simulated, packet by packet, never taken from this estimate.

The constants (NVIDIA/nccl at 5067397, tuning.cc 139-212, topo.h 19-24; summarised,
not copied; docs/fabric-model.md, "Protocols", lists them with their lines):

- base latency per protocol (Ring: LL 6.6, LL128 14.0, Simple 8.4 us) plus, per ring
  step, the NVLink hardware latency (LL 0.6, LL128 1.9, Simple 3.4 us); NVLS: 25 us
  and nothing else;
- bandwidth: the graph's per-link effective NVLink bandwidth (sm90: 20.6 GB/s, sm100:
  40.1 GB/s) times the links; LL keeps half of it, capped (sm90: 141, sm100: 282
  GB/s); LL128 keeps 0.92 of it, capped per channel (sm90: 36.7, sm100: 40 GB/s);
  NVLS: the NVLS efficiency (sm90: 0.85, sm100: 0.74) times (channels - 1) /
  channels, doubled for AllReduce;
- bus bandwidth to algorithm bandwidth: n / steps (AllReduce: n / (2 (n - 1))).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cais.errors import UserError

if TYPE_CHECKING:
    from cais.config import SystemConfig


@dataclass(frozen=True)
class ArchTable:
    """NCCL's tuning constants of one GPU generation."""

    link_GBps: float  # effective bandwidth per NVLink per direction (topo.h)
    ll_max_GBps: float  # LL's cap on bus bandwidth, one node (llMaxBws)
    ll128_per_channel_GBps: float  # LL128's cap per channel (perChMaxRingLL128Bws)
    nvls_efficiency: float  # nvlsEfficiency


TABLES = {"sm90": ArchTable(20.6, 141.0, 36.7, 0.85), "sm100": ArchTable(40.1, 282.0, 40.0, 0.74)}
RING_BASE_US = {"ll": 6.6, "ll128": 14.0, "simple": 8.4}
RING_NVLINK_STEP_US = {"ll": 0.6, "ll128": 1.9, "simple": 3.4}
NVLS_LATENCY_US = 25.0
LL128_FACTOR = 0.92
LL_FACTOR = 0.5


@dataclass(frozen=True)
class Choice:
    """An (algorithm, protocol) pair and NCCL's estimate for it (us), the reason it
    was chosen."""

    algo: str
    protocol: str
    estimate_us: float


#: NCCL's per-thread work thresholds before it adds threads or channels (comm.h), and
#: the most threads a ring channel runs per protocol (device.h): LL's threshold is
#: multiplied by the ranks for Ring (tuning.cc).
THREAD_THRESHOLD = {"ll": 8, "ll128": 8, "simple": 64}
MAX_THREADS = {"ll": 512, "ll128": 640, "simple": 512}


def ring_launch(nbytes: int, n: int, protocol: str, max_channels: int) -> tuple[int, int]:
    """The channels and threads per channel NCCL launches a ring collective of
    ``nbytes`` (the larger of its send and receive buffers) with: from ``max_channels``
    it drops a channel while ``nbytes < channels x threads x threshold``, then on one
    channel halves the threads (multiples of 128 only) while the same holds
    (NVIDIA/nccl ``src/enqueue.cc``, ``topoGetAlgoInfo``; summarised, not copied).
    On 8 GPUs in LL: one channel up to 32 KiB (128 threads at 8 KiB, 256 at 16 KiB),
    2 at 64 KiB, 4 at 128 KiB, 8 at 256 KiB, all 16 from 512 KiB."""
    threshold = THREAD_THRESHOLD[protocol] * (n if protocol == "ll" else 1)
    nt = MAX_THREADS[protocol]
    nc = max_channels
    while nbytes < nc * nt * threshold and nc >= 2:
        nc -= 1
    while nbytes < nc * nt * threshold and nt % 128 == 0:
        nt //= 2
    return nc, max(nt, 96)  # at least three warps (enqueue.cc)


def ring_steps(op: str, n: int) -> int:
    return 2 * (n - 1) if op == "allreduce" else n - 1


def estimates(op: str, nbytes: int, n: int, links: int, ring_channels: int, nvls_channels: int,
              arch: str = "sm90", nvls: bool = True) -> list[Choice]:
    """NCCL's estimate for every (algorithm, protocol) pair it could run ``op`` of
    ``nbytes`` with on ``n`` GPUs, each with ``links`` NVLinks to the switches."""
    try:
        t = TABLES[arch]
    except KeyError:
        raise UserError(f"collective.tuning: unknown '{arch}'; valid: {', '.join(TABLES)}") from None
    steps = ring_steps(op, n)
    to_alg = n / steps
    ring_bus = links * t.link_GBps
    out = []
    for proto in ("ll", "ll128", "simple"):
        bus = {"ll": min(t.ll_max_GBps, LL_FACTOR * ring_bus),
               "ll128": min(LL128_FACTOR * ring_bus, ring_channels * t.ll128_per_channel_GBps),
               "simple": ring_bus}[proto]
        lat = RING_BASE_US[proto] + steps * RING_NVLINK_STEP_US[proto]
        out.append(Choice("ring", proto, lat + nbytes / (1000 * bus * to_alg)))
    if nvls and nvls_channels >= 2:
        per_channel = ring_bus / nvls_channels * t.nvls_efficiency * (nvls_channels - 1) / nvls_channels
        per_channel *= 2 if op == "allreduce" else (n - 1) / n
        bus = nvls_channels * per_channel
        alg = bus * to_alg if op == "allreduce" else bus
        out.append(Choice("nvls", "simple", NVLS_LATENCY_US + nbytes / (1000 * alg)))
    return out


def choose(op: str, nbytes: int, n: int, links: int, ring_channels: int, nvls_channels: int, arch: str = "sm90",
           algo: str = "auto", protocol: str = "auto") -> Choice:
    """The pair NCCL would run: the cheapest estimate among those ``algo`` and
    ``protocol`` allow ("auto": any). NVLS runs Simple only."""
    cands = [c for c in estimates(op, nbytes, n, links, ring_channels, nvls_channels, arch)
             if algo in ("auto", c.algo) and protocol in ("auto", c.protocol)]
    if not cands:
        raise UserError(f"protocol: '{protocol}' cannot run algo '{algo}'; NVLS runs the simple protocol only")
    return min(cands, key=lambda c: c.estimate_us)


def choose_for(cfg: SystemConfig, op: str, nbytes: int, algo: str = "auto", protocol: str = "auto") -> Choice:
    """:func:`choose` on ``cfg``'s GPUs, links, channels and tuning table."""
    c = cfg.collective
    return choose(op, nbytes, cfg.gpus, sum(cfg.switch.links_per_gpu), c.ring_channels, c.nvls_channels, c.tuning,
                  algo, protocol)
