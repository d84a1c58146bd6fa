"""The recorder: what a run did over time, for timelines and over-time metrics."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cais.errors import UserError
from cais.hw.gpu import Kernel
from cais.hw.merge import MergeUnit
from cais.machine import Machine
from cais.results.occupancy import Occupancy, level_steps, peak_per_bin, vc_occupancy
from cais.results.timeline import bins_to_cover, busy_per_bin

DEFAULT_BIN_PS = 1_000_000  # 1 us
MAX_BINS = 1_000_000


@dataclass(frozen=True)
class Mark:
    """A named span on one GPU's timeline track (a collective phase, a barrier wait),
    reported through ``Machine.mark``."""

    gpu: int
    track: str
    name: str
    start_ps: int
    end_ps: int


class Recorder:
    """A flight recorder for one machine: it switches on the logs the hardware models
    keep when asked (busy intervals of every link direction, credit changes of every
    input buffer with flow control, every kernel and TB of every GPU, the lines in use
    of every merge unit of a CAIS switch), keeps the marks code reports, and turns
    them into series after the run.

    ``bin_ps``: width of the bins link utilisation, buffer and merge-table occupancy
    are reported in over time. ``links``, ``tbs``, ``buffers``, ``merge``: which logs
    to switch on (kernels and marks are always kept; they are few; ``merge`` does
    nothing on switches without merge units).
    """

    def __init__(self, bin_ps: int = DEFAULT_BIN_PS, links: bool = True, tbs: bool = True,
                 buffers: bool = True, merge: bool = True) -> None:
        if bin_ps <= 0:
            raise ValueError(f"bin width must be positive, got {bin_ps} ps")
        self.bin_ps = bin_ps
        self.links = links
        self.tbs = tbs
        self.buffers = buffers
        self.merge = merge
        self.machine: Machine | None = None
        self.marks: list[Mark] = []

    # ---- recording ---------------------------------------------------------------
    def attach(self, m: Machine) -> None:
        """Switch on the logs of ``m`` (called by ``Machine`` once it is built)."""
        if self.machine is not None:
            raise ValueError("a Recorder records one machine; make a new one for each run")
        self.machine = m
        for ch in m.fabric.channels():
            if self.links:
                ch.timeline = []
            credits = getattr(ch, "credits", None)
            if self.buffers and credits is not None:
                credits.log = []
        for gpu in m.gpus:
            gpu.kernel_log = []
            if self.tbs:
                gpu.tb_log = []
        if self.merge:
            for unit in self._merge_units():
                unit.log = []

    def mark(self, gpu: int, track: str, name: str, start_ps: int, end_ps: int) -> None:
        self.marks.append(Mark(gpu, track, name, start_ps, end_ps))

    # ---- what was recorded ------------------------------------------------------------
    @property
    def m(self) -> Machine:
        if self.machine is None:
            raise ValueError("the recorder was never attached to a machine")
        return self.machine

    def horizon_ps(self) -> int:
        """The last time anything recorded happened."""
        times = [self.m.sim.now] + [mk.end_ps for mk in self.marks]
        times += [max(t for t, _, _ in log) for _, _, log in self._credit_logs() if log]
        times += [u.log[-1][0] for u in self._merge_units() if u.log]
        return max(times)

    def n_bins(self) -> int:
        """Bins of ``bin_ps`` covering the run; UserError past ``MAX_BINS``."""
        n = bins_to_cover(self.horizon_ps(), self.bin_ps)
        if n > MAX_BINS:
            raise UserError(f"a bin of {self.bin_ps} ps cuts this run into {n:,} bins (at most {MAX_BINS:,}); "
                            "choose a wider bin")
        return n

    def kernels(self, gpu: int) -> list[Kernel]:
        return list(self.m.gpus[gpu].kernel_log or [])

    def tb_spans(self, gpu: int) -> list[tuple[str, int, int, int]]:
        """(kernel name, SM, start_ps, end_ps) of every TB that ran on ``gpu``."""
        return list(self.m.gpus[gpu].tb_log or [])

    def link_busy(self) -> dict[str, np.ndarray]:
        """Busy picoseconds of every channel (by name) in each bin; each channel's bins
        sum to its ``busy_ps``."""
        n = self.n_bins()
        return {ch.name: busy_per_bin(ch.timeline, ch.ps_per_byte, self.bin_ps, n)
                for ch in self.m.fabric.channels() if ch.timeline is not None}

    def link_util_bins(self) -> dict[str, np.ndarray]:
        """Fraction of each bin every channel's wire was busy."""
        return {name: busy / self.bin_ps for name, busy in self.link_busy().items()}

    def _credit_logs(self) -> list[tuple[str, int, list[tuple[int, int, int]]]]:
        out = []
        for ch in self.m.fabric.channels():
            credits = getattr(ch, "credits", None)
            if credits is not None and getattr(credits, "log", None) is not None:
                out.append((ch.name, credits.vcs, credits.log))
        return out

    def buffer_occupancy(self, start_ps: int, end_ps: int) -> dict[str, list[Occupancy]]:
        """Per port direction with credits (by channel name), per VC: peak bytes over the
        run and time-weighted mean bytes over ``[start_ps, end_ps]``."""
        return {name: vc_occupancy(log, vcs, start_ps, end_ps) for name, vcs, log in self._credit_logs()}

    def buffer_peak_bins(self) -> dict[str, list[np.ndarray]]:
        """Per port direction with credits, per VC: the peak occupancy (bytes) in each bin."""
        n = self.n_bins()
        return {name: [peak_per_bin(*level_steps(log, vc), self.bin_ps, n) for vc in range(vcs)]
                for name, vcs, log in self._credit_logs()}

    def _merge_units(self) -> list[MergeUnit]:
        return [u for sw in self.m.fabric.switches for u in getattr(sw, "units", [])]

    def merge_occupancy(self) -> dict[str, tuple[np.ndarray, np.ndarray, int]]:
        """Per merge unit that logged (``sw<chip>.port<gpu>``, as the end-of-run merge
        metrics name them): the lines it held as a step function, the times it
        changed (ascending) and the lines in use from each of them on (0 before the
        first), and the unit's line size in bytes. Several changes in one picosecond
        are all kept, in the order they happened (the last is the level from then on),
        so the highest level is the unit's ``stats.peak_lines``. Empty when the
        machine has no merge units or ``merge`` was off."""
        out = {}
        for sw in self.m.fabric.switches:
            for u in getattr(sw, "units", []):
                if u.log is None:
                    continue
                arr = np.asarray(u.log, dtype=np.int64).reshape(-1, 2)
                out[f"sw{sw.chip}.port{u.port}"] = (arr[:, 0], arr[:, 1], u.line_bytes)
        return out

    def merge_peak_bins(self) -> dict[str, np.ndarray]:
        """Per merge unit that logged: the most merging-table bytes (lines x line bytes)
        it held in each bin, including levels it held for less than a picosecond."""
        n = self.n_bins()
        return {name: peak_per_bin(times, lines, self.bin_ps, n) * line_bytes
                for name, (times, lines, line_bytes) in self.merge_occupancy().items()}
