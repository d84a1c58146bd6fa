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

Variants (§IV-C): ``cais`` (everything), ``cais-partial`` (no traffic control),
``cais-wo-coord`` (no TB coordination). Attention, activations and weight gradients
run as in ``cais-base``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cais.engine import Signal
from cais.engine.sim import ProgramGen
from cais.hw.gpu import Kernel, TbProgram
from cais.hw.hbm import HbmPhase
from cais.hw.memory import Region
from cais.isa import SmPort
from cais.kernels.gemm import GemmShape
from cais.kernels.local import ROWS_PER_TB
from cais.opt.fusion import asymmetric_split, fuse
from cais.opt.tb_dependencies import TbDependencies, tb_dependencies
from cais.opt.tb_order import k_start_owner, owner_interleaved_order
from cais.schemes.base import Deps, LayerRun
from cais.schemes.cais_base import CaisBase
from cais.workload.graph import Chain, Gemm

_PHASES = 2  # sync points per TB: pre-launch, pre-access


class Cais(CaisBase):
    """CAIS: merge unit + TB coordination + graph-level dataflow optimizer."""

    name = "cais"
    ablation = False
    coord = True
    traffic_control = True
    summary = "CAIS: merge unit + TB coordination (group sync, throttling) + fused GEMM-RS/LN/AG-GEMM pipeline"

    def run(self, r: LayerRun) -> None:
        self._deps: dict[str, TbDependencies] = {}  # chain -> its TB-level dependencies
        self._deps_of: dict[str, TbDependencies] = {}  # GEMM2 -> the same
        self._block_keys: dict[str, list[int]] = {}  # chain -> signal word per LN block
        self._ready: dict[str, list[dict[tuple[int, int], Signal]]] = {}  # gemm2 -> per GPU (owner, block)
        self._groups: dict[str, int] = {}  # kernel name -> first TB-group key
        super().run(r)

    # ---- the fused sub-layer --------------------------------------------------------
    def chain(self, r: LayerRun, c: Chain, deps: Deps) -> Deps:
        n, over = r.m.n, r.cm.kernel_overhead_ps
        rs_sms, ag_sms = self._split(r, c)
        tbd = self._deps[c.name] = self._deps_of[c.gemm2.name] = self._tb_dependencies(r, c, rs_sms, ag_sms)
        blocks = tbd.blocks
        self._block_keys[c.name] = [r.m.flag_key() for _ in blocks]
        ready = [{(o, b): Signal() for o in range(n) for b in range(len(blocks))} for _ in range(n)]
        self._ready[c.gemm2.name] = ready
        flags = [r.m.flag_key() for _ in blocks]
        for gemm in (c.gemm1, c.gemm2):
            self._groups[gemm.name] = r.m.flag_key() << 24
        ops = self._operands(c.gemm2)
        plan = fuse(r.period.graph.chain(c.name))  # GEMM-RS, LN, AG-GEMM launched together
        assert [op.name for op in plan.kernels] == [c.gemm1.name, c.rowop.name, c.gemm2.name]
        out = []
        for g in range(n):
            k1, _ = self._red_gemm(r, g, c, rs_sms)
            ln = self._ln_kernel(r, g, c, flags, ready, ag_sms)
            k2 = self._load_gemm(r, g, c.gemm2, ops, ag_sms)
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
        """The two SM groups of asymmetric kernel overlap (``opt.fusion``)."""
        t1, t2 = (r.cm.gemm_time_ps(gm.m, gm.n, gm.k, r.sms) for gm in (c.gemm1, c.gemm2))
        return asymmetric_split(t1, t2, r.sms, r.m.cfg.cais.split)

    def _ln_kernel(self, r: LayerRun, g: int, c: Chain, flags: list[int],
                   ready: list[dict[tuple[int, int], Signal]], sm_set: frozenset[int]) -> Kernel:
        """The row-wise op as row-block TBs: each waits for its rows' signal word,
        normalises them, and multicasts a flag that they are ready."""
        m, op = r.m, c.rowop
        deps = self._deps[c.name]
        sms = len(sm_set)
        waves = -(-len(deps.blocks) // sms)
        tb_ps = r.rowop_work_ps(op, op.rows, sms) // max(1, waves)
        keys = self._block_keys[c.name]
        functional = m.gpus[g].memory.functional

        def tb(b: int) -> TbProgram:
            r0, nr = deps.blocks[b]
            expected = deps.signal_bytes(g, b, r.model.dtype_bytes)  # every GPU's partial of the rows fed to it

            def program(sm: int, busy: int) -> ProgramGen:
                landed = Signal()
                m.gpus[g].wait_signal(keys[b], expected, lambda: landed.fire(m.sim))
                yield landed
                yield HbmPhase(tb_ps, r.rowop_bytes(op, nr))
                if functional:
                    r.rowop_apply(g, op, r0, nr)
                m.isa.flag_multicast(g, flags[b], lambda gpu: ready[gpu][(g, b)].fire(m.sim))
            return program

        return Kernel(op.name, [tb(b) for b in range(len(deps.blocks))], sm_set, hbm_phases=True)

    # ---- TB-level dependencies of the AG-GEMM ----------------------------------------
    def _operands_ready(self, r: LayerRun, g: int, gemm: Gemm, shape: GemmShape, i: int) -> list[Signal]:
        ready = self._ready.get(gemm.name)
        if ready is None:
            return []
        deps = self._deps_of[gemm.name]
        if shape != deps.gemm2:
            raise ValueError(f"{gemm.name}: tiled {shape}, its TB dependencies were derived for {deps.gemm2}")
        return [ready[g][key] for key in deps.waits(i)]

    # ---- the GEMM-RS epilogue: one red.cais per LN row block -------------------------
    def _reduce(self, r: LayerRun, g: int, c: Chain, owner: int, region: Region, data: np.ndarray | None,
                done: Callable[[], None], port: SmPort, drain: object) -> None:
        pieces = self._by_block(c, owner, region, data)
        left = [len(pieces)]

        def one() -> None:
            left[0] -= 1
            if left[0] == 0:
                done()
        keys = self._block_keys[c.name]
        for b, sub, part in pieces:
            r.m.isa.red_cais(g, owner, sub, part, keys[b], one, port, unit=self._red_unit(r), quorum=self._quorum(r))

    def _add_own(self, r: LayerRun, g: int, c: Chain, region: Region, data: np.ndarray | None) -> None:
        keys = self._block_keys[c.name]
        for b, sub, part in self._by_block(c, g, region, data):
            r.m.isa.red_cais(g, g, sub, part, keys[b])

    def _by_block(self, c: Chain, owner: int, region: Region, data: np.ndarray | None
                  ) -> list[tuple[int, Region, np.ndarray | None]]:
        """Cut a piece of an epilogue's block of ``owner``'s rows at LN row-block
        boundaries (the pass's cut): (block, sub-region, its data)."""
        width = c.gemm1.n
        if region.rows > 1:
            r0, c0 = divmod(region.start, width)
            spans = [(r0, region.rows, c0, region.count, 0)]
        else:  # a run: whole rows, or parts of rows where it starts or ends mid-row
            spans, pos, end = [], region.start, region.start + region.count
            while pos < end:
                r0, c0 = divmod(pos, width)
                if c0 == 0 and end - pos >= width:  # whole rows
                    rows = (end - pos) // width
                    spans.append((r0, rows, 0, width, pos - region.start))
                    pos += rows * width
                else:
                    cnt = min(width - c0, end - pos)
                    spans.append((r0, 1, c0, cnt, pos - region.start))
                    pos += cnt
        flat = None if data is None or region.rows > 1 else np.reshape(data, -1)
        out = []
        for r0, rows, c0, cols, off in spans:
            if data is None:
                mat = None
            elif flat is None:
                mat = np.reshape(data, (rows, cols))
            else:
                mat = flat[off:off + rows * cols].reshape(rows, cols)
            for b, t, cnt in self._deps[c.name].cut(owner, r0, rows):
                sub = Region.block(region.buffer, width, t, cnt, c0, cols, region.elem_bytes)
                part = None
                if mat is not None:
                    part = mat[t - r0:t - r0 + cnt]
                    if sub.rows == 1:
                        part = part.reshape(-1)
                out.append((b, sub, part))
        return out

    # ---- merging-aware TB coordination -----------------------------------------------
    def _quorum(self, r: LayerRun) -> int:
        q = r.m.cfg.cais.throttle_quorum
        return max(1, round(q * (r.m.n - 1))) if self.coord and q > 0 else 0

    def _window(self, r: LayerRun) -> int:
        if self.coord:
            return round(r.m.cfg.cais.outstanding_kB * 1024)
        return super()._window(r)

    def _load(self, r: LayerRun, g: int, home: int, region: Region, done: Callable[[np.ndarray | None], None],
              unit: int) -> None:
        r.m.isa.ld_cais(g, home, region, done, unit=unit, quorum=self._quorum(r))

    def _spreads(self, r: LayerRun) -> bool:
        """Whether merging-aware TB scheduling orders the tiles (opt/tb_order.py)."""
        return self.coord and r.m.cfg.cais.spread

    def _tile_order(self, r: LayerRun, shape: GemmShape, token_rows: bool = True) -> list[tuple[int, int]]:
        if token_rows and self._spreads(r):
            return owner_interleaved_order(shape, r.d.rows_l, r.m.n)
        return super()._tile_order(r, shape, token_rows)

    def _k_start(self, r: LayerRun, steps: list[tuple[int, int]], t: int) -> int:
        if not self._spreads(r):
            return 0
        first = k_start_owner(t, r.m.n) * r.d.rows_l  # the owner's first token row
        return next((s for s, (k0, _) in enumerate(steps) if k0 >= first), 0)

    def _tb_start(self, r: LayerRun, g: int, gemm: Gemm, t: int) -> ProgramGen:
        yield from self._sync(r, g, gemm, t, 0)

    def _first_access(self, r: LayerRun, g: int, gemm: Gemm, t: int) -> ProgramGen:
        yield from self._sync(r, g, gemm, t, 1)

    def _sync(self, r: LayerRun, g: int, gemm: Gemm, t: int, phase: int) -> ProgramGen:
        """Register TB ``t`` with its TB group at the switch and wait for the release."""
        base = self._groups.get(gemm.name)
        cfg = r.m.cfg.cais
        if not self.coord or base is None or not (cfg.pre_launch_sync, cfg.pre_access_sync)[phase]:
            return
        released = Signal()
        r.m.isa.group_sync(g, base + t * _PHASES + phase, r.m.n, lambda: released.fire(r.m.sim))
        yield released


class CaisPartial(Cais):
    """CAIS without traffic control: loads and reductions share one request VC."""

    name = "cais-partial"
    ablation = True
    traffic_control = False
    vc_policy = "one"
    summary = "CAIS without traffic control (loads and reductions share one VC)"


class CaisWoCoord(Cais):
    """CAIS without merging-aware TB coordination (no group sync, no throttling)."""

    name = "cais-wo-coord"
    ablation = True
    coord = False
    summary = "CAIS without TB coordination: merge unit + fused pipeline + traffic control"
