"""One GPU: its memory, its NVLink endpoint (what happens when a packet arrives,
compiled: :class:`cais._core.Endpoint`), and its SMs with the thread-block (TB)
dispatcher that places kernels' TBs on them. An SM's store path is
:class:`SmPort` (compiled: the rate at which the SM pushes the data it stores)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from cais._core import (CopyLoop, Endpoint, KeptLines, LoadPlan, LoadStream, RedForm, RedPlan, RedStream, ReduceStream,
                        RowBlocks, SmPort, StoreChains, TbDispatcher)
from cais.engine import Bound, Signal, Simulator
from cais.engine.sim import ProgramGen, TbPlan
from cais.config import SystemConfig
from cais.hw.hbm import HbmShare
from cais.hw.memory import Memory
from cais.hw.packets import Packetizer, VcMap
__all__ = ["CopyLoop", "Gpu", "KeptLines", "Kernel", "LoadPlan", "LoadStream", "RedForm", "RedPlan", "RedStream",
           "ReduceStream", "RowBlocks", "SmPort", "StoreChains", "TbProgram"]

# A TB program: called with (sm index, SMs busy when it starts) it returns the
# generator the SM runs, or the TB's plan for the core to execute (a TbPlan).
TbProgram = Callable[[int, int], ProgramGen | TbPlan]

# What a kernel's TBs wait for before their first step, asked when the kernel becomes
# dispatchable: per TB, the signals (data landed, a flag, a TB group's release) whose
# firing makes it ready to be placed on an SM (launch on ready, ``gpu.tb_launch``).
TbGates = Callable[[], list[list[Signal]]]


@dataclass
class Kernel:
    """A kernel launch: a grid of TB programs, optionally confined to a set of SMs (an
    SM partition, as when a collective runs beside a GEMM). ``done`` fires when every
    TB has finished. ``role`` says what the kernel is for: ``"communication"`` for
    collective kernels, ``"compute"`` for everything else (fused kernels included).
    ``hbm_phases``: its TBs yield :class:`~cais.hw.hbm.HbmPhase` compute phases, which
    the GPU times against its shared HBM (hw/hbm.py). ``priority``: a higher value is
    served first when SMs free up (a CUDA stream priority); equal ones in launch order.
    A kernel launches once: the GPU's dispatcher takes each TB's program out of ``tbs``
    as it starts the TB (leaving None; the list keeps its length, the kernel's TB
    count), so what a TB's factory holds is freed as the kernel runs. ``launched``: where
    set, fired when the kernel becomes dispatchable (its dependencies met, plus its
    launch overhead), for work a kernel brings beside it that needs no SM of its own
    (a copy engine's copies; kernels/remote_copy.py). ``gates``: where set, what each TB
    waits for before its first step (:data:`TbGates`); with ``gpu.tb_launch = on-ready``
    a TB is placed on an SM only once they have fired (its program still waits for
    them, at once), with ``on-launch`` it waits for them on its SM. ``placed``: where
    set, fired when its last TB has been placed on an SM. ``tb_ps`` and ``tb_wait_ps``,
    set when it ends: the SM time its TBs held SMs, and the part they spent waiting
    there for data, flags or TB-group syncs."""

    name: str
    tbs: list[TbProgram | None]
    sms: frozenset[int] | None = None
    role: str = "compute"
    hbm_phases: bool = False
    priority: int = 0
    done: Signal = field(default_factory=Signal)
    started_at: int | None = None
    finished_at: int | None = None
    launched: Signal | None = None
    gates: TbGates | None = None
    placed: Signal | None = None
    tb_ps: int = 0
    tb_wait_ps: int = 0


class Gpu(Endpoint):
    """A GPU in the fabric.

    Endpoint (compiled, :class:`cais._core.Endpoint`): an NVLink input buffer per
    switch chip and VC, drained as packets arrive: writes and reductions land in
    memory; read requests (plain or NVLS pulls) are answered after
    ``memory_latency_ps``, at most ``serve_bytes`` at once (a request beyond that
    waits in its buffer, holding its credits); responses, deliveries and flags call
    the issuer's completion (``train.done``); signal words (``signal``,
    ``wait_signal``). Its ports to the switch chips are bound by the fabric
    (``connect``), and it puts trains on them (``inject``).

    SMs: a dispatcher puts the TBs of launched kernels on free SMs, one TB per SM.
    Policy when kernels compete (as Hopper's TB scheduler without stream priorities
    does): kernels are served in the order they became dispatchable (launch time plus
    launch overhead); each takes every free SM it may use (its SM set) before the next
    is looked at, and TBs run to completion (no preemption). So a kernel launched
    while another holds SMs gets only the SMs left, and its tiles run in more waves
    (the tail effect); SMs freed later go to the oldest kernel with TBs left that are
    ready (a TB whose gates are shut is not placed: ``Kernel.gates``).

    HBM: ``hbm`` (hw/hbm.py) shares the achievable bandwidth among the kernel phases
    running on the SMs and the traffic the endpoint and copy engines move.
    """

    def __init__(self, sim: Simulator, index: int, cfg: SystemConfig, memory: Memory, packetizer: Packetizer,
                 vcmap: VcMap, hbm: HbmShare | None = None) -> None:
        # (Endpoint's constructor, from the same arguments, read what the endpoint needs of
        # cfg: gpu.memory_latency_ns, gpu.read_serve_kB, switch.chips, link.vcs)
        # the GPU's bound on outstanding remote SM requests (its request-tracking
        # entries, gpu.remote_outstanding_kB): every TB that loads from or reduces into a
        # peer takes its bytes here
        self.remote = Bound(sim, cfg.remote_outstanding_bytes())
        self.hbm = hbm if hbm is not None else HbmShare(1.0, 1, enabled=False)
        self.n_sms = cfg.gpu.sms
        self.on_ready = cfg.gpu.tb_launch == "on-ready"
        # the TB dispatcher (compiled): it places TBs on free SMs and runs their programs,
        # timing their HBM phases against ``hbm``
        self.dispatcher = TbDispatcher(sim, self.n_sms, self.hbm)
        self._running: list[Kernel] = []
        self.kernel_log: list[Kernel] | None = None  # every kernel launched, when not None

    @property
    def busy_sms(self) -> int:
        """SMs running a TB."""
        return self.dispatcher.busy

    @property
    def tbs_finished(self) -> int:
        return self.dispatcher.tbs_finished

    @property
    def slowdown(self) -> float:
        """Factor on the time its TBs compute (a straggler; 1: none)."""
        return self.dispatcher.slowdown

    @slowdown.setter
    def slowdown(self, factor: float) -> None:
        self.dispatcher.slowdown = factor

    @property
    def tb_log(self) -> list[tuple[str, int, int, int]] | None:
        """(kernel, sm, start, end) of every TB, when recording (set a list to start)."""
        return self.dispatcher.tb_log

    @tb_log.setter
    def tb_log(self, log: list[tuple[str, int, int, int]] | None) -> None:
        self.dispatcher.tb_log = log

    # ---- SMs and the TB dispatcher ----------------------------------------------
    def launch(self, kernel: Kernel, delay_ps: int = 0) -> Signal:
        """Make ``kernel`` dispatchable after ``delay_ps`` (its launch overhead)."""
        if self.kernel_log is not None:
            self.kernel_log.append(kernel)
        if not kernel.tbs:
            self.sim.after(delay_ps, self._finish_empty, kernel)
            return kernel.done
        self.sim.after(delay_ps, self._enqueue, kernel)
        return kernel.done

    def _finish_empty(self, kernel: Kernel) -> None:
        kernel.started_at = kernel.finished_at = self.sim.now
        kernel.done.fire(self.sim)

    def _enqueue(self, kernel: Kernel) -> None:
        if kernel.launched is not None:
            kernel.launched.fire(self.sim)
        sms = None if kernel.sms is None else sorted(kernel.sms)
        shut: list[list[Signal]] | None = None
        if kernel.gates is not None and self.on_ready:
            shut = [[s for s in sigs if not s.fired] for sigs in kernel.gates()]
            if len(shut) != len(kernel.tbs):
                raise ValueError(f"{kernel.name}: gates for {len(shut)} TBs, it has {len(kernel.tbs)}")
        counts = None if shut is None else [len(sigs) for sigs in shut]
        kid = self.dispatcher.enqueue(kernel, kernel.name, kernel.tbs, sms, kernel.priority, kernel.hbm_phases,
                                      kernel.done, counts, kernel.placed)
        if shut is not None:
            for i, sigs in enumerate(shut):
                for s in sigs:
                    s.on_fire(partial(self._open, kid, i))
        self._running.append(kernel)

    def _open(self, kid: int, index: int, _value: object) -> None:
        self.dispatcher.open(kid, index)

    def queued_kernels(self) -> int:
        """Kernels with TBs not yet placed on an SM."""
        return self.dispatcher.queued

    def running_kernels(self) -> list[str]:
        """Names of launched kernels that have not finished."""
        self._running = [k for k in self._running if k.finished_at is None]
        return [k.name for k in self._running]
