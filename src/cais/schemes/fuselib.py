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

The work queue and worker TBs are kernels/fused_workers.py; this scheme picks its
P2P data path (:class:`~cais.kernels.fused_workers.PushPath`).
"""

from __future__ import annotations

from cais.kernels.fused_workers import FusedPath, PushPath
from cais.schemes.base import Deps, LayerRun, Scheme
from cais.workload.graph import Chain


def fused_chain(r: LayerRun, c: Chain, deps: Deps, path: FusedPath) -> Deps:
    """One persistent fused GEMM1 + RS + row-wise + AG kernel per GPU, data moving
    along ``path``; then GEMM2 as its own kernel once the fused kernel has finished
    and every row of ``gather_dst`` has landed."""
    over = r.cm.kernel_overhead_ps
    fused, gathered = r.fused_kernels(c, path)
    out = []
    for g in range(r.m.n):
        k1 = r.submit(g, fused[g], [deps[g]], over, c.name)
        out.append(r.submit(g, r.gemm_kernel(g, c.gemm2), [k1, gathered[g]], over, c.name))
    return out


class FuseLib(Scheme):
    """One persistent fused GEMM1+RS+row-wise+AG kernel per GPU (P2P stores), then
    GEMM2."""

    name = "fuselib"
    sp = True
    algo = "p2p"
    summary = ("persistent fused kernel: GEMM tiles red-push partials to the row owner, the owner's row-wise "
               "TBs run as rows complete and st-push them to every GPU; next GEMM after the gather")

    def path(self) -> FusedPath:
        """Tiles ``red`` into the row owner, row-wise output ``st`` to every GPU."""
        return PushPath()

    def gather(self, r: LayerRun, name: str, src: str, dst: str, deps: Deps) -> Deps:
        """The backward re-gather (nothing to fuse it with): the library's (NCCL/RCCL)
        ring AllGather."""
        return self.collective_step(r, "allgather", src, dst, deps, name, algo="ring")

    def chain(self, r: LayerRun, c: Chain, deps: Deps) -> Deps:
        return fused_chain(r, c, deps, self.path())
