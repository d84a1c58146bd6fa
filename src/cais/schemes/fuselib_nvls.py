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

The work queue and worker TBs are kernels/fused_workers.py, as FuseLib's; this
scheme picks the NVLS data path (:class:`~cais.kernels.fused_workers.MulticastPath`).
"""

from __future__ import annotations

from cais.kernels.fused_workers import FusedPath, MulticastPath
from cais.schemes.base import Deps, LayerRun, Scheme
from cais.schemes.fuselib import fused_chain
from cais.workload.graph import Chain


class FuseLibNvls(Scheme):
    """Persistent fused GEMM1 + (ld_reduce -> row-wise -> multimem.st per row block)."""

    name = "fuselib-nvls"
    sp = True
    algo = "nvls"
    summary = ("FuseLib's persistent fused kernel with NVLS: tiles stored locally; when a row block is done on "
               "all GPUs its owner ld_reduces it, applies the row-wise op and multimem.st's it; next GEMM after")

    def path(self) -> FusedPath:
        """Tiles stored locally, the owner ``ld_reduce``-s and ``multimem.st``-s each block."""
        return MulticastPath()

    def gather(self, r: LayerRun, name: str, src: str, dst: str, deps: Deps) -> Deps:
        """The backward re-gather (nothing to fuse it with): NCCL's NVLS AllGather."""
        return self.collective_step(r, "allgather", src, dst, deps, name, algo="nvls")

    def chain(self, r: LayerRun, c: Chain, deps: Deps) -> Deps:
        return fused_chain(r, c, deps, self.path())
