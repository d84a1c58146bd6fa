"""A GPU's copy (DMA) engine: an issuing agent that runs on no SM. Software (or a
hardware tracker, as in T3) queues pre-programmed transfers of whole regions; the
engine cuts them into transfer units and pushes them through its own port with a
bounded number of bytes in flight."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import numpy as np

from cais.engine import Countdown, Process, Signal
from cais.config import PS_PER_NS, SystemConfig
from cais.hw.memory import Region
from cais.isa import SmPort
from cais.kernels.common import Window
from cais.machine import Machine


@dataclass
class DmaCommand:
    """One pre-programmed DMA transfer of a contiguous region.

    ``op``: ``st`` / ``red`` (``src`` on this GPU -> ``dst`` on GPU ``peer``),
    ``ld`` (a pull: ``src`` on GPU ``peer`` -> ``dst`` on this GPU, plain reads),
    ``mc_st`` (``src`` multicast to ``dst`` on every GPU), ``ld_reduce`` (the sum of
    ``src`` over all GPUs -> ``dst`` on this GPU). ``done`` fires when all of it
    has landed."""

    op: str
    src: Region
    dst: Region
    unit: int
    peer: int = -1
    done: Signal | None = None


def dma_rate_GBps(cfg: SystemConfig) -> float:
    """The copy engine's rate: ``gpu.copy_engine.rate_GBps``, or by default
    link-limited (the GPU's NVLink bandwidth per direction)."""
    rate = cfg.gpu.copy_engine.rate_GBps
    return rate if rate is not None else cfg.link.bandwidth_GBps * cfg.links_per_gpu


def dma_start_ps(cfg: SystemConfig) -> int:
    """The copy engine's start per command (``gpu.copy_engine.start_us``), in ps."""
    return round(cfg.gpu.copy_engine.start_us * 1e6)


def dma_window_bytes(cfg: SystemConfig) -> int:
    """Bytes the copy engine keeps in flight (``gpu.copy_engine.window_kB``)."""
    return round(cfg.gpu.copy_engine.window_kB * 1024)


class DmaEngine:
    """A GPU's DMA engine: a process on no SM that runs triggered commands in FIFO
    order, cutting each into transfer units pushed through its own port, with a
    bounded number of bytes not yet delivered (or, for pulls, not yet returned)."""

    def __init__(self, m: Machine, gpu: int, rate_GBps: float, window_bytes: int, start_ps: int = 0) -> None:
        self.m = m
        self.gpu = gpu
        self.start_ps = start_ps  # each command's start, in sequence (gpu.copy_engine.start_us)
        self.port = SmPort(PS_PER_NS / rate_GBps)
        self.ps_per_byte = PS_PER_NS / rate_GBps  # a pull's issue rate (its data comes back, not out)
        self.window = Window(m.sim, window_bytes)
        self.queue: deque[DmaCommand] = deque()
        self._wake: Signal | None = None
        self.bytes_moved = 0
        Process(m.sim, self._run())

    def push(self, cmd: DmaCommand) -> None:
        """Queue a command (the tracker's trigger)."""
        self.queue.append(cmd)
        wake, self._wake = self._wake, None
        if wake is not None:
            self.m.sim.after(0, wake.fire, self.m.sim)

    def on(self, trigger: Signal, cmd: DmaCommand) -> None:
        """Queue ``cmd`` when ``trigger`` fires."""
        trigger.on_fire(lambda _v: self.push(cmd))

    def _run(self) -> Generator[Any, Any, None]:
        while True:
            if not self.queue:
                self._wake = Signal()
                yield self._wake
                continue
            yield from self._issue(self.queue.popleft())

    def _issue(self, cmd: DmaCommand) -> Generator[Any, Any, None]:
        m, sim, isa = self.m, self.m.sim, self.m.isa
        mem = m.gpus[self.gpu].memory
        cut = cmd.src if cmd.op in ("ld_reduce", "ld") else cmd.dst  # cut at the routed address
        pieces = isa.pieces(cut, cmd.unit)
        left = Countdown(len(pieces))
        if self.start_ps:
            yield self.start_ps
        if cmd.done is not None:
            done = cmd.done
            left.on_fire(lambda _v: done.fire(sim))
        for p in pieces:
            yield from self.window.acquire(p.nbytes)
            self.bytes_moved += p.nbytes
            release = self._release(p.nbytes, left)
            other = (cmd.dst if cut is cmd.src else cmd.src).sub(p.start - cut.start, p.count)
            if cmd.op == "ld":  # a pull, issued at the engine's rate
                isa.ld(self.gpu, cmd.peer, p, self._landed(other, release), unit=cmd.unit)
                yield round(p.nbytes * self.ps_per_byte)
            elif cmd.op == "ld_reduce":
                isa.multimem_ld_reduce(self.gpu, p, self._landed(other, release), unit=cmd.unit)
            elif cmd.op == "mc_st":
                isa.multimem_st(self.gpu, p, mem.read(other), release, self.port, unit=cmd.unit)
            else:
                send = isa.st if cmd.op == "st" else isa.red
                send(self.gpu, cmd.peer, p, mem.read(other), release, self.port if cmd.peer != self.gpu else None,
                     unit=cmd.unit)

    def _landed(self, out: Region, release: Callable[[], None]) -> Callable[[np.ndarray | None], None]:
        mem = self.m.gpus[self.gpu].memory

        def got(data: np.ndarray | None) -> None:
            mem.write(out, data)
            release()
        return got

    def _release(self, nbytes: int, left: Countdown) -> Callable[[], None]:
        sim = self.m.sim

        def release() -> None:
            self.window.release(nbytes)
            left.arrive(sim)
        return release
