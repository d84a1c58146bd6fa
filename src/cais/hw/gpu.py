"""One GPU: its memory, its NVLink endpoint (what happens when a packet arrives,
compiled: :class:`cais._core.Endpoint`), and its SMs with the thread-block (TB)
dispatcher that places kernels' TBs on them. An SM's store path is
:class:`SmPort` (compiled: the rate at which the SM pushes the data it stores)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from cais._core import Endpoint, LoadStream, RedStream, SmPort
from cais.engine import Bound, Process, Signal, Simulator
from cais.engine.sim import ProgramGen
from cais.hw.config import SystemConfig
from cais.hw.hbm import HbmShare
from cais.hw.memory import Memory
from cais.hw.packets import Packetizer, VcMap
__all__ = ["Gpu", "Kernel", "LoadStream", "RedStream", "SmPort", "TbProgram"]

# A TB program: called with (sm index, SMs busy when it starts) it returns the
# generator the SM runs.
TbProgram = Callable[[int, int], ProgramGen]


@dataclass
class Kernel:
    """A kernel launch: a grid of TB programs, optionally confined to a set of SMs (an
    SM partition, as when a collective runs beside a GEMM). ``done`` fires when every
    TB has finished. ``role`` says what the kernel is for: ``"communication"`` for
    collective kernels, ``"compute"`` for everything else (fused kernels included).
    ``hbm_phases``: its TBs yield :class:`~cais.hw.hbm.HbmPhase` compute phases, which
    the GPU times against its shared HBM (hw/hbm.py). ``priority``: a higher value is
    served first when SMs free up (a CUDA stream priority); equal ones in launch order."""

    name: str
    tbs: list[TbProgram]
    sms: frozenset[int] | None = None
    role: str = "compute"
    hbm_phases: bool = False
    priority: int = 0
    done: Signal = field(default_factory=Signal)
    started_at: int | None = None
    finished_at: int | None = None
    _next: int = 0
    _running: int = 0
    _sm_mask: int = -1  # its SM set as bits (-1: every SM), fixed when it becomes dispatchable


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
    (the tail effect); SMs freed later go to the oldest kernel with TBs left.

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
        sms = cfg.gpu.sms
        self.n_sms = sms
        self._free = (1 << sms) - 1  # the free SMs, as bits (SM i: bit i)
        self._kernels: deque[Kernel] = deque()
        self._dispatch_pending = False
        self._prioritised = False  # some kernel has a non-zero priority: sort before dispatching
        self.busy_sms = 0
        self.tbs_finished = 0
        self._running: list[Kernel] = []
        self.tb_log: list[tuple[str, int, int, int]] | None = None  # (kernel, sm, start, end)
        self.slowdown = 1.0  # factor on the time its TBs compute (a straggler)
        self.kernel_log: list[Kernel] | None = None  # every kernel launched, when not None

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
        kernel._sm_mask = -1 if kernel.sms is None else sum(1 << sm for sm in kernel.sms)
        self._kernels.append(kernel)
        if kernel.priority:
            self._prioritised = True
        self._running.append(kernel)
        self._request_dispatch()

    def _request_dispatch(self) -> None:
        # Deferred to the end of the current instant, so TBs that finish together free
        # their SMs before new ones start (wave behaviour).
        if not self._dispatch_pending:
            self._dispatch_pending = True
            self.sim.after(0, self._dispatch)

    def _dispatch(self) -> None:
        self._dispatch_pending = False
        starts: list[tuple[Kernel, int, int]] = []
        order = sorted(self._kernels, key=_by_priority) if self._prioritised else list(self._kernels)
        free = self._free
        for kernel in order:
            tbs = len(kernel.tbs)
            while kernel._next < tbs and (usable := free & kernel._sm_mask):
                lowest = usable & -usable  # the lowest-numbered free SM the kernel may use
                free ^= lowest
                starts.append((kernel, lowest.bit_length() - 1, kernel._next))
                kernel._next += 1
                kernel._running += 1
            if kernel._next == tbs:
                self._kernels.remove(kernel)
        self._free = free
        self.busy_sms = self.n_sms - free.bit_count()
        for kernel, sm, tb_index in starts:
            if kernel.started_at is None:
                kernel.started_at = self.sim.now
            program = kernel.tbs[tb_index](sm, self.busy_sms)
            # the process times the program's HBM phases against this GPU's share
            # and stretches its compute delays by the GPU's slowdown
            proc = Process(self.sim, program, hbm=self.hbm if kernel.hbm_phases else None, slowdown=self.slowdown)
            proc.done.on_fire(self._tb_finisher(kernel, sm, self.sim.now))

    def _tb_finisher(self, kernel: Kernel, sm: int, start: int) -> Callable[[object], None]:
        def finished(_: object) -> None:
            self.tbs_finished += 1
            self._free |= 1 << sm
            self.busy_sms -= 1
            kernel._running -= 1
            if self.tb_log is not None:
                self.tb_log.append((kernel.name, sm, start, self.sim.now))
            if kernel._running == 0 and kernel._next == len(kernel.tbs):
                kernel.finished_at = self.sim.now
                kernel.done.fire(self.sim)
            self._request_dispatch()
        return finished

    def queued_kernels(self) -> int:
        """Kernels with TBs not yet placed on an SM."""
        return len(self._kernels)

    def running_kernels(self) -> list[str]:
        """Names of launched kernels that have not finished."""
        self._running = [k for k in self._running if k.finished_at is None]
        return [k.name for k in self._running]


def _by_priority(kernel: Kernel) -> int:
    return -kernel.priority  # sorted() is stable: launch order among equal priorities
