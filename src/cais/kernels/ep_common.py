"""What the expert-parallel (EP) kernels share: the call they serve (:class:`EpCall`),
their constants (:class:`EpConstants`, fitted in ``cais/data/calibration/ep.json``),
the rows one move carries (:class:`Move`) and the SM copy loop that sends them
(:func:`copy_tb`).

An EP kernel moves token rows between GPUs: dispatch sends rows of ``x`` to the ranks
holding their experts, combine sends expert outputs back. Each kernel module
(``ep_nccl``, ``ep_allgather``, ``ep_deepep``, ``ep_deepep_ll``) decides from its
source which rows travel, in which layout, on how many SMs; this module times the
rows on the fabric. A row of ``hidden`` elements travels as ``hidden`` elements of
``elem_bytes`` (FP8: 1, BF16: 2) plus, for FP8, its scales (one FP32 per 128
elements), as DeepEP sends them (``x_scales``). Functional runs carry real values
(float64, no FP8 rounding): a move's data are its source rows.

An SM's copy loop is an :class:`~cais.engine.SmPort` keeping at most
``collective.outstanding_bytes_per_sm`` in flight; its copies to its own GPU take the
same port time and nothing on the fabric. Its rate is the kernel's: DeepEP's
``UNROLLED_WARP_COPY`` with ``st_na_global`` stores to the peer's buffer runs at
``EpConstants.sm_copy_GBps`` of payload (fitted on DeepEP's H800 rows), NCCL's p2p
``Simple`` send at the GPU's SM copy rate (``gpu.sm_copy_bandwidth_GBps``), as the
dense path's NCCL kernels run their channels (``copy_tb``'s ``rate_GBps``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from importlib import resources
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from cais.engine import Countdown, Signal, Simulator
from cais.engine.sim import ProgramGen
from cais.errors import UserError
from cais.hw.gpu import SmPort, TbProgram
from cais.hw.memory import Region
from cais.isa import CopyMove
from cais.kernels.common import Window, pause
from cais.kernels.protocols import LL
from cais.machine import Machine
from cais.workload.routing import Routing

EP_OPS = ("dispatch", "combine")
EP_DTYPES = ("fp8", "bf16")
SCALE_BLOCK = 128  # elements per FP32 scale (DeepEP's per_token_cast_to_fp8)


class EpConstants(BaseModel):
    """Numbers the EP kernels take that no system field gives: fitted on DeepEP's
    published H800 EP8 figures (the fit set; docs/moe.md) and stored with their
    provenance in ``cais/data/calibration/ep.json``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sm_copy_GBps: float = Field(gt=0, description="payload rate of one SM's peer-store copy loop")
    ll_fixed_us: float = Field(ge=0, description="DeepEP low-latency: per-call cost beyond launch and copies")
    host_sync_us: float = Field(ge=0, description="host wait for receive counts (CPU polls a mapped counter)")
    nccl_channels: int = Field(gt=0, description="NCCL p2p channels (TBs) of one all-to-all")
    deepep_sms: int = Field(gt=0, description="DeepEP normal kernels' default SM count")


def ep_constants(path: str | Path | None = None) -> EpConstants:
    """The fitted EP constants (``cais/data/calibration/ep.json``, or ``path``)."""
    p = Path(path) if path else Path(str(resources.files("cais") / "data" / "calibration" / "ep.json"))
    data = json.loads(p.read_text())
    return EpConstants.model_validate(data["constants"])


@dataclass(frozen=True)
class EpCall:
    """One EP collective: ``op`` (dispatch or combine) of ``routing``'s tokens, rows of
    ``hidden`` elements in ``dtype`` (combine always runs BF16, as DeepEP's tests run
    it), on ``sms`` SMs (None: the kernel's default), with or without the host wait
    for receive counts (``host_sync``; DeepEP's tests time dispatch with a cached
    layout, so without it)."""

    op: str
    routing: Routing
    hidden: int
    dtype: str = "bf16"
    sms: int | None = None
    host_sync: bool = False
    constants: EpConstants | None = None
    chunk: int | None = None  # DeepEP normal: tokens per send round (None: its default config)
    comm_ranks: int | None = None  # ranks of the kernel's communicator (expert TP's EP group); None: the routing's

    def __post_init__(self) -> None:
        if self.op not in EP_OPS:
            raise UserError(f"op: unknown '{self.op}'; valid: {', '.join(EP_OPS)}")
        if self.dtype not in EP_DTYPES:
            raise UserError(f"dtype: unknown '{self.dtype}'; valid: {', '.join(EP_DTYPES)}")
        if self.hidden <= 0 or (self.fp8 and self.hidden % SCALE_BLOCK):
            raise UserError(f"hidden: must be a positive multiple of {SCALE_BLOCK} for fp8, got {self.hidden}")

    @property
    def fp8(self) -> bool:
        return self.dtype == "fp8" and self.op == "dispatch"

    @property
    def elem_bytes(self) -> int:
        return 1 if self.fp8 else 2

    @property
    def scale_elems(self) -> int:
        return self.hidden // SCALE_BLOCK if self.fp8 else 0

    @property
    def row_bytes(self) -> int:
        """Bytes of one token row on the wire (FP8: elements plus scales)."""
        return self.hidden * self.elem_bytes + 4 * self.scale_elems

    @property
    def consts(self) -> EpConstants:
        return self.constants or ep_constants()


@dataclass
class Move:
    """Rows ``rows`` of buffer ``src_buf`` on GPU ``src`` stored as ``len(rows)``
    consecutive rows from ``dst_row`` of ``dst_buf`` on GPU ``dst``; ``landed``
    signals (if any) count its arrival."""

    src: int
    dst: int
    src_buf: str
    rows: Sequence[int]
    dst_buf: str
    dst_row: int
    landed: list[Countdown] = field(default_factory=list)
    #: NCCL's protocol of this send (kernels/protocols.py): "" (the SM copy loop's plain
    #: stores, DeepEP's), "simple" (the stores, a system fence, then a flag store: the
    #: move lands when its flag does) or "ll" (8 B of data and a flag in each 16 B line,
    #: at the LL loop's rate: it lands with its lines)
    protocol: str = ""


def alloc_rows(m: Machine, g: int, name: str, rows: int, call: EpCall) -> None:
    """Allocate ``rows`` token rows of buffer ``name`` (and its scales for FP8) on GPU ``g``."""
    mem = m.gpus[g].memory
    if mem.functional and name not in mem.buffers:
        mem.alloc(name, max(1, rows) * call.hidden)
        mem.alloc(f"{name}.scales", max(1, rows) * max(1, call.scale_elems))


def copy_tb(m: Machine, g: int, call: EpCall, moves: Sequence[Move], before: Sequence[Signal] = (),
            after: Callable[[], ProgramGen] | None = None, start_ps: int = 0, stream: int = 0,
            unit_bytes: int | None = None, window_bytes: int | None = None,
            rate_GBps: float | None = None, compiled_loop: bool = True) -> TbProgram:
    """A TB on GPU ``g`` that waits for ``before``, spends ``start_ps``, then copies
    ``moves`` in order through one SM port (module doc) and waits for them to land;
    ``after`` (a generator factory) runs then (a receive phase). ``unit_bytes`` and
    ``window_bytes`` override the transfer unit and the in-flight bound (experiments);
    ``rate_GBps``: the copy loop's payload rate (default: ``EpConstants.sm_copy_GBps``).
    In timing mode the loop runs in the core (:meth:`cais.isa.Isa.copy_loop`), unless
    ``compiled_loop`` is off (the same loop in Python, which functional mode runs to
    carry the rows)."""
    isa, sim = m.isa, m.sim
    mem = m.gpus[g].memory
    h, eb, se = call.hidden, call.elem_bytes, call.scale_elems
    total = sum(len(mv.rows) for mv in moves) * call.row_bytes
    unit = m.cfg.unit_for(max(total // max(1, len(moves)), call.row_bytes)) if unit_bytes is None else unit_bytes
    limit = max(m.cfg.collective.outstanding_bytes_per_sm, 2 * call.row_bytes) if window_bytes is None else window_bytes

    def data_of(mv: Move, buf: str, width: int) -> np.ndarray | None:
        if not mem.functional:
            return None
        mat = mem.buffers[buf].reshape(-1, width)
        return mat[np.asarray(mv.rows, dtype=np.int64)].reshape(-1)

    def compiled(port: SmPort, ll_port: SmPort) -> Signal:
        """The loop in the core (timing mode: no rows' data to carry)."""
        loop: list[CopyMove] = []
        for mv in moves:
            if not mv.rows:
                continue
            nr = len(mv.rows)
            if mv.dst == g:
                loop.append((g, "local", [], round(nr * call.row_bytes * port.ps_per_byte), mv.landed))
                continue
            regions = [Region(mv.dst_buf, mv.dst_row * h, nr * h, eb)]
            if se:
                regions.append(Region(f"{mv.dst_buf}.scales", mv.dst_row * se, nr * se, 4))
            loop.append((mv.dst, mv.protocol or "plain", [(isa.stripes(r, unit), r.nbytes) for r in regions], 0,
                         mv.landed))

        def flag_wire(dst: int) -> tuple[int, int, int, int]:
            return isa.flag_wire(g, dst, m.flag_key())
        return isa.copy_loop(g, loop, port, ll_port, LL.encoding, flag_wire, stream, limit)

    def program(sm: int, busy: int) -> ProgramGen:
        for sig in before:
            yield sig
        if start_ps:
            yield pause(sim, start_ps)
        port = isa.sm_port(rate_GBps or call.consts.sm_copy_GBps)
        ll_port = isa.sm_port(m.cfg.collective.ll_channel_GBps) if any(mv.protocol == "ll" for mv in moves) else port
        if not mem.functional and compiled_loop:
            if any(mv.rows for mv in moves):
                yield compiled(port, ll_port)
            if after is not None:
                yield from after()
            return
        win = Window(sim, limit)
        remote = [mv for mv in moves if mv.dst != g and mv.rows]
        fin = Countdown(len(remote) * (2 if se else 1))
        for mv in moves:
            if not mv.rows:
                continue
            nr = len(mv.rows)
            parts = [(Region(mv.dst_buf, mv.dst_row * h, nr * h, eb), data_of(mv, mv.src_buf, h))]
            if se:
                parts.append((Region(f"{mv.dst_buf}.scales", mv.dst_row * se, nr * se, 4),
                              data_of(mv, f"{mv.src_buf}.scales", se)))
            if mv.dst == g:  # a copy to its own GPU: the loop's time, nothing on the fabric
                yield pause(sim, round(nr * call.row_bytes * port.ps_per_byte))
                for region, data in parts:
                    mem.write(region, data)
                for c in mv.landed:
                    c.arrive(sim)
                continue
            ll = mv.protocol == "ll"
            arrived: Countdown | None = None  # one part: its landing is the move's
            if len(parts) > 1:
                arrived = Countdown(len(parts))
                for c in mv.landed:
                    arrived.on_fire(partial(_arrive_on_fire, c, sim))
            for region, data in parts:
                nbytes = region.nbytes
                while win.used > 0 and win.used + nbytes > win.limit:  # Window.acquire, inline
                    yield win.wait()
                win.used += nbytes

                def landed(nb: int = nbytes, a: Countdown | None = arrived, each: list[Countdown] = mv.landed) -> None:
                    win.release(nb)
                    if a is not None:
                        a.arrive(sim)
                    else:  # as the one part's countdown firing would, in order
                        for c in each:
                            c.arrive(sim)
                    fin.arrive(sim)
                if mv.protocol == "simple":  # fence (the write responses back), then the flag; lands with it
                    key = m.flag_key()

                    def fenced(dst: int = mv.dst, k: int = key, done: Callable[[], None] = landed) -> None:
                        isa.flag(g, dst, k, done)
                    isa.st(g, mv.dst, region, data, None, port, stream, unit, fenced=fenced)
                else:
                    isa.st(g, mv.dst, region, data, landed, ll_port if ll else port, stream, unit,
                           encoding=LL.encoding if ll else 1.0)
        if fin.remaining:
            yield fin
        if after is not None:
            yield from after()
    return program


def _arrive_on_fire(c: Countdown, sim: Simulator, _value: object) -> None:
    c.arrive(sim)


def copy_time_ps(call: EpCall, nbytes: int) -> int:
    """An SM's local copy of ``nbytes`` at the copy loop's rate (a receive phase)."""
    return round(nbytes * 1000.0 / call.consts.sm_copy_GBps)
