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

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from cais.engine import Bound, Countdown, Signal
from cais.engine.sim import ProgramGen
from cais.hw.gpu import Kernel, TbProgram
from cais.hw.memory import Memory, Region
from cais.hw.packets import Traffic
from cais.kernels.common import RequestSlots, split
from cais.hw.hbm import HbmPhase
from cais.kernels.gemm import GemmShape, raster, store_epilogue, tile_hbm_bytes, tile_product
from cais.schemes.base import Deps, LayerRun, Scheme, all_of
from cais.isa import SmPort
from cais.workload.graph import Chain, Gather, Gemm, Local

SLICE_K = 64  # K elements per mainloop slice (a CUTLASS Hopper stage: BK = 64 bf16)


def tile_order(shape: GemmShape, how: str = "heuristic") -> list[tuple[int, int]]:
    """Tile launch order. ``heuristic``: CUTLASS's SM90 tile-scheduler rule, raster
    along M (column raster) if the GEMM has more column tiles than row tiles, else
    along N (row raster); or ``row`` / ``col``."""
    if how == "heuristic":
        how = "col" if shape.tiles_n > shape.tiles_m else "row"
    return raster(shape, how)


@dataclass(frozen=True)
class Sharded:
    """A [T, cols] activation of the single-GPU program whose token rows live on their
    owner: rows g*rows_l .. of it are rows 0.. of buffer ``shard`` on GPU g."""

    shard: str
    rows_l: int
    cols: int

    def owners(self, t0: int, nt: int) -> list[tuple[int, int, int]]:
        """(owner, first token, count) of the pieces of tokens t0 .. t0+nt-1."""
        out, t = [], t0
        while t < t0 + nt:
            owner = t // self.rows_l
            cnt = min(t0 + nt, (owner + 1) * self.rows_l) - t
            out.append((owner, t, cnt))
            t += cnt
        return out


@dataclass(frozen=True)
class Operand:
    """A GEMM operand read from a :class:`Sharded` activation: ``which`` is ``a`` or
    ``b``; ``trans`` as in GemmOperands (A stored [K, M], B stored [N, K])."""

    which: str
    src: Sharded
    trans: bool

    @property
    def k_is_tokens(self) -> bool:
        """Whether the GEMM's K runs over the stored rows (tokens): A^T and B."""
        return (self.which == "a") == self.trans

    def side(self, shape: GemmShape) -> int:
        """Rows (A) or columns (B) of the operand a tile loads: the tile's extent, or
        the whole GEMM's where it is smaller (a decode GEMM of a few token rows)."""
        return min(shape.bm, shape.m) if self.which == "a" else min(shape.bn, shape.n)

    def tile_span(self, shape: GemmShape, i: int, j: int) -> tuple[int, int]:
        """(first, count) of the tile's rows (A) or columns (B) of the operand."""
        return shape.rows(i) if self.which == "a" else shape.cols(j)

    def physical(self, shape: GemmShape, i: int, j: int, k0: int, kk: int) -> tuple[int, int, int, int]:
        """(token0, tokens, col0, cols) of the stored [T, cols] block holding the
        operand's part for tile (i, j) and K range k0 .. k0+kk-1."""
        s0, sn = self.tile_span(shape, i, j)
        return (k0, kk, s0, sn) if self.k_is_tokens else (s0, sn, k0, kk)

    def logical(self, block: np.ndarray) -> np.ndarray:
        """The stored block as the GEMM sees it (A [M, K], B [K, N])."""
        if self.which == "a":
            return block.T if self.k_is_tokens else block
        return block if self.k_is_tokens else block.T


@dataclass(frozen=True)
class Load:
    """One access of a tile's mainloop: ``region`` ([``nrows``, ``ncols``]) of operand
    ``op`` on GPU ``home``, placed at (``row``, ``col``) of the tile's stored block."""

    op: int
    home: int
    region: Region
    row: int
    col: int
    nrows: int
    ncols: int


class _Drain:
    """A kernel's remote reductions and its closing fence: ``done`` fires once the
    kernel has ended and a fence behind its last reductions (a probe down every path
    they took, and its write response back) has completed."""

    def __init__(self, r: LayerRun, g: int, kernel: Kernel) -> None:
        self.r = r
        self.g = g
        self.owners: set[int] = set()
        self.done = Signal()
        kernel.done.on_fire(lambda _v: self._close())

    def issue(self, owner: int) -> None:
        self.owners.add(owner)

    def _close(self) -> None:
        self.r.m.isa.fence(self.g, self.owners, Traffic.REDUCTION, lambda: self.done.fire(self.r.m.sim))


class Ladm(Scheme):
    """One NUMA GPU: GEMM epilogues ``red`` partial rows to their owner, GEMMs ``ld``
    the rows they need from their owner; global barriers at kernel boundaries."""

    name = "ladm"
    sp = True
    algo = "p2p"
    load_bytes = 512 * 1024  # about the bytes one remote ld brings (whole K-slices)
    order = "heuristic"  # tile launch order of every GEMM (see tile_order)
    summary = "one NUMA GPU: GEMM -> remote red to row owner | LN | GEMM with remote ld of A rows; no collectives"

    # ---- period -------------------------------------------------------------------
    def run(self, r: LayerRun) -> None:
        self._sharded = self._sharded_activations(r)
        super().run(r)

    @staticmethod
    def _sharded_activations(r: LayerRun) -> dict[str, Sharded]:
        """Gathered buffer name -> where its rows live (a chain's gather_dst, a
        re-gather's dst): the single-GPU program has one [T, h] tensor, sharded."""
        pairs = [(c.gather_dst, c.gather_src) for c in r.period.chains]
        pairs += [(s.dst, s.src) for s in r.period.segments if isinstance(s, Gather)]
        return {dst: Sharded(src, r.d.rows_l, r.period.buffers[dst][1]) for dst, src in pairs if dst != src}

    def _barrier(self, r: LayerRun, deps: Sequence[Signal]) -> list[Signal]:
        """The next kernel of the single virtual GPU may start on each GPU: ``deps``
        done on every GPU, through an NVLS barrier (kernels/sync.py)."""
        return r.barrier(deps)

    def gather(self, r: LayerRun, name: str, src: str, dst: str, deps: Deps) -> Deps:
        """No AllGather: the weight-gradient GEMM loads the rows where they live."""
        return deps

    def local(self, r: LayerRun, seg: Local, deps: Deps) -> Deps:
        start = self._barrier(r, deps)
        out = []
        for g in range(r.m.n):
            if seg.gemm is not None:
                k = self._load_gemm(r, g, seg.gemm, self._operands(seg.gemm))
                over = r.cm.kernel_overhead_ps
            else:
                k, over = r.local_kernel(g, seg)
            out.append(r.submit(g, k, [start[g]], over, seg.name))
        return out

    def chain(self, r: LayerRun, c: Chain, deps: Deps) -> Deps:
        n, over = r.m.n, r.cm.kernel_overhead_ps
        start = self._barrier(r, deps)
        flushed = []
        for g in range(n):
            k, drain = self._red_gemm(r, g, c)
            done = r.submit(g, k, [start[g]], over, c.name)
            flushed.append(all_of(r.m.sim, [done, drain.done]))
        reduced = self._barrier(r, flushed)
        rows = [r.submit(g, r.rowop_kernel(g, c.rowop), [reduced[g]], r.cm_mem_overhead_ps, c.name)
                for g in range(n)]
        normed = self._barrier(r, rows)
        ops = self._operands(c.gemm2)
        return [r.submit(g, self._load_gemm(r, g, c.gemm2, ops), [normed[g]], over, c.name) for g in range(n)]

    def _operands(self, gemm: Gemm) -> list[Operand]:
        out = []
        if gemm.ops.a in self._sharded:
            out.append(Operand("a", self._sharded[gemm.ops.a], gemm.ops.ta))
        if gemm.ops.b in self._sharded:
            out.append(Operand("b", self._sharded[gemm.ops.b], gemm.ops.tb))
        return out

    # ---- GEMM1: partial rows reduced into their owner ----------------------------
    def _red_gemm(self, r: LayerRun, g: int, c: Chain,
                  sm_set: frozenset[int] | None = None) -> tuple[Kernel, _Drain]:
        gemm = c.gemm1
        sms = len(sm_set) if sm_set else r.sms
        shape = r.shape(gemm, sms)
        floor = r.gemm_floor_ps(gemm, shape, sms)
        # A and B are local; of the output only the GPU's own rows stay (the rest leaves
        # as partial sums, counted where they land)
        tile_bytes = tile_hbm_bytes(shape, r.model.dtype_bytes, c=1.0 / r.m.n)
        kernel = Kernel(gemm.name, [], sm_set, hbm_phases=True)
        drain = self._drain(r, g, kernel)
        limit = self._window(r)
        isa = r.m.isa
        bound = isa.request_bound(g)
        unit = self._red_unit(r)
        per_sm: dict[int, tuple[RequestSlots, SmPort]] = {}  # the SM's store window and port, across its tiles

        def tile_tb(t: int, i: int, j: int) -> TbProgram:
            def program(sm: int, busy: int) -> ProgramGen:
                sim = r.m.sim
                yield from self._tb_start(r, g, gemm, t)
                yield HbmPhase(max(floor, r.cm.tile_time_ps(shape.bm, shape.bn, shape.k, busy)), tile_bytes)
                yield from self._first_access(r, g, gemm, t)
                mem = r.m.gpus[g].memory
                tile = tile_product(mem, gemm.ops, shape, i, j) if mem.functional else None
                if sm not in per_sm:
                    per_sm[sm] = (RequestSlots(Bound(sim, limit), bound), isa.sm_port())
                slots, port = per_sm[sm]
                piece_unit = min(unit, slots.piece)
                r0, nr = shape.rows(i)
                c0, nc = shape.cols(j)
                for owner, t0, cnt in Sharded(c.reduced, r.d.rows_l, shape.n).owners(r0, nr):
                    region = Region.block(c.reduced, shape.n, t0 - owner * r.d.rows_l, cnt, c0, nc,
                                          r.model.dtype_bytes)
                    data = tile[t0 - r0:t0 - r0 + cnt] if tile is not None else None
                    if data is not None and region.rows == 1:  # whole rows: a contiguous run
                        data = data.reshape(-1)
                    if owner == g:
                        self._add_own(r, g, c, region, data)
                        continue
                    for piece in isa.pieces(region, piece_unit):  # each takes its own room
                        yield from slots.acquire(piece.nbytes)
                        self._reduce(r, g, c, owner, piece, isa.piece_data(data, region, piece),
                                     self._landed(slots, piece.nbytes), port, drain)
                if port.free_at > sim.now:  # the SM pushes the tile out before it is free
                    yield port.free_at - sim.now
            return program

        kernel.tbs = [tile_tb(t, i, j) for t, (i, j) in enumerate(self._tile_order(r, shape))]
        return kernel, drain

    # ---- hooks a scheme built on these kernels may fill in -------------------------
    def _window(self, r: LayerRun) -> int:
        """Bytes of remote loads, or of reductions not yet taken, an SM keeps in flight."""
        return r.m.cfg.collective.outstanding_bytes_per_sm

    def _red_unit(self, r: LayerRun) -> int:
        """The transfer unit of GEMM1's remote reductions."""
        return r.m.cfg.transfer_unit_bytes

    def _load_unit(self, r: LayerRun, biggest: int) -> int:
        """The transfer unit of a load GEMM's remote loads, whose largest is ``biggest``
        bytes (one ld = one unit)."""
        return max(r.m.cfg.transfer_unit_bytes, 1 << (biggest - 1).bit_length())

    def _tile_order(self, r: LayerRun, shape: GemmShape, token_rows: bool = True) -> list[tuple[int, int]]:
        """Launch order of a GEMM's tiles (``token_rows``: its rows are token rows,
        sharded over the GPUs): CUTLASS's heuristic, the same on every GPU."""
        return tile_order(shape, self.order)

    def _k_start(self, r: LayerRun, steps: list[tuple[int, int]], t: int) -> int:
        """The K step tile ``t`` (in launch order) starts its mainloop at: the first."""
        return 0

    def _tb_start(self, r: LayerRun, g: int, gemm: Gemm, t: int) -> ProgramGen:
        """What TB ``t`` (in launch order) of ``gemm`` does before its work: nothing."""
        yield from ()

    def _first_access(self, r: LayerRun, g: int, gemm: Gemm, t: int) -> ProgramGen:
        """What TB ``t`` does before its first remote access: nothing."""
        yield from ()

    def _operands_ready(self, r: LayerRun, g: int, gemm: Gemm, shape: GemmShape, i: int) -> list[Signal]:
        """Signals a tile of row tile ``i`` waits for before loading its operands: none
        (a kernel boundary already orders them)."""
        return []

    def _drain(self, r: LayerRun, g: int, kernel: Kernel) -> _Drain:
        """What closes GEMM1 on GPU ``g``: a fence behind its remote reductions."""
        return _Drain(r, g, kernel)

    def _add_own(self, r: LayerRun, g: int, c: Chain, region: Region, data: np.ndarray | None) -> None:
        """The owner's own partial rows: added to its memory in place."""
        r.m.gpus[g].memory.add(region, data)

    def _reduce(self, r: LayerRun, g: int, c: Chain, owner: int, region: Region, data: np.ndarray | None,
                done: Callable[[], None], port: SmPort, drain: _Drain) -> None:
        """A piece of one epilogue's partial rows into their owner: a plain remote ``red``."""
        drain.issue(owner)
        r.m.isa.red(g, owner, region, data, done, port, unit=self._red_unit(r))

    def _load(self, r: LayerRun, g: int, home: int, region: Region, done: Callable[[np.ndarray | None], None],
              unit: int) -> None:
        """One mainloop load of remote operand rows: a plain remote ``ld``."""
        r.m.isa.ld(g, home, region, done, unit=unit)

    @staticmethod
    def _landed(slots: RequestSlots, nbytes: int) -> Callable[[], None]:
        def done() -> None:
            slots.release(nbytes)
        return done

    # ---- GEMM2 and weight gradients: operands loaded from their owners -----------
    def _load_gemm(self, r: LayerRun, g: int, gemm: Gemm, ops: list[Operand],
                   sm_set: frozenset[int] | None = None) -> Kernel:
        if not ops:
            return r.gemm_kernel(g, gemm, sm_set)
        sms = len(sm_set) if sm_set else r.sms
        shape = r.shape(gemm, sms)
        floor = r.gemm_floor_ps(gemm, shape, sms)
        eb = r.model.dtype_bytes
        steps = self._k_steps(shape, ops, eb)
        biggest = max(kk for _, kk in steps) * sum(op.side(shape) for op in ops) * eb
        unit = self._load_unit(r, biggest)
        limit = self._window(r)
        isa = r.m.isa
        bound = isa.request_bound(g)
        # the sharded operands come from their owners (this GPU holds 1/n of them)
        local = {op.which: 1.0 / r.m.n for op in ops}
        tile_bytes = tile_hbm_bytes(shape, eb, **local)
        mem = r.m.gpus[g].memory
        store = store_epilogue(mem, gemm.ops, shape) if mem.functional else None
        # with l2_keeps_peer_reads: remote lines already fetched (or on their way) for
        # this kernel, shared by its TBs; keyed by (home GPU, request piece of its buffer)
        kept: dict[tuple[int, Region], Signal] | None = {} if r.m.cfg.gpu.l2_keeps_peer_reads else None

        def plan(i: int, j: int, t: int) -> list[Load]:
            loads = []
            first = self._k_start(r, steps, t)
            for k0, kk in steps[first:] + steps[:first]:
                for o, op in enumerate(ops):
                    t0, nt, col0, ncol = op.physical(shape, i, j, k0, kk)
                    base_t, _, base_c, _ = op.physical(shape, i, j, 0, shape.k)
                    for owner, ft, cnt in op.src.owners(t0, nt):
                        region = Region.block(op.src.shard, op.src.cols, ft - owner * op.src.rows_l, cnt, col0, ncol,
                                              eb)
                        loads.append(Load(o, owner, region, ft - base_t, col0 - base_c, cnt, ncol))
            return loads

        def tile_tb(t: int, i: int, j: int) -> TbProgram:
            def program(sm: int, busy: int) -> ProgramGen:
                sim = r.m.sim
                yield from self._tb_start(r, g, gemm, t)
                for ready in self._operands_ready(r, g, gemm, shape, i):
                    yield ready
                start = sim.now
                # the mainloop's time, stretched by the HBM share at its start
                compute = yield HbmPhase(max(floor, r.cm.tile_time_ps(shape.bm, shape.bn, shape.k, busy)),
                                         tile_bytes, overlapped=True)
                loads = plan(i, j, t)
                yield from self._first_access(r, g, gemm, t)
                blocks = self._blocks(shape, ops, i, j) if mem.functional else None
                slots = RequestSlots(Bound(sim, limit), bound)
                piece_unit = min(unit, slots.piece)
                remote: list[tuple[Load, Region]] = []
                for ld in loads:
                    if ld.home != g:
                        remote += [(ld, pc) for pc in isa.pieces(ld.region, piece_unit)]
                    elif blocks is not None:
                        self._place(blocks, ld, ld.region, mem.read(ld.region))
                arrived = Countdown(len(remote))
                for ld, pc in remote:
                    key = (ld.home, pc)
                    line = kept.get(key) if kept is not None else None
                    if line is None:
                        yield from slots.acquire(pc.nbytes)
                        # another TB of this GPU may have asked for the piece meanwhile:
                        # a second request for a line in flight joins the first
                        line = kept.get(key) if kept is not None else None
                        if line is not None:
                            slots.release(pc.nbytes)
                    if line is not None:  # an L2 hit (or a miss already in flight)
                        line.on_fire(self._hit(r, ld, pc, blocks, arrived))
                        continue
                    got = self._got(r, slots, ld, pc, blocks, arrived)
                    if kept is not None:
                        kept[key] = line = Signal()
                        got = self._keep(r, got, line)
                    self._load(r, g, ld.home, pc, got, unit)
                if remote:
                    yield arrived
                # the mainloop computes each K-slice once it has landed: after the last
                # load, one slice of compute remains
                end = max(start + compute, sim.now + compute * SLICE_K // shape.k) if remote else start + compute
                if end > sim.now:
                    yield end - sim.now
                if store is not None:
                    store(i, j, self._tile(mem, gemm, shape, ops, blocks, i, j))
            return program

        token_rows = any(op.which == "a" and not op.k_is_tokens for op in ops)
        return Kernel(gemm.name, [tile_tb(t, i, j) for t, (i, j) in enumerate(self._tile_order(r, shape, token_rows))],
                      sm_set, hbm_phases=True)

    def _k_steps(self, shape: GemmShape, ops: list[Operand], eb: int) -> list[tuple[int, int]]:
        """(k0, count) of the K ranges one ld each (per owner) brings in: whole K-slices
        of about ``load_bytes``; where K runs over tokens (weight gradients), each
        owner's shard is cut into equal steps so that no ld straddles two owners."""
        side = sum(op.side(shape) for op in ops) * eb  # bytes per K element of the loaded operands
        if any(op.k_is_tokens for op in ops):
            rows_l, steps = ops[0].src.rows_l, []
            for s0 in range(0, shape.k, rows_l):
                n = min(rows_l, shape.k - s0)
                parts = max(1, round(n * side / self.load_bytes))
                steps += [(s0 + a, c) for a, c in split(0, n, parts) if c > 0]
            return steps
        step = max(1, self.load_bytes // (side * SLICE_K)) * SLICE_K
        return [(k0, min(step, shape.k - k0)) for k0 in range(0, shape.k, step)]

    @staticmethod
    def _got(r: LayerRun, slots: RequestSlots, ld: Load, piece: Region, blocks: list[np.ndarray] | None,
             arrived: Countdown) -> Callable[[np.ndarray | None], None]:
        def done(data: np.ndarray | None) -> None:
            slots.release(piece.nbytes)
            if blocks is not None and data is not None:
                Ladm._place(blocks, ld, piece, data)
            arrived.arrive(r.m.sim)
        return done

    @staticmethod
    def _keep(r: LayerRun, got: Callable[[np.ndarray | None], None],
              line: Signal) -> Callable[[np.ndarray | None], None]:
        """A load whose data the L2 keeps: ``line`` fires with it for later readers."""
        def done(data: np.ndarray | None) -> None:
            got(data)
            line.fire(r.m.sim, data)
        return done

    @staticmethod
    def _hit(r: LayerRun, ld: Load, piece: Region, blocks: list[np.ndarray] | None,
             arrived: Countdown) -> Callable[[np.ndarray | None], None]:
        def done(data: np.ndarray | None) -> None:
            if blocks is not None and data is not None:
                Ladm._place(blocks, ld, piece, data)
            arrived.arrive(r.m.sim)
        return done

    @staticmethod
    def _blocks(shape: GemmShape, ops: list[Operand], i: int, j: int) -> list[np.ndarray]:
        """Empty stored blocks of each loaded operand for tile (i, j)."""
        out = []
        for op in ops:
            _, nt, _, ncol = op.physical(shape, i, j, 0, shape.k)
            out.append(np.zeros((nt, ncol)))
        return out

    @staticmethod
    def _place(blocks: list[np.ndarray], ld: Load, piece: Region, data: np.ndarray) -> None:
        """Put the data of ``piece`` (of ``ld.region``) where the load's block goes."""
        view = blocks[ld.op][ld.row:ld.row + ld.nrows, ld.col:ld.col + ld.ncols]
        if ld.region.rows > 1:  # a block: the piece is some of its rows
            first = (piece.start - ld.region.start) // ld.region.stride
            view[first:first + piece.rows] = np.reshape(data, (piece.rows, ld.ncols))
        else:  # a run over the block's rows (whole rows, or part of one)
            off = piece.start - ld.region.start
            flat = view.reshape(-1).copy()
            flat[off:off + piece.count] = np.reshape(data, -1)
            view[...] = flat.reshape(view.shape)

    @staticmethod
    def _tile(mem: Memory, gemm: Gemm, shape: GemmShape, ops: list[Operand], blocks: list[np.ndarray] | None,
              i: int, j: int) -> np.ndarray | None:
        """The tile computed from the loaded blocks (and local operands)."""
        if blocks is None:
            return None
        r0, nr = shape.rows(i)
        c0, nc = shape.cols(j)
        got = {op.which: op.logical(blk) for op, blk in zip(ops, blocks)}
        if "a" in got:
            a_blk = got["a"]
        else:
            a = mem.matrix(gemm.ops.a, shape.m if gemm.ops.ta else shape.k)
            a_blk = a[:, r0:r0 + nr].T if gemm.ops.ta else a[r0:r0 + nr, :]
        if "b" in got:
            b_blk = got["b"]
        else:
            b = mem.matrix(gemm.ops.b, shape.k if gemm.ops.tb else shape.n)
            b_blk = b[c0:c0 + nc, :].T if gemm.ops.tb else b[:, c0:c0 + nc]
        return a_blk @ b_blk
