"""FuseLib-NVLS: FuseLib's fused computation-collective kernels with the collective
made of NVLS operations ("extended multimem instructions", CAIS paper §IV-C (c);
peers.md §4.5, §7).

What is modelled: the same persistent fused kernel per GPU as
:mod:`cais.schemes.fuselib` (one worker TB per SM, one launch, work items GEMM1 tiles
and ready row blocks, ready row blocks first), with the data movement replaced:

* **GEMM1 tile**: its epilogue stores the partial tile *locally* (into the GEMM's
  [T, h] output, as a plain GEMM would): nothing crosses NVLink yet.
* **Cross-GPU readiness** (TB-level): ``multimem.ld_reduce`` reads every GPU's
  replica, so a row block (``ROWS_PER_TB`` = 64 rows of its owner's shard) can be
  reduced only once every tile touching it is done on *all* GPUs. Each GPU counts
  its own tiles per block and, when its last one is done, stores a completion flag
  on the owner (a packet on the wire, kernels/sync.py); the block is ready when the
  owner has seen all n flags.
* **Reduction** (a TB of the fused kernel, on the owner): ``multimem.ld_reduce`` of
  the block's rows through the switch (the sum lands in the owner's ``reduced``),
  cut into transfer units, at most ``outstanding_bytes_per_sm`` of loads in flight.
* **Row-wise op** on the block (memory-bound time of its rows on one SM), then
  **``multimem.st``** of its output rows to every GPU's ``gather_dst`` (the switch
  multicasts; the owner's own copy crosses NVLink too), window-limited likewise.
* **Tile order**: the same on every GPU (row block b of owner 0, 1, ..., n-1, then
  row block b+1 ...), so a block is finished on all GPUs at about the same time and
  blocks become ready one after another; since the switch pulls every GPU's partial,
  no owner sees incast, so FuseLib's per-GPU rotation would only delay readiness.
* **GEMM2** (kernel-level): a separate GEMM kernel after the fused kernel, once
  every block's release flag (``multimem.red.release`` behind its multicast, down
  every chip's path) has landed on this GPU.
* **Standalone AllGather** (backward re-gather): NCCL's NVLS AllGather.
"""

from __future__ import annotations

import numpy as np

from cais.engine import Countdown, Signal
from cais.engine.sim import ProgramGen
from cais.hw.memory import Region
from cais.hw.packets import Traffic
from cais.kernels import sync
from cais.kernels.gemm import store_epilogue
from cais.schemes.base import LayerRun
from cais.schemes.fuselib import Fused, FuseLib, Plan, Worker, unit_chunks


class FuseLibNvls(FuseLib):
    """Persistent fused GEMM1 + (ld_reduce -> row-wise -> multimem.st per row block)."""

    name = "fuselib-nvls"
    algo = "nvls"
    standalone_algo = "nvls"
    summary = ("FuseLib's persistent fused kernel with NVLS: tiles stored locally; when a row block is done on "
               "all GPUs its owner ld_reduces it, applies the row-wise op and multimem.st's it; next GEMM after")

    def tile_order(self, r: LayerRun, plan: Plan, g: int) -> list[tuple[int, int]]:
        """Tile rows by position in their owner's shard, then owner; the same on every GPU."""
        def key(i: int) -> tuple[int, int, int]:
            p = plan.pieces[i][0]
            return p.local_first, p.owner, i
        return [(i, j) for i in sorted(range(plan.shape.tiles_m), key=key) for j in range(plan.shape.tiles_n)]

    def gather_signals(self, r: LayerRun, plan: Plan) -> list[Signal]:
        """Per GPU: every block's release flag has landed there (behind its data)."""
        return [Countdown(r.d.tokens * plan.h) for _ in range(r.m.n)]

    def wire(self, r: LayerRun, f: Fused) -> None:
        """Row block b of owner o is ready once every GPU's completion flag for it
        (stored when the GPU's last tile touching it is done) has reached o."""
        n = r.m.n
        f.tiles_done = [[[Countdown(e // n) for e in f.plan.expected[o]] for o in range(n)] for _ in range(n)]
        for o in range(n):
            for b in range(len(f.plan.expected[o])):
                done = sync.notify(r.m, [f.tiles_done[g][o][b] for g in range(n)], o)
                done.on_fire(lambda _v, o=o, b=b: f.queues[o].block_ready(r, b))

    def tile_epilogue(self, r: LayerRun, f: Fused, w: Worker, i: int, j: int,
                      tile: np.ndarray | None) -> ProgramGen:
        """Store the tile locally; count it towards every row block it touches."""
        mem = r.m.gpus[w.g].memory
        if tile is not None:
            store_epilogue(mem, f.c.gemm1.ops, f.plan.shape)(i, j, tile)
        for p in f.plan.pieces[i]:
            for b in p.blocks:
                f.tiles_done[w.g][p.owner][b].arrive(r.m.sim)
        yield from ()

    def block_task(self, r: LayerRun, f: Fused, w: Worker, b: int) -> ProgramGen:
        """ld_reduce row block b of this GPU's shard, apply the row-wise op, multicast it."""
        plan, g, c, sim = f.plan, w.g, f.c, r.m.sim
        first, cnt = plan.blocks[b]
        mem = r.m.gpus[g].memory
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
            r.m.isa.multimem_ld_reduce(g, piece, got, unit=plan.unit)
        yield summed
        if mem.functional:  # reads its inputs as it starts (outputs are pushed only after its time)
            r.rowop_apply(g, c.rowop, first, cnt)
        yield self.rowop_ps(r, c, cnt)
        data = mem.read(Region(c.gather_src, first * plan.h, cnt * plan.h, plan.eb))
        dst = Region(c.gather_dst, rows, cnt * plan.h, plan.eb)
        for piece in unit_chunks(dst, w.unit(plan.unit)):
            yield from w.issue(piece.nbytes)
            part = None if data is None else data[piece.start - dst.start:piece.start - dst.start + piece.count]
            r.m.isa.multimem_st(g, piece, part, w.released(piece.nbytes), w.port, unit=plan.unit)
        r.m.isa.release_flag_multicast(g, Traffic.STORE, lambda h, k=dst.count: f.gathered[h].arrive(sim, k))
