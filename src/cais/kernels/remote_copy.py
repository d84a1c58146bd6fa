"""Remote rows copied into the local gathered tensor by a copy stage, then a local GEMM
whose tiles wait for the chunks they read (``remote_read.strategy`` = ``copy-engine``
or ``comm-sms``; docs/remote-access.md).

What real distributed GEMMs do instead of every TB loading its remote rows: CUTLASS's
Distributed GEMM copies each peer's whole shard with ``cudaMemcpyAsync`` on the copy
engines in its own graph branch, and the GEMM's CTAs spin on a flag before they
start; PyTorch's async TP and Flux copy shard by shard on the copy engines behind
barriers; ThunderKittens gives some SMs to communication. Here:

* **Chunks.** Each loaded operand's rows of every other GPU are cut into chunks of
  ``remote_read.copy_chunk_kB`` (whole rows; 0: the owner's whole shard) where its
  rows are ready when the GEMM launches, and of ``remote_read.signalled_chunk_kB``
  where a producer signals them block by block (CAIS's fused pipeline): an implementer
  copies what the producer signals, as Flux's wait-copy-signal per chunk and
  ThunderKittens' comm SMs per row block do; the real kernels copy whole shards only
  because every row is ready at their launch. A chunk
  starts once its rows are ready: the GEMM kernel launched (a kernel boundary already
  orders them) and, under CAIS's TB-level dependencies, the ready flags of the LN row
  blocks it covers (:meth:`RemoteAccess.rows_ready`). When it has landed in the local
  copy its flag is set; a tile waits, for each chunk of rows it reads, until it sees
  the flag: one local poll (``gpu.memory_latency_ns``) after it was set. The GPU's
  own rows are read where they are (its chunks' flags are their readiness).
* **copy-engine.** The GPU's copy engine (kernels/dma.py, window
  ``gpu.copy_engine.window_kB``, rate ``remote_read.copy_GBps``) pulls each chunk
  with plain reads (a copy engine issues no ``ld.cais``); commands run in FIFO order,
  each starting ``remote_read.copy_start_us`` after the one before it has issued its
  last byte (or after its trigger, if the engine was idle): the start is charged per
  command, in sequence, as a copy engine takes its commands one at a time. It takes
  no SM.
* **comm-sms.** ``remote_read.comm_sms`` SMs of the GEMM's set (at most half of it)
  run a copy kernel, one TB per SM; TB ``t`` takes chunks ``t``, ``t + C``, ... of one
  list that is the same on every GPU (row position in the shard, then owner: the
  GPUs' TB ``t`` pull the same rows at once, which merging needs), skipping its own
  GPU's. It loads a chunk as a mainloop does (its window, the GPU's request bound,
  ``ld.cais`` with the scheme's quorum where it merges, the scheme's TB group syncs
  before it starts and before its first access), stores it to the local copy and sets
  its flag. The GEMM runs on the other SMs.

* **auto** (the H100 as sold): each copy as a competent implementer would run it,
  measured on paper-llama-7b (docs/remote-access.md, "The as-sold rule"): rows ready
  at the launch of a GEMM that runs alone (LADM, CAIS-Base, their weight gradients)
  by the copy engine, whole shards (``copy_chunk_kB``); rows a producer signals block
  by block (CAIS's fused pipeline), and the rows of a GEMM that runs beside other work
  (CAIS's overlapped weight gradients), by ``remote_read.signalled_comm_sms`` comm SMs
  (``signalled_chunk_kB`` chunks where signalled): there a copy engine's start per
  command, or its plain reads competing with the work beside it, cost more than the
  SMs the copy takes.

HBM: the local GEMM reads every row of a loaded operand from local HBM and the copy
writes the remote share there once: each tile's HBM phase counts the operand's share
2 - 1/N, as ``staged`` does (the copy's writes are counted where the tiles are, not
timed on their own).
"""

from __future__ import annotations

import itertools
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from cais.engine import Bound, Countdown, Signal, TbPlan, all_of
from cais.hw.compute import ComputeModel
from cais.config import PS_PER_NS
from cais.hw.gpu import Kernel, LoadPlan
from cais.hw.memory import Memory, Region
from cais.kernels.common import RequestSlots
from cais.kernels.dma import DmaCommand, DmaEngine, dma_rate_GBps, dma_window_bytes
from cais.kernels.gemm import GemmShape, gemm_kernel, gemm_shape, raster, tile_hbm_bytes
from cais.machine import Machine
from cais.workload.graph import Gemm

#: the strategies that copy remote rows into the local gathered tensor before the GEMM reads them
COPY_STRATEGIES = ("copy-engine", "comm-sms", "auto")


@dataclass(frozen=True)
class Chunk:
    """Rows ``r0 .. r0+nr-1`` of GPU ``owner``'s shard of loaded operand ``op``: ``src``
    there, ``dst`` in the local gathered tensor."""

    op: int
    owner: int
    r0: int
    nr: int
    src: Region
    dst: Region


def chunks(ops: Sequence[Any], gathered: Sequence[str], n: int, eb: int, chunk_bytes: int,
           first: int = 0) -> list[Chunk]:
    """Every chunk of every loaded operand (``ops``: :class:`Operand`, their gathered
    tensors ``gathered``), in the order they are copied: row position in the shard,
    then owner (from ``first`` round), then operand."""
    out = []
    per: list[list[tuple[int, int]]] = []
    for op in ops:
        rows_l, cols = op.src.rows_l, op.src.cols
        step = rows_l if chunk_bytes <= 0 else max(1, min(rows_l, chunk_bytes // (cols * eb)))
        per.append([(r0, min(step, rows_l - r0)) for r0 in range(0, rows_l, step)])
    for c in range(max(len(p) for p in per)):
        for owner in [(first + a) % n for a in range(n)]:
            for w, (op, name) in enumerate(zip(ops, gathered)):
                if c >= len(per[w]):
                    continue
                r0, nr = per[w][c]
                cols = op.src.cols
                src = Region(op.src.shard, r0 * cols, nr * cols, eb)
                dst = Region(name, (owner * op.src.rows_l + r0) * cols, nr * cols, eb)
                out.append(Chunk(w, owner, r0, nr, src, dst))
    return out


def _engine(m: Machine, g: int, plans: dict[tuple, Any]) -> DmaEngine:
    """GPU ``g``'s copy engine for remote copies, made once per run."""
    key = ("copy engine", g)
    hit = plans.get(key)
    if hit is None:
        rr = m.cfg.remote_read
        rate = rr.copy_GBps if rr.copy_GBps is not None else dma_rate_GBps(m.cfg)
        hit = plans[key] = DmaEngine(m, g, rate, dma_window_bytes(m.cfg), round(rr.copy_start_us * 1e6))
    return hit


def copy_gemm(m: Machine, cm: ComputeModel, g: int, gemm: Gemm, shape: GemmShape, floor_ps: int, eb: int,
              ops: list[Any], access: Any, sm_set: frozenset[int] | None, mem: Memory | None,
              plans: dict[tuple, Any], floor_of: Any, beside: bool = False) -> Kernel:
    """GPU ``g``'s GEMM reading the token-sharded operands ``ops`` from a local gathered
    copy that a copy stage fills (module doc); ``floor_of(sms)``: the tile's memory
    floor on that many SMs (the GEMM may run on fewer, comm-sms); ``beside``: the GEMM
    runs beside other work (a side stream: strategy ``auto`` copies by SMs there)."""
    rr = m.cfg.remote_read
    sim = m.sim
    gathered = [gemm.ops.a if op.which == "a" else gemm.ops.b for op in ops]
    # rows a producer signals block by block (a fused pipeline's TB-level dependencies)
    # are copied as they are signalled; rows ready at launch, as the real kernels copy them
    peer = (g + 1) % m.n
    signalled = bool(access.rows_ready(g, peer, 0, 1))
    strategy, chunk_kB, comm_sms = rr.strategy, rr.copy_chunk_kB, rr.comm_sms
    sms_field = "remote_read.comm_sms"
    if signalled:
        chunk_kB = rr.signalled_chunk_kB
    if strategy == "auto":  # each copy as an implementer runs it (module doc)
        by_sms = signalled or beside
        strategy, comm_sms = ("comm-sms", rr.signalled_comm_sms) if by_sms else ("copy-engine", comm_sms)
        sms_field = "remote_read.signalled_comm_sms" if by_sms else sms_field
    # the copy order: each GPU from the next one round (a peer serves one puller at a time,
    # as PyTorch's async TP and CUTLASS's Distributed GEMM rotate their peers), but for
    # mergeable loads, which every GPU issues in the same order so that the switch merges them
    merges = strategy == "comm-sms" and access.load_mode()[0]
    work = chunks(ops, gathered, m.n, eb, round(chunk_kB * 1024), 0 if merges else peer)
    rank = {c.owner: k for k, c in reversed(list(enumerate(work)))}  # an owner's first chunk's place
    rank[g] = -1  # the GPU's own rows are there first
    launched = Signal()
    poll_ps = round(m.cfg.gpu.memory_latency_ns * PS_PER_NS)
    landed: list[Signal] = [Signal() for _ in work]  # the chunk's flag set
    seen: list[Signal] = [Signal() for _ in work]  # ... and a tile's poll has read it
    for s, v in zip(landed, seen):
        s.on_fire(lambda _v, v=v: sim.after(poll_ps, v.fire, sim))
    ready = [all_of(sim, [launched, *access.rows_ready(g, c.owner, c.r0, c.nr)]) for c in work]

    for k, c in enumerate(work):  # the GPU's own rows: read in place, flagged when ready
        if c.owner == g:
            if mem is not None:
                ready[k].on_fire(lambda _v, c=c: mem.write(c.dst, mem.read(c.src)))
            ready[k].on_fire(lambda _v, k=k: landed[k].fire(sim))

    gemm_sms = sm_set
    comm: frozenset[int] = frozenset()
    if strategy == "comm-sms":
        whole = sorted(sm_set) if sm_set else list(range(m.cfg.gpu.sms))
        take = min(comm_sms, len(whole) // 2)
        if take < comm_sms:  # the GEMM keeps at least half its set: say what ran instead
            m.adjust(sms_field, comm_sms, take, "a GEMM's copies run on at most half of its SM set")
        comm = frozenset(whole[len(whole) - take:])
        gemm_sms = frozenset(whole[:len(whole) - take])
    if strategy == "copy-engine":
        engine = _engine(m, g, plans)
        unit = m.cfg.unit_for(max(c.src.nbytes for c in work))
        for k, c in enumerate(work):
            if c.owner != g:
                engine.on(ready[k], DmaCommand("ld", c.src, c.dst, unit, c.owner, landed[k]))
    else:
        copies = _copy_kernel(m, g, gemm, work, ready, landed, access, comm, mem)
        launched.on_fire(lambda _v: m.gpus[g].launch(copies, 0))

    # the local GEMM: its tiles wait for the chunks of rows they read
    sms = len(gemm_sms) if gemm_sms else m.cfg.gpu.sms
    if strategy == "comm-sms":
        shape = gemm_shape(cm, gemm.m, gemm.n, gemm.k, sms)
        floor_ps = floor_of(shape, sms)
    by_op: list[list[tuple[int, int, int]]] = [[] for _ in ops]  # (first token, tokens, chunk) per operand
    for k, c in enumerate(work):
        by_op[c.op].append((c.owner * ops[c.op].src.rows_l + c.r0, c.nr, k))
    for chunks_of_op in by_op:
        chunks_of_op.sort()  # by first token: the chunks of an operand tile its rows without overlap
    starts = [[a for a, _, _ in chunks_of_op] for chunks_of_op in by_op]
    asked: dict[tuple[int, tuple[int, int]], list[Signal]] = {}

    def span_waits(w: int, span: tuple[int, int]) -> list[Signal]:
        """The flags of operand ``w``'s chunks that token rows ``span`` = (first, count) touch."""
        hit = asked.get((w, span))
        if hit is None:
            t0, nt = span
            first = max(0, bisect_right(starts[w], t0) - 1)
            hit = asked[(w, span)] = [seen[k] for a, cnt, k in itertools.takewhile(
                lambda c: c[0] < t0 + nt, by_op[w][first:]) if t0 < a + cnt]
        return hit

    def waits(i: int, j: int) -> list[Signal]:
        out: list[Signal] = []
        for w, op in enumerate(ops):
            out += span_waits(w, (0, shape.k) if op.k_is_tokens else op.tile_span(shape, i, j))
        return out

    share = 2.0 - 1.0 / m.n
    loaded = {op.which: share for op in ops}
    hbm = tile_hbm_bytes(shape, eb, **loaded)
    # tiles in the order their rows arrive (the latest owner they read), CUTLASS's
    # heuristic raster among equals, as T3's GEMM waits for its ring's chunks (where every
    # tile reads every row, K over tokens: the raster alone)
    order = raster(shape, "col" if shape.tiles_n > shape.tiles_m else "row")
    if not any(op.k_is_tokens for op in ops):
        def latest(tile: tuple[int, int]) -> int:
            return max(rank[o] for op in ops for o, _, _ in op.src.owners(*op.tile_span(shape, *tile)))
        order.sort(key=latest)  # stable: the raster among tiles of the same latest owner
    kernel = gemm_kernel(cm, shape, gemm.name, gemm_sms, mem, gemm.ops if mem is not None else None, None, order,
                         waits, floor_ps, hbm)
    kernel.launched = launched
    return kernel


def _copy_kernel(m: Machine, g: int, gemm: Gemm, work: list[Chunk], ready: list[Signal], landed: list[Signal],
                 access: Any, comm: frozenset[int], mem: Memory | None) -> Kernel:
    """The comm-sms copy kernel on GPU ``g``: one TB per SM of ``comm``, TB ``t``
    copying chunks ``t``, ``t + C``, ... (those of other GPUs)."""
    isa, sim = m.isa, m.sim
    tbs = len(comm)
    limit = access.window()
    bound = isa.request_bound(g)
    piece_unit = min(access.load_unit(access.load_bytes), limit, bound.limit)

    def placer(c: Chunk, piece: Region) -> Any:
        def placed(data: np.ndarray | None) -> None:
            if mem is not None and data is not None:
                mem.write(c.dst.sub(piece.start - c.src.start, piece.count), data)
        return placed

    def planned(t: int, sm: int, busy: int) -> TbPlan:
        plan = TbPlan()
        access.plan_sync(plan, g, t, 0)
        first = True
        for k in range(t, len(work), tbs):
            c = work[k]
            if c.owner == g:
                continue
            plan.wait(ready[k])
            if first:
                access.plan_sync(plan, g, t, 1)
                first = False
            pieces = isa.pieces(c.src, piece_unit)
            loads = LoadPlan([(c.owner, pc, isa.stripes(pc, piece_unit), placer(c, pc)) for pc in pieces])
            arrived = Countdown(len(pieces))
            slots = RequestSlots(Bound(sim, limit), bound)
            plan.begin(access.load_stream(g, loads, slots, arrived))
            plan.wait(arrived)
            plan.call(partial(landed[k].fire, sim))  # stored to the local copy: its flag set
        if first:  # every GPU's TB t registers with its group, remote chunks or not
            access.plan_sync(plan, g, t, 1)
        return plan

    return Kernel(f"{gemm.name} copy", [partial(planned, t) for t in range(tbs)], comm, role="communication")
