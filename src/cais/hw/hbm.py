"""The HBM of one GPU as a shared resource: its achievable bandwidth is divided among
everything that reads or writes it at the same time.

Two kinds of users:

* **Kernel phases** (SM work): a GEMM tile's mainloop, a memory-bound kernel's TB.
  A TB program yields an :class:`HbmPhase` (how long it takes alone, how many bytes
  it moves through HBM in that time); the GPU's dispatcher turns it into a delay
  with :meth:`HbmShare.phase`.
* **Streams** driven by the fabric and copy engines: data read to be sent (stores,
  reductions, DMA), data landing (writes; reductions read, add and write back), and
  remote reads and NVLS pulls being served. They are counted, not timed, in
  ``HbmShare.stream`` (compiled, :class:`cais._core.HbmStreams`); their rate is
  estimated over the last complete window (``stream_rate``).

Model (proportional share of a saturated memory controller): when phases start,
the demand is their own rates (bytes / time alone) plus the rates of the kernel
phases still running plus the stream rate. If that exceeds the calibrated achievable
bandwidth, every user gets the same fraction supply / demand of what it asks for
(requests queue in the same controller queues and see the same delay), so the phase
takes ``time_alone * demand / supply``. Below the supply nothing changes. As with
the busy-SM count of a GEMM tile, the state at a phase's start fixes its time (the
phases starting at one instant are timed together); a phase already running is not
re-timed when another starts, and streams are not
slowed (the NVLink side, at most 2 x 450 GB/s per GPU, is the bottleneck there).
Interference only changes time: no data path goes through this class.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from cais._core import HbmStreams
from cais.engine import Signal, Simulator


_SLACK = 1e-6  # relative: float sums of rates that equal the supply do not count as over it


@dataclass(frozen=True, slots=True)
class HbmPhase:
    """What a TB yields for a compute phase that also streams HBM: ``ps`` is its time
    with the HBM to itself, ``nbytes`` what it reads and writes there meanwhile.

    ``overlapped``: the program times the phase itself (a GEMM mainloop that runs
    beside its own remote loads): it is sent the phase's time, stretched by the
    share, instead of sleeping it."""

    ps: int
    nbytes: float
    overlapped: bool = False


class HbmShare(HbmStreams):
    """One GPU's HBM: ``bytes_per_ps`` of achievable bandwidth (the calibrated
    effective figure), shared proportionally when the users together ask for more.
    ``enabled=False`` turns the sharing off (every phase takes its time alone), the
    behaviour before interference was modelled. ``window_ps`` is the window over
    which stream traffic is turned into a rate. ``streams_yield``: the memory
    controller serves the SMs first (T3's MCA), so kernel phases do not see streams."""

    def __init__(self, bytes_per_ps: float, window_ps: int, enabled: bool = True,
                 streams_yield: bool = False) -> None:
        # window, enabled and the stream counters are the compiled base's (HbmStreams:
        # the endpoint counts the fabric's streams there without entering Python)
        self.supply = bytes_per_ps
        self.streams_yield = streams_yield  # compute-first arbitration: phases do not see streams
        self._ends: list[tuple[int, int, float]] = []  # (end, seq, rate) of running kernel phases
        self._seq = 0
        self._kernel_rate = 0.0
        self._pending: list[tuple[int, float, Signal]] = []  # phases starting this instant
        self.phases = 0
        self.stretched = 0  # phases that took longer than alone
        self.added_ps = 0  # time added to phases, summed
        # Instants at which demand exceeded the supply, and what asked for it there,
        # summed in units of the supply: phases starting, phases running, streams.
        self.saturated = 0
        self.saturated_demand = [0.0, 0.0, 0.0]

    # ---- kernel phases ------------------------------------------------------------
    def kernel_rate(self, now: int) -> float:
        """Bytes per ps asked for by kernel phases running at ``now``."""
        ends = self._ends
        while ends and ends[0][0] <= now:
            self._kernel_rate -= heapq.heappop(ends)[2]
        if not ends:
            self._kernel_rate = 0.0  # no drift from float sums
        return self._kernel_rate

    def request(self, sim: Simulator, ps: int, nbytes: float) -> Signal:
        """A phase that starts now, takes ``ps`` alone and moves ``nbytes``. The
        returned signal fires at the end of this instant with the phase's time:
        ``ps`` stretched by demand / supply when demand exceeds supply. Phases that
        start at the same instant (a wave of tiles) are timed together, so they see
        the same demand."""
        sig = Signal()
        if not self._pending:
            sim.after(0, self._resolve, sim)
        self._pending.append((ps, nbytes, sig))
        return sig

    def _resolve(self, sim: Simulator) -> None:
        now, batch, self._pending = sim.now, self._pending, []
        rates = [nbytes / ps if ps > 0 else 0.0 for ps, nbytes, _ in batch]
        streams = 0.0 if self.streams_yield else self.stream_rate(now)
        starting, running = sum(rates), self.kernel_rate(now)
        factor = (starting + running + streams) / self.supply
        if factor > 1.0 + _SLACK:
            self.saturated += 1
            for i, part in enumerate((starting, running, streams)):
                self.saturated_demand[i] += part / self.supply
        for (ps, _, sig), rate in zip(batch, rates):
            out = round(ps * factor) if factor > 1.0 + _SLACK else ps
            if rate > 0.0:
                self._seq += 1
                heapq.heappush(self._ends, (now + out, self._seq, rate))
                self._kernel_rate += rate
            self.phases += 1
            if out > ps:
                self.stretched += 1
                self.added_ps += out - ps
            sig.fire(sim, out)
