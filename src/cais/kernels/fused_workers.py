"""FuseLib's persistent fused kernel (Punniyamurthy, Hamidouche, Beckmann, SC'24):
GEMM1 + ReduceScatter + row-wise op + AllGather of one sub-layer in one launch, as
a grid of persistent worker TBs (one per SM) that loop over their GPU's work queue.

* **Work queue** (:class:`WorkQueue`, one per GPU): GEMM1 tiles in the path's tile
  order, and the GPU's row blocks (``ROWS_PER_TB`` rows of its token shard) as they
  become ready. A free worker takes, first, a ready row block, else the next tile,
  else it waits for a block to become ready ("communication-aware WG scheduling").
* **Worker** (:class:`Worker`): a TB with its SM's store port and room for its remote
  requests (its SM's window inside its GPU's bound). A tile is the calibrated tile
  time of a GEMM TB with "busy SMs" = the workers running a tile or a row block (not
  those waiting for work), then the path's epilogue; a row block is the path's
  block task. After each item the worker waits until its SM has pushed what it
  issued.
* **Readiness**: each GPU counts its own tile pieces touching each owner's row
  block; the path turns the counts into "row block b of owner o is ready".

What differs between FuseLib and FuseLib-NVLS is a :class:`FusedPath`: how tiles
are ordered, how a tile's partial rows reach their owner, how a block's readiness
is signalled, and how a ready block is reduced, normalised and gathered.
:class:`PushPath` (FuseLib): P2P ``red`` of tile rows into the owner, release flags
behind them, ``st`` of the row-wise output to every GPU. :class:`MulticastPath`
(FuseLib-NVLS): tiles stored locally, completion flags to the owner, which reduces
the block with ``multimem.ld_reduce`` and multicasts its output rows with
``multimem.st``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from cais.engine import Bound, Countdown, Signal, Simulator
from cais.engine.sim import ProgramGen
from cais.hw.compute import ComputeModel
from cais.hw.gpu import Kernel, TbProgram
from cais.hw.hbm import HbmPhase
from cais.hw.memory import Region
from cais.hw.packets import Traffic
from cais.isa import SmPort
from cais.kernels import rowop, sync
from cais.kernels.common import RequestSlots
from cais.kernels.gemm import GemmShape, store_epilogue, tile_hbm_bytes, tile_product, tile_work_ps
from cais.kernels.local import ROWS_PER_TB, row_blocks
from cais.machine import Machine
from cais.workload.graph import Chain, Dims


@dataclass(frozen=True)
class Piece:
    """The rows of a GEMM1 tile row that one owner holds: owner GPU, first row in
    its shard, first row in the tile, row count, and the owner's row blocks touched."""

    owner: int
    local_first: int
    tile_first: int
    count: int
    blocks: tuple[int, ...]


@dataclass
class Plan:
    """How one chain's fused kernel is cut, the same on every GPU."""

    shape: GemmShape
    blocks: list[tuple[int, int]]  # row blocks (first, count) of a GPU's shard
    pieces: list[list[Piece]]  # per GEMM1 tile row
    expected: list[list[int]]  # per owner, per row block: tile pieces that complete it (from all GPUs)
    unit: int
    h: int
    rows_l: int
    eb: int


def owner_pieces(r0: int, nr: int, rows_l: int, blocks: list[tuple[int, int]]) -> list[Piece]:
    """Split global rows r0 .. r0+nr-1 at the owners' shard boundaries."""
    out = []
    row = r0
    while row < r0 + nr:
        owner = row // rows_l
        local = row - owner * rows_l
        cnt = min(r0 + nr, (owner + 1) * rows_l) - row
        touched = tuple(b for b, (f, c) in enumerate(blocks) if f < local + cnt and f + c > local)
        out.append(Piece(owner, local, row - r0, cnt, touched))
        row += cnt
    return out


def make_plan(c: Chain, shape: GemmShape, d: Dims, n: int, unit: int, eb: int) -> Plan:
    """The plan of chain ``c``'s fused kernel on ``n`` GPUs: GEMM1's tile rows split
    per owner, and the tile pieces each owner's row block waits for."""
    rows_l = d.rows_l
    if c.gemm1.n != d.hidden:
        raise ValueError(f"{c.name}: GEMM1 must produce rows of width hidden")
    blocks = row_blocks(rows_l, ROWS_PER_TB)
    pieces = [owner_pieces(*shape.rows(i), rows_l, blocks) for i in range(shape.tiles_m)]
    expected = [[0] * len(blocks) for _ in range(n)]
    for row in pieces:
        for p in row:
            for b in p.blocks:
                expected[p.owner][b] += n * shape.tiles_n
    return Plan(shape, blocks, pieces, expected, unit, d.hidden, rows_l, eb)


def unit_chunks(region: Region, unit: int) -> list[Region]:
    """A contiguous region cut into runs of at most ``unit`` bytes."""
    per = max(1, unit // region.elem_bytes)
    return [region.sub(s, min(per, region.count - s)) for s in range(0, region.count, per)]


@dataclass
class WorkQueue:
    """The work of one GPU's persistent fused kernel: GEMM tiles in order, and its
    row blocks as they become ready."""

    tiles: list[tuple[int, int]]
    blocks: int
    next_tile: int = 0
    taken: int = 0
    idle: int = 0
    ready: deque[int] = field(default_factory=deque)
    _wake: Signal | None = None

    def block_ready(self, sim: Simulator, b: int) -> None:
        self.ready.append(b)
        wake, self._wake = self._wake, None
        if wake is not None:
            wake.fire(sim)

    def pending(self) -> bool:
        """Row blocks not yet ready remain."""
        return self.taken + len(self.ready) < self.blocks

    def wake(self) -> Signal:
        if self._wake is None:
            self._wake = Signal()
        return self._wake


@dataclass
class Worker:
    """One persistent TB: its SM's store port, and room for its remote requests (its
    SM's window inside its GPU's bound)."""

    g: int
    port: SmPort
    slots: RequestSlots

    def issue(self, nbytes: int) -> Iterator[Signal]:
        """Wait for room for ``nbytes`` more in flight, then take it."""
        yield from self.slots.acquire(nbytes)

    def released(self, nbytes: int, then: Callable[[], None] | None = None) -> Callable[[], None]:
        def done() -> None:
            self.slots.release(nbytes)
            if then is not None:
                then()
        return done

    def unit(self, unit: int) -> int:
        """The largest request piece: the transfer unit, within both bounds."""
        return min(unit, self.slots.piece)

    def drain_port(self, sim: Simulator) -> Iterator[int]:
        """Wait until the SM has pushed everything it issued."""
        if self.port.free_at > sim.now:
            yield self.port.free_at - sim.now


@dataclass(frozen=True)
class RowWise:
    """What a row-block task needs of the row-wise op: the model's norm, its dropout
    probability, the element size, and the GPU's SM count (for the op's time)."""

    norm: str
    p_drop: float
    eb: int
    total_sms: int


@dataclass
class Fused:
    """One chain being run as fused kernels: the machine, the plan, each GPU's work
    queue, and the counters TBs and GEMM2 wait on."""

    m: Machine
    cm: ComputeModel
    c: Chain
    d: Dims
    rw: RowWise
    floor_ps: int  # GEMM1's least tile time (memory bound)
    plan: Plan
    queues: list[WorkQueue]
    gathered: list[Countdown]  # per GPU: every element of its gather_dst has landed
    tiles_done: list[list[list[Countdown]]]  # per GPU, owner, row block: its own tile pieces issued

    def rowop_ps(self, rows: int) -> int:
        """One SM streaming the row-wise op over ``rows`` rows (memory bound)."""
        return rowop.rowop_work_ps(self.cm, self.c.rowop, self.rw.eb, rows, 1, self.rw.total_sms)

    def rowop_bytes(self, rows: int) -> int:
        return rowop.rowop_bytes(self.c.rowop, self.rw.eb, rows)

    def rowop_apply(self, g: int, first: int, cnt: int) -> None:
        """Rows [first, first + cnt) of the row-wise op on GPU ``g``'s memory."""
        rowop.rowop_apply(self.m.gpus[g].memory, self.c.rowop, first, cnt, self.rw.norm, self.rw.p_drop,
                          rowop.row_offset(self.d, g))


class FusedPath(ABC):
    """How a fused kernel moves its data: the tile order, a tile's epilogue, when an
    owner's row block is ready, and the task that reduces, normalises and gathers
    a ready block. An interface: :class:`PushPath` (FuseLib) and
    :class:`MulticastPath` (FuseLib-NVLS) implement it."""

    @abstractmethod
    def tile_order(self, plan: Plan, g: int, n: int) -> list[tuple[int, int]]:
        """The (row tile, column tile) order GPU ``g``'s workers take GEMM1 tiles in."""

    @abstractmethod
    def wire(self, f: Fused) -> None:
        """Make ``f.queues[o].block_ready(b)`` run once row block b of owner o is ready."""

    @abstractmethod
    def tile_epilogue(self, f: Fused, w: Worker, i: int, j: int, tile: np.ndarray | None) -> ProgramGen:
        """What a worker does with finished tile (i, j): where its partial sums go."""

    @abstractmethod
    def block_task(self, f: Fused, w: Worker, b: int) -> ProgramGen:
        """A worker's task for ready row block ``b``: reduce, row-wise op, gather."""


class PushPath(FusedPath):
    """FuseLib's zero-copy P2P path: tile rows ``red``-pushed into their owner's
    ``reduced`` buffer with release flags behind them; the owner's row-wise output
    ``st``-pushed to every GPU's ``gather_dst``."""

    def tile_order(self, plan: Plan, g: int, n: int) -> list[tuple[int, int]]:
        """Tile rows by position in their owner's shard, owners from g+1 round to g."""
        shape = plan.shape

        def key(i: int) -> tuple[int, int, int]:
            p = plan.pieces[i][0]
            return p.local_first, (p.owner - g - 1) % n, i
        return [(i, j) for i in sorted(range(shape.tiles_m), key=key) for j in range(shape.tiles_n)]

    def wire(self, f: Fused) -> None:
        """Row block b of owner o is ready when every GPU's flag for it has landed on
        o: a GPU counts its own tile pieces of the block and, once it has issued the
        last one's reductions, stores a release flag behind them (``release_flag``)."""
        m = f.m
        n, sim = m.n, m.sim
        arrivals = [[self.block_flags(n) for _ in f.plan.expected[o]] for o in range(n)]
        for o in range(n):
            for b, flags in enumerate(arrivals[o]):
                flags.on_fire(lambda _v, o=o, b=b: f.queues[o].block_ready(sim, b))
                for g in range(n):
                    f.tiles_done[g][o][b].on_fire(
                        lambda _v, g=g, o=o, flags=flags: m.isa.release_flag(
                            g, o, Traffic.REDUCTION, lambda: flags.arrive(sim)))

    def block_flags(self, n: int) -> Countdown:
        """What an owner counts a row block's flags with: all n GPUs'."""
        return Countdown(n)

    def tile_epilogue(self, f: Fused, w: Worker, i: int, j: int, tile: np.ndarray | None) -> ProgramGen:
        """Push each owner's rows of the tile into its ``reduced`` buffer with ``red``."""
        plan, sim, isa = f.plan, f.m.sim, f.m.isa
        c0, nc = plan.shape.cols(j)
        for p in plan.pieces[i]:
            region = Region.block(f.c.reduced, plan.h, p.local_first, p.count, c0, nc, plan.eb)
            data = None if tile is None else tile[p.tile_first:p.tile_first + p.count]
            if data is not None and region.rows == 1:  # whole rows: a contiguous run
                data = data.reshape(-1)
            for piece in isa.pieces(region, w.unit(plan.unit)):
                yield from w.issue(piece.nbytes)
                isa.red(w.g, p.owner, piece, isa.piece_data(data, region, piece), w.released(piece.nbytes),
                        w.port, unit=plan.unit)
            for b in p.blocks:
                f.tiles_done[w.g][p.owner][b].arrive(sim)

    def block_task(self, f: Fused, w: Worker, b: int) -> ProgramGen:
        """Row-wise op on row block b of this GPU's shard, then its AllGather push."""
        plan, g, c, m = f.plan, w.g, f.c, f.m
        first, cnt = plan.blocks[b]
        mem = m.gpus[g].memory
        if mem.functional:  # reads its inputs as it starts (outputs are pushed only after its time)
            f.rowop_apply(g, first, cnt)
        yield HbmPhase(f.rowop_ps(cnt), f.rowop_bytes(cnt))
        data = mem.read(Region(c.gather_src, first * plan.h, cnt * plan.h, plan.eb))
        dst = Region(c.gather_dst, (g * plan.rows_l + first) * plan.h, cnt * plan.h, plan.eb)
        mem.write(dst, data)
        f.gathered[g].arrive(m.sim, dst.count)
        n = m.n
        for k in range(1, n):
            peer = (g + k) % n
            for piece in unit_chunks(dst, w.unit(plan.unit)):
                yield from w.issue(piece.nbytes)
                part = None if data is None else data[piece.start - dst.start:piece.start - dst.start + piece.count]
                m.isa.st(g, peer, piece, part, w.released(piece.nbytes), w.port, unit=plan.unit)
            arrived = (lambda peer=peer, cnt=dst.count: f.gathered[peer].arrive(m.sim, cnt))
            m.isa.release_flag(g, peer, Traffic.STORE, arrived)


class MulticastPath(FusedPath):
    """FuseLib-NVLS's path: tiles stored locally; a row block done on every GPU is
    reduced by its owner with ``multimem.ld_reduce``, normalised, and stored to every
    GPU's ``gather_dst`` with ``multimem.st``, a multicast release flag behind it."""

    def tile_order(self, plan: Plan, g: int, n: int) -> list[tuple[int, int]]:
        """Tile rows by position in their owner's shard, then owner; the same on every GPU."""
        def key(i: int) -> tuple[int, int, int]:
            p = plan.pieces[i][0]
            return p.local_first, p.owner, i
        return [(i, j) for i in sorted(range(plan.shape.tiles_m), key=key) for j in range(plan.shape.tiles_n)]

    def wire(self, f: Fused) -> None:
        """Row block b of owner o is ready once every GPU's completion flag for it
        (stored when the GPU's last tile touching it is done) has reached o."""
        n = f.m.n
        for o in range(n):
            for b in range(len(f.plan.expected[o])):
                done = sync.notify(f.m, [f.tiles_done[g][o][b] for g in range(n)], o)
                done.on_fire(lambda _v, o=o, b=b: f.queues[o].block_ready(f.m.sim, b))

    def tile_epilogue(self, f: Fused, w: Worker, i: int, j: int, tile: np.ndarray | None) -> ProgramGen:
        """Store the tile locally; count it towards every row block it touches."""
        mem = f.m.gpus[w.g].memory
        if tile is not None:
            store_epilogue(mem, f.c.gemm1.ops, f.plan.shape)(i, j, tile)
        for p in f.plan.pieces[i]:
            for b in p.blocks:
                f.tiles_done[w.g][p.owner][b].arrive(f.m.sim)
        yield from ()

    def block_task(self, f: Fused, w: Worker, b: int) -> ProgramGen:
        """ld_reduce row block b of this GPU's shard, apply the row-wise op, multicast it."""
        plan, g, c, m = f.plan, w.g, f.c, f.m
        sim = m.sim
        first, cnt = plan.blocks[b]
        mem = m.gpus[g].memory
        rows = (g * plan.rows_l + first) * plan.h
        src = Region(c.gemm1.ops.c, rows, cnt * plan.h, plan.eb)
        loads = unit_chunks(src, w.unit(plan.unit))
        summed = Countdown(len(loads))
        for piece in loads:
            yield from w.issue(piece.nbytes)
            out = Region(c.reduced, first * plan.h + piece.start - src.start, piece.count, plan.eb)

            def got(data: np.ndarray | None, out: Region = out, nbytes: int = piece.nbytes) -> None:
                mem.write(out, data)
                w.slots.release(nbytes)
                summed.arrive(sim)
            m.isa.multimem_ld_reduce(g, piece, got, unit=plan.unit)
        yield summed
        if mem.functional:  # reads its inputs as it starts (outputs are pushed only after its time)
            f.rowop_apply(g, first, cnt)
        yield f.rowop_ps(cnt)
        data = mem.read(Region(c.gather_src, first * plan.h, cnt * plan.h, plan.eb))
        dst = Region(c.gather_dst, rows, cnt * plan.h, plan.eb)
        for piece in unit_chunks(dst, w.unit(plan.unit)):
            yield from w.issue(piece.nbytes)
            part = None if data is None else data[piece.start - dst.start:piece.start - dst.start + piece.count]
            m.isa.multimem_st(g, piece, part, w.released(piece.nbytes), w.port, unit=plan.unit)
        m.isa.release_flag_multicast(g, Traffic.STORE, lambda h, k=dst.count: f.gathered[h].arrive(sim, k))


def _tile_task(f: Fused, path: FusedPath, w: Worker, i: int, j: int) -> ProgramGen:
    """A GEMM1 tile: the calibrated tile time (busy SMs: the workers not waiting for
    work), then the path's epilogue."""
    shape, gpu = f.plan.shape, f.m.gpus[w.g]
    busy = max(1, gpu.busy_sms - f.queues[w.g].idle)
    # A and B are local; of the output only the GPU's own rows stay (the rest is pushed)
    yield HbmPhase(max(f.floor_ps, tile_work_ps(f.cm, shape, busy)),
                   tile_hbm_bytes(shape, f.plan.eb, c=1.0 / f.m.n))
    mem = gpu.memory
    tile = tile_product(mem, f.c.gemm1.ops, shape, i, j) if mem.functional else None
    yield from path.tile_epilogue(f, w, i, j, tile)


def _worker(f: Fused, path: FusedPath, g: int) -> TbProgram:
    """One persistent worker TB of GPU ``g``: a ready row block first, else the next
    tile, else it waits for a block to become ready."""
    q, m = f.queues[g], f.m

    def program(sm: int, busy: int) -> ProgramGen:
        isa = m.isa
        w = Worker(g, isa.sm_port(),
                   RequestSlots(Bound(m.sim, m.cfg.collective.outstanding_bytes_per_sm), isa.request_bound(g)))
        while True:
            if q.ready:
                q.taken += 1
                yield from path.block_task(f, w, q.ready.popleft())
            elif q.next_tile < len(q.tiles):
                i, j = q.tiles[q.next_tile]
                q.next_tile += 1
                yield from _tile_task(f, path, w, i, j)
            elif q.pending():
                q.idle += 1
                yield q.wake()
                q.idle -= 1
                continue
            else:
                return
            yield from w.drain_port(m.sim)
    return program


def fused_kernels(m: Machine, cm: ComputeModel, c: Chain, d: Dims, shape: GemmShape, floor_ps: int, rw: RowWise,
                  path: FusedPath) -> tuple[list[Kernel], list[Countdown]]:
    """Chain ``c``'s fused GEMM1 + RS + row-wise + AG kernel on every GPU, one
    persistent worker TB per SM (all ``rw.total_sms``), moving data along ``path``.
    ``shape`` and ``floor_ps``: GEMM1's tiles and least tile time. Returns the
    kernels and, per GPU, the signal that its ``gather_dst`` is complete."""
    n = m.n
    plan = make_plan(c, shape, d, n, m.cfg.transfer_unit_bytes, rw.eb)
    queues = [WorkQueue(path.tile_order(plan, g, n), len(plan.blocks)) for g in range(n)]
    gathered = [Countdown(d.tokens * plan.h) for _ in range(n)]
    tiles_done = [[[Countdown(e // n) for e in plan.expected[o]] for o in range(n)] for _ in range(n)]
    f = Fused(m, cm, c, d, rw, floor_ps, plan, queues, gathered, tiles_done)
    path.wire(f)
    name = f"fused-{c.gemm1.name}-rs-{c.rowop.name}-ag"
    kernels = [Kernel(name, [_worker(f, path, g) for _ in range(rw.total_sms)], hbm_phases=True) for g in range(n)]
    return kernels, gathered
