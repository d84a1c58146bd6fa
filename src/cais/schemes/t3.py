"""T3 (Pati et al., ASPLOS'24): hardware "track & trigger" overlap of a GEMM with the
ring ReduceScatter of its output, with near-memory reduction; and the AG-GEMM overlap
the CAIS authors added to it (CAIS paper §IV-C).

What the real system does: software pre-programs, per output chunk, where the chunk
goes and with which DMA command; the GEMM kernel is unchanged except that each GPU
computes its output tiles in a staggered order (chunk needed at ring step s first). A
tracker at the memory controller counts the stores into each chunk; when a chunk's
expected count is reached (its local tiles AND the partial sum coming from the
previous GPU of the ring) it fires the pre-programmed DMA that sends the chunk to the
next GPU, where the memory (near-memory compute, NMC) adds it in place: no SM runs
the reduction or the transfer. The first stage is written by the GEMM itself as
remote update stores; the last stage is the fully reduced chunk, left in place.

What is modelled (per sub-layer ``Chain``):

* Chunks and stages: chunk q = GPU q's token shard (rows q*rows_l .. (q+1)*rows_l of
  the [T, h] partial sum) -- so the RS output lands on its owner. GPU g's stage s is
  chunk (g - 1 - s) mod n: stage 0 is the chunk of g-1 (sent right away), stage n-1
  its own chunk. GEMM1 runs on ALL SMs; its tile rows are launched in stage order (a
  tile row straddling two chunks goes with the earlier stage), N tiles inner.
* GEMM1 epilogue (TB level): a stage-0 tile is sent by the TB to GPU g+1 as a
  ``red`` (NMC add; pushed at the SM's store bandwidth); any other tile is added
  into local memory (NMC update: ``zo_p``-style partial buffer, or directly the RS
  output buffer for the own chunk) -- adds, so the arrival order of the local tile
  and the neighbour's partial does not matter.
* Tracker: one counter per (GPU, chunk) expecting the chunk's local tile pieces plus
  the incoming update (stage 1: the neighbour's per-tile remote stores; later
  stages: one DMA transfer). When it completes, the chunk is queued on the GPU's DMA
  engine, which ``red``s the whole chunk into the next GPU (its partial buffer, or
  the owner's RS output buffer at the last step).
* DMA engine: an ``engine.Process`` per GPU, on no SM: a FIFO of triggered commands;
  each whole-chunk command is cut into transfer units (the ISA's routing granule)
  issued back to back through a port of ``dma_rate`` (link-limited: the GPU's total
  NVLink bandwidth per direction, 18 x 25 = 450 GB/s on DGX-H100; T3 does not model
  its DMA engine's internals, only the links) with at most ``dma_window_bytes``
  (4 MiB) not yet delivered (or, for pulls, returned). The window is sized so the
  engine stays link-limited: alone on the fabric, one chunk pulled with
  ``multimem.ld_reduce`` reaches about 275 GB/s with 1 MiB outstanding and the link
  bound (about 316-321 GB/s: the owner's down-link carries the sums plus the pull
  requests for its own replica) from 2-4 MiB; 4 MiB also leaves room for loaded
  round trips. A stored chunk (``st``/``red``) moves at about 347 GB/s (the write
  packet format's bound is 360). No trigger latency: the tracker sits at the memory
  controller and the command is pre-programmed.
* Row-wise op (choice): a normal kernel on all SMs, launched (kernel overhead) when
  this GPU's ReduceScatter is done (its own chunk complete) and GEMM1 finished:
  coarse-grained, after the whole RS, before the AG.
* AllGather (the CAIS authors' extension, modelled as the mirror image of the RS): a
  DMA-driven ring. When the row-wise kernel ends, the tracker (counting its stores)
  triggers the DMA to ``st`` the GPU's shard into the next GPU's gathered buffer and
  to copy it into its own; every arrival of a chunk at a GPU is tracked and
  triggers its forwarding to the next GPU (store-and-forward per chunk) until the
  chunk reaches the GPU before its owner.
* GEMM2 (TB level): launched after the row-wise kernel; its tile rows wait only for
  the chunks they read (``waits``), and are ordered by when those chunks arrive on
  this GPU: the own shard first, then g-1, g-2, ... (ring order); a row straddling
  two chunks is ranked by the later one.
* Stand-alone AllGathers (the backward re-gathers) use the same DMA ring.

HBM (issue 9): the DMA's reads, the NMC updates (read-add-write) and the stores it
receives count as fabric-side HBM traffic of their GPU (hw/hbm.py), which the GEMM's
and the row-wise kernel's phases share the HBM with; ``gpu.interference.mc_policy =
"compute-first"`` is T3's MCA (SM requests first, so the kernels do not see that
traffic). The copy engine's rate and window are ``gpu.copy_engine`` fields. Not
modelled: the time of the local DMA copy of the own shard, and the tracker's size
(256 entries in T3; a GPU tracks n chunks per sub-layer here, never near it).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cais.engine import Countdown, Signal, all_of
from cais.hw.gpu import Kernel
from cais.hw.memory import Region
from cais.kernels.gemm import GemmShape
from cais.kernels.dma import DmaCommand, DmaEngine, dma_rate_GBps, dma_start_ps, dma_window_bytes
from cais.schemes.base import Deps, LayerRun, Scheme
from cais.workload.graph import Chain

Piece = tuple[int, int, int]  # (chunk, first global row, rows)


# ---- chunk bookkeeping shared by T3 and T3-NVLS -----------------------------------------
def row_pieces(shape: GemmShape, i: int, rows_l: int) -> list[Piece]:
    """The parts of tile row ``i`` lying in each GPU's token shard (= chunk)."""
    r0, nr = shape.rows(i)
    out = []
    row = r0
    while row < r0 + nr:
        q = row // rows_l
        stop = min(r0 + nr, (q + 1) * rows_l)
        out.append((q, row, stop - row))
        row = stop
    return out


def pieces_by_row(shape: GemmShape, rows_l: int) -> list[list[Piece]]:
    return [row_pieces(shape, i, rows_l) for i in range(shape.tiles_m)]


def pieces_per_chunk(shape: GemmShape, pieces: list[list[Piece]], n: int) -> list[int]:
    """Tile pieces (tile x chunk overlaps) each chunk receives from one GPU's GEMM."""
    count = [0] * n
    for row in pieces:
        for q, _, _ in row:
            count[q] += shape.tiles_n
    return count


def tile_order(shape: GemmShape, pieces: list[list[Piece]], rank: Callable[[int], int],
               latest: bool = False) -> list[tuple[int, int]]:
    """Tile rows sorted by the rank of the chunks they touch (the best one for a
    producer: a straddling row feeds its earlier chunk; the worst one, ``latest``, for
    a consumer: it can only start when its last chunk is there), N tiles inner."""
    pick = max if latest else min
    rows = sorted(range(shape.tiles_m), key=lambda i: (pick(rank(q) for q, _, _ in pieces[i]), i))
    return [(i, j) for i in rows for j in range(shape.tiles_n)]


def shard(buffer: str, q: int, r: LayerRun, base_rows: int = 0) -> Region:
    """Chunk ``q`` (GPU q's token shard, whole rows) of a [*, h] buffer whose first
    row is global row ``base_rows``."""
    rl, h = r.d.rows_l, r.d.hidden
    return Region(buffer, (q * rl - base_rows) * h, rl * h, r.model.dtype_bytes)


def chunk_unit(r: LayerRun) -> int:
    return r.m.cfg.unit_for(r.d.rows_l * r.d.hidden * r.model.dtype_bytes)


class DmaScheme(Scheme):
    """What T3 and T3-NVLS share: a DMA engine per GPU, made at the start of a run."""

    name = ""
    sp = True
    dma: list[DmaEngine]

    def run(self, r: LayerRun) -> None:
        rate, window = dma_rate_GBps(r.m.cfg), dma_window_bytes(r.m.cfg)  # gpu.copy_engine
        self.dma = [DmaEngine(r.m, g, rate, window, dma_start_ps(r.m.cfg)) for g in range(r.m.n)]
        super().run(r)

    def gemm2_waiting(self, r: LayerRun, c: Chain, g: int, arrived: list[Signal],
                      rank: Callable[[int], int]) -> Kernel:
        """GEMM2 on GPU g: each tile row waits for the gathered chunks it reads, tile rows
        in ``rank`` order of those chunks."""
        if c.gemm2.ops.a != c.gather_dst or c.gemm2.ops.ta or c.gemm2.m != r.d.tokens:
            raise ValueError(f"{c.name}: GEMM2 does not read the gathered rows as its A operand")
        shape = r.shape(c.gemm2)
        pieces = pieces_by_row(shape, r.d.rows_l)

        def waits(i: int, _j: int) -> list[Signal]:
            return [arrived[q] for q, _, _ in pieces[i]]
        return r.gemm_kernel(g, c.gemm2, None, None, tile_order(shape, pieces, rank, latest=True), waits, shape)


class T3(DmaScheme):
    """GEMM (staggered) || tracker-triggered DMA ring RS with NMC; LN; DMA ring AG ||
    GEMM (tile rows wait for their chunk)."""

    name = "t3"
    algo = "ring"
    summary = ("staggered GEMM || tracker-triggered DMA ring RS with near-memory adds (no SMs); LN kernel; "
               "DMA ring AG || next GEMM, tile rows waiting for their chunk")

    def chain(self, r: LayerRun, c: Chain, deps: Deps) -> Deps:
        n = r.m.n
        rs_done, g1 = self.gemm_rs(r, c, deps)
        rows = [r.submit(g, r.rowop_kernel(g, c.rowop), [rs_done[g], g1[g]], r.cm_mem_overhead_ps, c.name)
                for g in range(n)]
        arrived = self.ring_allgather(r, c.gather_src, c.gather_dst, rows)
        over = r.cm.kernel_overhead_ps
        out = []
        for g in range(n):
            k2 = self.gemm2_waiting(r, c, g, arrived[g], lambda q, g=g: (g - q) % n)
            out.append(r.submit(g, k2, [rows[g]], over, c.name))
        return out

    def gather(self, r: LayerRun, name: str, src: str, dst: str, deps: Deps) -> Deps:
        arrived = self.ring_allgather(r, src, dst, deps)
        return [all_of(r.m.sim, a) for a in arrived]

    # ---- GEMM || ring ReduceScatter ------------------------------------------------
    def gemm_rs(self, r: LayerRun, c: Chain, deps: Deps) -> tuple[Deps, Deps]:
        """GEMM1 with the tracker-driven ring RS; returns (own chunk reduced, GEMM1 done)
        per GPU."""
        n, sim, isa = r.m.n, r.m.sim, r.m.isa
        rl, h, eb = r.d.rows_l, r.d.hidden, r.model.dtype_bytes
        part = c.gemm1.ops.c
        shape = r.shape(c.gemm1)
        pieces = pieces_by_row(shape, rl)
        per_chunk = pieces_per_chunk(shape, pieces, n)
        unit = chunk_unit(r)

        def stage(g: int, q: int) -> int:
            return (g - 1 - q) % n

        def incoming(g: int, q: int) -> int:
            s = stage(g, q)
            return 0 if s == 0 else per_chunk[q] if s == 1 else 1

        def target(x: int, q: int) -> tuple[str, int]:
            """Where chunk q's sum is kept on GPU x: the RS output on its owner, else
            the partial-sum buffer (buffer, global row of its first row)."""
            return (c.reduced, q * rl) if x == q else (part, 0)

        tracker = [[Countdown(per_chunk[q] + incoming(g, q)) for q in range(n)] for g in range(n)]
        for g in range(n):
            nxt = (g + 1) % n
            for q in range(n):
                if stage(g, q) == n - 1:
                    continue
                buf, base = target(nxt, q)
                cmd = DmaCommand("red", shard(part, q, r), shard(buf, q, r, base), unit, nxt,
                                 self._arrive(r, tracker[nxt][q]))
                self.dma[g].on(tracker[g][q], cmd)

        over = r.cm.kernel_overhead_ps
        g1 = []
        for g in range(n):
            nxt = (g + 1) % n

            def epilogue(i: int, j: int, tile: np.ndarray | None, g: int = g, nxt: int = nxt) -> None:
                c0, nc = shape.cols(j)
                t0 = shape.rows(i)[0]
                for q, row, nr in pieces[i]:
                    data = None if tile is None else tile[row - t0:row - t0 + nr]
                    if stage(g, q) == 0:  # remote update store to the ring neighbour
                        buf, base = target(nxt, q)
                        dst = Region.block(buf, h, row - base, nr, c0, nc, eb)
                        isa.red(g, nxt, dst, data, self._arrive_cb(r, tracker[nxt][q]), isa.sm_port(), unit=unit)
                    else:  # local update (NMC op-and-store), counted by the tracker
                        buf, base = target(g, q)
                        isa.add_local(g, Region.block(buf, h, row - base, nr, c0, nc, eb), data)
                        tracker[g][q].arrive(sim)

            order = tile_order(shape, pieces, lambda q, g=g: stage(g, q))
            k1 = r.gemm_kernel(g, c.gemm1, None, epilogue, order, shape=shape)
            g1.append(r.submit(g, k1, [deps[g]], over, c.name))
        return [tracker[g][g] for g in range(n)], g1

    @staticmethod
    def _arrive_cb(r: LayerRun, counter: Countdown) -> Callable[[], None]:
        return lambda: counter.arrive(r.m.sim)

    @staticmethod
    def _arrive(r: LayerRun, counter: Countdown) -> Signal:
        """A signal whose firing is one arrival at ``counter``."""
        sig = Signal()
        sig.on_fire(lambda _v: counter.arrive(r.m.sim))
        return sig

    # ---- ring AllGather --------------------------------------------------------------
    def ring_allgather(self, r: LayerRun, src: str, dst: str, deps: Deps) -> list[list[Signal]]:
        """DMA ring AllGather of every GPU's shard ``src`` into ``dst``: GPU g sends its
        shard when ``deps[g]`` fires, and forwards each chunk on arrival. Returns, per
        GPU, the arrival signal of each chunk."""
        n = r.m.n
        unit = chunk_unit(r)
        arrived = [[Signal() for _ in range(n)] for _ in range(n)]
        for g in range(n):
            nxt = (g + 1) % n
            own = shard(src, 0, r)
            self.dma[g].on(deps[g], DmaCommand("st", own, shard(dst, g, r), unit, g, arrived[g][g]))
            self.dma[g].on(deps[g], DmaCommand("st", own, shard(dst, g, r), unit, nxt, arrived[nxt][g]))
            for q in range(n):
                if q != g and nxt != q:
                    fwd = DmaCommand("st", shard(dst, q, r), shard(dst, q, r), unit, nxt, arrived[nxt][q])
                    self.dma[g].on(arrived[g][q], fwd)
        return arrived
