"""CAIS (paper §III) and its ablations: the mergeable ISA and merge unit of
``cais-base`` plus

* **the graph-level dataflow optimizer** (§III-C), on each sub-layer GEMM-RS -> LN ->
  AG-GEMM:
  - *deep fusion*: the three kernels are launched together as one pipeline; nothing
    waits for a kernel boundary;
  - *TB-level dependencies*: an LN row-block TB starts when every GPU's
    contributions to its rows have landed (its signal word), and announces its rows
    with a multicast flag; an AG-GEMM tile loads a row block as soon as its owner's
    flag for it is in (which tile rows feed which block, and which blocks a tile
    reads, come from the pass ``cais.opt.tb_dependencies`` over the layer graph);
  - *asymmetric kernel overlap*: GEMM-RS (up-link heavy) runs on one SM group and
    LN + AG-GEMM (down-link heavy) on the other, at the same time, so both link
    directions carry traffic (``cais.split``);
  - *traffic control*: loads and reductions on separate virtual channels, served
    round-robin (the ``class`` VC policy); without it (``cais-partial``) every
    request shares one VC (``one``).
* **merging-aware TB coordination** (§III-B): the TBs with the same index on every
  GPU form a TB group; each TB registers with the switch's Group Sync Table before
  it starts (pre-launch sync) and again before its first ``*.cais`` access
  (pre-access sync), two empty packets each way; and TB-aware throttling: a
  mergeable request is acknowledged only once ``cais.throttle_quorum`` of its
  session's requesters have reached the switch, with ``cais.outstanding_kB`` of
  unacknowledged requests per TB.

The GEMMs are the remote-access kernels of kernels/remote_gemm.py with
:class:`CoordinatedAccess`: ``ld.cais``/``red.cais`` plus the coordination hooks.

Variants (§IV-C): ``cais`` (everything), ``cais-partial`` (no traffic control),
``cais-wo-coord`` (no TB coordination). Attention and activations run as in
``cais-base``. The weight gradients (schemes/remote_wgrad.py) are where the optimizer
meets the backward pass, which the paper does not describe. Nothing in the period
waits for a weight gradient, so the optimizer runs each beside the work around it,
on a low-priority stream, as soon as its operands are ready: a weight gradient of a
forward input (QKV's, FC1's) loads its rows beside the dgrad sub-layer before it
(asymmetric kernel overlap past the sub-layer: its loads are switch-to-GPU traffic,
the dgrad's GEMM-RS GPU-to-switch), and one of an output gradient (the output
projection's, FC2's) reads the copy its sub-layer's AG-GEMM wrote as it loaded the
rows (one gathered tensor, two consumers: materialised once, as Megatron-LM keeps the
gathered gradient for both) beside what follows. ``train.wgrad_inputs`` /
``train.wgrad_grads`` choose otherwise (docs/schemes.md, "Weight gradients").
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from functools import partial

import numpy as np

from cais.engine import Countdown, Signal
from cais.hw.gpu import RedForm, RowBlocks
from cais.hw.group_sync import TbGroupRegistrar
from cais.hw.memory import Region
from cais.hw.packets import Kind
from cais.isa import StreamRed
from cais.kernels.gemm import GemmShape
from cais.kernels.local import ROWS_PER_TB
from cais.kernels.remote_gemm import MergeableAccess, SyncGroups, remote_operands, sharded_activations, tile_order
from cais.machine import Machine
from cais.opt.fusion import asymmetric_split, choose_split, fuse
from cais.opt.tb_dependencies import TbDependencies, tb_dependencies
from cais.opt.tb_order import k_start_owner, owner_interleaved_order
from cais.schemes.base import Deps, LayerRun
from cais.schemes.remote_wgrad import RemoteLoadScheme
from cais.workload.graph import Chain

_PHASES = 2  # sync points per TB: pre-launch, pre-access
# Where GEMM-RS, LN and AG-GEMM share every SM (no split): a ready LN TB goes first (it is
# short and what the AG-GEMM waits for), then the GEMM-RS's tiles (the producer first, so
# every row block is reduced as early as it can be), and AG-GEMM tiles take the SMs left.
# The orders measured against each other: docs/validation.md, "CAIS as its paper
# schedules it"
CONSUMER_PRIORITY = 1

# per GPU: (owner, LN row block) -> its rows are ready (a countdown of one: the block's
# ready flag landing on the GPU counts it in, in the core)
Ready = list[dict[tuple[int, int], Countdown]]


class CoordinatedAccess(MergeableAccess):
    """Mergeable accesses of one GEMM under CAIS's merging-aware TB coordination
    (§III-B) and TB-level dependencies (§III-C) on GPUs owning ``rows_l`` token
    rows each: with ``coord``, each TB syncs with
    its TB group (the TBs of the same index on every GPU, keys from ``group``) at
    the switch before it starts and before its first ``*.cais`` access, the tiles are
    ordered so that the GPUs' TBs touch different owners at a time (``cais.spread``),
    requests are throttled to a quorum and an SM keeps ``cais.outstanding_kB`` in
    flight. ``deps``: the pass's TB-level dependencies of the sub-layer: the GEMM-RS
    epilogue cuts its reductions at LN row blocks (one signal word each,
    ``block_keys``), and an AG-GEMM tile waits for the blocks it reads (``ready``)."""

    def __init__(self, m: Machine, rows_l: int, coord: bool, group: int | None = None,
                 deps: TbDependencies | None = None, block_keys: list[int] | None = None,
                 ready: Ready | None = None) -> None:
        cfg = m.cfg.cais
        quorum = max(1, round(cfg.throttle_quorum * (m.n - 1))) if coord and cfg.throttle_quorum > 0 else 0
        super().__init__(m, quorum=quorum, window=round(cfg.outstanding_kB * 1024) if coord else None)
        self.rows_l = rows_l
        self.coord = coord
        self.spreads = coord and cfg.spread  # merging-aware TB scheduling (opt/tb_order.py)
        self.group = group
        # which of the two sync points (pre-launch, pre-access) a TB registers at, and
        # with which group (one per TB and sync point, of one TB per GPU)
        self._groups: tuple[SyncGroups | None, SyncGroups | None] = (None, None)
        # the pre-launch registration, made before dispatch where TBs launch on ready
        # (the paper's: the TB stays pending, holding no SM; hw/group_sync.py)
        self._at_dispatch: SyncGroups | None = None
        if coord and group is not None:
            launch = (group, _PHASES, m.n) if cfg.pre_launch_sync else None
            if m.cfg.gpu.tb_launch == "on-ready":
                self._at_dispatch, launch = launch, None
            self._groups = (launch, (group + 1, _PHASES, m.n) if cfg.pre_access_sync else None)
        self._early = cfg.pre_access_overlap
        self.deps = deps
        self.block_keys = block_keys or []
        # the pass's LN row blocks as the core cuts an epilogue's partial rows at them
        self._rows = None if deps is None else RowBlocks(deps.width, deps.rows_l, deps.block_rows, self.block_keys)
        self.ready = ready

    # ---- merging-aware TB scheduling and group sync ------------------------------------
    def tile_order(self, shape: GemmShape, token_rows: bool) -> list[tuple[int, int]]:
        if token_rows and self.spreads:
            return owner_interleaved_order(shape, self.rows_l, self.m.n, self.m.cfg.cais.bands)
        return tile_order(shape)

    def k_start(self, steps: list[tuple[int, int]], t: int) -> int:
        if not self.spreads:
            return 0
        first = k_start_owner(t, self.m.n) * self.rows_l  # the owner's first token row
        s = bisect_left(steps, (first,))  # the first step at or after it (steps run in K order)
        return s if s < len(steps) else 0

    def sync_groups(self) -> tuple[SyncGroups | None, SyncGroups | None]:
        """TB ``t`` registers with its TB group at the switch (one per TB and sync
        point) and waits for the release, at the sync points the config enables that
        it makes on its SM (the pre-launch one is made before dispatch with launch on
        ready: :meth:`launch_gates`)."""
        return self._groups

    def early_access(self) -> bool:
        return self._early and self._groups[1] is not None

    def launch_gates(self, g: int, data: list[list[Signal]], window: int) -> list[list[Signal]]:
        """With launch on ready, each TB registers with its pre-launch TB group before
        dispatch (after its data gates, one wave ahead: :class:`TbGroupRegistrar`) and
        is placed at the release."""
        if self._at_dispatch is None:
            return data
        base, per, members = self._at_dispatch
        return TbGroupRegistrar(self.m.sim, partial(self.m.isa.group_sync, g), base, per, members, data,
                                window).gates

    # ---- TB-level dependencies -------------------------------------------------------
    def operands_ready(self, g: int, shape: GemmShape, i: int) -> list[Signal]:
        if self.ready is None or self.deps is None:
            return []
        if shape != self.deps.gemm2:
            raise ValueError(f"tiled {shape}, its TB dependencies were derived for {self.deps.gemm2}")
        return [self.ready[g][key] for key in self.deps.waits(i)]

    def rows_ready(self, g: int, owner: int, r0: int, nr: int) -> list[Signal]:
        """The ready flags (on ``g``) of ``owner``'s LN row blocks that rows ``r0 ..
        r0+nr-1`` of its shard fall in."""
        if self.ready is None or self.deps is None:
            return []
        return [self.ready[g][(owner, b)] for b, _, _ in self.deps.cut(owner, r0, nr)]

    def reductions(self, g: int, owner: int, region: Region, data: np.ndarray | None) -> list[StreamRed]:
        """One ``red.cais`` per LN row block the piece covers, into the block's signal word."""
        return [self.m.isa.red_cais_op(owner, sub, part, self.block_keys[b], self.red_unit(), self.quorum)
                for b, sub, part in self._by_block(owner, region, data)]

    def add_own(self, g: int, region: Region, data: np.ndarray | None) -> None:
        for b, sub, part in self._by_block(g, region, data):
            self.m.isa.red_cais(g, g, sub, part, self.block_keys[b])

    def red_form(self) -> RedForm:
        """``red.cais``, each part of a piece into its LN row block's signal word."""
        assert self._rows is not None, "an epilogue's reductions need the pass's TB-level dependencies"
        return RedForm(int(Kind.RED_CAIS), self.red_unit(), quorum=self.quorum, blocks=self._rows)

    def _by_block(self, owner: int, region: Region, data: np.ndarray | None
                  ) -> list[tuple[int, Region, np.ndarray | None]]:
        """Cut a piece of an epilogue's block of ``owner``'s rows at LN row-block
        boundaries (the pass's cut, as the core makes it): (block, sub-region, its data)."""
        assert self._rows is not None, "an epilogue's reductions need the pass's TB-level dependencies"
        flat = None if data is None else np.reshape(data, -1)
        out = []
        for b, sub, off in self._rows.cut(region, owner):
            part = None
            if flat is not None:
                part = flat[off:off + sub.rows * sub.count]
                if sub.rows > 1:
                    part = part.reshape(sub.rows, sub.count)
            out.append((b, sub, part))
        return out


class Cais(RemoteLoadScheme):
    """CAIS: merge unit + TB coordination + graph-level dataflow optimizer."""

    name = "cais"
    sp = True
    algo = "p2p"
    switch = "cais"
    coord = True
    vc_policies = ("class", "kernel", "destination")  # traffic control: loads and reductions on their own VCs
    summary = "CAIS: merge unit + TB coordination (group sync, throttling) + fused GEMM-RS/LN/AG-GEMM pipeline"
    wgrad_inputs = "refetch-overlap"
    wgrad_grads = "keep-overlap"

    def run(self, r: LayerRun) -> None:
        self._sharded = sharded_activations(r.period)
        # the weight gradients' loads (ld.cais): no TB group, no TB-level dependencies
        self._wgrad_access = self.access(r)
        super().run(r)

    def access(self, r: LayerRun, group: int | None = None, deps: TbDependencies | None = None,
               block_keys: list[int] | None = None, ready: Ready | None = None) -> CoordinatedAccess:
        """How the GEMMs touch remote rows (a TB group's key base ``group``, the
        sub-layer's TB-level dependencies ``deps``, the GEMM-RS's LN-block signal words
        ``block_keys``, the AG-GEMM's ``ready`` flags): ``ld.cais``/``red.cais`` under
        the coordination :attr:`coord` says."""
        return CoordinatedAccess(r.m, r.d.rows_l, self.coord, group, deps, block_keys, ready)

    # ---- the fused sub-layer --------------------------------------------------------
    def chain(self, r: LayerRun, c: Chain, deps: Deps) -> Deps:
        n, over = r.m.n, r.cm.kernel_overhead_ps
        rs_sms, ag_sms = self._split(r, c)
        tbd = self._tb_dependencies(r, c, rs_sms, ag_sms)
        blocks = tbd.blocks
        block_keys = [r.m.flag_key() for _ in blocks]
        ready: Ready = [{(o, b): Countdown(1) for o in range(n) for b in range(len(blocks))} for _ in range(n)]
        flags = [r.m.flag_key() for _ in blocks]
        groups = [r.m.flag_key() << 24 for _ in (c.gemm1, c.gemm2)]
        reductions = self.access(r, groups[0], tbd, block_keys)
        loads = self.access(r, groups[1], tbd, ready=ready)
        ops = remote_operands(c.gemm2, self._sharded)
        plan = fuse(r.period.graph.chain(c.name))  # GEMM-RS, LN, AG-GEMM launched together
        assert [op.name for op in plan.kernels] == [c.gemm1.name, c.rowop.name, c.gemm2.name]
        out = []
        for g in range(n):
            k1, _ = r.reduce_gemm(g, c.gemm1, c.reduced, reductions, rs_sms)
            expected = [tbd.signal_bytes(g, b, r.model.dtype_bytes) for b in range(len(blocks))]
            ln = r.signalled_rowop_kernel(g, c.rowop, blocks, expected, block_keys, flags, ready, ag_sms)
            k2 = r.load_gemm(g, c.gemm2, ops, loads, ag_sms, keep=self.keeps(c))
            if rs_sms & ag_sms:  # one SM pool: LN first as its rows are ready, then the producer, then the AG-GEMM
                ln.priority, k1.priority = CONSUMER_PRIORITY + 1, CONSUMER_PRIORITY
                if self.coord and k2.gates is not None:  # every GPU places the coordinated TBs in one order
                    k1.placed = placed = Signal()
                    gates = k2.gates
                    k2.gates = partial(_after, gates, placed)
            for k in (k1, ln):
                r.submit(g, k, [deps[g]], over, c.name)
            out.append(r.submit(g, k2, [deps[g]], over, c.name))
        return out

    @staticmethod
    def _tb_dependencies(r: LayerRun, c: Chain, rs_sms: frozenset[int], ag_sms: frozenset[int]) -> TbDependencies:
        """The pass over the layer graph: which GEMM1 tile rows feed each LN row block,
        which LN row blocks each GEMM2 row tile reads (GEMM1 on ``rs_sms``, GEMM2 on
        ``ag_sms``: their tile shapes)."""
        graph = r.period.graph
        if graph is None:
            raise ValueError(f"{c.name}: the period has no dataflow graph to derive TB dependencies from")
        return tb_dependencies(graph, graph.chain(c.name), r.shape(c.gemm1, len(rs_sms)), r.shape(c.gemm2, len(ag_sms)),
                               ROWS_PER_TB, r.m.n)

    @staticmethod
    def _split(r: LayerRun, c: Chain) -> tuple[frozenset[int], frozenset[int]]:
        """The two SM groups of asymmetric kernel overlap (``opt.fusion``): the
        config's split, or with ``auto`` the optimizer's choice for this sub-layer
        (recorded in ``r.sm_splits``)."""
        t1, t2 = (r.cm.gemm_time_ps(gm.m, gm.n, gm.k, r.sms) for gm in (c.gemm1, c.gemm2))
        split = r.m.cfg.cais.split
        if split == "auto":
            _, comm = r.chain_bound_ps(c)  # an activation's least link time, each direction
            f = r.slowest  # the GEMMs' times as the slowest GPU runs them
            split = choose_split(round(t1 * f), round(t2 * f), comm, comm, max(1, c.rowop.rows // ROWS_PER_TB)).split
        rs, ag = asymmetric_split(t1, t2, r.sms, split)
        r.sm_splits[c.name] = (len(rs), len(ag))
        return rs, ag


def _after(gates: Callable[[], list[list[Signal]]], first: Signal) -> list[list[Signal]]:
    """An AG-GEMM's gates in a pool of SMs it shares with its GEMM-RS: each TB also
    waits until every GEMM-RS TB has been placed (``first``), so that every GPU places
    the sub-layer's coordinated TBs in one order (hw/group_sync.py)."""
    return [[*sigs, first] for sigs in gates()]


class CaisPartial(Cais):
    """CAIS without traffic control: loads and reductions share one request VC."""

    name = "cais-partial"
    family = "ablation"
    vc_policy = "one"
    summary = "CAIS without traffic control (loads and reductions share one VC)"


class CaisWoCoord(Cais):
    """CAIS without merging-aware TB coordination (no group sync, no throttling)."""

    name = "cais-wo-coord"
    family = "ablation"
    coord = False
    summary = "CAIS without TB coordination: merge unit + fused pipeline + traffic control"
