"""The all-reduce kernels production inference stacks run for tensor parallelism,
as thread-block programs beside NCCL's (``collectives.py``). Each is one kernel per
GPU over registered (IPC or symmetric-memory) buffers: the same buffer name on every
GPU stands for the peer's mapping of it, as NVLink P2P addresses do.

Sources read (not copied), with the figures taken from them:

* **vLLM custom all-reduce** (``custom-oneshot``, ``custom-twoshot``, ``custom``):
  vllm-project/vllm ``csrc/custom_all_reduce.cuh`` @c9eabec7 (kernels, launch,
  thresholds) and ``vllm/distributed/device_communicators/custom_all_reduce.py``,
  ``all_reduce_utils.py`` @00d618aa (max size, copy into the registered buffer).
  SGLang's default TP all-reduce (``sgl-kernel/csrc/allreduce/custom_all_reduce.cuh``)
  is the same kernel (same signal layout, block count and thresholds).

  - one-shot (``cross_device_reduce_1stage``): every block loads its slice of the
    buffer from every peer's registered buffer (P2P loads), adds its own copy and
    stores the sum locally. Wire bytes per GPU, S the buffer:
    GPU -> switch (n - 1) S (read responses its peers asked for), switch -> GPU
    (n - 1) S (the responses it asked for); read requests are headers only.
  - two-shot (``cross_device_reduce_2stage``): reduce-scatter (each block loads its
    part of this GPU's 1/n shard from every peer and stores the sum locally), a
    barrier, then all-gather (the same block loads the same part of every peer's
    summed shard). Wire bytes per GPU: 2 (n - 1) S / n each way.
  - synchronisation: per-block flags in the signal pads (``multi_gpu_barrier``:
    every block stores a flag to each peer and waits for theirs). The one-shot has a
    volatile barrier at its start and its end; the two-shot one at its start and a
    release/acquire one at system scope between its stages (``need_fence``; its cost
    beyond the packets is ``collective.fence_us``), and none at its end:
    ``sync.BlockFlags``, (n - 1) flag packets per block per barrier.
  - launch: 512 threads x min(36, ceil(S / 16 B / 512)) blocks (``block_limit`` 36,
    one block per SM); each block's slice is contiguous here (the source strides
    16-byte packets over the grid: the same bytes per block).
  - path (``allreduce``): one-shot at n = 2, or for S < 512 KiB at n <= 4 and
    S < 256 KiB at n <= 8; two-shot otherwise. vLLM uses the kernel while S is
    below ``max_size`` (8 MiB; with torch symmetric memory enabled on sm90
    ``CUSTOM_ALL_REDUCE_MAX_SIZES`` caps it at 256 KiB for n = 8 and 32 MiB for
    n = 4) and for n in {2, 4, 6, 8}; otherwise NCCL runs it (the schemes model that
    fallback; a standalone call refuses).
  - buffers: outside a CUDA graph vLLM copies the input into its registered buffer
    first (``all_reduce(registered=False)``, the default its docstring states); in
    a graph the input is registered. ``copy_ps`` is that copy's time, or 0.

* **PyTorch symmetric memory, multimem** (``multimem-oneshot``,
  ``multimem-twoshot``, ``multimem``): pytorch/pytorch
  ``torch/csrc/distributed/c10d/symm_mem/CUDASymmetricMemoryOps.cu`` @fd6c4b6a and
  ``CUDASymmetricMemory-inl.cuh`` @05676925.

  - two-shot (``multimem_all_reduce_``, in place): each GPU ``multimem.ld_reduce``s
    its 1/n shard (the switch reads every replica and sums) and ``multimem.st``s the
    sum to every replica. Wire bytes per GPU: (n + 1) S / n each way (as NCCL's
    zero-copy NVLS kernel, without its staging, its host cost or its NVLS barrier).
  - one-shot (``multimem_one_shot_all_reduce``): each GPU ``multimem.ld_reduce``s
    the whole buffer and stores the sum locally. Wire bytes per GPU: n S up (its
    replica, once per GPU's load), S down.
  - synchronisation: ``sync_remote_blocks`` before and after (per-block flags, a
    CAS into each peer's signal pad; the closing one with release semantics, so the
    flags go after the block's stores have landed).
  - launch: ``init_elementwise_launch_config`` with at most 8 blocks of 1024
    threads, 16 B per thread: one block while a split (the shard; the whole buffer
    for the one-shot) is at most 1024 x 16 B, else ceil(split / 16 KiB) blocks,
    at most 8.
  - path (``multimem``): the two-shot; PyTorch chooses nothing by size (the caller
    picks the op), and vLLM's ``SymmMemCommunicator`` calls
    ``multimem_all_reduce_`` for n in {4, 6, 8} on sm90 ({6, 8} on sm100) up to
    ``SYMM_MEM_ALL_REDUCE_MAX_SIZES`` (sm90: 32 MiB at n = 4, 64 MiB at 6 and 8),
    copying the input into the symmetric buffer and the result out (``copy_ps``).

* **TensorRT-LLM all-reduce fusion** (``fused-oneshot``, ``fused-twoshot``,
  ``fused``; the kernel of ``tp-fused-ar-norm``): NVIDIA/TensorRT-LLM
  ``cpp/tensorrt_llm/kernels/communicationKernels/allReduceFusionKernels.cu``
  @04c74656 (FlashInfer's ``trtllm_allreduce_fusion`` is the same kernel).

  - one-shot (``allreduce_fusion_kernel_oneshot_lamport``): each block stores its
    slice of the input into every peer's Lamport buffer (P2P stores; the data is
    its own flag: the reader polls until no word holds the -0 sentinel), waits until
    every peer's slice has landed in its own buffer, sums the n copies locally and
    applies the fused op. Wire bytes per GPU: (n - 1) S each way.
  - two-shot (``allreduce_fusion_kernel_twoshot_sync``): a barrier, each GPU loads
    its token shard from every peer (P2P loads) and stores the sum into every
    peer's buffer (P2P stores), a barrier, then the fused op over all tokens. Wire
    bytes per GPU: 2 (n - 1) S / n each way (loads (n - 1) S / n, stores the same).
  - path: one-shot up to 128 tokens (``kOneShotMaxToken``), two-shot above.
  - launch: clusters of up to 8 blocks (sm90) per token (one-shot) or per token of
    a shard (two-shot), 16 B per thread; the grid is min(SMs, clusters x cluster
    size), rounded down to whole clusters (``allreduce_fusion_kernel_launcher``):
    a few SMs in decode, every SM for a prefill.
  - the fused op (residual add + RMSNorm) runs inside the same TBs after their
    all-reduce (``rowop``: a callback the scheme hands in).

What is not modelled: the SMs' own arithmetic (the sums and the norm's reduction
are timed as memory-bound work only: the rowop's calibrated time, the copies at
HBM bandwidth); the local HBM reads of the GPU's own copy and writes of the result
(no link sees them); the cost of polling beyond the flag's arrival; vLLM's
half-butterfly kernel for GPUs without full NVLink; the ROCm variants.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from cais.config import PS_PER_US
from cais.engine import Countdown
from cais.engine.sim import ProgramGen
from cais.errors import UserError
from cais.hw.gpu import Kernel, TbProgram
from cais.hw.memory import Region
from cais.kernels.common import Window, pause, split
from cais.kernels.sync import BlockFlags
from cais.machine import Machine

PACKET = 16  # bytes one thread moves per access in every kernel here (ld.128 / st.128)

# ---- vLLM custom all-reduce --------------------------------------------------------
CUSTOM_THREADS = 512
CUSTOM_BLOCK_LIMIT = 36
CUSTOM_WORLD_SIZES = (2, 4, 6, 8)
CUSTOM_MAX_SIZE = 8192 * 1024  # vLLM's default max_size: sizes below it run the kernel


def custom_path(n: int, nbytes: int) -> str:
    """vLLM's kernel for ``nbytes`` on ``n`` fully connected GPUs: ``oneshot`` or
    ``twoshot`` (``CustomAllreduce::allreduce``)."""
    if n == 2 or (n <= 4 and nbytes < 512 * 1024) or (n <= 8 and nbytes < 256 * 1024):
        return "oneshot"
    return "twoshot"


def custom_runs(n: int, nbytes: int, max_size: int = CUSTOM_MAX_SIZE) -> bool:
    """Whether vLLM runs its custom all-reduce (not NCCL) for ``nbytes`` on ``n``
    GPUs (``should_custom_ar``: a supported world size, a multiple of 16 bytes, below
    ``max_size``)."""
    return n in CUSTOM_WORLD_SIZES and nbytes % PACKET == 0 and nbytes < max_size


def custom_window_bytes(n: int, threads: int = CUSTOM_THREADS) -> int:
    """The loads one block of vLLM's kernel keeps in flight: every thread loads one
    16-byte packet from each peer per pass of its loop (``packed_reduce`` in the
    one-shot and the reduce-scatter; the all-gather's loop over ranks likewise) and
    uses them before the next pass: (n - 1) x 512 x 16 B = (n - 1) x 8 KiB."""
    return threads * PACKET * (n - 1)


def custom_blocks(nbytes: int) -> int:
    """Blocks of vLLM's launch: one per 512 16-byte packets, at most 36."""
    packets = -(-nbytes // PACKET)
    return max(1, min(CUSTOM_BLOCK_LIMIT, -(-packets // CUSTOM_THREADS)))


# ---- PyTorch symmetric memory, multimem --------------------------------------------
MULTIMEM_MAX_BLOCKS = 8
MULTIMEM_THREADS = 1024
MULTIMEM_WORLD_SIZES_SM90 = (4, 6, 8)  # vLLM's SymmMemCommunicator._WORLD_SIZES_MULTIMEM["9.0"]
SYMM_MEM_MAX_SIZES_SM90 = {2: 64 << 20, 4: 32 << 20, 6: 64 << 20, 8: 64 << 20}


def multimem_blocks(nbytes: int, splits: int) -> int:
    """Blocks of ``init_elementwise_launch_config`` for ``nbytes`` cut in ``splits``
    (the world size for the two-shot, 1 for the one-shot)."""
    per_split = -(-nbytes // splits)
    per_block = MULTIMEM_THREADS * PACKET
    if per_split <= per_block:
        return 1
    return min(-(-per_split // per_block), MULTIMEM_MAX_BLOCKS)


def multimem_runs(n: int, nbytes: int) -> bool:
    """Whether vLLM's SymmMemCommunicator runs the multimem all-reduce for ``nbytes``
    on ``n`` sm90 GPUs."""
    return n in MULTIMEM_WORLD_SIZES_SM90 and nbytes % 4 == 0 and nbytes <= SYMM_MEM_MAX_SIZES_SM90[n]


# ---- TensorRT-LLM all-reduce fusion --------------------------------------------------
FUSED_ONESHOT_MAX_TOKENS = 128
FUSED_CLUSTER_SM90 = 8


def fused_path(tokens: int) -> str:
    return "oneshot" if tokens <= FUSED_ONESHOT_MAX_TOKENS else "twoshot"


def fused_grid(tokens: int, hidden: int, n: int, sms: int, elem_bytes: int = 2, oneshot: bool = True) -> int:
    """Blocks of TensorRT-LLM's fused launch (``allreduce_fusion_kernel_launcher`` on
    sm90): clusters of up to 8 blocks, one cluster per token (one-shot) or per token
    of the largest shard (two-shot), the block at least 128 threads of 16 B; then
    clusters shrink (blocks grow, to 1024 threads) while the grid would exceed the
    SMs; the grid is whole clusters, at most the SMs."""
    clusters = tokens if oneshot else -(-tokens // n)
    threads_per_token = max(1, hidden * elem_bytes // PACKET)
    cluster = FUSED_CLUSTER_SM90
    while threads_per_token % cluster and cluster > 1:
        cluster //= 2
    threads = threads_per_token // cluster
    while threads < 128 and cluster >= 2:
        threads *= 2
        cluster //= 2
    while clusters * cluster > sms and cluster > 1 and threads <= 512:
        threads *= 2
        cluster //= 2
    return max(1, min(sms, clusters * cluster) // cluster * cluster)


# ---- the kernels ----------------------------------------------------------------------
KINDS = ("custom", "multimem", "fused")
PATHS = ("oneshot", "twoshot")


@dataclass(frozen=True)
class ProductionAr:
    """One production all-reduce: which kernel family, which path, over ``count``
    elements of ``send`` into ``recv`` (the same names on every GPU), with ``blocks``
    TBs per GPU. ``copy_ps``: a local copy before the data moves (vLLM's copy into
    the registered buffer), ``copy_out_ps`` one after (vLLM's symmetric-memory copy
    out). ``staging``: the name of the fused one-shot's Lamport buffer (n slots of
    the buffer). ``rowop``: the fused op a TB runs on its rows after the all-reduce
    (``fused`` only, ``row_elems`` elements a row: (gpu, the block's rows as
    (first, count) pairs) -> the rest of the TB's program)."""

    kind: str
    path: str
    count: int
    elem_bytes: int = 2
    send: str = "send"
    recv: str = "recv"
    blocks: int = 1
    copy_ps: int = 0
    copy_out_ps: int = 0
    host_ps: int = 0
    stream: int = 0
    staging: str = "lamport"
    row_elems: int = 1
    rowop: Callable[[int, list[tuple[int, int]]], ProgramGen] | None = None
    clear_ps: int = 0
    label: str = ""

    @property
    def name(self) -> str:
        return f"{self.label or self.kind}-{self.path}-allreduce"


def copy_time_ps(m: Machine, nbytes: int) -> int:
    """A device-to-device copy of ``nbytes`` on one GPU: read and write at the GPU's
    peak HBM bandwidth (GB/s = bytes/ns)."""
    return round(2 * nbytes / m.cfg.gpu.hbm_bandwidth_GBps * 1000)


def _pull(m: Machine, g: int, win: Window, region: Region, out: Region, stream: int, unit: int,
          reduce: bool, finished: Countdown) -> ProgramGen:
    """Load ``region`` from every peer (P2P ``ld``, at most the window in flight) and
    store into ``out`` (this GPU's memory) their sum, with this GPU's own copy if
    ``reduce``; ``finished`` counts one arrival per piece of ``region``."""
    isa, sim, n = m.isa, m.sim, m.n
    mem = m.gpus[g].memory
    for piece in isa.pieces(region, unit):
        dst = Region(out.buffer, out.start + piece.start - region.start, piece.count, piece.elem_bytes)
        parts: list[np.ndarray | None] = [mem.read(piece)] if reduce else []
        got = Countdown(n - 1)

        def summed(_v: object, parts: list = parts, dst: Region = dst) -> None:
            total = None if any(p is None for p in parts) else np.sum(parts, axis=0)
            mem.write(dst, total)
            finished.arrive(sim)
        got.on_fire(summed)
        for k in range(1, n):
            peer = (g + k) % n

            def arrived(data: np.ndarray | None, parts: list = parts, nbytes: int = piece.nbytes,
                        got: Countdown = got) -> None:
                win.release(nbytes)
                parts.append(data)
                got.arrive(sim)
            yield from win.acquire(piece.nbytes)
            isa.ld(g, peer, piece, arrived, stream, unit)


def _gather(m: Machine, g: int, win: Window, regions: list[tuple[int, Region]], stream: int, unit: int,
            finished: Countdown) -> ProgramGen:
    """Load each (peer, region) from that peer's memory into the same place of this
    GPU's; ``finished`` counts one arrival per piece."""
    isa, sim = m.isa, m.sim
    mem = m.gpus[g].memory
    for peer, region in regions:
        for piece in isa.pieces(region, unit):
            def arrived(data: np.ndarray | None, piece: Region = piece) -> None:
                win.release(piece.nbytes)
                mem.write(piece, data)
                finished.arrive(sim)
            yield from win.acquire(piece.nbytes)
            isa.ld(g, peer, piece, arrived, stream, unit)


def _n_pieces(m: Machine, regions: list[Region], unit: int) -> int:
    return sum(len(m.isa.pieces(r, unit)) for r in regions if r.count)


def _slices(start: int, count: int, blocks: int) -> list[tuple[int, int]]:
    return split(start, start + count, blocks)


def _custom_tb(m: Machine, g: int, b: int, spec: ProductionAr, flags: list[BlockFlags], unit: int) -> TbProgram:
    """Block ``b`` of vLLM's one-shot or two-shot kernel on GPU ``g``. Barriers as
    the source has them: the one-shot's start and end are volatile flag rounds; the
    two-shot's start is volatile, its middle one release/acquire at system scope
    (``need_fence``: its cost beyond the flags' packets is ``collective.fence_us``), and it has
    no end barrier (the next call's start barrier orders the buffers' reuse)."""
    n, eb, sim = m.n, spec.elem_bytes, m.sim
    limit = custom_limit(m, unit)
    shards = split(0, spec.count, n)
    fence = fence_ps(m)
    # the release's wait for the block's last stage-1 sums to be written: the last
    # window's worth of loads summed into one packet per n - 1 loaded, at the block's
    # share of the GPU's HBM bandwidth (GB/s = bytes/ns)
    drain = 0
    if m.cfg.collective.release_drain:
        share = m.cfg.gpu.hbm_bandwidth_GBps / spec.blocks
        drain = round(limit / (n - 1) / share * 1000)

    def program(sm: int, busy: int) -> ProgramGen:
        if spec.host_ps:
            yield pause(sim, spec.host_ps)
        if spec.copy_ps:  # the input copied into the registered buffer (out of a CUDA graph)
            yield pause(sim, spec.copy_ps)
        win = Window(sim, limit)
        yield flags[0].arrive(g, b)  # start_sync
        if spec.path == "oneshot":
            s, c = _slices(0, spec.count, spec.blocks)[b]
            mine = Region(spec.send, s, c, eb)
            done = Countdown(_n_pieces(m, [mine], unit))
            if c:
                yield from _pull(m, g, win, mine, Region(spec.recv, s, c, eb), spec.stream, unit, True, done)
                yield done
            yield flags[1].arrive(g, b)  # end_sync (volatile)
            return
        # two-shot: reduce-scatter of this GPU's shard (part b of it), into recv
        s0, c0 = shards[g]
        s, c = _slices(s0, c0, spec.blocks)[b]
        mine = Region(spec.send, s, c, eb)
        done = Countdown(_n_pieces(m, [mine], unit))
        if c:
            yield from _pull(m, g, win, mine, Region(spec.recv, s, c, eb), spec.stream, unit, True, done)
            yield done
        if fence + drain:  # st.release.sys / ld.acquire.sys: the sums written and visible system-wide first
            yield pause(sim, fence + drain)
        yield flags[1].arrive(g, b)  # the middle barrier
        # all-gather: part b of every peer's summed shard, from the peer's recv
        parts = []
        for k in range(1, n):
            peer = (g + k) % n
            ps, pc = _slices(*shards[peer], spec.blocks)[b]
            if pc:
                parts.append((peer, Region(spec.recv, ps, pc, eb)))
        got = Countdown(_n_pieces(m, [r for _, r in parts], unit))
        if parts:
            yield from _gather(m, g, win, parts, spec.stream, unit, got)
            yield got
    return program


def _multimem_tb(m: Machine, g: int, b: int, spec: ProductionAr, flags: list[BlockFlags], unit: int) -> TbProgram:
    """Block ``b`` of PyTorch's multimem two-shot (``multimem_all_reduce_``) or one-shot
    (``multimem_one_shot_all_reduce``) on GPU ``g``."""
    n, eb, sim, isa = m.n, spec.elem_bytes, m.sim, m.isa
    mem = m.gpus[g].memory
    limit = max(m.cfg.collective.outstanding_bytes_per_sm, 2 * unit)
    syncs = round(m.cfg.collective.multimem_sync_us * PS_PER_US)

    def program(sm: int, busy: int) -> ProgramGen:
        if spec.host_ps:
            yield pause(sim, spec.host_ps)
        if spec.copy_ps:  # vLLM: input copied into the symmetric buffer
            yield pause(sim, spec.copy_ps)
        port = isa.sm_port()
        win = Window(sim, limit)
        yield flags[0].arrive(g, b)  # sync_remote_blocks<false, true>
        if spec.path == "twoshot":
            s0, c0 = split(0, spec.count, n)[g]
        else:
            s0, c0 = 0, spec.count
        s, c = _slices(s0, c0, spec.blocks)[b]
        region = Region(spec.send, s, c, eb)
        pieces = isa.pieces(region, unit) if c else []
        landed = Countdown(len(pieces))
        for piece in pieces:
            out = Region(spec.recv, piece.start, piece.count, eb)

            def got(data: np.ndarray | None, piece: Region = piece, out: Region = out) -> None:
                win.release(piece.nbytes)
                if spec.path == "twoshot":  # multimem.st the sum to every replica; posted
                    isa.multimem_st(g, out, data, lambda: landed.arrive(sim), port, spec.stream, unit)
                else:  # one-shot: the sum stays here
                    mem.write(out, data)
                    landed.arrive(sim)
            yield from win.acquire(piece.nbytes)
            isa.multimem_ld_reduce(g, piece, got, spec.stream, unit)
        if pieces:
            yield landed  # release: the flags go once the block's stores have landed
        if syncs:  # the syncs' acquire and release at system scope beyond their packets
            yield pause(sim, syncs)
        yield flags[1].arrive(g, b)  # sync_remote_blocks<true, ...>
        if spec.copy_out_ps:  # vLLM: the result copied out of the symmetric buffer
            yield pause(sim, spec.copy_out_ps)
    return program


def _fused_tb(m: Machine, g: int, b: int, spec: ProductionAr, flags: list[BlockFlags], unit: int,
              lamport: list[list[Countdown]]) -> TbProgram:
    """Block ``b`` of TensorRT-LLM's fused all-reduce on GPU ``g``: its all-reduce,
    then ``spec.rowop`` (the fused residual add + RMSNorm) on its rows. Blocks own
    whole token rows (the source's clusters own tokens): block b takes part b of
    the rows (one-shot) or of every GPU's token shard (two-shot), on every GPU
    alike, so the rows it normalises are the ones its peers' block b reduced."""
    n, eb, sim, isa = m.n, spec.elem_bytes, m.sim, m.isa
    mem = m.gpus[g].memory
    limit = max(m.cfg.collective.outstanding_bytes_per_sm, 2 * unit)
    h = spec.row_elems
    rows = spec.count // h
    fence = fence_ps(m)
    fixed = round(m.cfg.collective.fused_fixed_us * PS_PER_US)

    def part(r0: int, nr: int) -> tuple[int, int]:
        """Block b's rows of rows [r0, r0 + nr)."""
        return split(r0, r0 + nr, spec.blocks)[b]

    def program(sm: int, busy: int) -> ProgramGen:
        if spec.host_ps:
            yield pause(sim, spec.host_ps)
        if spec.clear_ps:  # the one-shot clears an earlier call's Lamport buffer (to the -0 sentinel)
            yield pause(sim, spec.clear_ps)
        if spec.copy_ps:  # the two-shot copies its input into its own buffer first
            yield pause(sim, spec.copy_ps)
        port = isa.sm_port()
        win = Window(sim, limit)
        if spec.path == "oneshot":
            mine = [part(0, rows)]
            r0, nr = mine[0]
            s, c = r0 * h, nr * h
            data = mem.read(Region(spec.send, s, c, eb))
            slot = Region(spec.staging, g * spec.count + s, c, eb)
            mem.write(slot, data)  # own slot of the Lamport buffer; every peer's by P2P stores
            for k in range(1, n):
                peer = (g + k) % n
                arrived = lamport[0 if m.fabric.mirror else peer][b]
                for piece in isa.pieces(slot, unit) if c else []:
                    yield from win.acquire(piece.nbytes)
                    off = piece.start - slot.start
                    chunk = None if data is None else data[off:off + piece.count]

                    def landed(nbytes: int = piece.nbytes, arrived: Countdown = arrived) -> None:
                        win.release(nbytes)
                        arrived.arrive(sim, nbytes)
                    isa.st(g, peer, piece, chunk, landed, port, spec.stream, unit)
            if c:
                yield lamport[g][b]  # every peer's slice is in its slot (no -0 sentinel left)
                if mem.functional:
                    total = np.sum([mem.read(Region(spec.staging, r * spec.count + s, c, eb)) for r in range(n)],
                                   axis=0)
                    mem.write(Region(spec.recv, s, c, eb), total)
        else:
            shards = split(0, rows, n)
            mine = [part(*sh) for sh in shards]
            yield flags[0].arrive(g, b)
            r0, nr = mine[g]
            s, c = r0 * h, nr * h
            if c:
                src = Region(spec.send, s, c, eb)
                done = Countdown(_n_pieces(m, [src], unit))
                out = Region(spec.recv, s, c, eb)
                yield from _pull(m, g, win, src, out, spec.stream, unit, True, done)
                yield done
                data = mem.read(out)  # the sum, pushed into every peer's buffer (P2P stores)
                pieces = isa.pieces(out, unit)
                pushed = Countdown((n - 1) * len(pieces))
                for k in range(1, n):
                    peer = (g + k) % n
                    for piece in pieces:
                        yield from win.acquire(piece.nbytes)
                        chunk = None if data is None else data[piece.start - s:piece.start - s + piece.count]

                        def stored(nbytes: int = piece.nbytes) -> None:
                            win.release(nbytes)
                            pushed.arrive(sim)
                        isa.st(g, peer, piece, chunk, stored, port, spec.stream, unit)
                yield pushed  # the barrier's flags go after the stores have landed
            if fence:
                yield pause(sim, fence)
            yield flags[1].arrive(g, b)
        if fixed:  # the kernel's own fixed time (collective.fused_fixed_us)
            yield pause(sim, fixed)
        if spec.rowop is not None:
            yield from spec.rowop(g, [(r0, nr) for r0, nr in mine if nr])
    return program


def custom_limit(m: Machine, unit: int) -> int:
    """The in-flight load window of one block of vLLM's kernel (``collective.custom_window``):
    as its loop runs (:func:`custom_window_bytes`, at most the SM's
    ``outstanding_bytes_per_sm``) or the SM's; at least two transfer units."""
    sm = m.cfg.collective.outstanding_bytes_per_sm
    window = min(sm, custom_window_bytes(m.n)) if m.cfg.collective.custom_window == "threads" else sm
    return max(window, 2 * unit)


def fence_ps(m: Machine) -> int:
    """A system-scope release/acquire flag barrier's cost beyond its packets
    (``collective.fence_us``)."""
    return round(m.cfg.collective.fence_us * PS_PER_US)


def production_kernels(m: Machine, spec: ProductionAr) -> list[Kernel]:
    """One kernel per GPU running ``spec``."""
    n = m.n
    if spec.kind not in KINDS:
        raise UserError(f"algo: unknown kernel family '{spec.kind}'; valid: {', '.join(KINDS)}")
    if spec.path not in PATHS:
        raise UserError(f"algo: unknown path '{spec.path}'; valid: {', '.join(PATHS)}")
    if n < 2:
        raise UserError(f"gpus: the {spec.kind} all-reduce needs at least 2 GPUs, got {n}")
    eb = spec.elem_bytes
    if spec.path == "oneshot":  # every block walks a slice of the whole buffer
        per_tb = -(-spec.count // spec.blocks)
    else:  # a slice of the GPU's shard
        per_tb = -(-spec.count // (n * spec.blocks))
    unit = m.cfg.unit_for(max(1, per_tb * eb))
    if spec.kind == "custom":  # units no larger than half the block's window, so that it binds
        unit = max(m.cfg.min_transfer_unit_bytes, min(unit, custom_limit(m, 1) // 2))
    flags = [BlockFlags(m, spec.blocks, f"{spec.name} start"), BlockFlags(m, spec.blocks, f"{spec.name} end")]
    lamport: list[list[Countdown]] = []
    if spec.kind == "fused" and spec.count % spec.row_elems:
        raise UserError(f"bytes: the fused all-reduce works on whole token rows of {spec.row_elems} elements; "
                        f"{spec.count} elements are not")
    if spec.kind == "fused" and spec.path == "oneshot":
        slices = split(0, spec.count // spec.row_elems, spec.blocks)
        lamport = [[Countdown((n - 1) * c * spec.row_elems * eb) if c else Countdown(0) for _, c in slices]
                   for _ in range(n)]
        for gpu in m.gpus:
            if gpu.memory.functional and spec.staging not in gpu.memory.buffers:
                gpu.memory.alloc(spec.staging, n * spec.count)
    kernels = []
    for g in range(n):
        if spec.kind == "custom":
            tbs = [_custom_tb(m, g, b, spec, flags, unit) for b in range(spec.blocks)]
        elif spec.kind == "multimem":
            tbs = [_multimem_tb(m, g, b, spec, flags, unit) for b in range(spec.blocks)]
        else:
            tbs = [_fused_tb(m, g, b, spec, flags, unit, lamport) for b in range(spec.blocks)]
        kernels.append(Kernel(spec.name, tbs, None, role="communication", hbm_phases=spec.rowop is not None))
    return kernels

