"""Chunked overlap of a GEMM with the collective that follows it (the CoCoNet
family): the producer GEMM runs on the compute SMs in chunk order, and as soon as a
chunk of token rows is complete on a GPU, the communication SMs reduce-scatter it,
apply the row-wise op to it and all-gather it, while the GEMM computes the next
chunk. The consuming GEMM starts when every chunk has been gathered (kernel-level
dependency: overlap with the *producer* only).

A chunk is a slice of every GPU's token shard (rows ``first .. first+count`` of each
shard), so each GPU keeps owning a contiguous shard and a chunk's ReduceScatter and
AllGather are ordinary collectives over a strided layout.
"""

from __future__ import annotations

from cais.engine import Countdown, all_of
from cais.kernels.common import split
from cais.kernels.gemm import GemmShape
from cais.kernels.local import row_blocks
from cais.schemes.base import Deps, LayerRun, Scheme
from cais.workload.graph import Chain


def chunk_rows(r: LayerRun, chunks: int) -> list[tuple[int, int]]:
    """(first, count) of each chunk inside a GPU's shard of ``rows_l`` rows."""
    return [c for c in split(0, r.d.rows_l, chunks) if c[1] > 0]


def tile_rows_of_chunks(r: LayerRun, shape: GemmShape, chunks: list[tuple[int, int]]) -> list[list[int]]:
    """For each chunk, the GEMM tile rows (row blocks of BM) covering its rows in any
    GPU's shard."""
    out = []
    for first, cnt in chunks:
        rows = set()
        for g in range(r.m.n):
            lo = g * r.d.rows_l + first
            rows.update(range(lo // shape.bm, (lo + cnt - 1) // shape.bm + 1))
        out.append(sorted(rows))
    return out


class ChunkedOverlap(Scheme):
    """GEMM -> (per chunk: RS -> row-wise -> AG on ``comm_sms`` SMs) -> GEMM."""

    sp = True
    comm_sms = 16  # SMs given to the collective (NCCL-style channels)
    chunks = 4  # chunks of each token shard (CoCoNet's pipelining depth; not given by the paper)

    def chain(self, r: LayerRun, c: Chain, deps: Deps) -> Deps:
        n = r.m.n
        k = max(1, min(self.comm_sms, r.sms // 2))
        comm, comp = frozenset(range(k)), frozenset(range(k, r.sms))
        chunks = chunk_rows(r, self.chunks)
        shape = r.shape(c.gemm1, len(comp))
        need = tile_rows_of_chunks(r, shape, chunks)
        first_need: dict[int, int] = {}
        for q, rows in enumerate(need):
            for i in rows:
                first_need.setdefault(i, q)
        order = [(i, j) for i in sorted(range(shape.tiles_m), key=lambda i: (first_need.get(i, len(chunks)), i))
                 for j in range(shape.tiles_n)]
        chunks_of_row = {i: [q for q, rows in enumerate(need) if i in rows] for i in range(shape.tiles_m)}
        ready = [[Countdown(len(rows) * shape.tiles_n) for rows in need] for _ in range(n)]
        over = r.cm.kernel_overhead_ps
        g1 = []
        for g in range(n):
            store = r.store_epilogue(g, c.gemm1, shape)

            def epilogue(i: int, j: int, tile, g: int = g, store=store) -> None:
                if store is not None:
                    store(i, j, tile)
                for q in chunks_of_row[i]:
                    ready[g][q].arrive(r.m.sim)
            k1 = r.gemm_kernel(g, c.gemm1, comp, epilogue, order, shape=shape)
            g1.append(r.submit(g, k1, [deps[g]], over, c.name))
        prev = deps
        for q, rows in enumerate(chunks):
            launch = r.m.launch_ps if q == 0 else 0  # one persistent communication kernel
            start = [all_of(r.m.sim, [ready[g][q], prev[g]]) for g in range(n)]
            red = self.collective_step(r, "reducescatter", c.gemm1.ops.c, c.reduced, start, c.name,
                                       [comm] * n, rows, k, launch)
            blocks = [(rows[0] + b0, bc) for b0, bc in row_blocks(rows[1])]
            normed = [r.submit(g, r.rowop_kernel(g, c.rowop, comm, blocks), [red[g]], 0, c.name) for g in range(n)]
            prev = self.collective_step(r, "allgather", c.gather_src, c.gather_dst, normed, c.name,
                                        [comm] * n, rows, k, 0)
        return [r.submit(g, r.gemm_kernel(g, c.gemm2), [prev[g], g1[g]], over, c.name) for g in range(n)]
