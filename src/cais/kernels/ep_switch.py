"""In-switch expert parallelism (CAIS-EP, in the spirit of DySHARP, arXiv 2605.05607,
whose abstract is all that is public; docs/moe.md, "In-switch expert parallelism", has
the design and every decision the abstract leaves open) and its ablations.

* **Dispatch as an in-switch multicast** (``st.mc.dyn``, hw/ep_switch.py): a token's row
  goes up once; the switch copies it to the ranks that hold its top-k experts, named by
  a dynamic multicast group of the sender's port (a group per distinct set of remote
  destination ranks, bound by the runtime at layout time, most copies saved first). A
  group that does not fit in the table (an overflow) sends its rows as unicast stores,
  one per rank, as DeepEP does. Tokens with one remote destination need no group.
* **Combine as an in-switch reduction** (``red.cais.dyn``: CAIS's ``red.cais`` carrying
  the access's contributor count): each rank holding some of a token's experts sums
  their weighted outputs itself (sender-side scaling, as DeepEP's normal combine gets
  them) and sends the partial to the token's rank; the merge unit of that rank's port
  sums the partials of the other ranks and writes one row down. The token's rank adds
  its own partial locally.
* **Token-centric fusion**: tokens go in blocks of ``block_tokens`` (the same token
  range on every rank); a block's dispatch, expert GEMM and combine follow each other,
  and the blocks pipeline, so block ``b``'s combine (down-link heavy without the
  reduction, up-link light with it) overlaps block ``b + 1``'s dispatch. Unfused: one
  block.

Receive layout: symmetric, as NVLS needs (``recv_x`` and ``expert_out`` hold one slot per
(source rank, token), ``src * tokens + t``, on every rank; only a rank's own tokens'
slots are written), so a multicast copy lands at the same offset on every member.

The variants (:data:`VARIANTS`): ``ep-switch`` (multicast, reduction, fused),
``ep-switch-mcast`` (multicast dispatch, unicast combine), ``ep-switch-red`` (unicast
dispatch, in-switch combine), ``ep-switch-unfused`` (both, one block) and
``ep-switch-sw``, the same dataflow on an NVLS switch with unicast stores and
reductions only (as ``cais-sw`` is to ``cais``). Each runs ``comm_sms`` SMs (default:
DeepEP's normal kernels' count), half sending the dispatch and half the combine, at the
SM copy loop's fitted rate (kernels/ep_common.py); the expert GEMM of a fused layer
runs on the GPU's other SMs (kernels/grouped_gemm.py)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from functools import partial

import numpy as np

from cais.engine import Countdown, Signal
from cais.engine.sim import ProgramGen
from cais.errors import UserError
from cais.hw.compute import ComputeModel
from cais.hw.ep_switch import EpSwitch
from cais.hw.gpu import Kernel, TbProgram
from cais.hw.memory import Region
from cais.kernels.common import Window, pause
from cais.kernels.ep_common import EpCall, alloc_rows
from cais.kernels.grouped_gemm import grouped_gemm_ps, groups_of
from cais.machine import Machine

#: M rows of the grouped GEMM's tile a fused block should fill per local expert on
#: average (DeepGEMM's BLOCK_M); fewer rows per block leave tile rows empty
TILE_ROWS = 128
#: group-binding orders: the groups that save the most copies first, or in token order
GROUP_ORDERS = ("frequent", "first")

#: bytes per element of a combine's rows (BF16, whatever the dispatch sent)
COMBINE_BYTES = 2


def combine_row_bytes(call: EpCall) -> int:
    """Bytes of one of the combine's partials (a BF16 row of ``call.hidden``), whatever
    row the dispatch sent (``call.row_bytes``: an FP8 row and its scales after an FP8
    dispatch): what the combine's transfer unit, in-flight window and byte counts are
    sized on."""
    return call.hidden * COMBINE_BYTES


@dataclass(frozen=True)
class ExpertFfn:
    """The experts' FFN a fused layer runs between dispatch and combine: SwiGLU of width
    ``ffn`` (gate/up ``[hidden, 2 ffn]``, down ``[ffn, hidden]``), operands in ``dtype``;
    ``act``: the SwiGLU's own pass over each block's rows, as a MoE layer's activation
    kernel costs it, times this factor (0: folded away, as the kernel-level ladder has
    it; 1: the forward; 2: the backward, which reads and writes twice as much)."""

    ffn: int
    dtype: str = "bf16"
    act: float = 0.0


@dataclass(frozen=True)
class EpSwitchKernel:
    """One member of the in-switch EP family (module doc): which phases use the switch
    (``mcast``: dispatch by ``st.mc.dyn``; ``reduce``: combine by ``red.cais.dyn``),
    whether it is fused (``block_tokens`` per block, else one block), the group table's
    SRAM per port (``table_bytes``; None: the merge table's), its lookup latency, and
    the order groups are bound in."""

    name: str
    mcast: bool
    reduce: bool
    fused: bool
    block_tokens: int | None = None  # None: enough for TILE_ROWS rows per expert
    table_bytes: int | None = None
    lookup_ns: float = 0.0
    group_order: str = "frequent"
    red_window_bytes: int = 0  # a combine TB's reductions in flight (0: the SM's usual bound)
    per: str = "rank"  # the routing matrix it moves: one row per (token, rank)
    #: a design this project derives (docs/moe.md), not a kernel a production stack ships
    proposed = True
    #: its dispatch stores rows as DeepEP's do, BF16 or FP8 with their scales (``st.mc.dyn``
    #: carries either); its combine reduces BF16 partials (the merge unit adds BF16)
    DISPATCH_DTYPES = ("bf16", "fp8")

    @property
    def switch(self) -> str:
        """The switch model it needs (``auto`` resolves to it)."""
        return "cais-ep" if self.mcast or self.reduce else "nvls"

    def with_(self, **changes: object) -> EpSwitchKernel:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def kernels(self, m: Machine, call: EpCall) -> list[Kernel]:
        """One kernel per GPU running ``call.op`` (dispatch or combine) alone."""
        return _build(m, call, self, None)

    def layer_kernels(self, m: Machine, call: EpCall, ffn: ExpertFfn) -> list[Kernel]:
        """One kernel per GPU running dispatch, the experts' grouped GEMM and combine
        (fused per block, or one after the other when unfused)."""
        return _build(m, call, self, ffn)

    def own_bytes(self, call: EpCall) -> int:
        """Payload bytes rank 0 sends for ``call`` (a multicast row once; the in-switch
        combine sends what the unicast one does: a partial per (token, rank))."""
        plan = Plan.of(call, self, call.routing.ranks, None)
        if call.op == "combine":  # a partial per (token of another rank, this rank)
            return int(plan.hit[1:, :, 0].sum()) * combine_row_bytes(call)
        return plan.sent_rows(0) * call.row_bytes


def recv_layout(call: EpCall) -> list[list[tuple[int, int]]]:
    """For each rank, the (source rank, token) slots dispatch fills (slot ``src *
    tokens + t`` of ``recv_x``), in slot order."""
    hit = call.routing.in_rank()
    n, T = call.routing.ranks, call.routing.tokens
    return [[(g, t) for g in range(n) for t in range(T) if hit[g, t, r]] for r in range(n)]


@dataclass
class Plan:
    """What one call moves: per sender, each token's remote destinations and its group
    (or -1: unicast), the groups bound per sender, the token blocks."""

    hit: np.ndarray
    blocks: list[tuple[int, int]]
    groups: list[dict[tuple[int, ...], int]]  # sender -> member tuple -> group tag (bound ones)
    overflow: list[int]  # sender -> groups refused

    @staticmethod
    def of(call: EpCall, k: EpSwitchKernel, n: int, capacity: int | None) -> Plan:
        rt, T = call.routing, call.routing.tokens
        hit = rt.in_rank()
        auto = -(-TILE_ROWS * rt.experts // (rt.topk * rt.ranks))
        bt = (call.chunk or k.block_tokens or auto) if k.fused else max(1, T)
        if bt <= 0:
            raise UserError(f"chunk: tokens per block must be positive, got {bt}")
        blocks = [(t0, min(bt, T - t0)) for t0 in range(0, T, bt)] or [(0, 0)]
        groups: list[dict[tuple[int, ...], int]] = [{} for _ in range(n)]
        overflow = [0] * n
        if k.mcast:
            for g in range(n):
                uses: Counter[tuple[int, ...]] = Counter()
                first: dict[tuple[int, ...], int] = {}
                for t in range(T):
                    mem = tuple(int(r) for r in np.nonzero(hit[g, t])[0] if r != g)
                    if len(mem) >= 2:
                        uses[mem] += 1
                        first.setdefault(mem, t)
                order = sorted(uses, key=lambda s: (-(uses[s] * (len(s) - 1)), first[s])) \
                    if k.group_order == "frequent" else sorted(uses, key=lambda s: first[s])
                cap = len(order) if capacity is None else capacity
                for i, s in enumerate(order):
                    if i < cap:
                        groups[g][s] = i
                    else:
                        overflow[g] += 1
        return Plan(hit, blocks, groups, overflow)

    def remote(self, g: int, t: int) -> tuple[int, ...]:
        return tuple(int(r) for r in np.nonzero(self.hit[g, t])[0] if r != g)

    def sent_rows(self, g: int) -> int:
        """Rows sender ``g`` puts on its links at dispatch (a multicast row counts once)."""
        rows = 0
        for t in range(self.hit.shape[1]):
            mem = self.remote(g, t)
            rows += 1 if mem in self.groups[g] else len(mem)
        return rows


def _build(m: Machine, call: EpCall, k: EpSwitchKernel, ffn: ExpertFfn | None) -> list[Kernel]:
    rt, n, T = call.routing, m.n, call.routing.tokens
    if rt.ranks != n:
        raise UserError(f"gpus: the routing has {rt.ranks} ranks, the system {n} GPUs")
    if k.group_order not in GROUP_ORDERS:
        raise UserError(f"group_order: unknown '{k.group_order}'; valid: {', '.join(GROUP_ORDERS)}")
    sms = call.sms or call.consts.deepep_sms
    if sms < 2 or sms % 2:
        raise UserError(f"sms: the in-switch EP kernels take an even SM count of at least 2, got {sms}")
    capacity = None
    switches = m.fabric.switches
    eps = [sw for sw in switches if isinstance(sw, EpSwitch)]
    if k.mcast:
        if len(eps) != len(switches):
            raise UserError(f"switch.model: kernel '{k.name}' needs a 'cais-ep' switch (st.mc.dyn's group tables)")
        if k.table_bytes is not None or k.lookup_ns:
            for sw in eps:
                size = k.table_bytes if k.table_bytes is not None else sw.tables[0].capacity * sw.entry_bytes
                sw.size_tables(size, round(k.lookup_ns * 1000))
        capacity = min(sw.tables[0].capacity for sw in eps)
    if k.reduce and not all(hasattr(sw, "units") and sw.units for sw in switches):
        raise UserError(f"switch.model: kernel '{k.name}' needs merge units (a 'cais' or 'cais-ep' switch)")
    plan = Plan.of(call, k, n, capacity)
    for sw in eps if k.mcast else ():
        for g in range(n):
            for mem, tag in plan.groups[g].items():
                if not sw.tables[g].bind(tag, mem):
                    raise RuntimeError(f"sw{sw.chip}: group {tag} of gpu{g} did not fit")  # capacity was checked
            sw.tables[g].stats.overflows += plan.overflow[g]
    for g in range(n):
        alloc_rows(m, g, "x", T, call)
        alloc_rows(m, g, "recv_x", n * T, call)
        alloc_rows(m, g, "expert_out", n * T, call)
        alloc_rows(m, g, "combined", T, call)
    unit = m.cfg.unit_for(call.row_bytes)  # the dispatch's rows (FP8 and its scales after an FP8 dispatch)
    combine_unit = m.cfg.unit_for(combine_row_bytes(call))  # the combine's BF16 partials
    B = len(plan.blocks)
    C = sms // 2  # senders per phase: DeepEP's normal kernels' count (its other half receives)
    dispatch = call.op == "dispatch" or ffn is not None
    combine = call.op == "combine" or ffn is not None
    # arrivals: dispatch rows into (rank, block); the combine's rows (or bytes) into (home, block)
    into = np.array([plan.hit[:, t0:t0 + tc].sum(axis=(0, 1)) for t0, tc in plan.blocks])  # [block, rank]
    landed = [[Countdown(int(into[b, r])) for b in range(B)] for r in range(n)]
    home = [[Countdown(_combine_rows(plan, g, b)) for b in range(B)] for g in range(n)]
    ready = [[Signal() for _ in range(B)] for _ in range(n)]  # the block's expert outputs on rank g
    sig_key = m.flag_key() * 1_000_003
    out = []
    for g in range(n):
        tbs: list[TbProgram | None] = []
        if dispatch:
            tbs += [_dispatch_tb(m, g, call, k, plan, c, C, landed, unit) for c in range(C)]
        tbs.append(_experts_tb(m, g, call, plan, landed[g], ready[g], ffn, sms, dispatch, combine))
        if combine:
            tbs += [_combine_tb(m, g, call, k, plan, c, C, ready[g], home, sig_key, combine_unit) for c in range(C)]
            tbs.append(_home_tb(m, g, call, k, plan, home[g], sig_key))
        out.append(Kernel(f"{k.name}-{call.op if ffn is None else 'layer'}", tbs, None, role="communication"))
    return out


class _Outstanding:
    """A TB's sends not yet acknowledged; :meth:`drained` is what it waits for at the end."""

    __slots__ = ("left", "sig")

    def __init__(self) -> None:
        self.left = 0
        self.sig: Signal | None = None

    def add(self) -> None:
        self.left += 1

    def done(self, sim: object) -> None:
        self.left -= 1
        if not self.left and self.sig is not None:
            self.sig.fire(sim)  # type: ignore[arg-type]

    def drained(self) -> Signal | None:
        if not self.left:
            return None
        self.sig = Signal()
        return self.sig


def _combine_rows(plan: Plan, home: int, b: int) -> int:
    t0, tc = plan.blocks[b]
    return int(plan.hit[home, t0:t0 + tc].sum())


def _rows(mem_buf: np.ndarray, width: int, row: int) -> np.ndarray:
    return mem_buf.reshape(-1, width)[row]


def _dispatch_tb(m: Machine, g: int, call: EpCall, k: EpSwitchKernel, plan: Plan, c: int, C: int,
                 landed: list[list[Countdown]], unit: int) -> TbProgram:
    """Sender ``c`` of GPU ``g``'s dispatch: block by block, its tokens (every ``C``-th),
    each once by ``st.mc.dyn`` to its group, else by a unicast store per remote rank; a
    copy to its own GPU takes the copy loop's time."""
    isa, sim = m.isa, m.sim
    mem = m.gpus[g].memory
    h, eb, se, T = call.hidden, call.elem_bytes, call.scale_elems, call.routing.tokens

    def parts(t: int) -> list[tuple[Region, np.ndarray | None]]:
        slot = g * T + t
        got = [(Region("recv_x", slot * h, h, eb), _rows(mem.buffers["x"], h, t) if mem.functional else None)]
        if se:
            got.append((Region("recv_x.scales", slot * se, se, 4),
                        _rows(mem.buffers["x.scales"], se, t) if mem.functional else None))
        return got

    def program(sm: int, busy: int) -> ProgramGen:
        port = isa.sm_port(call.consts.sm_copy_GBps)
        win = Window(sim, max(m.cfg.collective.outstanding_bytes_per_sm, 2 * call.row_bytes))
        sent = _Outstanding()
        for b, (t0, tc) in enumerate(plan.blocks):
            for t in range(t0 + (c - t0) % C, t0 + tc, C):
                dests = np.nonzero(plan.hit[g, t])[0]
                if not len(dests):
                    continue
                if plan.hit[g, t, g]:  # its own experts: a local copy
                    yield pause(sim, round(call.row_bytes * port.ps_per_byte))
                    for region, data in parts(t):
                        mem.write(region, data)
                    landed[g][b].arrive(sim)
                members = plan.remote(g, t)
                if not members:
                    continue
                group = plan.groups[g].get(members)
                targets: list[tuple[int, ...]] = [members] if group is not None else [(r,) for r in members]
                for tgt in targets:
                    prs = parts(t)
                    arrived = Countdown(len(prs))
                    arrived.on_fire(partial(_arrive_all, sim, [landed[r][b] for r in tgt]))
                    for region, data in prs:
                        yield from win.acquire(region.nbytes)
                        sent.add()
                        done = partial(_landed, sim, win, region.nbytes, arrived, sent)
                        if group is not None:
                            isa.st_mc_dyn(g, group, len(tgt), region, data, done, port, 0, unit)
                        else:
                            isa.st(g, tgt[0], region, data, done, port, 0, unit)
        wait = sent.drained()
        if wait is not None:
            yield wait
    return program


def _arrive_all(sim: object, counts: list[Countdown], _value: object = None) -> None:
    for cd in counts:
        cd.arrive(sim)  # type: ignore[arg-type]


def _landed(sim: object, win: Window, nbytes: int, arrived: Countdown, sent: _Outstanding) -> None:
    win.release(nbytes)
    arrived.arrive(sim)  # type: ignore[arg-type]
    sent.done(sim)


def _experts_tb(m: Machine, g: int, call: EpCall, plan: Plan, landed: list[Countdown], ready: list[Signal],
                ffn: ExpertFfn | None, comm_sms: int, dispatch: bool, combine: bool) -> TbProgram:
    """GPU ``g``'s experts: per block, once its rows are in, the grouped GEMMs (gate/up,
    down) on the SMs the communication leaves (all of them when unfused), then the
    block's outputs are ready for the combine. A lone dispatch waits for its rows; a
    lone combine's outputs are ready at once."""
    sim = m.sim
    times = _gemm_ps(m, g, call, plan, ffn, comm_sms) if ffn is not None else [0] * len(plan.blocks)

    def program(sm: int, busy: int) -> ProgramGen:
        for b in range(len(plan.blocks)):
            if dispatch and landed[b].remaining:
                yield landed[b]
            if times[b]:
                yield pause(sim, times[b])
            ready[b].fire(sim)
    return program


def _gemm_ps(m: Machine, g: int, call: EpCall, plan: Plan, ffn: ExpertFfn, comm_sms: int) -> list[int]:
    rt = call.routing
    per = rt.per_rank
    cm = ComputeModel.load(m.cfg.gpu.compute_model, m.cfg.gpu.hbm_bandwidth_GBps)
    sms = m.cfg.gpu.sms - (comm_sms if len(plan.blocks) > 1 else 0)
    out = []
    for t0, tc in plan.blocks:
        idx = rt.topk_idx[:, t0:t0 + tc].reshape(-1)
        counts = np.bincount(idx[(idx >= 0) & (idx // per == g)] - g * per, minlength=per)
        if not counts.sum():
            out.append(0)
            continue
        up = groups_of(counts.tolist(), 2 * ffn.ffn, call.hidden, ffn.dtype)
        down = groups_of(counts.tolist(), call.hidden, ffn.ffn, ffn.dtype)
        t = grouped_gemm_ps(cm, up, sms) + grouped_gemm_ps(cm, down, sms)
        if ffn.act:  # as kernels/activation.py's rows_activation_kernel costs it, less its launch overhead
            total = m.cfg.gpu.sms
            act = cm.elementwise_time_ps("gelu", int(counts.sum()), 2 * ffn.ffn, sms, total)
            t += round(ffn.act * (act - cm.memory_time_ps(0, sms, total)))
        out.append(t)
    return out


def _combine_tb(m: Machine, g: int, call: EpCall, k: EpSwitchKernel, plan: Plan, c: int, C: int,
                ready: list[Signal], home: list[list[Countdown]], sig_key: int, unit: int) -> TbProgram:
    """Sender ``c`` of GPU ``g``'s combine: per block, once its outputs are ready, the
    partial of every slot it holds (every ``C``-th token) to the token's rank: by
    ``red.cais.dyn`` (the contributor count: the token's remote ranks), else by a
    unicast ``red``; the token's own rank adds its partial locally. Its transfer unit
    (``unit``) and in-flight window are sized on the partial's BF16 row
    (:func:`combine_row_bytes`), not on the dispatch's."""
    isa, sim = m.isa, m.sim
    mem = m.gpus[g].memory
    h, T, n = call.hidden, call.routing.tokens, m.n
    row = combine_row_bytes(call)

    def program(sm: int, busy: int) -> ProgramGen:
        port = isa.sm_port(call.consts.sm_copy_GBps)
        win = Window(sim, k.red_window_bytes if k.reduce and k.red_window_bytes
                     else max(m.cfg.collective.outstanding_bytes_per_sm, 2 * row))
        sent = _Outstanding()
        for b, (t0, tc) in enumerate(plan.blocks):
            if not ready[b].fired:
                yield ready[b]
            for t in range(t0 + (c - t0) % C, t0 + tc, C):  # token-major: every rank's partials of a token together
                for src in range(n):
                    if not plan.hit[src, t, g]:
                        continue
                    region = Region("combined", t * h, h, COMBINE_BYTES)
                    data = _rows(mem.buffers["expert_out"], h, src * T + t).copy() if mem.functional else None
                    if src == g:
                        yield pause(sim, round(region.nbytes * port.ps_per_byte))
                    else:
                        yield from win.acquire(region.nbytes)
                        sent.add()
                    if k.reduce:
                        expect = len(plan.remote(src, t))
                        done = None if src == g else partial(_released, sim, win, region.nbytes, sent)
                        isa.red_cais(g, src, region, data, sig_key + b, done, port, 0, unit, expect=expect)
                    elif src == g:
                        isa.add_local(g, region, data)
                        home[g][b].arrive(sim)
                    else:
                        isa.red(g, src, region, data, partial(_red_landed, sim, win, region.nbytes, sent, home[src][b]),
                                port, 0, unit)
        wait = sent.drained()
        if wait is not None:
            yield wait
    return program


def _released(sim: object, win: Window, nbytes: int, sent: _Outstanding) -> None:
    win.release(nbytes)
    sent.done(sim)


def _red_landed(sim: object, win: Window, nbytes: int, sent: _Outstanding, home: Countdown) -> None:
    _released(sim, win, nbytes, sent)
    home.arrive(sim)  # type: ignore[arg-type]


def _home_tb(m: Machine, g: int, call: EpCall, k: EpSwitchKernel, plan: Plan, home: list[Countdown],
             sig_key: int) -> TbProgram:
    """GPU ``g`` as the tokens' rank: waits until every block's combined rows are in
    (the in-switch reduction: its signal word counts the contributions' bytes)."""
    sim = m.sim
    row = combine_row_bytes(call)

    def program(sm: int, busy: int) -> ProgramGen:
        for b in range(len(plan.blocks)):
            if k.reduce:
                target = _combine_rows(plan, g, b) * row
                if target:
                    sig = Signal()
                    m.isa.wait_signal(g, sig_key + b, target, partial(_fire, sim, sig))
                    yield sig
            else:
                if home[b].remaining:
                    yield home[b]
    return program


def _fire(sim: object, sig: Signal) -> None:
    sig.fire(sim)  # type: ignore[arg-type]


#: the family, by ``--kernel`` name
VARIANTS: dict[str, EpSwitchKernel] = {k.name: k for k in (
    EpSwitchKernel("ep-switch", mcast=True, reduce=True, fused=True),
    EpSwitchKernel("ep-switch-mcast", mcast=True, reduce=False, fused=True),
    EpSwitchKernel("ep-switch-red", mcast=False, reduce=True, fused=True),
    EpSwitchKernel("ep-switch-unfused", mcast=True, reduce=True, fused=False),
    EpSwitchKernel("ep-switch-sw", mcast=False, reduce=False, fused=True),
)}

