"""Collective kernels as thread-block programs, one kernel per GPU.

NVLS (NCCL's single-node NVLink SHARP algorithms): each GPU owns 1/n of the buffer;
its TBs (``nvls_channels`` of them) walk their part of that shard one transfer unit at
a time:
  AllReduce      ``multimem.ld_reduce`` the unit, then ``multimem.st`` the sum;
  ReduceScatter  ``multimem.ld_reduce`` the unit, store the sum locally;
  AllGather      ``multimem.st`` the unit of the GPU's own shard.
Each TB keeps at most ``outstanding_bytes_per_sm`` of loads in flight (AllGather:
of stores not yet delivered, standing in for link backpressure); an AllReduce's
stores are posted and do not hold the window.

Ring: ``ring_channels`` TBs per GPU, each owning a slice of the buffer. Per
iteration a channel's slice is cut into n chunks that travel the ring in steps (2n-2
for AllReduce, n-1 for AllGather and ReduceScatter). Each step is a P2P store of up
to one step's bytes into one of ``ring_slots`` staging slots of the next GPU; the
receiver, once it has used the slot, stores a credit flag back to the sender, which
waits for a free slot before reusing it (kernels/sync.py; every flag is a packet on
the wire). How the next GPU learns that the slot is full is the protocol's
(kernels/protocols.py): Simple (``ring_step_bytes`` per step) waits for the stores'
write responses (a fence) and then stores a flag; LL and LL128 write the flag inside
the data's lines, so the slot is full when the last line lands, at the price of the
lines' extra bytes on the wire.

Buffers: ``spec.send`` (input) and ``spec.recv`` (output) on every GPU, elements of
``elem_bytes`` bytes. AllGather: send holds the GPU's shard, recv the whole buffer.
ReduceScatter: send holds the whole buffer, recv the GPU's shard. AllReduce: both
hold the whole buffer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from cais.engine import Countdown, Signal
from cais.engine.sim import ProgramGen
from cais.errors import UserError
from cais.hw.gpu import Kernel, TbProgram
from cais.machine import Machine
from cais.hw.memory import Region
from cais.kernels.algorithms import OPS, Algorithm, algorithm, names, register
from cais.kernels.common import Window, pause, split
from cais.kernels import production_ar as pa
from cais.kernels.nvls_staged import nvls_staged_kernels
from cais.kernels.production_ar import ProductionAr, production_kernels
from cais.kernels.protocols import SIMPLE, Protocol, protocol
from cais.kernels.tuning import MAX_THREADS, ring_launch

# The production all-reduce kernels (kernels/production_ar.py; AllReduce only): a
# family and a path, or the family alone for the path its stack picks by size.
PRODUCTION_ALGOS = ("custom-oneshot", "custom-twoshot", "custom", "multimem-oneshot", "multimem-twoshot", "multimem",
                    "fused-oneshot", "fused-twoshot", "fused")


@dataclass(frozen=True)
class CollectiveSpec:
    """What to run: the operation, the algorithm, and the buffer size in elements
    (the nccl-tests 'size': the AllReduce buffer, the AllGather output, the
    ReduceScatter input)."""

    op: str
    algo: str
    count: int
    elem_bytes: int = 2
    send: str = "send"
    recv: str = "recv"
    staging: str = "ring"
    channels: int | None = None  # TBs per GPU (default: the system's ring/nvls channels)
    stream: int = 0  # tags this collective's traffic (VC policy "kernel")
    sms: frozenset[int] | None = None  # SMs the kernel may use (None: any free SM)
    # Layout of the whole-buffer side (ReduceScatter input, AllGather output): shard k
    # starts at element full_base + k * full_stride (default: contiguous shards). The
    # shard side (AllGather input, ReduceScatter output) starts at shard_base. This
    # lets a collective move one chunk of every GPU's token shard.
    full_base: int = 0
    full_stride: int | None = None
    shard_base: int = 0
    protocol: str = "simple"  # ring only: simple, ll or ll128 (kernels/protocols.py); NVLS runs simple
    host_ps: int = 0  # the host's cost of the call before its data moves (collective.host_us; standalone calls)
    staged: bool = False  # NVLS AllReduce through NCCL's staging buffers (kernels/nvls_staged.py)
    registered: bool = False  # custom*: the input is in vLLM's registered buffer (else copied into it first)
    row_elems: int = 4096  # fused*: elements per token row (sets the tokens, hence the path and the grid)
    # Disjoint rings over subsets of the GPUs (an MoE layer's expert-TP groups), each running this collective
    # (``count``: one group's buffer) at once; ring only. None: one ring over every GPU.
    groups: tuple[tuple[int, ...], ...] | None = None

    def full(self, n: int, start: int) -> int:
        """Element offset in the whole-buffer side of logical element ``start``."""
        if self.full_stride is None:
            return self.full_base + start
        shard = self.count // n
        k = start // shard
        return self.full_base + k * self.full_stride + start - k * shard

    @property
    def nbytes(self) -> int:
        return self.count * self.elem_bytes


def shard_bounds(count: int, n: int) -> list[tuple[int, int]]:
    """(start, count) of each GPU's shard of a ``count``-element buffer."""
    return split(0, count, n)


# ---- NVLS -------------------------------------------------------------------------
def _nvls_tb(m: Machine, gpu: int, spec: CollectiveSpec, region: Region, out_of: Callable[[Region], Region],
             unit: int) -> TbProgram:
    """One NVLS TB over ``region`` (in ``send``: the GPU's shard of the input, or for
    AllGather its own shard); ``out_of`` maps a piece to where its result goes."""
    isa, sim = m.isa, m.sim
    mem = m.gpus[gpu].memory
    # At least two units in flight, so a TB pipelines even when a coarse unit (large
    # transfers, where bandwidth, not latency hiding, sets the time) exceeds the window.
    limit = max(m.cfg.collective.outstanding_bytes_per_sm, 2 * unit)
    op = spec.op

    def program(sm: int, busy: int) -> ProgramGen:
        if spec.host_ps:  # the host's per-call cost on a standalone call's critical path
            yield pause(sim, spec.host_ps)
        port = isa.sm_port()
        win = Window(sim, limit)
        pieces = isa.pieces(region, unit)
        finished = Countdown(len(pieces))

        def landed(piece: Region, holds_window: bool) -> Callable[[], None]:
            def done() -> None:
                if holds_window:
                    win.release(piece.nbytes)
                finished.arrive(sim)
            return done

        def reduced(piece: Region) -> Callable[[np.ndarray | None], None]:
            out = out_of(piece)

            def got(data: np.ndarray | None) -> None:
                win.release(piece.nbytes)  # the load is done; the store below is posted
                if op == "allreduce":
                    isa.multimem_st(gpu, out, data, landed(piece, False), port, spec.stream, unit)
                else:  # reducescatter: the sum stays on this GPU
                    mem.write(out, data)
                    finished.arrive(sim)
            return got

        for piece in pieces:
            yield from win.acquire(piece.nbytes)
            if op == "allgather":
                isa.multimem_st(gpu, out_of(piece), mem.read(piece), landed(piece, True), port, spec.stream, unit)
            else:
                isa.multimem_ld_reduce(gpu, piece, reduced(piece), spec.stream, unit)
        if pieces:
            yield finished
    return program


def nvls_kernels(m: Machine, spec: CollectiveSpec) -> list[Kernel]:
    n, eb = m.n, spec.elem_bytes
    channels = spec.channels or m.cfg.collective.nvls_channels
    bounds = shard_bounds(spec.count, n)
    unit = m.cfg.unit_for(-(-bounds[0][1] // channels) * eb)
    kernels = []
    for g in range(n):
        start, cnt = bounds[g]

        def out_of(piece: Region, g: int = g, start: int = start) -> Region:
            if spec.op == "allgather":  # own shard -> its place in every GPU's whole buffer
                at = spec.full(n, start + piece.start - spec.shard_base)
            elif spec.op == "reducescatter":  # whole-buffer piece -> this GPU's shard
                at = spec.shard_base + piece.start - spec.full(n, start)
            else:
                at = piece.start
            return Region(spec.recv, at, piece.count, piece.elem_bytes)

        src = spec.shard_base if spec.op == "allgather" else spec.full(n, start)
        tbs = [_nvls_tb(m, g, spec, Region(spec.send, src + s, c, eb), out_of, unit)
               for s, c in split(0, cnt, channels) if c > 0]
        kernels.append(Kernel(f"nvls-{spec.op}", tbs, spec.sms, role="communication"))
    return kernels


# ---- ring -------------------------------------------------------------------------
class _RingState:
    """Flags of one ring: data-arrived and slot-free signals per (gpu, channel, step)."""

    def __init__(self, mirror: bool = False) -> None:
        self.arrived: dict[tuple[int, int, int], Signal] = {}
        self.credit: dict[tuple[int, int, int], Signal] = {}
        self.mirror = mirror  # mirror mode: every GPU is GPU 0's image, so are its flags

    def get(self, table: dict[tuple[int, int, int], Signal], key: tuple[int, int, int]) -> Signal:
        if self.mirror:
            key = (0, key[1], key[2])
        sig = table.get(key)
        if sig is None:
            sig = table[key] = Signal()
        return sig


def _ring_plan(spec: CollectiveSpec, n: int, channels: int, step: int) -> list[list[list[tuple[int, int]]]]:
    """For each channel, for each iteration, the n chunks as (start, count) in the
    full buffer. AllReduce cuts the buffer; AllGather/ReduceScatter cut each shard
    alike, chunk k lying in shard k."""
    plans: list[list[list[tuple[int, int]]]] = []
    if spec.op == "allreduce":
        for cs, cc in split(0, spec.count, channels):
            iters = []
            for it_start in range(cs, cs + cc, n * step):
                iters.append(split(it_start, min(cs + cc, it_start + n * step), n))
            plans.append(iters)
        return plans
    shards = shard_bounds(spec.count, n)
    shard_len = shards[0][1]
    for cs, cc in split(0, shard_len, channels):
        iters = []
        for it_start in range(cs, cs + cc, step):
            cnt = min(step, cs + cc - it_start)
            iters.append([(shards[k][0] + it_start, cnt) for k in range(n)])
        plans.append(iters)
    return plans


def _ring_tb(m: Machine, spec: CollectiveSpec, ring: tuple[int, ...], rank: int, ch: int,
             plan: list[list[tuple[int, int]]], state: _RingState, slot_elems: int, unit: int, key: int,
             proto: Protocol, threads: int | None = None) -> TbProgram:
    """Channel ``ch`` of the GPU at position ``rank`` of ``ring`` (the GPUs in ring order)."""
    n, eb, isa, sim = len(ring), spec.elem_bytes, m.isa, m.sim
    gpu, nxt, prv = ring[rank], ring[(rank + 1) % n], ring[(rank - 1) % n]
    mem = m.gpus[gpu].memory
    slots = m.cfg.collective.ring_slots
    op = spec.op
    steps = 2 * n - 2 if op == "allreduce" else n - 1
    own = shard_bounds(spec.count, n)[rank][0]
    staging_base = ch * slots * slot_elems  # channels use distinct staging addresses

    def chunk_of(j: int) -> int:
        return (rank - j - 1) % n if op == "reducescatter" else (rank - j) % n

    def slot(s: int, cnt: int) -> Region:
        return Region(spec.staging, staging_base + (s % slots) * slot_elems, cnt, eb)

    def local_in(start: int, cnt: int) -> Region:  # this GPU's input for logical elements
        at = spec.shard_base + start - own if op == "allgather" else spec.full(n, start)
        return Region(spec.send, at, cnt, eb)

    def out(start: int, cnt: int) -> Region:
        at = spec.shard_base + start - own if op == "reducescatter" else spec.full(n, start)
        return Region(spec.recv, at, cnt, eb)

    rate = {"ll": m.cfg.collective.ll_channel_GBps, "ll128": m.cfg.collective.ll128_channel_GBps}.get(proto.name)
    if rate is not None and threads is not None:  # LL/LL128 on fewer threads than NCCL's most: the
        rate *= threads / MAX_THREADS[proto.name]  # poll-and-store loop's rate scales with them

    # LL with NCCL's threads (ring_launch=nccl): each thread stores its first line of a
    # step as soon as it has it, so that wave (threads x 8 B) goes out at the SM's
    # remote-store rate (collective.ll_wave_GBps); each thread's further lines follow,
    # one per iteration of the poll-and-store loop (prims_ll.h), at the channel's LL
    # rate scaled by its threads.
    wave = threads * proto.line_payload // eb if proto.name == "ll" and threads is not None else 0

    def program(sm: int, busy: int) -> ProgramGen:
        if spec.host_ps:  # the host's per-call cost on a standalone call's critical path
            yield pause(sim, spec.host_ps)
        port = isa.sm_port(rate)
        first_port = isa.sm_port(m.cfg.collective.ll_wave_GBps) if wave else None
        s_send = s_recv = 0  # step counters across iterations (slot sequence numbers)

        def receive(j: int, start: int, cnt: int) -> ProgramGen:
            """Wait for step ``j``'s data from the previous GPU, fold it, free the slot."""
            nonlocal s_recv
            yield state.get(state.arrived, (gpu, ch, s_recv))
            data = mem.read(slot(s_recv, cnt))
            reduce_phase = (op == "allreduce" and j < n - 1) or op == "reducescatter"
            if reduce_phase and data is not None:
                data = data + mem.read(local_in(start, cnt))
            freed = state.get(state.credit, (prv, ch, s_recv))
            isa.flag(gpu, prv, key + ch * slots + s_recv % slots, lambda sig=freed: sig.fire(sim))
            s_recv += 1
            return data

        for chunks in plan:
            data = None
            for j in range(steps):
                start, cnt = chunks[chunk_of(j)]
                if j == 0:
                    data = mem.read(local_in(start, cnt))
                    if op == "allgather":
                        mem.write(out(start, cnt), data)
                else:
                    data = yield from receive(j - 1, start, cnt)
                    if (op == "allreduce" and j >= n - 1) or op == "allgather":
                        mem.write(out(start, cnt), data)
                if s_send >= slots:
                    yield state.get(state.credit, (gpu, ch, s_send - slots))
                arrived = state.get(state.arrived, (nxt, ch, s_send))
                flag_key = key + ch * slots + s_send % slots

                def post(sig: Signal = arrived, k: int = flag_key) -> None:
                    isa.flag(gpu, nxt, k, lambda: sig.fire(sim))
                if cnt and proto.inline_flag and wave:  # the first wave at once, the rest at the loop's rate
                    first = min(cnt, wave)
                    landed = Countdown(1 if first == cnt else 2)
                    landed.on_fire(lambda _v, sig=arrived: sig.fire(sim))
                    whole = slot(s_send, cnt)
                    head = Region(whole.buffer, whole.start, first, eb)
                    isa.st(gpu, nxt, head, None if data is None else data[:first], lambda c=landed: c.arrive(sim),
                           first_port, spec.stream, unit, encoding=proto.encoding)
                    if first < cnt:  # each thread's next lines follow its first
                        yield pause(sim, round(first * eb * first_port.ps_per_byte))
                        tail = Region(whole.buffer, whole.start + first, cnt - first, eb)
                        isa.st(gpu, nxt, tail, None if data is None else data[first:], lambda c=landed: c.arrive(sim),
                               port, spec.stream, unit, encoding=proto.encoding)
                elif cnt and proto.inline_flag:  # the flags are in the lines: the slot is full when they land
                    isa.st(gpu, nxt, slot(s_send, cnt), data, lambda sig=arrived: sig.fire(sim), port, spec.stream,
                           unit, encoding=proto.encoding)
                elif cnt:
                    isa.st(gpu, nxt, slot(s_send, cnt), data, None, port, spec.stream, unit, fenced=post)
                else:
                    post()
                s_send += 1
            start, cnt = chunks[chunk_of(steps)] if op != "reducescatter" else chunks[rank]
            data = yield from receive(steps - 1, start, cnt)
            mem.write(out(start, cnt), data)
    return program


def ring_kernels(m: Machine, spec: CollectiveSpec) -> list[Kernel]:
    """One ring kernel per GPU: a ring over every GPU, or one per group of ``spec.groups``
    (the same collective on each, at once; its flags and traffic apart)."""
    rings = spec.groups or (tuple(range(m.n)),)
    n, cfg = len(rings[0]), m.cfg.collective
    proto = protocol(spec.protocol)
    step = max(1, (cfg.ring_step_bytes if proto is SIMPLE else proto.step_bytes) // spec.elem_bytes)
    channels, threads = spec.channels or cfg.ring_channels, None
    if spec.channels is None and cfg.ring_launch == "nccl":  # NCCL's channels and threads by size
        channels, threads = ring_launch(spec.nbytes, n, proto.name, cfg.ring_channels)
    plans = _ring_plan(spec, n, channels, step)
    slot_elems = max((c for plan in plans for it in plan for _, c in it), default=1)
    unit = m.cfg.unit_for(slot_elems * spec.elem_bytes)
    key = m.flag_key() * 1_000_003  # the flags of this collective: one per channel and slot
    state = _RingState(m.fabric.mirror)
    for gpu in m.gpus:  # the staging slots every channel writes into on its next GPU
        if gpu.memory.functional and spec.staging not in gpu.memory.buffers:
            gpu.memory.alloc(spec.staging, len(plans) * cfg.ring_slots * slot_elems)
    by_gpu: dict[int, Kernel] = {}
    for ring in rings:
        for rank, g in enumerate(ring):
            tbs = [_ring_tb(m, spec, ring, rank, ch, plan, state, slot_elems, unit, key, proto, threads)
                   for ch, plan in enumerate(plans) if plan]
            by_gpu[g] = Kernel(f"ring-{spec.op}", tbs, spec.sms, role="communication")
    return [by_gpu[g] for g in range(m.n)]


def production_spec(m: Machine, spec: CollectiveSpec) -> ProductionAr:
    """The production all-reduce ``spec.algo`` names, as its source launches it for
    this size on ``m``: the path (the family alone: the one its stack picks by size),
    the block count, vLLM's copy into its registered buffer (``spec.registered``
    off). NCCL's host cost (``spec.host_ps``) is not charged: these kernels are
    launched directly, without NCCL's enqueue."""
    n, nbytes = m.n, spec.nbytes
    kind, _, path = spec.algo.partition("-")
    if kind == "custom":
        if n not in pa.CUSTOM_WORLD_SIZES:
            raise UserError(f"gpus: vLLM's custom all-reduce runs on {', '.join(map(str, pa.CUSTOM_WORLD_SIZES))} "
                            f"GPUs, got {n}")
        path = path or pa.custom_path(n, nbytes)
        return ProductionAr(kind, path, spec.count, spec.elem_bytes, spec.send, spec.recv, pa.custom_blocks(nbytes),
                            0 if spec.registered else pa.copy_time_ps(m, nbytes), stream=spec.stream)
    if kind == "multimem":
        path = path or "twoshot"
        blocks = pa.multimem_blocks(nbytes, n if path == "twoshot" else 1)
        return ProductionAr(kind, path, spec.count, spec.elem_bytes, spec.send, spec.recv, blocks, stream=spec.stream)
    tokens = max(1, spec.count // spec.row_elems)
    path = path or pa.fused_path(tokens)
    blocks = pa.fused_grid(tokens, spec.row_elems, n, m.cfg.gpu.sms, spec.elem_bytes, path == "oneshot")
    return ProductionAr(kind, path, spec.count, spec.elem_bytes, spec.send, spec.recv, blocks, stream=spec.stream,
                        staging=spec.staging, row_elems=spec.row_elems)


def build(m: Machine, spec: CollectiveSpec) -> list[Kernel]:
    """One kernel per GPU implementing ``spec`` on machine ``m``: its algorithm's
    (:mod:`cais.kernels.algorithms`), after checking the operation and protocol."""
    if spec.full_stride is not None and (spec.op == "allreduce" or spec.count % m.n):
        raise ValueError("a strided layout needs ReduceScatter or AllGather with equal shards")
    if spec.groups is not None:
        members = sorted(g for ring in spec.groups for g in ring)
        if spec.algo != "ring" or members != list(range(m.n)) or len({len(r) for r in spec.groups}) != 1:
            raise ValueError("groups: equal rings that partition the GPUs, under the ring algorithm")
    if spec.op not in OPS:
        raise UserError(f"op: unknown collective '{spec.op}'; valid: {', '.join(OPS)}")
    algo = algorithm(spec.algo)
    algo.check(spec.op, spec.protocol)
    return algo.build(m, spec)


def _nvls(m: Machine, spec: CollectiveSpec) -> list[Kernel]:
    """NVLS: an AllReduce staged through NCCL's own buffers where the spec says so,
    else zero-copy on the registered buffers."""
    if spec.staged and spec.op == "allreduce" and spec.full_stride is None:
        return nvls_staged_kernels(m, spec.send, spec.recv, spec.count, spec.elem_bytes,
                                   spec.channels or m.cfg.collective.nvls_channels, spec.host_ps, spec.stream,
                                   spec.sms)
    return nvls_kernels(m, spec)


def _production(m: Machine, spec: CollectiveSpec) -> list[Kernel]:
    return production_kernels(m, production_spec(m, spec))


# events per packet train: measured 3.2-6.0 (ring) and 3.7-4.6 (NVLS), docs/errors.md, "Size limits"
register(Algorithm("ring", OPS, ("simple", "ll", "ll128"), nccl=True, barriers=False,
                   channels=lambda cfg: cfg.collective.ring_channels, events_per_train=7, build=ring_kernels,
                   step_bytes=lambda cfg: cfg.collective.ring_step_bytes))
register(Algorithm("nvls", OPS, ("simple",), nccl=True, barriers=True,
                   channels=lambda cfg: cfg.collective.nvls_channels, events_per_train=5, build=_nvls))
for _name in PRODUCTION_ALGOS:
    register(Algorithm(_name, ("allreduce",), ("simple",), nccl=False, barriers=False,
                       channels=lambda cfg: cfg.collective.ring_channels, events_per_train=7, build=_production,
                       step_bytes=lambda cfg: cfg.collective.ring_step_bytes))

#: NCCL's algorithms, and every algorithm (the registry's names)
ALGOS = names(nccl=True)
ALL_ALGOS = names()
