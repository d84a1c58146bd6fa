"""NCCL's NVLS AllReduce on buffers it has not registered (what nccl-tests runs).

The zero-copy NVLS kernel (``collectives.nvls_kernels``) reduces straight out of the
user's buffers, which NCCL can only do when they are mapped into the multicast
object (user-buffer registration). Without registration NCCL stages the data
through multicast-mapped buffers of its own, and each channel (one TB per GPU) runs
three warp groups as a pipeline of steps over ``NCCL_STEPS`` slots (NVIDIA/nccl at
5067397, ``src/device/all_reduce.h``, ``src/transport/nvls.cc``; read, not copied):

  scatter  copies this GPU's input, one chunk per head GPU, into its staging slot;
  reduce   (on the head) polls the slot's tail with ``multimem.ld_reduce.min`` until
           every GPU has scattered the step, ``multimem.ld_reduce``s its chunk,
           ``multimem.st``s the sum into every GPU's broadcast slot, fences, and
           stores the new tail (and the scatter slot's credit) with a multicast
           store;
  gather   waits until every head's tail has landed, copies the step's chunks from
           the broadcast slot into the output, and frees the slot.

The step's chunk follows NCCL's size schedule (``chunk_bytes``): 128 KiB from 1 GiB
up, then 64, 32 and 16 KiB as the buffer shrinks. What this adds over the zero-copy
kernel, and what the published curve shows, is a per-step cost (a poll round trip,
a fence round trip, the flags) and a fill and drain (the first step's scatter copy,
the last step's gather copy) that grow with the chunk.

Modelling decisions: the staging copies are local (no link sees them) and take
``n x chunk / collective.nvls_copy_GBps`` each (the copy warps' loads in flight
over the memory latency; a calibration, docs/fabric-model.md); the data path reads
the user's input and writes the user's output directly, which moves the same bytes
on the wire as the staging buffers would and gives the same sums.

How a warp waits for a counter is ``collective.poll``. ``oracle``: the reduce warps
issue one ``multimem.ld_reduce.min`` once the value is there, the scatter and gather
see their local flags the moment they land. ``spin``: as NCCL's ``waitPeer`` loop
(``prims_simple.h``): the warp polls back to back from when it starts waiting, and
the wait ends with the first poll whose read reaches the flag after it landed; a
value an earlier poll already read (NCCL's ``connStepCache``) needs no poll. The
reduce warps' polls are ``multimem.ld_reduce.min`` through the switch (the first is
simulated, its round trip R measured, its read taken at R / 2, and the later ones,
back to back and alike, are counted arithmetically: the k-th reads at t0 + k R +
R / 2); the scatter's credit and the gather's tail are ``ld.volatile`` of the
GPU's own memory, a round trip of ``gpu.memory_latency_ns``. Against ``oracle``
a spinning multimem wait ends between R / 2 earlier and R / 2 later (its
successful poll was already in flight when the flag landed, or just missed it), a
local one between 0 and two local round trips later.
"""

from __future__ import annotations

from cais.engine import Countdown, Signal
from cais.engine.sim import ProgramGen, Process
from cais.config import PS_PER_US
from cais.hw.gpu import Kernel, TbProgram
from cais.hw.memory import Region
from cais.hw.packets import Traffic
from cais.kernels.common import pause, split
from cais.machine import Machine

NCCL_STEPS = 8  # staging slots per channel
MIN_CHUNK = 16384


def chunk_bytes(nbytes: int, channels: int, heads: int, max_chunk: int) -> int:
    """NCCL's NVLS step size for a ``nbytes`` AllReduce (``enqueue.cc``): the
    largest chunk, halved to 64 KiB below 64 concurrent rounds of it, to 32 KiB
    below 8, to 16 KiB below 2 (a round: one chunk per channel per head)."""
    chunk = max_chunk
    for rounds, cap in ((64, 65536), (8, 32768), (2, MIN_CHUNK)):
        if nbytes < rounds * channels * heads * chunk and chunk > cap:
            chunk = cap
    return chunk


def staged_steps(nbytes: int, channels: int, heads: int, max_chunk: int) -> int:
    """Steps of each channel of a staged NVLS AllReduce of ``nbytes`` (one chunk per
    head each, :func:`chunk_bytes`)."""
    chunk = chunk_bytes(nbytes, channels, heads, max_chunk)
    return -(-nbytes // (channels * heads * chunk))


def spin_end(t0: int, landed: int, rtt: int) -> tuple[int, int]:
    """Polls issued back to back from ``t0``, each a round trip of ``rtt`` whose read
    reaches the flag halfway: (when the first poll that reads the flag after it
    ``landed`` returns, when that poll read it)."""
    half = rtt // 2
    k = max(0, -(-(landed - t0 - half) // rtt))
    return t0 + k * rtt + rtt, t0 + k * rtt + half


class _Channel:
    """The signals of one channel across GPUs: per step, every GPU has scattered it
    (the heads' tail poll then succeeds) and every GPU has gathered it (its
    broadcast slot is free again); per GPU and step, every head's tail and credit
    flags have landed there."""

    def __init__(self, ranks: int, n: int, steps: int) -> None:
        self.scattered = [Countdown(ranks) for _ in range(steps)]
        self.gathered = [Countdown(ranks) for _ in range(steps)]
        self.tails = [[Countdown(n) for _ in range(steps)] for _ in range(n)]
        self.credits = [[Countdown(n) for _ in range(steps)] for _ in range(n)]


def _staged_tb(m: Machine, gpu: int, steps: list[Region], step_bytes: list[int], state: _Channel, recv: str,
               host_ps: int, stream: int, unit: int) -> TbProgram:
    """A channel on ``gpu``: its scatter and gather warp groups as processes
    beside the reduce loop over ``steps`` (this GPU's chunk of each step, as a head);
    ``step_bytes[i]`` is the whole step's bytes per GPU (every head's chunk)."""
    isa, sim, n = m.isa, m.sim, m.n
    cfg = m.cfg.collective
    ps_per_byte = 1e3 / cfg.nvls_copy_GBps
    copy_step_ps = round(cfg.nvls_copy_step_us * PS_PER_US)
    limit = max(cfg.outstanding_bytes_per_sm, 2 * unit)
    key = m.flag_key()

    spinning = cfg.poll == "spin"
    local_rtt = max(1, round(m.cfg.gpu.memory_latency_ns * 1000))

    def wait_local(flag: Signal, seen: list[int]) -> ProgramGen:
        """An ``ld.volatile`` loop on a flag of this GPU's own memory (``seen[0]``:
        when the last successful poll read it)."""
        if not spinning:
            yield flag
            return
        if flag.fired and flag.time <= seen[0]:
            return  # an earlier poll already read this value
        t0 = sim.now
        yield flag
        end, seen[0] = spin_end(t0, flag.time, local_rtt)
        if end > sim.now:
            yield pause(sim, end - sim.now)

    scatter_seen, gather_seen = [-1], [-1]

    def scatter() -> ProgramGen:
        for i, nbytes in enumerate(step_bytes):
            if i >= NCCL_STEPS:  # the slot is free once every head has reduced it
                yield from wait_local(state.credits[gpu][i - NCCL_STEPS], scatter_seen)
            yield copy_step_ps + round(nbytes * ps_per_byte)
            state.scattered[i].arrive(sim)

    def gather() -> ProgramGen:
        for i, nbytes in enumerate(step_bytes):
            yield from wait_local(state.tails[gpu][i], gather_seen)
            yield copy_step_ps + round(nbytes * ps_per_byte)
            state.gathered[i].arrive(sim)

    def poll(region: Region) -> Signal:
        """One ``multimem.ld_reduce.min`` of a step counter: a round trip through the
        switch to every GPU's copy."""
        sig = Signal()
        flag = Region(region.buffer, region.start, max(1, min(region.count, 8 // region.elem_bytes)),
                      region.elem_bytes)
        isa.multimem_ld_reduce(gpu, flag, lambda _d: sig.fire(sim), stream)
        return sig

    def wait_multimem(flag: Signal, region: Region, seen: list[int]) -> ProgramGen:
        """The reduce warps' ``multimem.ld_reduce.min`` loop on a counter every GPU
        raises (``seen[0]``: when the last successful poll read it)."""
        if flag.fired and flag.time <= seen[0]:
            return
        t0 = sim.now
        first = poll(region)
        yield flag
        yield first
        end, seen[0] = spin_end(t0, flag.time, max(1, first.time - t0))
        if end > sim.now:
            yield pause(sim, end - sim.now)

    recv_seen, send_seen = [-1], [-1]

    def program(sm: int, busy: int) -> ProgramGen:
        if host_ps:  # the host's per-call cost on a standalone call's critical path
            yield pause(sim, host_ps)
        port = isa.sm_port()
        gathering = Process(sim, gather())
        Process(sim, scatter())
        for i, region in enumerate(steps):
            # waitPeer: the recv side (every GPU scattered step i) and the send side
            # (every GPU gathered step i - NCCL_STEPS) poll at once.
            if spinning:
                waits = [Process(sim, wait_multimem(state.scattered[i], region, recv_seen)).done]
                if i >= NCCL_STEPS:
                    waits.append(Process(sim, wait_multimem(state.gathered[i - NCCL_STEPS], region, send_seen)).done)
                for sig in waits:
                    yield sig
            else:
                yield state.scattered[i]
                ready = [poll(region)]
                if i >= NCCL_STEPS:
                    yield state.gathered[i - NCCL_STEPS]
                    ready.append(poll(region))
                for sig in ready:
                    yield sig
            # multimem.ld_reduce the chunk piece by piece within the window, and
            # multimem.st each sum into every GPU's broadcast slot as it comes back
            pieces = isa.pieces(region, unit) if region.count else []
            if pieces:
                yield isa.ld_reduce_stream(gpu, pieces, recv, limit, port, stream, unit)
                fenced = Signal()  # postPeer: fence the broadcast, then store the counters
                isa.fence(gpu, range(n), Traffic.STORE, lambda s=fenced: s.fire(sim))
                yield fenced
            # every GPU's copy of the tail and credit flags arrives on its step-i
            # countdown, counted in the core
            isa.flag_multicast_counts(gpu, key + 2 * i, [row[i] for row in state.tails])
            isa.flag_multicast_counts(gpu, key + 2 * i + 1, [row[i] for row in state.credits])
        yield gathering.done
    return program


def nvls_staged_kernels(m: Machine, send: str, recv: str, count: int, elem_bytes: int, channels: int,
                        host_ps: int, stream: int, sms: frozenset[int] | None) -> list[Kernel]:
    """One kernel per GPU: a staged NVLS AllReduce of ``count`` elements of ``send``
    into ``recv`` (each GPU the head of its 1/n of every step)."""
    n, cfg = m.n, m.cfg
    chunk = chunk_bytes(count * elem_bytes, channels, n, cfg.collective.nvls_chunk_bytes)
    chunk_elems = max(1, chunk // elem_bytes)
    # Channel ch owns a contiguous slice of the buffer; a step of it holds one chunk
    # per head, GPU g's chunk being its g-th part.
    plans = []
    for cs, cc in split(0, count, channels):
        steps = [(s, min(n * chunk_elems, cs + cc - s)) for s in range(cs, cs + cc, n * chunk_elems)]
        plans.append(steps)
    unit = cfg.unit_for(chunk)
    ranks = 1 if m.fabric.mirror else n
    states = [_Channel(ranks, n, len(steps)) for steps in plans]
    kernels = []
    for g in range(n):
        tbs = []
        for steps, state in zip(plans, states):
            if not steps:
                continue
            mine = []
            for s, c in steps:
                start, cnt = split(s, s + c, n)[g]
                mine.append(Region(send, start, cnt, elem_bytes))
            tbs.append(_staged_tb(m, g, mine, [c * elem_bytes for _, c in steps], state, recv, host_ps,
                                  stream, unit))
        kernels.append(Kernel("nvls-allreduce-staged", tbs, sms, role="communication"))
    return kernels
