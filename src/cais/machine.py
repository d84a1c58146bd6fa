"""A whole simulated system: the simulator, the fabric, the GPUs and the ISA that
thread-block programs use, assembled from one :class:`SystemConfig`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from cais.engine import Channel, Simulator
from cais.errors import UserError
from cais.engine.sim import fewer_collections
from cais.hw.compute import ComputeModel
from cais.config import PS_PER_NS, PS_PER_US, SystemConfig
from cais.hw.fabric import Fabric
from cais.hw.gpu import Gpu
from cais.hw.hbm import HbmShare
from cais.hw.memory import Memory
from cais.hw.packets import Packetizer, VcMap
from cais.isa import Isa
from cais.record import MERGE_COUNTS, ChannelRecord, GpuRecord, MergeUnitRecord, RunRecord, SwitchRecord


# The simulated clock counts picoseconds in a signed 64-bit integer (the compiled
# core's i64, about 107 days). A run stops with ClockOverflow once its next event is
# past half of it, so that no sum formed on the way (an event's time plus one delay,
# the watchdog's look-ahead) can pass the clock and wrap around. cais.limits refuses
# before a run the steps that could get it there (MAX_TIME_PS, the same value).
CLOCK_GUARD_PS = 2**62

# A livelock whose events come less often than the horizon: stopped after this many
# stretches of events in a row in which nothing moved or finished (a slow machine
# moves a train or finishes a TB every few).
STALL_WAKEUPS = 10_000


class ClockOverflow(UserError):
    """A run's simulated time went past :data:`CLOCK_GUARD_PS`: its steps (latencies,
    bandwidths, GPU slowdowns) are too long for the picosecond clock. A user's mistake
    that ``cais.limits.check_times`` did not foresee; one line, as any UserError."""


class Stalled(RuntimeError):
    """The simulated system can make no more progress (a deadlock, or a program
    waiting for something that never comes); the message is one line naming what
    is stuck."""


def _waiting(ch: Channel) -> list[str]:
    return [f"{ch.name} VC {vc}: {count} train(s) queued" + (" waiting for credits" if credit else "")
            for vc, count, credit in ch.waiting()]


class Observer(Protocol):
    """What a machine needs from a recorder (``cais.results.Recorder``): it is attached
    once the machine is built, and receives the marks (named spans) code reports."""

    def attach(self, machine: "Machine") -> None: ...

    def mark(self, gpu: int, track: str, name: str, start_ps: int, end_ps: int) -> None: ...


@dataclass(frozen=True)
class Conservation:
    """Fabric-wide byte balance (payload bytes)."""

    injected: int
    delivered: int
    absorbed: int
    created: int
    per_channel_ok: bool
    per_switch_ok: bool

    @property
    def ok(self) -> bool:
        return (self.per_channel_ok and self.per_switch_ok
                and self.injected + self.created == self.delivered + self.absorbed)


class Ticker(Protocol):
    """What a machine needs from a progress report (``cais.progress.RunProgress``)."""

    def tick(self, now_ps: int, events: int) -> None: ...


def hbm_share_args(cfg: SystemConfig) -> tuple[float, int, bool, bool]:
    """(achievable bytes per ps, stream window in ps, enabled, streams yield) of each GPU's HBM: the
    compute model's calibrated effective bandwidth (its ``hbm_efficiency`` of the
    configured peak), as memory-bound kernels see it."""
    cm = ComputeModel.for_gpu(cfg.gpu)
    inter = cfg.gpu.interference
    return cm.hbm_efficiency * cm.hbm_bandwidth_GBps / PS_PER_NS, round(inter.window_ns * PS_PER_NS), inter.hbm, \
        inter.mc_policy == "compute-first"


class Machine:
    """GPUs + NVSwitch fabric + event loop. ``functional=True`` makes every memory
    operation carry real numpy data, so results can be checked against numpy.

    ``recorder`` (optional, e.g. ``cais.results.Recorder``) is attached once the
    machine is built and records what happens over time; without one, nothing is
    recorded and nothing is spent on it."""

    def __init__(self, cfg: SystemConfig, functional: bool = False, recorder: Observer | None = None,
                 progress: Ticker | None = None, mirror: bool = False) -> None:
        self.cfg = cfg
        self.functional = functional
        self.sim = Simulator()
        if progress is not None:  # told every few thousand events (cais.progress)
            self.sim.tick = progress.tick
        self.pk = Packetizer(cfg.packet)
        self.vcmap = VcMap(cfg.link)
        hbm = hbm_share_args(cfg)
        self.gpus = [Gpu(self.sim, g, cfg, Memory(functional), self.pk, self.vcmap, HbmShare(*hbm))
                     for g in range(cfg.gpus)]
        for g, factor in cfg.gpu_slowdown.items():
            self.gpus[g].slowdown = factor
        self.fabric = Fabric(self.sim, cfg, self.gpus, self.pk, self.vcmap, mirror)
        self.isa = Isa(self)
        self.launch_ps = round(cfg.gpu.kernel_launch_us * PS_PER_US)
        self._flags = 0
        #: settings the run could not honour as given: field -> (asked, the least used, why)
        self._adjusted: dict[str, tuple[float, float, str]] = {}
        self.recorder = recorder
        if recorder is not None:
            recorder.attach(self)

    def adjust(self, field: str, asked: float, used: float, why: str) -> None:
        """Record that the run used ``used`` where the setting ``field`` asked for
        ``asked`` (the least used over the run is kept), and ``why``."""
        least = min(used, self._adjusted[field][1]) if field in self._adjusted else used
        self._adjusted[field] = (asked, least, why)

    @property
    def adjusted(self) -> dict[str, str]:
        """Each setting the run could not honour as given, in one line: what was asked,
        the least used instead, and why."""
        return {f: f"{a:g} asked, {u:g} used where fewest: {why}" for f, (a, u, why) in sorted(self._adjusted.items())}

    @property
    def n(self) -> int:
        return self.cfg.gpus

    def record(self, span_ps: int) -> RunRecord:
        """The plain record of this machine's counters after a run whose measured
        interval lasted ``span_ps`` (``cais.record``; what ``cais.results`` reads)."""
        channels = []
        for ch in self.fabric.channels():
            credits = getattr(ch, "credits", None)
            peak = getattr(credits, "peak", None) if credits is not None else None
            log = getattr(credits, "log", None) if credits is not None and peak is None else None
            channels.append(ChannelRecord(ch.name, ch.wire_bytes, ch.busy_ps, credits.vcs if credits is not None else 0,
                                          tuple(peak) if peak is not None else None,
                                          tuple(tuple(e) for e in log) if log is not None else None))
        gpus = []
        for gpu in self.gpus:
            h, rb = gpu.hbm, gpu.remote
            gpus.append(GpuRecord(gpu.tbs_finished, h.phases, h.stretched, h.added_ps, h.stream_bytes, h.saturated,
                                  tuple(h.saturated_demand), rb.limit, rb.peak, rb.waited))  # type: ignore[arg-type]
        switches = []
        for sw in self.fabric.switches:
            units = getattr(sw, "units", None)
            if not units:
                continue
            recs = tuple(MergeUnitRecord(f"sw{sw.chip}.port{u.port}", u.line_bytes, u.stats.peak_lines,
                                         u.line_ps_until(span_ps), {k: getattr(u.stats, k) for k in MERGE_COUNTS},
                                         u.stats.skew_n, u.stats.skew_sum_ps, u.stats.skew_max_ps, u.stats.sessions,
                                         dict(u.tensor_peak), u.stats.lookups, u.stats.lookup_wait_ps)
                         for u in units)
            any_ps, port_ps = sw.spread.until(span_ps)
            switches.append(SwitchRecord(sw.chip, any_ps, port_ps, recs, getattr(sw, "sync_timeouts", 0)))
        return RunRecord(span_ps, self.n, self.cfg.link.bandwidth_GBps, self.cfg.links_per_gpu, tuple(channels),
                         tuple(gpus), tuple(switches))

    def flag_key(self) -> int:
        """A new synchronisation flag's key (it decides the flag's address and chip)."""
        self._flags += 1
        return self._flags

    def run(self) -> int:
        """Run until nothing is left to do. The forward-progress watchdog tells a
        stuck machine from a slow one and stops only a stuck one, with
        :class:`Stalled`:

        * a deadlock: the event queue empties while work is still pending (trains
          queued or held, TBs unfinished): no event will ever move them;
        * a livelock: events keep running for ``watchdog_horizon_us`` of simulated
          time while no train starts or is delivered, no TB finishes and no wire
          is carrying a train. Only the simulated time in which events run counts:
          a jump to the next event (a TB computing for long, a far-off timeout)
          waits for something that will come, and a train on a slow wire, or in
          flight on a long link, is a packet moving, however slowly.

        A slow machine (``link.bandwidth_GBps`` of 1e-6, a latency of seconds) takes
        as many events as a fast one and only ends later in simulated time; steps
        that could add up beyond what the clock counts are refused before the run
        (``cais.limits.check_times``), and a run whose time reaches
        :data:`CLOCK_GUARD_PS` anyway stops with :class:`ClockOverflow`."""
        sim = self.sim
        horizon = round(self.cfg.watchdog_horizon_us * PS_PER_US)
        mark, since = self._progress(), sim.now
        idle = 0  # simulated time in which events ran, nothing moved and nothing finished
        wakeups = 0  # and the stretches of events (after a jump) that did so
        with fewer_collections():
            while (nxt := sim.next_time()) is not None:
                self._check_clock(nxt)
                sim.run(until=min(nxt + horizon, CLOCK_GUARD_PS))
                now_mark = self._progress()
                if now_mark != mark or self._moving():
                    mark, since, idle, wakeups = now_mark, sim.now, 0, 0
                    continue
                idle += sim.now - nxt  # not the jump to nxt: that was a wait for a scheduled event
                wakeups += 1
                if (idle >= horizon or wakeups >= STALL_WAKEUPS) and self.pending():
                    what = (f"{self.cfg.watchdog_horizon_us:g} us of simulated time" if idle >= horizon else
                            f"{wakeups:,} wake-ups over {(sim.now - since) / PS_PER_US:,.1f} us of simulated time")
                    raise Stalled(f"no progress for {what} at t = {sim.now / PS_PER_US:,.1f} us (events ran, but no "
                                  "train moved and no TB finished): " + self._stuck_line())
            if self.pending():
                raise Stalled(f"deadlock at t = {sim.now / PS_PER_US:,.1f} us, nothing left to happen: "
                              + self._stuck_line())
        return sim.now

    def _check_clock(self, nxt: int) -> None:
        """ClockOverflow if the next event is past :data:`CLOCK_GUARD_PS`, or before
        the present (a time that wrapped around the clock)."""
        now = self.sim.now
        if nxt > CLOCK_GUARD_PS or nxt < now:
            at = f"{nxt:,} ps" if nxt >= now else "a time past the clock's end"
            raise ClockOverflow(f"simulated time would go past {CLOCK_GUARD_PS:.3g} ps ({CLOCK_GUARD_PS / 8.64e16:.1f} "
                                f"days), half of what the 64-bit picosecond clock counts: the next event is at {at}, "
                                f"after {self.sim.events:,} events; the system's steps are too long for this run: use "
                                "shorter latencies and timeouts, larger bandwidths or smaller gpu_slowdown factors")

    def _moving(self) -> bool:
        """Whether some wire is carrying a train now (serialising it, or the train is in
        flight to the far end): its arrival is scheduled, so the machine is slow, not
        stuck."""
        now = self.sim.now
        return any(ch.free_at + ch.latency_ps > now for ch in self.fabric.channels())

    def _progress(self) -> tuple[int, int, int]:
        """(trains put on a wire, payload bytes delivered, TBs finished): any change is
        progress."""
        chans = self.fabric.channels()
        return (sum(ch.trains for ch in chans), sum(ch.delivered_payload for ch in chans),
                sum(g.tbs_finished for g in self.gpus))

    def pending(self) -> bool:
        """Whether work is unfinished: TBs running or waiting, trains queued or held."""
        return bool(self.fabric.stuck() or any(g.stuck() or g.busy_sms or g.queued_kernels() for g in self.gpus))

    def _stuck_line(self) -> str:
        """One line: the first stuck item of each kind (queued port, switch buffer,
        held endpoint, waiting TBs), then how many more there are."""
        fab = self.fabric
        groups = [[line for ch in fab.channels() for line in _waiting(ch)],
                  [line for sw in fab.switches for line in sw.stuck()],
                  [line for g in self.gpus for line in g.stuck()],
                  [f"gpu{g.index}: {g.busy_sms} TB(s) waiting in {', '.join(g.running_kernels()[:3]) or 'no kernel'}"
                   for g in self.gpus if g.busy_sms or g.queued_kernels()]]
        shown = [grp[0] for grp in groups if grp]
        more = sum(len(grp) for grp in groups) - len(shown)
        return "; ".join(shown) + (f" (+{more} more)" if more else "")

    def mark(self, gpu: int, track: str, name: str, start_ps: int, end_ps: int) -> None:
        """Report a named span on GPU ``gpu`` (a collective phase, a barrier wait) on the
        timeline track ``track``; kept by the recorder if one is attached, else dropped."""
        if self.recorder is not None:
            self.recorder.mark(gpu, track, name, start_ps, end_ps)

    def conservation(self) -> Conservation:
        fab = self.fabric
        up = [ch for row in fab.up for ch in row]
        down = [ch for row in fab.down for ch in row]
        chans = up + down
        return Conservation(
            injected=sum(ch.payload_bytes for ch in up),
            delivered=sum(ch.delivered_payload for ch in down),
            absorbed=sum(sw.ledger.reduction_absorbed for sw in fab.switches),
            created=sum(sw.ledger.multicast_created for sw in fab.switches),
            per_channel_ok=all(ch.payload_bytes == ch.delivered_payload for ch in chans),
            per_switch_ok=all(sw.ledger.balanced() for sw in fab.switches),
        )
