"""FuseLib (Punniyamurthy, Hamidouche, Beckmann, SC'24): fused computation-collective
kernels with GPU-initiated communication.

What the real system does: each fused operator is one self-contained *persistent*
kernel; a workgroup (TB) that finishes its piece of the output sends it at once to
the GPUs that need it with GPU-initiated stores, zero-copy (straight into the peer's
destination buffer, no staging), while the other TBs of the same kernel keep
computing. WG scheduling inside the kernel is communication-aware, and nothing inside
the fused kernel pays a launch gap. A collective is fused with its *producer*; its
consumer is a separate kernel.

What is modelled, per sub-layer (GEMM1 -> RS -> row-wise op -> AG -> GEMM2), per GPU:

* **One fused kernel** (GEMM1 + ReduceScatter + row-wise op + AllGather), launched
  once with the GEMM's fixed overhead. It is persistent: one worker TB per SM
  (all ``r.sms`` SMs); each worker loops over a per-GPU work queue.
* **Work items and their priority** (the choice the sources leave open; FuseLib's
  "communication-aware WG scheduling"): a worker that is free takes, first, a row
  block of this GPU's shard whose reduction is complete (row-wise op + its
  AllGather push), else the next GEMM1 tile, else it waits for a row block to become
  ready. So the row-wise TBs run on the GEMM's SMs, *between* its tiles, as soon as
  their rows are reduced: no SMs are set aside and none idle while tiles remain.
* **GEMM1 tile**: the calibrated tile time of a GEMM TB, with "busy SMs" = the
  workers running a tile or a row block (not those waiting for work). Its epilogue
  pushes the tile's rows to the GPU that owns those token rows with P2P ``red`` (a
  remote add into the owner's ``reduced`` buffer; rows this GPU owns: a local add). A
  tile spanning two owners' shards is split at the boundary. The stores leave
  through the SM's port (SM copy bandwidth); the worker moves on once its SM has
  issued them (posted writes), keeping at most ``outstanding_bytes_per_sm`` of
  undelivered stores in flight, so a congested fabric backpressures the GEMM.
  ``reduced`` is assumed zeroed beforehand (off the critical path).
* **Tile order**: row blocks of every owner interleaved (row block b of owner
  g+1, g+2, ..., g, then row block b+1 ...; all column tiles of a tile row
  together), so every GPU reduces into every owner at once (no incast on one owner)
  and each owner's shard completes progressively from its first rows.
* **Reduction completion** (TB-level), per row block of ``ROWS_PER_TB`` (64) rows:
  each GPU counts its own tile pieces touching the block (all column tiles) and,
  once it has issued the last one's ``red``s, stores a release flag on the owner
  behind them (``Isa.release_flag``: one flag down every chip's path, on the
  reductions' VC, so it lands after them); the owner starts the block when all n
  GPUs' flags have landed.
* **Row-wise op + AllGather** (TB-level): the worker runs the row block's dropout +
  residual + norm (or its backward) for the memory-bound time of those rows on one
  SM, writes its own copy of the output rows into ``gather_dst``, and pushes them to
  every other GPU's ``gather_dst`` with P2P ``st`` (peers in the order g+1, g+2, ...),
  cut into transfer units, at most ``outstanding_bytes_per_sm`` in flight per SM.
* **Standalone AllGather** (the backward re-gather of a GEMM input for its weight
  gradient has no producer in the chain to fuse with): NCCL's ring kernel.
* **GEMM2** (kernel-level): a separate GEMM kernel (its own fixed overhead) on each
  GPU once its fused kernel has finished and every row of ``gather_dst`` has landed.

Transfer unit: the system's largest (``transfer_unit_bytes``, 64 KiB): a tile piece
(<= 32 KiB) is one unit; a 64-row block of h = 4096 is 8 units per destination (the
ISA stripes each unit over the switch chips).
Not modelled: HBM contention between the row-wise TBs, the stores and the GEMM
tiles (the compute model has no shared-HBM term).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from cais.engine import Countdown, Signal
from cais.engine.sim import ProgramGen
from cais.hw.gpu import Kernel, TbProgram
from cais.hw.hbm import HbmPhase
from cais.hw.memory import Region
from cais.hw.packets import Traffic
from cais.isa import SmPort
from cais.engine import Bound
from cais.kernels.common import RequestSlots
from cais.kernels.gemm import GemmShape, tile_hbm_bytes, tile_product
from cais.kernels.local import ROWS_PER_TB, row_blocks
from cais.schemes.base import Deps, LayerRun, Scheme
from cais.workload.graph import Chain


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


def make_plan(r: LayerRun, c: Chain, rows_per_block: int) -> Plan:
    shape = r.shape(c.gemm1)
    rows_l, n = r.d.rows_l, r.m.n
    if c.gemm1.n != r.d.hidden:
        raise ValueError(f"{c.name}: GEMM1 must produce rows of width hidden")
    blocks = row_blocks(rows_l, rows_per_block)
    pieces = [owner_pieces(*shape.rows(i), rows_l, blocks) for i in range(shape.tiles_m)]
    expected = [[0] * len(blocks) for _ in range(n)]
    for row in pieces:
        for p in row:
            for b in p.blocks:
                expected[p.owner][b] += n * shape.tiles_n
    return Plan(shape, blocks, pieces, expected, r.m.cfg.transfer_unit_bytes, r.d.hidden, rows_l,
                r.model.dtype_bytes)


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

    def block_ready(self, r: LayerRun, b: int) -> None:
        self.ready.append(b)
        wake, self._wake = self._wake, None
        if wake is not None:
            wake.fire(r.m.sim)

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

    def drain_port(self, r: LayerRun) -> Iterator[int]:
        """Wait until the SM has pushed everything it issued."""
        if self.port.free_at > r.m.sim.now:
            yield self.port.free_at - r.m.sim.now


@dataclass
class Fused:
    """One chain being run as fused kernels: the plan, each GPU's work queue, and
    the counters TBs and GEMM2 wait on."""

    c: Chain
    plan: Plan
    queues: list[WorkQueue]
    gathered: list[Signal]
    arrivals: list[list[Countdown]] = field(default_factory=list)  # per owner, per row block
    tiles_done: list[list[list[Countdown]]] = field(default_factory=list)  # per GPU, owner, row block


class FuseLib(Scheme):
    """One persistent fused GEMM1+RS+row-wise+AG kernel per GPU (P2P stores), then
    GEMM2."""

    name = "fuselib"
    sp = True
    algo = "p2p"
    summary = ("persistent fused kernel: GEMM tiles red-push partials to the row owner, the owner's row-wise "
               "TBs run as rows complete and st-push them to every GPU; next GEMM after the gather")
    rows_per_block = ROWS_PER_TB  # rows of a row-wise TB (the reduction and gather granule)
    standalone_algo = "ring"  # a collective with no producer to fuse with: the library's (NCCL/RCCL) ring

    def gather(self, r: LayerRun, name: str, src: str, dst: str, deps: Deps) -> Deps:
        """The backward re-gather (nothing to fuse it with): a plain collective."""
        return self.collective_step(r, "allgather", src, dst, deps, name, algo=self.standalone_algo)

    def chain(self, r: LayerRun, c: Chain, deps: Deps) -> Deps:
        n, over = r.m.n, r.cm.kernel_overhead_ps
        plan = make_plan(r, c, self.rows_per_block)
        queues = [WorkQueue(self.tile_order(r, plan, g), len(plan.blocks)) for g in range(n)]
        f = Fused(c, plan, queues, self.gather_signals(r, plan))
        self.wire(r, f)
        out = []
        for g in range(n):
            kernel = Kernel(f"fused-{c.gemm1.name}-rs-{c.rowop.name}-ag", [self.worker(r, f, g) for _ in range(r.sms)],
                            hbm_phases=True)
            k1 = r.submit(g, kernel, [deps[g]], over, c.name)
            out.append(r.submit(g, r.gemm_kernel(g, c.gemm2), [k1, f.gathered[g]], over, c.name))
        return out

    # ---- hooks the NVLS variant replaces -------------------------------------------
    def tile_order(self, r: LayerRun, plan: Plan, g: int) -> list[tuple[int, int]]:
        """Tile rows by position in their owner's shard, owners from g+1 round to g."""
        n, shape = r.m.n, plan.shape

        def key(i: int) -> tuple[int, int, int]:
            p = plan.pieces[i][0]
            return p.local_first, (p.owner - g - 1) % n, i
        return [(i, j) for i in sorted(range(shape.tiles_m), key=key) for j in range(shape.tiles_n)]

    def gather_signals(self, r: LayerRun, plan: Plan) -> list[Signal]:
        """Per GPU: every element of its ``gather_dst`` has landed."""
        return [Countdown(r.d.tokens * plan.h) for _ in range(r.m.n)]

    def wire(self, r: LayerRun, f: Fused) -> None:
        """Row block b of owner o is ready when every GPU's flag for it has landed on
        o: a GPU counts its own tile pieces of the block and, once it has issued the
        last one's reductions, stores a release flag behind them (``release_flag``)."""
        n, sim = r.m.n, r.m.sim
        f.tiles_done = [[[Countdown(e // n) for e in f.plan.expected[o]] for o in range(n)] for _ in range(n)]
        f.arrivals = [[self.block_flags(n) for _ in f.plan.expected[o]] for o in range(n)]
        for o in range(n):
            for b, flags in enumerate(f.arrivals[o]):
                flags.on_fire(lambda _v, o=o, b=b: f.queues[o].block_ready(r, b))
                for g in range(n):
                    f.tiles_done[g][o][b].on_fire(
                        lambda _v, g=g, o=o, flags=flags: r.m.isa.release_flag(
                            g, o, Traffic.REDUCTION, lambda: flags.arrive(sim)))

    @staticmethod
    def block_flags(n: int) -> Countdown:
        """What an owner counts a row block's flags with: all n GPUs'."""
        return Countdown(n)

    def tile_epilogue(self, r: LayerRun, f: Fused, w: Worker, i: int, j: int,
                      tile: np.ndarray | None) -> ProgramGen:
        """Push each owner's rows of the tile into its ``reduced`` buffer with ``red``."""
        plan, sim = f.plan, r.m.sim
        c0, nc = plan.shape.cols(j)
        for p in plan.pieces[i]:
            region = Region.block(f.c.reduced, plan.h, p.local_first, p.count, c0, nc, plan.eb)
            data = None if tile is None else tile[p.tile_first:p.tile_first + p.count]
            if data is not None and region.rows == 1:  # whole rows: a contiguous run
                data = data.reshape(-1)
            for piece in r.m.isa.pieces(region, w.unit(plan.unit)):
                yield from w.issue(piece.nbytes)
                r.m.isa.red(w.g, p.owner, piece, r.m.isa.piece_data(data, region, piece), w.released(piece.nbytes),
                            w.port, unit=plan.unit)
            for b in p.blocks:
                f.tiles_done[w.g][p.owner][b].arrive(sim)

    def block_task(self, r: LayerRun, f: Fused, w: Worker, b: int) -> ProgramGen:
        """Row-wise op on row block b of this GPU's shard, then its AllGather push."""
        plan, g, c = f.plan, w.g, f.c
        first, cnt = plan.blocks[b]
        mem = r.m.gpus[g].memory
        if mem.functional:  # reads its inputs as it starts (outputs are pushed only after its time)
            r.rowop_apply(g, c.rowop, first, cnt)
        yield HbmPhase(self.rowop_ps(r, c, cnt), r.rowop_bytes(c.rowop, cnt))
        data = mem.read(Region(c.gather_src, first * plan.h, cnt * plan.h, plan.eb))
        dst = Region(c.gather_dst, (g * plan.rows_l + first) * plan.h, cnt * plan.h, plan.eb)
        mem.write(dst, data)
        f.gathered[g].arrive(r.m.sim, dst.count)
        n = r.m.n
        for k in range(1, n):
            peer = (g + k) % n
            for piece in unit_chunks(dst, w.unit(plan.unit)):
                yield from w.issue(piece.nbytes)
                part = None if data is None else data[piece.start - dst.start:piece.start - dst.start + piece.count]
                r.m.isa.st(g, peer, piece, part, w.released(piece.nbytes), w.port, unit=plan.unit)
            arrived = (lambda peer=peer, cnt=dst.count: f.gathered[peer].arrive(r.m.sim, cnt))
            r.m.isa.release_flag(g, peer, Traffic.STORE, arrived)

    # ---- the persistent kernel ------------------------------------------------------
    @staticmethod
    def rowop_ps(r: LayerRun, c: Chain, rows: int) -> int:
        """One SM streaming the row-wise op over ``rows`` rows (memory bound)."""
        return r.rowop_work_ps(c.rowop, rows, 1)

    def tile_task(self, r: LayerRun, f: Fused, w: Worker, i: int, j: int) -> ProgramGen:
        shape, gpu = f.plan.shape, r.m.gpus[w.g]
        busy = max(1, gpu.busy_sms - f.queues[w.g].idle)
        # A and B are local; of the output only the GPU's own rows stay (the rest is pushed)
        yield HbmPhase(max(r.gemm_floor_ps(f.c.gemm1, shape, r.sms), r.cm.tile_time_ps(shape.bm, shape.bn, shape.k, busy)),
                       tile_hbm_bytes(shape, f.plan.eb, c=1.0 / r.m.n))
        mem = gpu.memory
        tile = tile_product(mem, f.c.gemm1.ops, shape, i, j) if mem.functional else None
        yield from self.tile_epilogue(r, f, w, i, j, tile)

    def worker(self, r: LayerRun, f: Fused, g: int) -> TbProgram:
        q = f.queues[g]

        def program(sm: int, busy: int) -> ProgramGen:
            isa = r.m.isa
            w = Worker(g, isa.sm_port(),
                       RequestSlots(Bound(r.m.sim, r.m.cfg.collective.outstanding_bytes_per_sm), isa.request_bound(g)))
            while True:
                if q.ready:
                    q.taken += 1
                    yield from self.block_task(r, f, w, q.ready.popleft())
                elif q.next_tile < len(q.tiles):
                    i, j = q.tiles[q.next_tile]
                    q.next_tile += 1
                    yield from self.tile_task(r, f, w, i, j)
                elif q.pending():
                    q.idle += 1
                    yield q.wake()
                    q.idle -= 1
                    continue
                else:
                    return
                yield from w.drain_port(r)
        return program
