"""T3-NVLS: T3's track & trigger with its DMA engines issuing NVLS operations (the
"DMA-based NVLS design" of Klenk et al., ISCA'20), as the CAIS paper builds it for
fairness (§IV-A, §IV-C (c)); it "keeps coarse-grained dependencies between RS, LN
and AG" (§V-A.3).

What is modelled (per sub-layer ``Chain``):

* Chunks, stages, owners: chunk q = GPU q's token shard (rows q*rows_l ..
  (q+1)*rows_l of the [T, h] partial sum); its owner is GPU q. An in-switch
  reduction reads every GPU's replica at once, so chunk q can only be reduced when
  it is complete on ALL GPUs; every GPU therefore computes its stages in the same
  order, stage s = chunk s (no stagger): GEMM1 (all SMs) launches its tile rows in
  chunk order (a tile row straddling two chunks goes with the earlier one), N tiles
  inner, and stores them locally.
* Tracker: the GEMM epilogue's stores are counted per (GPU, chunk); when chunk q is
  complete on every GPU (each GPU's counter done and its completion flag stored on
  the owner, a packet on the wire) the owner's DMA engine pulls the
  chunk's sum with ``multimem.ld_reduce`` (switch reduction) into its RS output.
  The pulls of different chunks run on different GPUs' engines, overlapped with the
  rest of GEMM1.
* DMA engine (shared with :mod:`cais.schemes.t3`): an ``engine.Process`` per GPU on
  no SM, FIFO of triggered whole-chunk commands cut into transfer units, at most
  ``dma_window_bytes`` (4 MiB) of pulls outstanding, stores pushed at the link rate
  (450 GB/s on DGX-H100).
* Coarse-grained RS -> LN -> AG -> GEMM2 (kernel-level dependencies): the row-wise
  kernel (all SMs, launch overhead) starts when the whole ReduceScatter is done
  (every owner's pull, then an NVLS barrier) and GEMM1 has finished; the
  AllGather starts when every GPU's row-wise kernel is done (the NVLS team's start
  barrier), each DMA engine ``multimem.st``-ing its GPU's shard to every replica;
  GEMM2 (all SMs) launches after the whole AllGather (every multicast delivered,
  then a barrier). Barriers and flags are packets on the wire (kernels/sync.py).
* Stand-alone AllGathers (backward re-gathers): the same DMA multicast AllGather.

Not modelled: HBM contention between DMA traffic and the GEMM; the DMA trigger
latency (the tracker is at the memory controller).
"""

from __future__ import annotations

import numpy as np

from cais.engine import Countdown, Signal
from cais.kernels import sync
from cais.kernels.dma import DmaCommand
from cais.kernels.gemm import Epilogue
from cais.schemes.base import Deps, LayerRun
from cais.schemes.t3 import DmaScheme, chunk_unit, pieces_by_row, pieces_per_chunk, shard, tile_order
from cais.workload.graph import Chain


class T3Nvls(DmaScheme):
    """GEMM || per-chunk DMA ld_reduce (after all GPUs finish the chunk); LN; DMA
    multicast AG; GEMM."""

    name = "t3-nvls"
    algo = "nvls"
    summary = ("GEMM || tracker-triggered DMA multimem.ld_reduce per chunk; LN after the whole RS; "
               "DMA multimem.st AG; next GEMM after the whole AG")

    def chain(self, r: LayerRun, c: Chain, deps: Deps) -> Deps:
        n = r.m.n
        rs_end, g1 = self.gemm_rs(r, c, deps)
        rows = [r.submit(g, r.rowop_kernel(g, c.rowop), [rs_end[g], g1[g]], r.cm_mem_overhead_ps, c.name)
                for g in range(n)]
        ag_end = self.nvls_allgather(r, c.gather_src, c.gather_dst, rows)
        over = r.cm.kernel_overhead_ps
        return [r.submit(g, r.gemm_kernel(g, c.gemm2), [ag_end[g], rows[g]], over, c.name) for g in range(n)]

    def gather(self, r: LayerRun, name: str, src: str, dst: str, deps: Deps) -> Deps:
        return self.nvls_allgather(r, src, dst, deps)

    def gemm_rs(self, r: LayerRun, c: Chain, deps: Deps) -> tuple[Deps, Deps]:
        """GEMM1 with per-chunk NVLS pulls; returns (whole RS done, GEMM1 done per GPU)."""
        n, sim = r.m.n, r.m.sim
        shape = r.shape(c.gemm1)
        pieces = pieces_by_row(shape, r.d.rows_l)
        per_chunk = pieces_per_chunk(shape, pieces, n)
        unit = chunk_unit(r)
        tracker = [[Countdown(per_chunk[q]) for q in range(n)] for _ in range(n)]
        pulled = [Signal() for _ in range(n)]
        for q in range(n):
            everywhere = sync.notify(r.m, [tracker[g][q] for g in range(n)], q, f"{c.name} chunk {q} tracked")
            cmd = DmaCommand("ld_reduce", shard(c.gemm1.ops.c, q, r), shard(c.reduced, 0, r), unit, done=pulled[q])
            self.dma[q].on(everywhere, cmd)
        over = r.cm.kernel_overhead_ps
        order = tile_order(shape, pieces, lambda q: q)
        g1 = []
        for g in range(n):
            store = r.store_epilogue(g, c.gemm1, shape)

            def epilogue(i: int, j: int, tile: np.ndarray | None, g: int = g,
                         store: Epilogue | None = store) -> None:
                if store is not None:
                    store(i, j, tile)
                for q, _, _ in pieces[i]:
                    tracker[g][q].arrive(sim)
            k1 = r.gemm_kernel(g, c.gemm1, None, epilogue, order, shape=shape)
            g1.append(r.submit(g, k1, [deps[g]], over, c.name))
        return r.barrier(pulled, f"{c.name} RS end"), g1

    def nvls_allgather(self, r: LayerRun, src: str, dst: str, deps: Deps) -> Deps:
        """Coarse-grained DMA multicast AllGather: starts after every ``deps`` (an
        NVLS barrier), ends when every shard reached every GPU (another)."""
        n = r.m.n
        unit = chunk_unit(r)
        start = r.barrier(deps, "AG start")
        sent = [Signal() for _ in range(n)]
        for g in range(n):
            self.dma[g].on(start[g], DmaCommand("mc_st", shard(src, 0, r), shard(dst, g, r), unit, done=sent[g]))
        return r.barrier(sent, "AG end")
