"""What every scheme shares: running one period of the layer graph on a machine.

A :class:`LayerRun` owns the machine, the period and the compute model, and builds
kernels for one GPU (GEMMs, row-wise ops, attention, activations, collectives) by
handing what they need to the kernel builders in ``cais.kernels``. A :class:`Scheme`
walks the period's segments and decides how each one runs: which kernels, on which
SMs, waiting for what. The base class runs everything bulk-synchronously, kernel
after kernel on each GPU, with NCCL-like collectives between the GEMMs; an overlap
scheme overrides :meth:`Scheme.chain`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from cais.errors import UserError
from cais.engine import Countdown, Signal, all_of
from cais.hw.compute import ComputeModel
from cais.config import TrainConfig
from cais.hw.gpu import Kernel
from cais.hw.memory import Memory
from cais.machine import Machine
from cais.kernels import activation, attention, fused_workers, mla, remote_copy, remote_gemm, rowop, sync
from cais.kernels.algorithms import algorithm
from cais.kernels.collectives import ALGOS, CollectiveSpec, build
from cais.kernels.production_ar import ProductionAr, production_kernels
from cais.kernels.fused_workers import FusedPath, RowWise
from cais.kernels.gemm import Epilogue, GemmShape, gemm_kernel, gemm_shape, store_epilogue
from cais.kernels.remote_gemm import Drain, Operand, RemoteAccess, Sharded
from cais.kernels.remote_reuse import RemoteReuse
from cais.kernels.tuning import choose_for
from cais.workload.dims import dims_for
from cais.workload.graph import Chain, Gather, Gemm, Local, Period, RowOp
from cais.workload.models import ModelSpec

Deps = list[Signal]

#: a scheme's ``algo`` that asks for NCCL's own algorithm and protocol by size per call
#: (what a call gets with no ``NCCL_ALGO`` set: tp-nccl, sp-nccl, a production kernel's
#: fallback); any other ``algo`` is forced (:meth:`LayerRun.nccl_call`)
NCCL_CHOICE = "nccl"


class AsymmetricRun(UserError):
    """Mirror mode was asked for a run whose GPUs do not all run GPU 0's program."""


class SwitchMismatch(UserError):
    """A scheme asked of a system whose switch chips lack what it needs (a CAIS scheme
    on a switch without merge units): refused before the machine is built."""


class VcMismatch(UserError):
    """A scheme asked of links whose VC policy undoes what defines it (CAIS's traffic
    control on one request VC, which is CAIS-Partial): refused before the machine is
    built."""


class WgradMismatch(UserError):
    """A backward dataflow for the weight gradients' gathered operands that a scheme
    cannot run (``train.wgrad_grads`` = refetch on a scheme whose gradients are
    gathered by a collective): refused before the machine is built."""


@dataclass(frozen=True)
class WgradPlan:
    """How a period's weight gradients get their gathered operands (``train``): the
    forward inputs (``inputs``) and the output gradients (``grads``), each ``keep``
    or ``refetch``, in program order or with ``-overlap`` (config.py,
    ``TrainConfig``)."""

    inputs: str
    grads: str

    def of(self, kind: str) -> str:
        """The choice for a gathered operand of class ``kind`` (``input``, ``grad``)."""
        return self.inputs if kind == "input" else self.grads


def gathered_class(period: Period, name: str) -> str:
    """Whether the gathered tensor ``name`` a weight gradient reads is a forward
    ``input`` (a forward sub-layer's gather, or a re-gather) or an output ``grad`` (a
    backward sub-layer's)."""
    for c in period.chains:
        if c.gather_dst == name:
            return "input" if c.gemm2.role == "fwd" else "grad"
    return "input"


@dataclass
class Span:
    """When a segment ran: first kernel start to last kernel end, over all GPUs."""

    start: int | None = None
    end: int = 0

    def add(self, kernel: Kernel) -> None:
        if kernel.started_at is not None:
            self.start = kernel.started_at if self.start is None else min(self.start, kernel.started_at)
        self.end = max(self.end, kernel.finished_at or 0)


@dataclass
class LayerRun:
    """One period of a layer stack on one machine, being scheduled by a scheme."""

    m: Machine
    model: ModelSpec
    period: Period
    cm: ComputeModel
    p_drop: float = 0.1
    spans: dict[str, Span] = field(default_factory=dict)
    kernels: list[tuple[str, int, Kernel]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.d = self.period.dims
        self.sms = self.m.cfg.gpu.sms
        self.collectives = 0
        self.choices: dict[tuple[str, str], int] = {}  # (algo, protocol) -> collectives that ran it
        # sub-layer -> (GEMM-RS SMs, LN + AG-GEMM SMs) of a fused pipeline's SM split
        self.sm_splits: dict[str, tuple[int, int]] = {}
        self.last_algo = ""  # the algorithm the latest :meth:`collective` ran
        # Mirror mode: GPU 0's kernels run; GPU g's k-th kernel of a name is the
        # image of GPU 0's k-th kernel of that name (its done signal stands for it).
        self._images: dict[str, list[Kernel]] = {}
        self._image_seen: dict[tuple[int, str], int] = {}
        # remote GEMM tiles' planned loads and epilogue pieces, shared by the GPUs
        self.plans: dict[tuple, Any] = {}
        # launch modes (gpu.launch): when each GPU's host thread has issued its latest kernel (eager)
        self._host_ps = [0] * self.m.n

    # ---- launch modes --------------------------------------------------------------
    @property
    def launch_mode(self) -> str:
        """``gpu.launch``: fitted (the compute model's per-kernel overheads), eager or graph."""
        return self.m.cfg.gpu.launch

    def _launch(self, g: int, delay_ps: int, host: str, pdl: bool) -> tuple[int, int]:
        """(the kernel's gap after its inputs are ready, when the host has issued it) for
        a kernel submitted with the fitted fixed cost ``delay_ps`` (docs/compute-model.md,
        "Launch modes"): fitted keeps ``delay_ps`` and has no host; eager and graph
        replace it by the dependent-kernel gap (``pdl_gap_us`` for a PDL launch; none
        where the scheme submits the kernel with no cost, already queued), and eager
        charges the host ``host_op_us`` for an op's first kernel and ``host_launch_us``
        for each further one (``host`` = ``op`` or ``launch``)."""
        gpu = self.m.cfg.gpu
        if gpu.launch == "fitted":
            return delay_ps, 0
        gap = 0 if delay_ps == 0 else round((gpu.pdl_gap_us if pdl else gpu.kernel_gap_us) * 1_000_000)
        if gpu.launch == "graph":
            return gap, 0
        cost = gpu.host_op_us if host == "op" else gpu.host_launch_us
        self._host_ps[g] += round(cost * 1_000_000)
        return gap, self._host_ps[g]

    # ---- scheduling --------------------------------------------------------------
    def when(self, deps: Sequence[Signal], fn: Callable[[], None]) -> None:
        all_of(self.m.sim, list(deps)).on_fire(lambda _v: fn())

    def submit(self, g: int, kernel: Kernel, deps: Sequence[Signal], delay_ps: int = 0,
               segment: str | None = None, host: str = "op", pdl: bool = False) -> Signal:
        """Launch ``kernel`` on GPU ``g`` once ``deps`` have fired (plus ``delay_ps``:
        its fitted fixed cost; in the eager and graph launch modes the dependent-kernel
        gap instead, and in eager no earlier than its host issue, :meth:`_launch`).
        ``host``: ``op`` for an op's first kernel, ``launch`` for a further kernel of
        the same op; ``pdl``: launched with programmatic dependent launch."""
        if self.m.fabric.mirror:
            if g == 0:
                self._images.setdefault(kernel.name, []).append(kernel)
            else:
                return self._image(g, kernel)
        self.kernels.append((segment or kernel.name, g, kernel))
        if segment is not None:
            span = self.spans.setdefault(segment, Span())
            kernel.done.on_fire(lambda _v: span.add(kernel))
        gap, issued = self._launch(g, delay_ps, host, pdl)
        sim = self.m.sim
        self.when(deps, lambda: self.m.gpus[g].launch(kernel, max(gap, issued - sim.now)))
        return kernel.done

    def _image(self, g: int, kernel: Kernel) -> Signal:
        """Mirror mode: the done signal of GPU 0's kernel that ``kernel`` (on GPU
        ``g``) is the image of; AsymmetricRun if GPU g's program is not GPU 0's."""
        k = self._image_seen.get((g, kernel.name), 0)
        self._image_seen[(g, kernel.name)] = k + 1
        mine = self._images.get(kernel.name, [])
        if k >= len(mine) or len(mine[k].tbs) != len(kernel.tbs):
            raise AsymmetricRun(f"GPU {g}'s kernel '{kernel.name}' #{k + 1} ({len(kernel.tbs)} TBs) has no "
                                "counterpart on GPU 0")
        return mine[k].done

    def barrier(self, arrive: Sequence[Signal], name: str = "barrier") -> list[Signal]:
        """An NVLS barrier on the wire (kernels/sync.py): GPU g arrives when
        ``arrive[g]`` fires and passes (its signal) once it has seen every GPU."""
        return sync.barrier(self.m, arrive, name)

    # ---- kernels -----------------------------------------------------------------
    def _memory(self, g: int) -> Memory:
        """GPU ``g``'s memory, handed to the kernel builders (the one place a scheme's
        run reaches it: its data in functional mode, nothing in timing mode)."""
        return self.m.gpus[g].memory

    def store_epilogue(self, g: int, gemm: Gemm, shape: GemmShape) -> Epilogue | None:
        """A GEMM tile's plain epilogue on GPU ``g`` (store it into C, kernels/gemm.py),
        for a scheme's epilogue to call before its own work; None in timing mode."""
        mem = self._memory(g)
        return store_epilogue(mem, gemm.ops, shape) if mem.functional else None

    @property
    def slowest(self) -> float:
        """The slowest GPU's factor on its compute time (``gpu_slowdown``; 1: none)."""
        cfg = self.m.cfg
        return max(cfg.gpu_slowdown.get(g, 1.0) for g in range(cfg.gpus))

    def chain_bound_ps(self, c: Chain) -> tuple[int, int]:
        """(compute, communication) lower bounds of a sub-layer: its kernels' calibrated
        work on all SMs (without launch and fixed kernel overheads), stretched by the
        slowest GPU's ``gpu_slowdown`` (a sub-layer ends with its slowest GPU), and the
        least bytes a GPU must move per link direction, S = one [T, h] activation, T with
        its padding (ReduceScatter with in-switch reduction: S up, S/n down; AllGather
        with multicast: S/n up, S(n-1)/n down), over the GPU's NVLink bandwidth."""
        cm, sms, cfg = self.cm, self.sms, self.m.cfg
        compute = sum(cm.gemm_time_ps(g.m, g.n, g.k, sms) - cm.kernel_overhead_ps for g in (c.gemm1, c.gemm2))
        compute += self.rowop_work_ps(c.rowop, c.rowop.rows, sms)
        slowest = self.slowest
        s_bytes = self.d.tokens * self.d.hidden * self.model.dtype_bytes
        gbps = cfg.link.bandwidth_GBps * cfg.links_per_gpu
        return round(compute * slowest), round(s_bytes / gbps * 1000)

    def shape(self, gemm: Gemm, sms: int | None = None) -> GemmShape:
        return gemm_shape(self.cm, gemm.m, gemm.n, gemm.k, sms or self.sms)

    def gemm_floor_ps(self, gemm: Gemm, shape: GemmShape, sms: int) -> int:
        """Least time of one tile: the GEMM's operand bytes over HBM, per wave."""
        eb = self.model.dtype_bytes
        nbytes = eb * (gemm.m * gemm.k + gemm.k * gemm.n + gemm.m * gemm.n)
        waves = -(-shape.tiles // sms)
        return max(0, self.cm.memory_time_ps(nbytes, sms, self.sms) - self.cm_mem_overhead_ps) // waves

    @property
    def cm_mem_overhead_ps(self) -> int:
        return self.cm.memory_time_ps(0, self.sms, self.sms)

    def gemm_kernel(self, g: int, gemm: Gemm, sm_set: frozenset[int] | None = None, epilogue: Epilogue | None = None,
                    order: Sequence[tuple[int, int]] | None = None,
                    waits: Callable[[int, int], Sequence[Signal]] | None = None,
                    shape: GemmShape | None = None) -> Kernel:
        sms = len(sm_set) if sm_set else self.sms
        shape = shape or self.shape(gemm, sms)
        mem = self._memory(g)
        return gemm_kernel(self.cm, shape, gemm.name, sm_set, mem if mem.functional else None, gemm.ops,
                           epilogue, order, waits, self.gemm_floor_ps(gemm, shape, sms))

    def reduce_gemm(self, g: int, gemm: Gemm, reduced: str, access: RemoteAccess,
                    sm_set: frozenset[int] | None = None) -> tuple[Kernel, Drain | None]:
        """A GEMM-RS kernel whose epilogues reduce partial rows into the owners of
        ``reduced`` (a [rows_l, n] shard per GPU) through ``access``
        (kernels/remote_gemm.py)."""
        sms = len(sm_set) if sm_set else self.sms
        shape = self.shape(gemm, sms)
        mem = self._memory(g)
        return remote_gemm.reduce_gemm(self.m, self.cm, g, gemm, shape, self.gemm_floor_ps(gemm, shape, sms),
                                       self.model.dtype_bytes, Sharded(reduced, self.d.rows_l, shape.n), access,
                                       sm_set, mem if mem.functional else None, self.plans)

    def load_gemm(self, g: int, gemm: Gemm, ops: list[Operand], access: RemoteAccess,
                  sm_set: frozenset[int] | None = None, keep: bool = False, beside: bool = False) -> Kernel:
        """A GEMM kernel whose tiles load the token-sharded operands ``ops`` from their
        owners through ``access`` (kernels/remote_gemm.py); a plain GEMM without any.
        ``keep``: the tiles also write the rows they load to the gathered tensor's local
        copy (a later GEMM reads it there); ``beside``: it runs beside other work (a
        side stream), which a copy strategy may weigh (kernels/remote_copy.py)."""
        if not ops:
            return self.gemm_kernel(g, gemm, sm_set)
        sms = len(sm_set) if sm_set else self.sms
        shape = self.shape(gemm, sms)
        mem = self._memory(g)
        if RemoteReuse.of(self.m.cfg, [op.which for op in ops]).copies:
            # the remote rows copied into the local gathered tensor by a copy stage, and a
            # local GEMM whose tiles wait for them (kernels/remote_copy.py); ``keep`` holds
            return remote_copy.copy_gemm(self.m, self.cm, g, gemm, shape, self.gemm_floor_ps(gemm, shape, sms),
                                         self.model.dtype_bytes, ops, access, sm_set,
                                         mem if mem.functional else None, self.plans,
                                         lambda s, n: self.gemm_floor_ps(gemm, s, n), beside)
        return remote_gemm.load_gemm(self.m, self.cm, g, gemm, shape, self.gemm_floor_ps(gemm, shape, sms),
                                     self.model.dtype_bytes, ops, access, sm_set, mem if mem.functional else None,
                                     self.plans, keep)

    def fused_kernels(self, c: Chain, path: FusedPath) -> tuple[list[Kernel], list[Countdown]]:
        """Chain ``c``'s persistent fused GEMM1 + RS + row-wise + AG kernel per GPU,
        moving data along ``path`` (kernels/fused_workers.py), and per GPU the signal
        that its ``gather_dst`` is complete."""
        shape = self.shape(c.gemm1)
        rw = RowWise(self.model.norm, self.p_drop, self.model.dtype_bytes, self.sms)
        return fused_workers.fused_kernels(self.m, self.cm, c, self.d, shape,
                                           self.gemm_floor_ps(c.gemm1, shape, self.sms), rw, path)

    def rowop_kernel(self, g: int, op: RowOp, sm_set: frozenset[int] | None = None,
                     rows: Sequence[tuple[int, int]] | None = None) -> Kernel:
        """The fused dropout + residual + norm kernel (or its backward) over this GPU's
        rows (or the given row blocks): kernels/rowop.py; a kernel of its own, so in
        decode under the graph and eager launches it has the small-kernel floor."""
        small = round(self.m.cfg.gpu.small_kernel_us * 1_000_000) if self.decode_small else 0
        return rowop.rowop_kernel(self.cm, self._memory(g), op, self.model.dtype_bytes, self.model.norm,
                                  self.p_drop, self.row_offset(g), self.sms, sm_set, rows, small)

    def signalled_rowop_kernel(self, g: int, op: RowOp, blocks: Sequence[tuple[int, int]], expected: Sequence[int],
                               keys: Sequence[int], flags: Sequence[int],
                               ready: Sequence[dict[tuple[int, int], Countdown]], sm_set: frozenset[int]) -> Kernel:
        """The row-wise op as row-block TBs that wait for their rows' signal word and
        multicast a ready flag (kernels/rowop.py)."""
        return rowop.signalled_rowop_kernel(self.m, self.cm, g, self._memory(g), op, self.model.dtype_bytes,
                                            self.model.norm, self.p_drop, self.row_offset(g), self.sms, blocks,
                                            expected, keys, flags, ready, sm_set)

    def rowop_work_ps(self, op: RowOp, rows: int, sms: int) -> int:
        """Row-wise kernel time without its fixed overhead (kernels/rowop.py)."""
        return rowop.rowop_work_ps(self.cm, op, self.model.dtype_bytes, rows, sms, self.sms)

    def rowop_bytes(self, op: RowOp, rows: int) -> int:
        """HBM bytes the row-wise kernel moves over ``rows`` rows (kernels/rowop.py)."""
        return rowop.rowop_bytes(op, self.model.dtype_bytes, rows)

    def row_offset(self, g: int) -> int:
        """Global index of this GPU's first row of the row-wise ops."""
        return rowop.row_offset(self.d, g)

    def rowop_apply(self, g: int, op: RowOp, r0: int, nr: int) -> None:
        """Rows [r0, r0 + nr) of the row-wise op on GPU ``g``'s memory (kernels/rowop.py)."""
        rowop.rowop_apply(self._memory(g), op, r0, nr, self.model.norm, self.p_drop, self.row_offset(g))

    def local_kernel(self, g: int, local: Local, sm_set: frozenset[int] | None = None) -> tuple[Kernel, int]:
        """(kernel, its fixed overhead) for attention, activations and their backwards
        (kernels/attention.py, kernels/activation.py), and a MoE period's MLA attention and
        latent norms (kernels/mla.py, the period's ``mla`` widths)."""
        mem = self._memory(g)
        gpu = self.m.cfg.gpu
        small = self.decode_small
        floor = (round(gpu.attn_decode_floor_us * 1_000_000), gpu.attn_decode_bw_fraction) if small else None
        if local.kind in attention.KINDS:
            return attention.attention_kernel(self.cm, mem, local.name, local.kind, self.d, self.period.mode,
                                              self.sms, sm_set, floor)
        if local.kind in mla.KINDS or local.kind in mla.NORM_KINDS:
            dims = self.period.mla
            if dims is None:
                raise ValueError(f"segment {local.name}: an MLA kernel ({local.kind}) in a period without MLA widths")
            if local.kind in mla.KINDS:
                return mla.mla_attention_kernel(self.cm, local.name, local.kind, self.d, dims, self.period.mode,
                                                self.sms, sm_set, floor)
            if small:  # a small kernel of the decode step, as its rotary and KV write
                nbytes = mla.latent_norm_bytes(local.kind, self.d.tokens, dims)
                return self.small_kernel(local.name, nbytes), self.cm_mem_overhead_ps
            return mla.latent_norm_kernel(self.cm, local.name, local.kind, self.d.tokens, dims, self.sms, sm_set)
        return activation.activation_kernel(self.cm, mem, local.name, local.kind, self.d, self.sms, sm_set,
                                            round(gpu.small_kernel_us * 1_000_000) if small else 0)

    @property
    def decode_small(self) -> bool:
        """Whether the decode step's small kernels are timed from their sourced floors:
        decode under the graph or eager launch (docs/compute-model.md, "The decode
        step"); the fitted launch keeps its fitted per-kernel overheads."""
        return self.period.mode == "decode" and self.m.cfg.gpu.launch != "fitted"

    def small_kernel(self, name: str, nbytes: int) -> Kernel:
        """A small memory-bound kernel of the decode step (rotary, the KV-cache write):
        ``gpu.small_kernel_us`` plus ``nbytes`` at the calibrated HBM rate, on every SM.
        It moves no data in functional mode (the cache already holds the new K, V)."""
        from cais.kernels.local import even_kernel

        work = round(self.m.cfg.gpu.small_kernel_us * 1_000_000) + max(
            0, self.cm.memory_time_ps(nbytes, self.sms, self.sms) - self.cm_mem_overhead_ps)
        tbs = max(1, min(self.sms, -(-nbytes // (16 * 1024))))
        return even_kernel(name, work, tbs, self.sms, None, hbm_bytes=nbytes)

    def decode_prologue(self, g: int) -> list[Kernel]:
        """The decode step's kernels between the QKV GEMM and attention, as vLLM runs them:
        rotary on the new token's Q and K (read and written), then the new K and V written
        into the paged KV cache (read and written). Timing MLA (the period's ``mla``):
        rotary on the query's RoPE part (heads x rope) and the shared RoPE key (rope), then
        the latent (kv_lora + rope) written into the cache, as SGLang's absorbed decode
        (``forward_absorb_prepare``, then the backend's ``set_kv_buffer``)."""
        d, eb, lat = self.d, self.model.dtype_bytes, self.period.mla
        if lat is not None:
            qk = d.batch * (lat.heads_l + 1) * lat.rope * eb
            kv = d.batch * lat.latent * eb
        else:
            qk = d.batch * (d.heads_l + d.kv_l) * d.head_dim * eb
            kv = d.batch * 2 * d.kv_l * d.head_dim * eb
        return [self.small_kernel("rotary", 2 * qk), self.small_kernel("kv_write", 2 * kv)]

    def decode_epilogue(self, g: int) -> list[Kernel]:
        """The decode step's kernels between attention and the output projection that a
        stack adds (``decode.stack``): vLLM 0.6's FlashAttention backend writes the
        decode attention's output into a tensor of its own and copies it into the
        layer's (``output[num_prefill_tokens:] = flash_attn_with_kvcache(...)``,
        vllm/attention/backends/flash_attn.py at v0.6.1), read and written; none
        otherwise (today's backends pass the layer's tensor as the kernel's output)."""
        if self.m.cfg.decode.stack != "vllm-0.6":
            return []
        d, eb, lat = self.d, self.model.dtype_bytes, self.period.mla
        width = d.q_l if lat is None else lat.o_latent  # timing MLA: the absorbed attention's latent output
        return [self.small_kernel("attn_out_copy", 2 * d.batch * width * eb)]

    def nccl_call(self, op: str, algo: str, nbytes: int) -> tuple[str, str]:
        """(algorithm, protocol) one of the layer's NCCL collectives runs, counted in
        :attr:`choices`. ``algo`` is the scheme's: an algorithm it names (``ring``,
        ``nvls``) runs as ``NCCL_ALGO=<algo>`` would force it, in the Simple protocol,
        or with ``collective.layer_choice`` = nccl in NCCL's protocol by size for that
        algorithm (NVLS has Simple only); :data:`NCCL_CHOICE` (the ``*-nccl``
        schemes, a production kernel's fallback) runs NCCL's own algorithm and
        protocol by size whatever ``layer_choice`` says (kernels/tuning.py)."""
        c = self.m.cfg
        if algo == NCCL_CHOICE:
            pick = choose_for(c, op, nbytes)
            algo, protocol = pick.algo, pick.protocol
        elif c.collective.layer_choice == "nccl" and algo in ALGOS:
            protocol = choose_for(c, op, nbytes, algo=algo).protocol
        else:
            protocol = "simple"
        self.choices[(algo, protocol)] = self.choices.get((algo, protocol), 0) + 1
        return algo, protocol

    def staged(self, asked: str) -> bool:
        """Whether an NVLS AllReduce of a collective the scheme asked to run with
        ``asked`` goes through NCCL's own staging buffers (``collective.nvls_buffers``
        = staged): where NCCL runs the layer's calls as a real one would
        (``layer_choice`` = nccl, or the scheme asks for NCCL's choice); the
        schemes' own NVLS calls otherwise stay zero-copy (the paper's assumption)."""
        c = self.m.cfg.collective
        return c.nvls_buffers == "staged" and (c.layer_choice == "nccl" or asked == NCCL_CHOICE)

    def collective(self, op: str, algo: str, src: str, dst: str, channels: int | None = None,
                   sm_sets: Sequence[frozenset[int] | None] | None = None,
                   rows: tuple[int, int] | None = None) -> list[Kernel]:
        """One kernel per GPU for a collective over token rows of width ``hidden``:
        all of them, or (``rows`` = (first, count) inside each GPU's shard) one chunk
        of every GPU's shard. ``algo``: the scheme's (:meth:`nccl_call`); what ran is
        :attr:`last_algo`."""
        h = self.d.hidden
        self.collectives += 1
        stage = f"stage{self.collectives}"  # ring staging slots, one set per collective
        count = self.d.tokens * h if rows is None else self.m.n * rows[1] * h
        asked = algo
        algo, protocol = self.nccl_call(op, algo, count * self.model.dtype_bytes)
        self.last_algo = algo
        staged = self.staged(asked)
        if rows is None:
            spec = CollectiveSpec(op, algo, count, self.model.dtype_bytes, src, dst, stage, channels,
                                  stream=self.collectives, protocol=protocol, staged=staged)
        else:
            first, cnt = rows
            spec = CollectiveSpec(op, algo, count, self.model.dtype_bytes, src, dst, stage,
                                  channels, stream=self.collectives, full_base=first * h,
                                  full_stride=self.d.rows_l * h, shard_base=first * h, protocol=protocol,
                                  staged=staged)
        kernels = build(self.m, spec)
        for k, sms in zip(kernels, sm_sets or []):
            k.sms = sms
        return kernels

    def copy_kernel(self, g: int, nbytes: int, name: str = "copy") -> Kernel:
        """A device-to-device copy of ``nbytes`` on GPU ``g`` as a kernel of its own (a
        stack's copy into or out of a registered buffer): the calibrated memory-bound
        time of reading and writing them on every SM, without the fitted fixed overhead
        (the caller charges it as the launch). It moves no data: the copy is the identity
        on the values the next kernel reads, so it is timed and left out of the data."""
        from cais.kernels.local import even_kernel

        work = max(0, self.cm.memory_time_ps(2 * nbytes, self.sms, self.sms) - self.cm_mem_overhead_ps)
        tbs = max(1, min(self.sms, -(-nbytes // (32 * 1024))))
        return even_kernel(name, work, tbs, self.sms, None, hbm_bytes=2 * nbytes)

    def production_allreduce(self, spec: ProductionAr) -> list[Kernel]:
        """One kernel per GPU for a production all-reduce (kernels/production_ar.py)
        over the layer's token rows; counted in :attr:`choices` under its family and
        path (``custom-oneshot``, ...), beside NCCL's choices."""
        self.collectives += 1
        key = (spec.name.removesuffix("-allreduce"), "simple")
        self.choices[key] = self.choices.get(key, 0) + 1
        return production_kernels(self.m, replace(spec, stream=self.collectives,
                                                  staging=f"{spec.staging}{self.collectives}"))


#: the forward attention kernels' kinds (the dense path's, MLA's): the decode prologue and epilogue go around them
FORWARD_ATTENTION = (attention.KINDS[0], mla.KINDS[0])

#: the methods through which a scheme runs a period besides :meth:`Scheme.allreduce`, and
#: the settings it runs them with (what :meth:`Scheme.same_run_as` compares)
_PERIOD_METHODS = ("run", "local", "local_gemm", "collective_step", "gather", "chain")
_RUN_SETTINGS = ("sp", "algo", "switch", "vc_policy", "vc_policies", "wgrad_inputs", "wgrad_grads", "loads_remote")


class Scheme:
    """A way of running tensor-parallel layers: a name, whether activations are
    sequence-parallel between GEMMs, and how each segment of the period runs. This
    base runs everything bulk-synchronously with NVLS collectives."""

    name = ""  # set by concrete schemes
    sp = True
    algo = "nvls"
    summary = ""
    switch = "nvls"  # the switch model it needs when the system's is "auto" (cais: with merge units)
    #: the modes it is designed for, and why where not all (an inference stack has no training)
    modes: tuple[str, ...] = ("train", "prefill", "decode")
    modes_why = ""
    vc_policy: str | None = None  # a VC policy the scheme is defined with (None: the system's)
    vc_policies: tuple[str, ...] | None = None  # the system's VC policies it runs with (None: any)
    #: "baseline" (a system the paper compares, or plain Megatron), "ablation" (a variant of another
    #: scheme), "production" (a kernel production TP stacks run; the production experiment runs them)
    family: str = "baseline"
    #: how the backward feeds a weight gradient its gathered operands where the system
    #: says ``scheme`` (``train.wgrad_inputs``, ``train.wgrad_grads``): the forward inputs
    #: fetched again beside the dgrad sub-layer and the dgrad's gathered gradients kept,
    #: as Megatron-LM's linear layers do with sequence parallelism (docs/schemes.md)
    wgrad_inputs = "refetch-overlap"
    wgrad_grads = "keep"
    #: whether its weight-gradient GEMMs load token-sharded rows from their owners
    #: themselves (remote-load schemes: LADM, CAIS) rather than from a gathered copy
    loads_remote = False

    #: the scheme a production all-reduce kernel's period runs as where it hands every
    #: AllReduce to NCCL (:meth:`same_run_as`)
    NCCL_RUN = "tp-nccl"

    def hands_to_nccl(self, n: int, nbytes: int) -> bool:
        """Whether this scheme's :meth:`allreduce` of ``nbytes`` on ``n`` GPUs is NCCL's
        (:meth:`collective_step`): always, but for a production kernel, which says at
        which sizes its source runs it instead (the one rule its :meth:`allreduce`
        and :meth:`same_run_as` both read)."""
        return True

    def same_run_as(self, model: ModelSpec, n: int, mode: str) -> str:
        """The scheme whose simulation of ``model``'s period in ``mode`` on ``n`` GPUs
        is this scheme's, event for event: its own name, unless it hands every
        AllReduce of that period to NCCL (:meth:`hands_to_nccl`) and runs the rest of
        it with :attr:`NCCL_RUN`'s code and settings (no other method of the period
        overridden; the same sequence parallelism, fallback algorithm, switch model
        and VC policy): then that scheme's name. A sweep runs such a pair once
        (``cais.reproduce.points.same_run``)."""
        from cais.schemes import get_scheme

        nccl = get_scheme(self.NCCL_RUN)
        if nccl.name == self.name or not self.hands_to_nccl(n, allreduce_bytes(model, n, mode, self.sp)):
            return self.name
        same_code = all(getattr(type(self), m) is getattr(type(nccl), m) for m in _PERIOD_METHODS)
        same_settings = all(getattr(self, a) == getattr(nccl, a) for a in _RUN_SETTINGS)
        return nccl.name if same_code and same_settings else self.name

    @property
    def in_demo(self) -> bool:
        """Whether ``cais demo`` runs it: the baselines and CAIS, not ablations or production kernels."""
        return self.family == "baseline"

    def switch_model(self, configured: str) -> str:
        """The switch model this scheme runs on, given the system's ``switch.model``
        (``configured``): ``auto`` becomes the one it needs (:attr:`switch`); any model
        that has what that one has (its class or a subclass: a CAIS switch also does
        NVLS) is kept. A model without it (an NVLS-only switch under a CAIS scheme,
        whose ld.cais/red.cais need merge units) is a :class:`SwitchMismatch` naming
        ``switch.model`` and the values allowed with this scheme."""
        from cais.hw.switches import SWITCH_MODELS, switch_model

        if configured == "auto":
            return self.switch
        needed = switch_model(self.switch)
        if issubclass(switch_model(configured), needed):
            return configured
        allowed = ["auto", *(name for name, cls in SWITCH_MODELS.items() if issubclass(cls, needed))]
        raise SwitchMismatch(f"switch.model: scheme '{self.name}' needs a '{self.switch}' switch ({needed.has}); "
                             f"'{configured}' has {switch_model(configured).has} only; allowed with this scheme: "
                             f"{', '.join(allowed)}")

    def vc_policy_for(self, configured: str) -> str:
        """The VC policy this scheme runs with, given the system's ``link.vc_policy``:
        the one it is defined with, else the system's where the scheme allows it; one
        it does not allow is a :class:`VcMismatch` naming ``link.vc_policy``."""
        if self.vc_policy is not None:
            return self.vc_policy
        if self.vc_policies is not None and configured not in self.vc_policies:
            raise VcMismatch(f"link.vc_policy: scheme '{self.name}' keeps loads and reductions on separate VCs (its "
                             f"traffic control); '{configured}' puts them on one, which is another scheme's "
                             f"(cais-partial); allowed with this scheme: {', '.join(self.vc_policies)}")
        return configured

    def wgrad_plan(self, train: TrainConfig) -> WgradPlan:
        """The weight gradients' backward dataflow this scheme runs under ``train``
        (``scheme``: its own); one it cannot run is a :class:`WgradMismatch`: a
        scheme whose gradients a collective gathers keeps that copy, and its weight
        gradients run in stream order (only a re-gather runs beside the dgrad)."""
        inputs = self.wgrad_inputs if train.wgrad_inputs == "scheme" else train.wgrad_inputs
        grads = self.wgrad_grads if train.wgrad_grads == "scheme" else train.wgrad_grads
        if not self.loads_remote:
            for field_, got, allowed in (("wgrad_inputs", inputs, ("keep", "refetch", "refetch-overlap")),
                                         ("wgrad_grads", grads, ("keep",))):
                if got not in allowed:
                    raise WgradMismatch(
                        f"train.{field_}: scheme '{self.name}' gathers with collectives and runs its weight "
                        f"gradients in stream order after the dgrad's gathered copy; '{got}' needs a scheme whose "
                        f"GEMMs load remote rows; allowed with this scheme: scheme, {', '.join(allowed)}")
        return WgradPlan(inputs, grads)

    def period_wgrad_plan(self, r: LayerRun) -> WgradPlan:
        """:meth:`wgrad_plan` for a training period; a period without weight
        gradients (prefill, decode) runs the scheme's own, whatever ``train`` says."""
        if r.period.mode == "train":
            return self.wgrad_plan(r.m.cfg.train)
        return WgradPlan(self.wgrad_inputs, self.wgrad_grads)

    def run(self, r: LayerRun) -> None:
        """The period's segments in program order, each after the one before it, but
        for the weight gradients' gathered operands (:meth:`wgrad_plan`): a kept copy
        skips the re-gather, ``refetch-overlap`` starts it beside the dgrad sub-layer
        before it, and :meth:`wgrad` places the weight gradient."""
        plan = self.period_wgrad_plan(r)
        ready: Deps = [Signal() for _ in range(r.m.n)]
        for s in ready:
            s.fire(r.m.sim)
        before = ready  # what the last sub-layer started after
        fetched: dict[str, Deps] = {}  # gathered tensor -> its re-gather done, where it runs beside
        for seg in r.period.segments:
            if isinstance(seg, Chain):
                before = ready
                ready = self.chain(r, seg, ready)
            elif isinstance(seg, Gather):
                if plan.inputs == "refetch-overlap" and not self.loads_remote:
                    fetched[seg.dst] = self.gather(r, seg.name, seg.src, seg.dst, before)
                elif plan.inputs == "refetch":  # (a remote-load scheme's is its wgrad's own loads)
                    ready = self.gather(r, seg.name, seg.src, seg.dst, ready)
            elif seg.gemm is not None and seg.gemm.role == "wgrad":
                ready = self.wgrad(r, seg, ready, before, fetched, plan)
            else:
                ready = self.local(r, seg, ready)

    def wgrad(self, r: LayerRun, seg: Local, deps: Deps, before: Deps, fetched: dict[str, Deps],
              plan: WgradPlan) -> Deps:
        """A weight-gradient GEMM after ``deps`` (and the re-gather of its operand where
        that ran beside the sub-layer, ``fetched``); ``before``: what that sub-layer
        started after. Here a local GEMM over gathered copies."""
        gemm = seg.gemm
        assert gemm is not None
        mine = [fetched[t] for t in (gemm.ops.a, gemm.ops.b) if t in fetched]
        if mine:
            deps = [all_of(r.m.sim, [deps[g], *(f[g] for f in mine)]) for g in range(r.m.n)]
        return self.local(r, seg, deps)

    # ---- building blocks, bulk synchronous ---------------------------------------
    def local(self, r: LayerRun, seg: Local, deps: Deps) -> Deps:
        out = []
        fwd_attention = seg.kind in FORWARD_ATTENTION
        if fwd_attention and r.decode_small:  # rotary and the KV-cache write first
            deps = list(deps)
            for g in range(r.m.n):
                for k in r.decode_prologue(g):
                    deps[g] = r.submit(g, k, [deps[g]], r.cm_mem_overhead_ps, seg.name)
        for g in range(r.m.n):
            if seg.gemm is not None:
                k, over = self.local_gemm(r, g, seg.gemm), r.cm.kernel_overhead_ps
            else:
                k, over = r.local_kernel(g, seg)
            done = r.submit(g, k, [deps[g]], over, seg.name)
            if fwd_attention and r.decode_small:  # a stack's copy of the output after it
                for k in r.decode_epilogue(g):
                    done = r.submit(g, k, [done], r.cm_mem_overhead_ps, seg.name)
            out.append(done)
        return out

    def local_gemm(self, r: LayerRun, g: int, gemm: Gemm) -> Kernel:
        """The kernel of a GEMM outside a sub-layer (a weight gradient) on GPU ``g``:
        a plain tiled GEMM over local operands."""
        return r.gemm_kernel(g, gemm)

    def collective_step(self, r: LayerRun, op: str, src: str, dst: str, deps: Deps, segment: str,
                        sm_sets: Sequence[frozenset[int] | None] | None = None, rows: tuple[int, int] | None = None,
                        channels: int | None = None, launch: int | None = None, algo: str | None = None) -> Deps:
        """A collective after ``deps`` on every GPU. NVLS kernels start and end with a
        barrier over all GPUs (as NCCL's do: a GPU may not pull or push replicas its
        peers have not produced, or use data its peers have not sent), on the wire."""
        kernels = r.collective(op, algo or self.algo, src, dst, channels, sm_sets, rows)
        launch = r.m.launch_ps if launch is None else launch
        if algorithm(r.last_algo).barriers:
            start = r.barrier(deps, f"{segment} {op} start")
            done = [r.submit(g, k, [start[g]], launch, segment) for g, k in enumerate(kernels)]
            return r.barrier(done, f"{segment} {op} end")
        return [r.submit(g, k, [deps[g]], launch, segment) for g, k in enumerate(kernels)]

    def allreduce(self, r: LayerRun, src: str, dst: str, deps: Deps, segment: str) -> Deps:
        """The AllReduce of a sub-layer's partial sums without sequence parallelism
        (basic TP): the scheme's NCCL collective (:meth:`collective_step`). The seam
        for a scheme that runs another all-reduce kernel there (tp-custom-ar,
        tp-multimem)."""
        return self.collective_step(r, "allreduce", src, dst, deps, segment)

    def gather(self, r: LayerRun, name: str, src: str, dst: str, deps: Deps) -> Deps:
        return self.collective_step(r, "allgather", src, dst, deps, name)

    def chain(self, r: LayerRun, c: Chain, deps: Deps) -> Deps:
        """GEMM -> RS (AR without SP) -> row-wise -> AG -> GEMM, each a kernel."""
        n, over = r.m.n, r.cm.kernel_overhead_ps
        g1 = [r.submit(g, r.gemm_kernel(g, c.gemm1), [deps[g]], over, c.name) for g in range(n)]
        if r.d.sp:
            red = self.collective_step(r, "reducescatter", c.gemm1.ops.c, c.reduced, g1, c.name)
        else:
            red = self.allreduce(r, c.gemm1.ops.c, c.reduced, g1, c.name)
        mem_over = r.cm_mem_overhead_ps
        rows = [r.submit(g, r.rowop_kernel(g, c.rowop), [red[g]], mem_over, c.name) for g in range(n)]
        if r.d.sp and c.gather_dst != c.gather_src:  # (a MoE layer's router reads the shard itself)
            rows = self.collective_step(r, "allgather", c.gather_src, c.gather_dst, rows, c.name)
        return [r.submit(g, r.gemm_kernel(g, c.gemm2), [rows[g]], over, c.name) for g in range(n)]


def allreduce_bytes(model: ModelSpec, n: int, mode: str, sp: bool = False) -> int:
    """Bytes of each AllReduce of ``model``'s period in ``mode`` on ``n`` GPUs without
    sequence parallelism: the sub-layer's partial sums over its token rows (every
    AllReduce of a period has this size)."""
    d = dims_for(model, n, mode, sp)
    return d.tokens * d.hidden * model.dtype_bytes
