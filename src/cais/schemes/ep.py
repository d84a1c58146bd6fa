"""Expert-parallel (EP) schemes: a MoE layer's period (cais.workload.moe_dataflow) with
its dispatch and combine run by one EP kernel of the registry
(:data:`cais.kernels.ep_registry.EP_KERNELS`), one scheme ``ep-<kernel>`` per entry:
``ep-nccl`` (Megatron-Core's all-to-all dispatcher), ``ep-allgather`` (its all-gather
dispatcher), ``ep-deepep`` and ``ep-deepep-ll`` (DeepEP's normal and low-latency
kernels), and any kernel added to the registry later, without a change here.

Mechanism: bulk synchronous as the dense baselines (every kernel after the one before
it on each GPU), with the dense path's kernels for attention, the GEMMs, the row-wise
ops and (attention under TP) NCCL's ReduceScatter / AllGather by size; the router's
top-k and the permutes as memory-bound kernels; the experts' grouped GEMMs
(kernels/grouped_gemm.py) over the rows the period's routing gives each GPU; the EP
kernel's dispatch and combine, the forward dispatch with the host's wait for the
receive counts. A fused kernel of the in-switch family (``ep-switch``: token-centric
fusion, kernels/ep_switch.py) runs each dispatch, the experts' GEMMs and activation
after it and the combine that closes them as one kernel per GPU (``layer_kernels``), per
block of tokens; in training the data-gradient chain (the combine's backward, the GEMMs'
data gradients and the activation's backward, the dispatch's backward) likewise, with
the experts' weight-gradient GEMMs after it as their own kernels. Where the kernel's
stacks overlap the shared experts with the dispatch
(``SHARED_OVERLAP``), the shared experts run on a side stream on the SMs the EP kernel
leaves, and the step after the dispatch waits for them (the experts' grouped GEMMs run
after both, as the stacks order them); elsewhere in program order.

Expert TP > 1 (the period's ``expert_tp``; cais.workload.moe_dataflow): the routing is
over the GPUs' (expert, expert-TP slot) pairs, in the form the kernel's stack sends
them (its ``EXPERT_TP``, cais.kernels.ep_registry). ``group`` (``nccl``: Megatron-Core's
all-to-all dispatcher): the all-to-all stays among the EP ranks of one slot, and the
expert-TP steps are NCCL's ring AllGather / ReduceScatter (kernels/collectives.py,
one ring per expert-TP group, all at once; NCCL's protocol by size for a ring of
``expert_tp``; the simulator's NVLS kernels span every GPU, so not NVLS) over the rows
the group's GPUs received, every shard the largest any GPU received (Megatron passes
the uneven split sizes; the padding is this model's); the experts' GEMMs take the
group's rows. ``all`` (``allgather``, ``deepep``: Megatron-Core's all-gather and flex
dispatchers): the exchange itself carries a token's rows to every slot and its combine
adds the partial sums, so the expert-TP steps run nothing. Other kernels refuse
expert TP > 1 (a UserError naming ``expert_tp``).

Attention TP groups smaller than the GPUs (the period's ``attention_tp``, 1 < N < GPUs;
cais.workload.moe_dataflow): the attention's ReduceScatter and AllGather run within each
group of N consecutive GPUs, all groups at once, as NCCL's ring over the group's GPUs
(kernels/collectives.py ``groups``) in NCCL's protocol by size for a ring of N: the
simulator's NVLS kernels multicast over every GPU, and no NVLS kernel over a subset
exists here (NCCL itself would pick NVLS by size for a group's communicator where the
switch allows it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from cais.engine import Signal, all_of
from cais.errors import UserError
from cais.hw.gpu import Kernel
from cais.kernels.activation import rows_activation_kernel
from cais.kernels.ep_common import EpCall
from cais.kernels.collectives import CollectiveSpec, build
from cais.kernels.ep_registry import EP_KERNELS, EpKernels, expert_tp_form, permute_place, shared_overlap, switch_of
from cais.kernels.grouped_gemm import (GroupedGemm, grouped_bytes, grouped_gemm_ps, grouped_kernel,
                                       kgrouped_gemm_ps)
from cais.kernels.tuning import choose
from cais.schemes.base import NCCL_CHOICE, Deps, LayerRun, Scheme
from cais.workload.graph import Chain, Gather, Local, MoeStep, Reduce, Segment
from cais.workload.routing import Routing


class EpScheme(Scheme):
    """A MoE layer with attention as the dense path runs it and its experts behind an EP
    kernel of the registry (:attr:`kernel`), bulk synchronous (module doc)."""

    kernel = ""  # its EP_KERNELS name
    family = "moe"
    sp = True
    algo = NCCL_CHOICE
    modes_why = ""
    summary = "MoE layer: attention as the dense path, experts behind an EP kernel"

    @property
    def module(self) -> EpKernels:
        return EP_KERNELS[self.kernel]

    @property
    def overlaps_shared(self) -> bool:
        return shared_overlap(self.module)

    def run(self, r: LayerRun) -> None:
        rt = r.period.routing
        if rt is None:
            raise UserError(f"scheme: '{self.name}' runs MoE layers; {r.model.name} is dense (use a dense scheme, "
                            "see 'cais schemes')")
        tp = r.period.expert_tp
        counts = _received(rt, tp if expert_tp_form(self.module, tp, self.kernel) == "group" else 1)
        sim, n = r.m.sim, r.m.n
        ready: Deps = [Signal() for _ in range(n)]
        for s in ready:
            s.fire(sim)
        side: list[Segment] = []  # shared-expert steps waiting for the next dispatch to overlap with
        side_done: Deps | None = None
        segments = list(r.period.segments)
        i = 0
        while i < len(segments):
            seg = segments[i]
            i += 1
            if getattr(seg, "side", False) and self.overlaps_shared:
                side.append(seg)
                continue
            if isinstance(seg, MoeStep) and seg.kind == "exchange":
                block = self._fused_block(segments, i) if self.fuses and seg.kernel == "dispatch" else None
                after: list[MoeStep] = []
                if block is None:
                    kernels = self._exchange_kernels(r, seg, rt)
                else:
                    inner, after, i = block
                    kernels = self._fused_kernels(r, seg, rt, inner)
                if side:
                    side_done = self._side(r, side, ready, kernels, counts)
                    side = []
                name = seg.name if block is None else fused_name(seg.name, segments[i - 1].name)
                ready = [r.submit(g, k, [ready[g]], r.m.launch_ps, name) for g, k in enumerate(kernels)]
                for step in after:  # the weight gradients, after the fused data-gradient chain
                    ready = self.step(r, step, ready, counts)
                continue
            if side_done is not None:  # the step after the dispatch waits for the shared experts too
                ready = [all_of(sim, [ready[g], side_done[g]]) for g in range(n)]
                side_done = None
            ready = self.step(r, seg, ready, counts)

    # ---- one segment ---------------------------------------------------------------
    def step(self, r: LayerRun, seg: Segment, deps: Deps, counts: np.ndarray,
             sm_set: frozenset[int] | None = None) -> Deps:
        """``seg`` on every GPU after ``deps`` (on ``sm_set``, a side stream's SMs)."""
        n = r.m.n
        if isinstance(seg, Chain):
            return self.chain(r, seg, deps)
        if isinstance(seg, Gather):
            return self.collective_step(r, "allgather", seg.src, seg.dst, deps, seg.name)
        if isinstance(seg, Reduce):
            return self.collective_step(r, seg.op, seg.src, seg.dst, deps, seg.name)
        if isinstance(seg, Local) and seg.rowop is not None:
            return [r.submit(g, r.rowop_kernel(g, seg.rowop, sm_set), [deps[g]], r.cm_mem_overhead_ps, seg.name)
                    for g in range(n)]
        if isinstance(seg, Local) and seg.gemm is not None and sm_set is not None:
            return [r.submit(g, r.gemm_kernel(g, seg.gemm, sm_set), [deps[g]], r.cm.kernel_overhead_ps, seg.name)
                    for g in range(n)]
        if isinstance(seg, Local):
            return self.local(r, seg, deps)
        assert isinstance(seg, MoeStep)
        if seg.kind == "expert_tp":
            return self.expert_tp_step(r, seg, deps)
        out = []
        for g in range(n):
            built = self._moe_kernel(r, g, seg, counts, sm_set)
            out.append(deps[g] if built is None else r.submit(g, built[0], [deps[g]], built[1], seg.name))
        return out

    def _moe_kernel(self, r: LayerRun, g: int, seg: MoeStep, counts: np.ndarray,
                    sm_set: frozenset[int] | None) -> tuple[Kernel, int] | None:
        """(kernel, its launch delay) of a MoE step on GPU ``g``; None where the step
        has no kernel under this EP kernel (a permute it does not need)."""
        rt = r.period.routing
        assert rt is not None
        h, eb, sms = r.d.hidden, r.model.dtype_bytes, r.sms
        mine = counts[g]  # rows of each of GPU g's experts
        if seg.kind == "route":  # top-k (and softmax) over the logits; its backward alike
            rows = rt.tokens
            nbytes = rows * rt.experts * eb + rows * rt.topk * 8
            return r.copy_kernel(g, nbytes, seg.name), r.cm_mem_overhead_ps
        if seg.kind == "permute":
            rows = _permute_rows(permute_place(self.module), rt, g, int(mine.sum()))
            return (r.copy_kernel(g, rows * h * eb, seg.name), r.cm_mem_overhead_ps) if rows else None
        if seg.kind == "expert_act":
            rows = seg.m or int(mine.sum())  # the shared experts' rows are given; the routed ones routed
            return rows_activation_kernel(r.cm, seg.name, seg.kernel, rows,
                                          2 * seg.n, sms, sm_set)
        if seg.kind == "grouped_gemm":
            layout = "masked" if permute_place(self.module) == "none" else "contiguous"
            use = len(sm_set) if sm_set else sms
            if seg.role == "wgrad":
                t = kgrouped_gemm_ps(r.cm, seg.m, seg.n, mine.tolist(), use)
                nbytes = grouped_bytes(mine.tolist(), seg.m, 1) + grouped_bytes(mine.tolist(), seg.n, 1)
            else:
                dtype = r.m.cfg.moe.expert_dtype if seg.role == "fwd" else "bf16"  # FP8 in inference only
                gg = GroupedGemm(tuple(int(c) for c in mine), seg.n, seg.k, dtype, layout)
                t = grouped_gemm_ps(r.cm, gg, use)
                nbytes = grouped_bytes(gg.ms, seg.n, seg.k, dtype)
            return grouped_kernel(r.cm, seg.name, t - r.cm.kernel_overhead_ps, nbytes, sms, sm_set)
        raise ValueError(f"MoE step {seg.name}: unknown kind '{seg.kind}'")

    def expert_tp_spec(self, r: LayerRun, seg: MoeStep) -> CollectiveSpec | None:
        """The collective of expert-TP step ``seg`` (module doc): NCCL's ring over each
        expert-TP group, every shard the largest number of rows a GPU received, in
        NCCL's protocol by size for a ring of ``expert_tp``; None where the kernel's
        exchange does it (the ``all`` form) or at expert TP 1."""
        rt, tp = r.period.routing, r.period.expert_tp
        assert rt is not None
        if tp == 1 or expert_tp_form(self.module, tp, self.kernel) != "group":
            return None
        n, h, eb, c = r.m.n, r.d.hidden, r.model.dtype_bytes, r.m.cfg
        rows = max(1, int(_received(rt).sum(axis=1).max()))
        count = tp * rows * h
        pick = choose(seg.kernel, count * eb, tp, sum(c.switch.links_per_gpu), c.collective.ring_channels,
                      c.collective.nvls_channels, c.collective.tuning, "ring")
        groups = tuple(tuple(range(first, first + tp)) for first in range(0, n, tp))
        return CollectiveSpec(seg.kernel, "ring", count, eb, f"{seg.name}.in", f"{seg.name}.out",
                              protocol=pick.protocol, groups=groups)

    def expert_tp_step(self, r: LayerRun, seg: MoeStep, deps: Deps) -> Deps:
        """Expert-TP step ``seg`` on every GPU after ``deps``: its ring collectives
        (:meth:`expert_tp_spec`; counted in the run's choices), or nothing."""
        spec = self.expert_tp_spec(r, seg)
        if spec is None:
            return deps
        r.collectives += 1
        r.choices[("ring", spec.protocol)] = r.choices.get(("ring", spec.protocol), 0) + 1
        spec = replace(spec, staging=f"stage{r.collectives}", stream=r.collectives)
        return [r.submit(g, k, [deps[g]], r.m.launch_ps, seg.name) for g, k in enumerate(build(r.m, spec))]

    def collective_step(self, r: LayerRun, op: str, src: str, dst: str, deps: Deps, segment: str,
                        sm_sets: Sequence[frozenset[int] | None] | None = None, rows: tuple[int, int] | None = None,
                        channels: int | None = None, launch: int | None = None, algo: str | None = None) -> Deps:
        """The attention's collective after ``deps``: within each attention group where
        the groups are smaller than the GPUs (:meth:`attention_group_spec`), else over
        every GPU as the dense path runs it."""
        spec = self.attention_group_spec(r, op, src, dst)
        if spec is None:
            return super().collective_step(r, op, src, dst, deps, segment, sm_sets, rows, channels, launch, algo)
        r.collectives += 1
        r.choices[("ring", spec.protocol)] = r.choices.get(("ring", spec.protocol), 0) + 1
        r.last_algo = "ring"
        spec = replace(spec, staging=f"stage{r.collectives}", stream=r.collectives)
        launch = r.m.launch_ps if launch is None else launch
        return [r.submit(g, k, [deps[g]], launch, segment) for g, k in enumerate(build(r.m, spec))]

    def attention_group_spec(self, r: LayerRun, op: str, src: str, dst: str) -> CollectiveSpec | None:
        """The attention collective ``op`` (ReduceScatter or AllGather of the group's
        token rows) as NCCL's ring within each attention group of ``attention_tp``
        consecutive GPUs, in NCCL's protocol by size for a ring of that many (module
        doc); None where the group is every GPU (or one: data parallel, no collective)."""
        tp, n = r.period.attention_tp, r.m.n
        if tp is None or not 1 < tp < n:
            return None
        c, eb = r.m.cfg, r.model.dtype_bytes
        count = r.d.tokens * r.d.hidden  # one group's buffer: its token rows
        pick = choose(op, count * eb, tp, sum(c.switch.links_per_gpu), c.collective.ring_channels,
                      c.collective.nvls_channels, c.collective.tuning, "ring")
        groups = tuple(tuple(range(first, first + tp)) for first in range(0, n, tp))
        return CollectiveSpec(op, "ring", count, eb, src, dst, protocol=pick.protocol, groups=groups)

    def exchange_call(self, r: LayerRun, seg: MoeStep, rt: Routing) -> EpCall:
        """The EP call of exchange step ``seg``: ``hidden``-wide rows, the forward
        dispatch in the run's ``moe.dispatch_dtype`` (BF16 or FP8 with its scales; a
        kernel that does not take it was refused before the run) and waiting for the
        receive counts on the host; every other exchange (the combine, the backward's)
        BF16."""
        tp = r.period.expert_tp
        comm = r.m.n // tp if tp > 1 and expert_tp_form(self.module, tp, self.kernel) == "group" else None
        forward = seg.name == "dispatch"
        dtype = r.m.cfg.moe.dispatch_dtype if forward else "bf16"
        return EpCall(seg.kernel, rt, r.d.hidden, dtype, None, host_sync=forward, comm_ranks=comm)

    def _exchange_kernels(self, r: LayerRun, seg: MoeStep, rt: Routing) -> list[Kernel]:
        """The EP kernel's dispatch or combine (:meth:`exchange_call`), one kernel per GPU."""
        call = self.exchange_call(r, seg, rt)
        kernels = self.module.kernels(r.m, call)
        if len(kernels) != r.m.n:
            raise ValueError(f"EP kernel {self.kernel}: {len(kernels)} kernels for {r.m.n} GPUs")
        return kernels

    @property
    def fuses(self) -> bool:
        """Whether the EP kernel fuses dispatch, the experts and combine (the in-switch
        family's token-centric fusion: ``fused`` and ``layer_kernels``)."""
        return bool(getattr(self.module, "fused", False)) and hasattr(self.module, "layer_kernels")

    @staticmethod
    def _fused_block(segments: Sequence[Segment], start: int) -> tuple[list[MoeStep], list[MoeStep], int] | None:
        """The steps a fused kernel takes over from the dispatch before ``segments[start]``:
        (the experts' GEMMs and activation it runs, the weight-gradient GEMMs left to run
        after it, the index after the combine that closes the block); None when anything
        else stands between the dispatch and that combine."""
        inner: list[MoeStep] = []
        after: list[MoeStep] = []
        for j in range(start, len(segments)):
            seg = segments[j]
            if not isinstance(seg, MoeStep) or seg.side:
                return None
            if seg.kind == "exchange":
                return (inner, after, j + 1) if seg.kernel == "combine" and inner else None
            if seg.kind not in ("grouped_gemm", "expert_act"):
                return None
            (after if seg.role == "wgrad" else inner).append(seg)
        return None

    def _fused_kernels(self, r: LayerRun, seg: MoeStep, rt: Routing, inner: Sequence[MoeStep]) -> list[Kernel]:
        """One fused kernel per GPU: the dispatch ``seg``, the experts' ``inner`` steps
        (two grouped GEMMs of the expert FFN's shapes: the forward's, or the data-gradient
        chain's, which has the same FLOPs; the activation, forward or backward, per block)
        and the combine after them (kernels/ep_switch.py ``layer_kernels``)."""
        from cais.kernels.ep_switch import ExpertFfn

        acts = [s for s in inner if s.kind == "expert_act"]
        act = 0.0 if not acts else (2.0 if acts[0].kernel == "act_bwd" else 1.0)
        call = self.exchange_call(r, seg, rt)  # the dispatch's: its combine runs BF16 (kernels/ep_switch.py)
        ffn = ExpertFfn(r.model.ffn_hidden, r.m.cfg.moe.expert_dtype, act)
        kernels = self.module.layer_kernels(r.m, call, ffn)  # type: ignore[attr-defined]
        if len(kernels) != r.m.n:
            raise ValueError(f"EP kernel {self.kernel}: {len(kernels)} fused kernels for {r.m.n} GPUs")
        return kernels

    def _side(self, r: LayerRun, steps: Sequence[Segment], deps: Deps, ep: Sequence[Kernel],
              counts: np.ndarray) -> Deps:
        """The shared experts' ``steps`` on a side stream beside the EP kernels ``ep``:
        the EP kernel on the last SMs (as many as its TBs), the side on the others."""
        sms = r.sms
        used = max(len(k.tbs) for k in ep)
        side_set = None
        if used < sms:
            side_set = frozenset(range(sms - used))
            for k in ep:
                k.sms = frozenset(range(sms - used, sms))
        out = deps
        for seg in steps:
            out = self.step(r, seg, out, counts, side_set)
        return out


#: what joins a fused block's segment name: ``dispatch+experts+combine``
FUSED_MARK = "+experts+"


def fused_name(dispatch: str, combine: str) -> str:
    """The segment name of a fused block from ``dispatch`` to ``combine`` (its spans and
    times are reported under it)."""
    return f"{dispatch}{FUSED_MARK}{combine}"


def _received(rt: Routing, tp: int = 1) -> np.ndarray:
    """[ranks, experts per rank]: the (token, expert) rows each rank's experts receive;
    with ``tp`` > 1, those its expert-TP group's GPUs (``tp`` consecutive ranks, each
    holding a slot of the same experts) received together: the rows after the group's
    AllGather."""
    per_expert = rt.expert_rows().sum(axis=0)
    out = per_expert.reshape(rt.ranks, rt.per_rank)
    if tp > 1:
        out = np.repeat(out.reshape(rt.ranks // tp, tp, rt.per_rank).sum(axis=1), tp, axis=0)
    return out


def _permute_rows(place: str, rt: Routing, g: int, received: int) -> int:
    """Rows GPU ``g`` moves in a permute: its own (token, expert) selections where the
    stack permutes before sending (with its padding rows under capacity ``pad``:
    Megatron-Core's ``permute(..., drop_and_pad=True)`` writes ``capacity`` rows per
    expert), the rows its experts received where after (padding included), none where
    the kernel writes the experts' layout."""
    if place == "sender":
        return int((rt.topk_idx[g] >= 0).sum()) + (int(rt.pad_rows[g].sum()) if rt.pad_rows.size else 0)
    return received if place == "receiver" else 0


def scheme_name(kernel: str) -> str:
    """The scheme of EP kernel ``kernel``: ``ep-<kernel>`` (a name that starts ``ep-`` as it is)."""
    return kernel if kernel.startswith("ep-") else f"ep-{kernel}"


def scheme_for(kernel: str) -> type[EpScheme]:
    """The EP scheme class that runs ``kernel`` of the registry."""
    cls_name = "Ep" + "".join(part.capitalize() for part in scheme_name(kernel)[3:].replace("_", "-").split("-"))
    return type(cls_name, (EpScheme,), {
        "name": scheme_name(kernel), "kernel": kernel, "__module__": __name__,
        "switch": switch_of(EP_KERNELS[kernel]),  # an in-switch kernel's switch model (cais-ep)
        "__doc__": f"A MoE layer whose dispatch and combine run the '{kernel}' EP kernel (module doc).",
        "summary": f"MoE layer: attention as the dense path, experts behind the '{kernel}' EP kernel"})


# One scheme per registered EP kernel (found by cais.schemes' discovery).
for _kernel in EP_KERNELS:
    _cls = scheme_for(_kernel)
    globals()[_cls.__name__] = _cls
