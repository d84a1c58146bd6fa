"""LADM (Khairy, Nikiforov, Nellans, Rogers, MICRO'20, "Locality-Centric Data and
Threadblock Management for Massive GPUs"): the 8 GPUs are programmed as one large
NUMA GPU. A compiler pass analyses each kernel's index expressions, and a runtime
places data pages and thread blocks (TBs) so that most accesses are local; whatever
is not local is reached by the kernel's own TBs with ordinary remote loads and
stores over NVLink, at the granularity the TB touches it. There are no collectives
at all, and no NVLS (the CAIS paper: LADM "cannot utilize NVLS because of its
communication-centric design"; §IV-C (d), §V-A.3).

What is modelled, per sub-layer (``Chain``):

* **GEMM1** (row-parallel, partial sums over the GPU's K shard): one TB per output
  tile on all SMs. The tile's epilogue sends its partial rows to the GPU that owns
  those token rows (GPU g owns rows g*T/n ..) with P2P ``red`` (remote add into the
  owner's ``reduced`` buffer; the owner's own rows are added locally): ``red`` is
  the only way to combine partial sums without a collective. The SM pushes the data
  through its store port (``sm_copy_bandwidth``) and keeps at most
  ``outstanding_bytes_per_sm`` (64 KiB) of reductions undelivered, across its
  successive tiles: an epilogue that finds the window full waits (store
  backpressure). For its consumers the kernel is finished when its TBs have ended
  **and** all its reductions have landed (a kernel boundary makes writes visible).
* **Kernel boundaries are global**: in a single-GPU programming model the next
  kernel starts when the previous one has finished on every GPU, plus
  an NVLS barrier (kernels/sync.py). This holds for every kernel of the period (GEMM1 -> row-wise op
  -> GEMM2, and the local kernels); it costs time where GPUs finish apart.
* **Row-wise op** (dropout + residual + norm, or its backward) on the owner's shard
  rows, one kernel on all SMs, as in SP-NVLS.
* **GEMM2** (consumer of the gathered activation): there is no AllGather. Each TB
  loads the A rows of its tile from their owner's shard with remote ``ld`` (its own
  rows are read locally, no traffic), as a GEMM mainloop does: it walks K in order
  and keeps at most ``outstanding_bytes_per_sm`` of loads in flight. Nominally
  (``load_bytes`` <= 32 KiB) that is 2-4 K-slices of BM x 64 elements (16 KiB at
  BM = 128, 32 KiB at BM = 256). By default (``load_bytes`` = 512 KiB) one ld
  brings 512 KiB of whole K-slices (BM x 2048 or BM x 1024) and is the only one in
  flight, because the fine version costs ~10x the events (a LLaMA-7B training
  period takes 160 s instead of 17 s). Measured effect of the coarse loads:
  +1 % prefill, +7 % train with the fine ones (docs/schemes/ladm.md). The tile's
  compute (``cm.tile_time_ps``, never below the GEMM's memory floor) overlaps its
  loads: it finishes at max(start + compute, last load landed + the compute of one
  64-wide K-slice). In functional mode the tile is computed from the loaded data
  (its A block is assembled from the ld results).
* **Weight-gradient GEMMs** (training) read the same token-sharded activations (n1,
  n2 as their transposed A, dzf and dzo as B) with K = tokens: they load them the
  same way, K running over each owner's shard in turn (the shard is cut into
  ~``load_bytes`` steps that never straddle two owners). Megatron's re-gathers
  before them (``Gather`` segments) do not exist in a single-GPU program.

Reuse of remote data. TBs that need the same rows do not share what they loaded:
a tile's mainloop streams its block through shared memory, and (to our knowledge)
a Hopper GPU caches peer memory only in the home GPU's L2, so LADM's proposed
remote-data L2 insertion policy has nothing to act on in a DGX-H100. Each remote
row block is therefore loaded once per column tile of the GEMM (once per row tile
for a weight gradient's B). LADM's TB placement does not remove this either: the
program is TP, so each GPU holds one column shard of the weights and produces that
shard of the output, which its next local kernel (activation, attention heads)
reads; the placement keeps tiles with their weights and outputs, as modelled.
Binding tiles to the owner of their A rows instead would make the weights the
remote operand: per GPU (rows_l / BM) x (n-1)/n x K x N_total x 2 B, i.e. BM/BN
times the A-row traffic (0.5x for 256x128 tiles, 2x for 128x256), plus remote
output writes and remote inputs for every following kernel, so it is not modelled.

The GEMM thread blocks are the remote-access kernels of kernels/remote_gemm.py
with plain ``ld``/``red`` (:class:`~cais.kernels.remote_gemm.RemoteAccess`).

Choices the sources leave open, with their values: tile order = CUTLASS's SM90
heuristic (row raster when the GEMM has at least as many row tiles as column
tiles: every chain GEMM here), identical on every GPU, so all GPUs walk the same
token rows at the same time: GEMM1's reductions converge on one owner at a time
and GEMM2's loads leave one owner at a time (a column raster, measured as a
sensitivity, is 2.3x faster in prefill); the weight-gradient mainloops all start
at token 0 (owner 0); reductions cut in ``transfer_unit_bytes`` units (one per
tile); 64 KiB of loads / undelivered reductions per SM
(``collective.outstanding_bytes_per_sm``, as NVLS kernels); a GPU arrives at a
kernel boundary once its remote reductions are fenced, and an NVLS barrier on the
wire separates every kernel.
"""

from __future__ import annotations

from cais.engine import all_of
from cais.kernels.remote_gemm import RemoteAccess, remote_operands, sharded_activations
from cais.schemes.base import Deps, LayerRun
from cais.schemes.remote_wgrad import RemoteLoadScheme
from cais.workload.graph import Chain, Local


class Ladm(RemoteLoadScheme):
    """One NUMA GPU: GEMM epilogues ``red`` partial rows to their owner, GEMMs ``ld``
    the rows they need from their owner; global barriers at kernel boundaries."""

    name = "ladm"
    sp = True
    algo = "p2p"
    summary = "one NUMA GPU: GEMM -> remote red to row owner | LN | GEMM with remote ld of A rows; no collectives"

    def run(self, r: LayerRun) -> None:
        self._sharded = sharded_activations(r.period)
        self._access = self._wgrad_access = self.access(r)
        super().run(r)

    def access(self, r: LayerRun) -> RemoteAccess:
        """How the GEMMs touch remote rows: plain ``ld``/``red`` in CUTLASS's tile order."""
        return RemoteAccess(r.m)

    def local(self, r: LayerRun, seg: Local, deps: Deps) -> Deps:
        """Each kernel of the single virtual GPU starts once the previous one has
        finished on every GPU, through an NVLS barrier (kernels/sync.py)."""
        return super().local(r, seg, r.barrier(deps))

    def chain(self, r: LayerRun, c: Chain, deps: Deps) -> Deps:
        n, over = r.m.n, r.cm.kernel_overhead_ps
        start = r.barrier(deps)
        flushed = []
        for g in range(n):
            k, drain = r.reduce_gemm(g, c.gemm1, c.reduced, self._access)
            assert drain is not None
            done = r.submit(g, k, [start[g]], over, c.name)
            flushed.append(all_of(r.m.sim, [done, drain.done]))
        reduced = r.barrier(flushed)
        rows = [r.submit(g, r.rowop_kernel(g, c.rowop), [reduced[g]], r.cm_mem_overhead_ps, c.name)
                for g in range(n)]
        normed = r.barrier(rows)
        ops = remote_operands(c.gemm2, self._sharded)
        return [r.submit(g, r.load_gemm(g, c.gemm2, ops, self._access, keep=self.keeps(c)), [normed[g]], over, c.name) for g in range(n)]
