"""CAIS-SW (issue 57): software-only CAIS, the ablation that separates what CAIS's
dataflow and kernels buy from what its switch buys.

It is ``cais`` (schemes/cais.py) with everything that needs the CAIS switch taken
out, and nothing else changed:

* **Kept** (software, or NVLS): the graph-level dataflow optimizer (GEMM-RS -> LN ->
  AG-GEMM launched together as one pipeline, asymmetric SM split ``cais.split``), the
  TB-level dependencies of the pass ``opt.tb_dependencies`` (LN row blocks of 64 rows;
  an AG-GEMM tile waits for the ready flags of the blocks it reads), the
  owner-interleaved tile order and weight-gradient K start (``cais.spread``,
  ``cais.bands``), CAIS's request size (``cais.request_kB`` per load and reduction)
  and remote-read strategy (``remote_read.strategy``, the L2 setting), and the
  traffic control of the links (loads and reductions on their own VCs). The LN row
  blocks' ready flags stay NVLS ``multimem.red`` multicasts: they need only NVLS.
* **Replaced**: ``ld.cais``/``red.cais`` by the plain ``ld``/``red`` LADM issues
  (``Kind.READ_REQ``, ``Kind.RED``); the switch merges nothing, and the scheme runs on
  an NVLS-only switch (``switch = "nvls"``: ``switch.model=nvls``, and ``auto``).
* **How an owner learns that its rows are reduced.** A plain ``red`` raises no
  signal word (that count is part of ``red.cais``). In software it is FuseLib's
  counter: each GPU counts its own GEMM-RS tiles that touch each (owner, LN row block);
  the TB that finishes the last of them (its reductions out, its SM port drained)
  stores a release flag on the owner behind them (``Isa.release_flag``: one flag down
  every chip's path on the reductions' VC, so it lands after them;
  ``st.release``/``red.release`` of a counter). Its landing adds that GPU's share to
  the block's word, so the LN TB waits for the same word, N x its rows' bytes, as in
  ``cais``; the owner's own partial raises it locally as there.
* **TB coordination: none.** CAIS's pre-launch and pre-access group syncs exist to
  make every GPU's TB of a group reach the switch together, so that their requests
  merge inside a 40 KB table; TB-aware throttling holds a request's acknowledgement
  in the switch until a quorum of its merge session has arrived. Without a merge unit
  there is nothing to merge, so alignment buys nothing, and a software stand-in (an
  NVLS flag barrier per TB group, ``kernels/sync.py``) would cost a flag round trip
  per TB, twice, for no traffic saved; throttling needs the switch's per-address
  state and has no software form. An SM keeps LADM's window of plain requests
  (``collective.outstanding_bytes_per_sm``, 64 KiB, as ``cais.outstanding_kB``).

``cais-sw`` against ``cais`` is therefore what the merge unit and the coordination it
needs buy; against ``tp-nvls``, what the software side of CAIS buys on an H100 as
sold. docs/cais.md, "What each part buys", has the ladder.
"""

from __future__ import annotations

from collections import Counter
from functools import partial

import numpy as np

from cais.hw.gpu import RedForm
from cais.hw.memory import Region
from cais.hw.packets import Kind, Traffic
from cais.isa import StreamRed
from cais.kernels.gemm import GemmShape
from cais.machine import Machine
from cais.opt.tb_dependencies import TbDependencies
from cais.schemes.base import LayerRun
from cais.schemes.cais import Cais, CoordinatedAccess, Ready


class SoftwareAccess(CoordinatedAccess):
    """CAIS's GEMM accesses without the CAIS switch: plain ``ld``/``red`` in CAIS's
    owner-interleaved tile order, no group syncs, no throttling; a GEMM-RS (``deps``
    and ``block_keys`` given) signals each (owner, LN row block) with a release flag
    behind the GPU's last reduction into it (``elem_bytes``: the activation's)."""

    epilogue_hook = False

    def __init__(self, m: Machine, rows_l: int, elem_bytes: int, deps: TbDependencies | None = None,
                 block_keys: list[int] | None = None, ready: Ready | None = None) -> None:
        super().__init__(m, rows_l, False, None, deps, block_keys, ready)
        self.spreads = m.cfg.cais.spread  # the owner-interleaved order is software: kept
        self.elem_bytes = elem_bytes
        self.epilogue_hook = deps is not None and bool(block_keys)
        self._blocks: dict[int, list[tuple[int, int]]] = {}  # row tile -> the (owner, block)s it touches
        self._left: dict[int, Counter[tuple[int, int]]] = {}  # GPU -> its tiles left per (owner, block)

    def load_mode(self) -> tuple[bool, int]:
        return (False, 0)  # plain ld

    def red_form(self) -> RedForm:
        """Plain ``red``s, cut at LN row blocks as in ``cais`` (the owner's own add
        raises its blocks' words; the others' count through :meth:`epilogue_out`)."""
        return RedForm(int(Kind.RED), self.red_unit(), blocks=self._rows)

    def reductions(self, g: int, owner: int, region: Region, data: np.ndarray | None) -> list[StreamRed]:
        return [self.m.isa.red_op(owner, sub, part, self.red_unit()) for _, sub, part in self._by_block(owner, region, data)]

    def add_own(self, g: int, region: Region, data: np.ndarray | None) -> None:
        gpu = self.m.gpus[g]
        for b, sub, part in self._by_block(g, region, data):
            self.m.isa.add_local(g, sub, part)
            gpu.signal(self.block_keys[b], sub.nbytes)

    # ---- the owner's counters, in software ---------------------------------------------
    def _tile_blocks(self, shape: GemmShape, i: int) -> list[tuple[int, int]]:
        """The (owner, LN row block) pairs row tile ``i``'s partial rows fall in."""
        hit = self._blocks.get(i)
        if hit is None:
            assert self.deps is not None
            r0, nr = shape.rows(i)
            hit, t = [], r0
            while t < r0 + nr:
                owner = t // self.rows_l
                cnt = min(r0 + nr, (owner + 1) * self.rows_l) - t
                hit += [(owner, b) for b, _, _ in self.deps.cut(owner, t - owner * self.rows_l, cnt)]
                t += cnt
            self._blocks[i] = hit
        return hit

    def epilogue_out(self, g: int, shape: GemmShape, i: int, j: int) -> None:
        """GPU ``g``'s TB of tile (i, j) has its reductions out: count it off each
        (owner, block) it touched; the last of ``g``'s tiles for one stores a release
        flag on the owner, whose landing adds ``g``'s share to the block's word."""
        left = self._left.get(g)
        if left is None:
            left = self._left[g] = Counter(ob for r in range(shape.tiles_m) for ob in self._tile_blocks(shape, r)
                                           for _ in range(shape.tiles_n))
        for owner, b in self._tile_blocks(shape, i):
            if owner == g:
                continue
            left[(owner, b)] -= 1
            if left[(owner, b)] == 0:
                self.m.isa.release_flag(g, owner, Traffic.REDUCTION, partial(self._landed, owner, b))

    def _landed(self, owner: int, b: int) -> None:
        """One GPU's partial rows of ``owner``'s block ``b`` have all landed there."""
        assert self.deps is not None
        share = self.deps.signal_bytes(owner, b, self.elem_bytes) // self.m.n
        self.m.gpus[owner].signal(self.block_keys[b], share)


class CaisSw(Cais):
    """Software-only CAIS: the fused pipeline, TB-level dependencies, SM split, tile
    order and remote-read strategy of ``cais`` with plain ``ld``/``red`` on an NVLS
    switch; no merging, no TB coordination."""

    name = "cais-sw"
    family = "ablation"
    switch = "nvls"
    coord = False
    summary = ("software-only CAIS: fused GEMM-RS/LN/AG-GEMM pipeline, TB-level deps, CAIS tile order, plain "
               "ld/red on NVLS; no merging, no TB coordination")

    def access(self, r: LayerRun, group: int | None = None, deps: TbDependencies | None = None,
               block_keys: list[int] | None = None, ready: Ready | None = None) -> CoordinatedAccess:
        """Plain ``ld``/``red`` (:class:`SoftwareAccess`); no TB group (``group`` unused)."""
        return SoftwareAccess(r.m, r.d.rows_l, r.model.dtype_bytes, deps, block_keys, ready)
