"""GEMM thread blocks that reach remote data themselves, with no collective kernel:
the kernels of a TP layer programmed as one NUMA GPU (LADM) and of CAIS.

* :func:`reduce_gemm` (GEMM-RS): one TB per output tile computes its partial sums
  over the GPU's K shard and its epilogue reduces each row of the tile into the GPU
  that owns that token row (the owner's own rows are added locally). The SM pushes
  the data through its store port (``sm_copy_bandwidth``) and keeps at most a
  window of reductions not yet taken, across its successive tiles: an epilogue that
  finds the window full waits (store backpressure).
* :func:`load_gemm` (AG-GEMM, and weight gradients over token-sharded activations):
  each TB loads the rows of its sharded operands from their owners as a GEMM
  mainloop does: it walks K in steps of about ``load_bytes`` and keeps at most a
  window of loads in flight (its own rows are read locally, no traffic). The tile's
  compute (never below the GEMM's memory floor) overlaps its loads: it finishes at
  max(start + compute, last load landed + the compute of one 64-wide K-slice). In
  functional mode the tile is computed from the loaded data.

How the TBs touch remote data is a :class:`RemoteAccess` strategy: plain ``ld`` /
``red`` with a fence behind the reductions (LADM), or ``ld.cais`` / ``red.cais``
into the owner's signal word (:class:`MergeableAccess`, CAIS); a scheme may refine
it with merging-aware TB coordination (pre-launch and pre-access syncs, TB-aware
throttling, the tile order, TB-level operand dependencies).

Reuse of remote data: by default TBs that need the same rows do not share what they
loaded (a mainloop streams its block through shared memory); an L2 that keeps peer
reads (``gpu.l2_keeps_peer_reads``), TMA multicast in a TB cluster or a staging
buffer lets a second request for a remote piece join the first
(:mod:`cais.kernels.remote_reuse`, ``remote_read.strategy``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

import numpy as np

from cais._core import LoadTbs, ReduceTbs, TilePlans
from cais.engine import Bound, Countdown, Signal, TbPlan
from cais.hw.compute import ComputeModel
from cais.hw.gpu import KeptLines, Kernel, LoadPlan, LoadStream, RedForm, RedPlan, RedStream
from cais.hw.memory import Memory, Region
from cais.hw.packets import Kind, Traffic
from cais.isa import Isa, SmPort, StreamItem, StreamRed
from cais.kernels.common import RequestSlots, split
from cais.kernels.gemm import GemmShape, TilePhases, raster, store_epilogue, tile_hbm_bytes, tile_product
from cais.kernels.remote_reuse import RemoteReuse
from cais.machine import Machine
from cais.workload.graph import Gather, Gemm, Period

SLICE_K = 64  # K elements per mainloop slice (a CUTLASS Hopper stage: BK = 64 bf16)


def tile_order(shape: GemmShape, how: str = "heuristic") -> list[tuple[int, int]]:
    """Tile launch order. ``heuristic``: CUTLASS's SM90 tile-scheduler rule, raster
    along M (column raster) if the GEMM has more column tiles than row tiles, else
    along N (row raster); or ``row`` / ``col``."""
    if how == "heuristic":
        how = "col" if shape.tiles_n > shape.tiles_m else "row"
    return raster(shape, how)


@dataclass(frozen=True)
class Sharded:
    """A [T, cols] activation of the single-GPU program whose token rows live on their
    owner: rows g*rows_l .. of it are rows 0.. of buffer ``shard`` on GPU g."""

    shard: str
    rows_l: int
    cols: int

    def owners(self, t0: int, nt: int) -> list[tuple[int, int, int]]:
        """(owner, first token, count) of the pieces of tokens t0 .. t0+nt-1."""
        out, t = [], t0
        while t < t0 + nt:
            owner = t // self.rows_l
            cnt = min(t0 + nt, (owner + 1) * self.rows_l) - t
            out.append((owner, t, cnt))
            t += cnt
        return out


def sharded_activations(period: Period) -> dict[str, Sharded]:
    """Gathered buffer name -> where its rows live (a chain's gather_dst, a re-gather's
    dst): the single-GPU program has one [T, h] tensor, sharded by token rows."""
    pairs = [(c.gather_dst, c.gather_src) for c in period.chains]
    pairs += [(s.dst, s.src) for s in period.segments if isinstance(s, Gather)]
    return {dst: Sharded(src, period.dims.rows_l, period.buffers[dst][1]) for dst, src in pairs if dst != src}


@dataclass(frozen=True)
class Operand:
    """A GEMM operand read from a :class:`Sharded` activation: ``which`` is ``a`` or
    ``b``; ``trans`` as in GemmOperands (A stored [K, M], B stored [N, K])."""

    which: str
    src: Sharded
    trans: bool

    @property
    def k_is_tokens(self) -> bool:
        """Whether the GEMM's K runs over the stored rows (tokens): A^T and B."""
        return (self.which == "a") == self.trans

    def side(self, shape: GemmShape) -> int:
        """Rows (A) or columns (B) of the operand a tile loads: the tile's extent, or
        the whole GEMM's where it is smaller (a decode GEMM of a few token rows)."""
        return min(shape.bm, shape.m) if self.which == "a" else min(shape.bn, shape.n)

    def tile_span(self, shape: GemmShape, i: int, j: int) -> tuple[int, int]:
        """(first, count) of the tile's rows (A) or columns (B) of the operand."""
        return shape.rows(i) if self.which == "a" else shape.cols(j)

    def physical(self, shape: GemmShape, i: int, j: int, k0: int, kk: int) -> tuple[int, int, int, int]:
        """(token0, tokens, col0, cols) of the stored [T, cols] block holding the
        operand's part for tile (i, j) and K range k0 .. k0+kk-1."""
        s0, sn = self.tile_span(shape, i, j)
        return (k0, kk, s0, sn) if self.k_is_tokens else (s0, sn, k0, kk)

    def logical(self, block: np.ndarray) -> np.ndarray:
        """The stored block as the GEMM sees it (A [M, K], B [K, N])."""
        if self.which == "a":
            return block.T if self.k_is_tokens else block
        return block if self.k_is_tokens else block.T


def remote_operands(gemm: Gemm, sharded: dict[str, Sharded]) -> list[Operand]:
    """The operands of ``gemm`` that are token-sharded activations (loaded remotely)."""
    out = []
    if gemm.ops.a in sharded:
        out.append(Operand("a", sharded[gemm.ops.a], gemm.ops.ta))
    if gemm.ops.b in sharded:
        out.append(Operand("b", sharded[gemm.ops.b], gemm.ops.tb))
    return out


#: a TB group registration as :meth:`RemoteAccess.sync_groups` gives it: (base, per TB, members)
SyncGroups = tuple[int, int, int]


class Load(NamedTuple):
    """One access of a tile's mainloop: ``region`` ([``nrows``, ``ncols``]) of operand
    ``op`` on GPU ``home``, placed at (``row``, ``col``) of the tile's stored block
    (a named tuple: a tile plans dozens, so it is cheap to make)."""

    op: int
    home: int
    region: Region
    row: int
    col: int
    nrows: int
    ncols: int


class TilePlan:
    """One tile's planned mainloop loads in functional mode (timing mode's are
    ``LoadPlan``s shared through the core's ``TilePlans``), shared by the GPUs that run
    its GEMM and by the tiles that load the same operand blocks (the same rows of A, or
    columns of B, from the same K step): each takes the plan once (``users`` counts
    those still to come; ``shared``: more than one GPU takes it). The loads are cut into
    request pieces of at most ``piece_unit`` bytes and the pieces into stripes of
    ``unit`` (``Isa.stripes``) once, for every GPU: the cut does not depend on who
    loads. With one user (mirror mode, where striping counts what it cuts) only the
    pieces that GPU loads are striped, in its order."""

    __slots__ = ("loads", "piece_unit", "unit", "users", "_shared", "_pieces", "_striped")

    def __init__(self, loads: list[Load], piece_unit: int, unit: int, users: int, shared: bool) -> None:
        self.loads = loads
        self.piece_unit = piece_unit
        self.unit = unit
        self.users = users
        self._shared = shared
        self._pieces: list[tuple[Load, Region]] | None = None
        self._striped: list[tuple[int, Region, list[tuple[Region, int]], Load]] | None = None

    def pieces(self, isa: Isa) -> list[tuple[Load, Region]]:
        """Every load's request pieces, in the plan's order."""
        if self._pieces is None:
            self._pieces = [(ld, pc) for ld in self.loads for pc in isa.pieces(ld.region, self.piece_unit)]
        return self._pieces

    def stream(self, isa: Isa, g: int, blocks: list[np.ndarray]) -> LoadPlan:
        """GPU ``g``'s remote pieces in the plan's order, as ``Isa.ld_stream`` takes
        them, each with its placer into the tile's operand ``blocks`` (functional mode;
        in timing mode ``LoadPlan.cut`` cuts the loads in the core)."""
        striped = self._striped
        if striped is None:
            striped = self._striped = [(ld.home, pc, isa.stripes(pc, self.unit), ld) for ld, pc in self.pieces(isa)
                                       if self._shared or ld.home != g]
        return LoadPlan([(home, pc, st, _placer(ld, pc, blocks)) for home, pc, st, ld in striped if home != g])


class Drain:
    """A kernel's remote reductions and its closing fence: ``done`` fires once the
    kernel has ended and a fence behind its last reductions (a probe down every path
    they took, and its write response back) has completed."""

    def __init__(self, m: Machine, g: int, kernel: Kernel) -> None:
        self.m = m
        self.g = g
        self.owners: set[int] = set()
        self.done = Signal()
        kernel.done.on_fire(lambda _v: self._close())

    def issue(self, owner: int) -> None:
        self.owners.add(owner)

    def _close(self) -> None:
        self.m.isa.fence(self.g, self.owners, Traffic.REDUCTION, lambda: self.done.fire(self.m.sim))


class RemoteAccess:
    """How a GEMM's TBs touch remote data: plain P2P ``ld`` and ``red`` (LADM), with
    a fence behind a kernel's reductions; every TB runs as soon as it is scheduled,
    in CUTLASS's tile order, its mainloop starting at the first K step.

    ``load_bytes``: about the bytes one remote load brings (whole K-slices)."""

    def __init__(self, m: Machine, load_bytes: int = 512 * 1024) -> None:
        self.m = m
        self.load_bytes = load_bytes

    # ---- sizes ----------------------------------------------------------------------
    def window(self) -> int:
        """Bytes of remote loads, or of reductions not yet taken, an SM keeps in flight."""
        return self.m.cfg.collective.outstanding_bytes_per_sm

    def red_unit(self) -> int:
        """The transfer unit of an epilogue's remote reductions."""
        return self.m.cfg.transfer_unit_bytes

    def load_unit(self, biggest: int) -> int:
        """The transfer unit of a mainloop's remote loads, whose largest is ``biggest``
        bytes (one ld = one unit)."""
        return max(self.m.cfg.transfer_unit_bytes, 1 << (biggest - 1).bit_length())

    # ---- order and coordination --------------------------------------------------
    def tile_order(self, shape: GemmShape, token_rows: bool) -> list[tuple[int, int]]:
        """Launch order of a GEMM's tiles (``token_rows``: its rows are token rows,
        sharded over the GPUs): CUTLASS's heuristic, the same on every GPU."""
        return tile_order(shape)

    def k_start(self, steps: list[tuple[int, int]], t: int) -> int:
        """The K step tile ``t`` (in launch order) starts its mainloop at: the first."""
        return 0

    def sync_groups(self) -> tuple[SyncGroups | None, SyncGroups | None]:
        """The TB groups a TB registers with before its work (phase 0) and before its
        first remote access (1), each ``(base, per TB, members)``: TB ``t`` (in launch
        order) registers with group ``base + t * per`` and waits for its release;
        None: it does not (here, at neither)."""
        return (None, None)

    def early_access(self) -> bool:
        """Whether a TB's pre-access registration goes out as it starts, its release
        waited for only before its first remote access (here: no registrations)."""
        return False

    def launch_gates(self, g: int, data: list[list[Signal]], window: int) -> list[list[Signal]]:
        """What each TB (in launch order) on GPU ``g`` waits for before it is placed on
        an SM, given its ``data`` gates (launch on ready; ``window``: the kernel's SMs):
        its data alone here (no TB-group registration before dispatch)."""
        return data

    def plan_sync(self, plan: TbPlan, g: int, t: int, phase: int) -> None:
        """What TB ``t`` (in launch order) on GPU ``g`` waits for before its work
        (``phase`` 0) or before its first remote access (1), as a step of its plan
        (:meth:`sync_groups`); with :meth:`early_access`, phase 1's registration is
        :meth:`register_early`'s."""
        sync = self.sync_groups()[phase]
        if sync is not None and not (phase == 1 and self.early_access()):
            base, per, members = sync
            self.m.isa.group_sync_step(plan, g, base + t * per, members)

    def register_early(self, g: int, t: int) -> Signal | None:
        """With :meth:`early_access`, TB ``t``'s pre-access registration on GPU ``g``,
        made now (as the TB starts): its release's signal (else None)."""
        sync = self.sync_groups()[1]
        if sync is None or not self.early_access():
            return None
        base, per, members = sync
        return self.m.isa.group_sync(g, base + t * per, members)

    def operands_ready(self, g: int, shape: GemmShape, i: int) -> list[Signal]:
        """Signals a tile of row tile ``i`` waits for before loading its operands: none
        (a kernel boundary already orders them)."""
        return []

    def rows_ready(self, g: int, owner: int, r0: int, nr: int) -> list[Signal]:
        """Signals, on GPU ``g``, that rows ``r0 .. r0+nr-1`` of ``owner``'s shard are
        ready to copy (kernels/remote_copy.py): none (a kernel boundary orders them)."""
        return []

    # ---- the accesses -------------------------------------------------------------
    def drain(self, g: int, kernel: Kernel) -> Drain | None:
        """What closes a reducing kernel on GPU ``g``: a fence behind its reductions."""
        return Drain(self.m, g, kernel)

    def add_own(self, g: int, region: Region, data: np.ndarray | None) -> None:
        """The owner's own partial rows: added to its memory in place."""
        self.m.isa.add_local(g, region, data)

    def red_form(self) -> RedForm:
        """How :meth:`reductions` go out and :meth:`add_own` counts, as the core makes a
        tile's epilogue plan in timing mode (``ReduceTbs``, ``RedPlan.tile``): plain
        ``red``s, nothing signalled."""
        return RedForm(int(Kind.RED), self.red_unit())

    def reductions(self, g: int, owner: int, region: Region, data: np.ndarray | None) -> list[StreamRed]:
        """What a piece of one epilogue's partial rows into their owner (another GPU)
        goes out as: a plain remote ``red`` (the kernel's drain fences it). Without
        data (timing mode) the answer must not depend on the issuing GPU ``g``: the
        GPUs that run a GEMM share it (``EpiloguePlan``)."""
        return [self.m.isa.red_op(owner, region, data, self.red_unit())]

    def load_mode(self) -> tuple[bool, int]:
        """How a mainloop's remote loads go out: (mergeable ``ld.cais``, its quorum);
        here plain ``ld``s."""
        return (False, 0)

    #: whether a GEMM-RS TB calls :meth:`epilogue_out` once its epilogue's reductions are
    #: out (its port drained). Such a kernel's TB plans are made in Python in timing mode
    #: too (the core's ``ReduceTbs`` has no step for it); here: no.
    epilogue_hook = False

    def epilogue_out(self, g: int, shape: GemmShape, i: int, j: int) -> None:
        """What GPU ``g``'s TB of tile (i, j) of a GEMM-RS of ``shape`` does once its
        reductions are all out (with :attr:`epilogue_hook`): nothing here; a software
        signal (a release flag behind them) in ``cais-sw``."""

    def load_stream(self, g: int, loads: LoadPlan, slots: RequestSlots, arrived: Countdown,
                    kept: KeptLines | None = None, scope: int = 0) -> LoadStream:
        """A TB's mainloop loads (a tile's :class:`LoadPlan`, less those whose home is
        ``g``), in order, as a stream to start: each goes out as :meth:`load_mode` says
        once ``slots`` have room, counted into ``arrived`` when its data is in; with
        ``kept``, a load this GPU already asked for in ``scope`` joins that one
        (``Isa.ld_stream``). The one path a TB's remote loads take in functional mode
        (``LoadTbs`` makes the same in timing mode)."""
        cais, quorum = self.load_mode()
        return self.m.isa.new_ld_stream(g, loads, slots.sm, slots.gpu, arrived, cais=cais, quorum=quorum, kept=kept,
                                        scope=scope)


class MergeableAccess(RemoteAccess):
    """CAIS's mergeable accesses (§III-A): ``ld.cais`` and ``red.cais``, which the
    merge unit of the home's switch port merges across GPUs. A reduction adds to the
    owner's signal word ``signal`` (so no fence closes the kernel); ``quorum``:
    TB-aware throttling (a request is acknowledged once that many of its session's
    requesters reached the switch; 0: at once); ``window``: bytes an SM keeps in
    flight (None: as plain accesses). One access is ``cais.request_kB``."""

    def __init__(self, m: Machine, signal: int = 0, quorum: int = 0, window: int | None = None,
                 load_bytes: int = 32 * 1024) -> None:
        super().__init__(m, load_bytes)
        self.signal = signal
        self.quorum = quorum
        self._window = window

    def window(self) -> int:
        return super().window() if self._window is None else self._window

    def red_unit(self) -> int:
        return round(self.m.cfg.cais.request_kB * 1024)

    def load_unit(self, biggest: int) -> int:
        return self.red_unit()

    def drain(self, g: int, kernel: Kernel) -> Drain | None:
        return None  # the owner counts what lands; nothing to fence

    def add_own(self, g: int, region: Region, data: np.ndarray | None) -> None:
        self.m.isa.red_cais(g, g, region, data, self.signal)  # a local add that signals

    def red_form(self) -> RedForm:
        return RedForm(int(Kind.RED_CAIS), self.red_unit(), self.signal, self.quorum)

    def reductions(self, g: int, owner: int, region: Region, data: np.ndarray | None) -> list[StreamRed]:
        return [self.m.isa.red_cais_op(owner, region, data, self.signal, self.red_unit(), self.quorum)]

    def load_mode(self) -> tuple[bool, int]:
        return (True, self.quorum)


def _plan_key(plans: dict[tuple, Any], gemm: tuple) -> object:
    """A small key for ``gemm`` (what all of a GEMM's tile plans depend on), the same
    object on every GPU that runs it: a tile's key in ``plans`` then hashes a few ints
    and this, not the GEMM's shapes and operands once per TB."""
    return plans.setdefault(("gemm",) + gemm, object())


# ---- GEMM-RS: partial rows reduced into their owner ------------------------------------
def reduce_gemm(m: Machine, cm: ComputeModel, g: int, gemm: Gemm, shape: GemmShape, floor_ps: int, eb: int,
                reduced: Sharded, access: RemoteAccess, sm_set: frozenset[int] | None = None,
                mem: Memory | None = None, plans: dict[tuple, Any] | None = None
                ) -> tuple[Kernel, Drain | None]:
    """GPU ``g``'s GEMM whose tiles' epilogues reduce their partial rows into the
    owners' ``reduced`` shards; ``mem``: the GPU's memory in functional mode;
    ``plans``: the tiles' epilogue pieces in timing mode, shared by the GPUs that run
    this GEMM (a layer's)."""
    # A and B are local; of the output only the GPU's own rows stay (the rest leaves
    # as partial sums, counted where they land)
    tile_bytes = tile_hbm_bytes(shape, eb, c=1.0 / m.n)
    kernel = Kernel(gemm.name, [], sm_set, hbm_phases=True)
    drain = access.drain(g, kernel)
    limit = access.window()
    isa = m.isa
    bound = isa.request_bound(g)
    unit = access.red_unit()
    # the SM's store window, port and request piece, across its tiles
    per_sm: dict[int, tuple[RequestSlots, SmPort, int]] = {}
    phases = TilePhases(cm, shape, floor_ps, tile_bytes)
    plans = {} if plans is None else plans
    users = 1 if m.fabric.mirror else m.n  # the GPUs that run this GEMM's programs

    order = access.tile_order(shape, True)

    def cut(owner: int, region: Region, data: np.ndarray | None, piece_unit: int
            ) -> list[tuple[int, list[StreamRed]]]:
        """A block of partial rows for ``owner`` in request pieces, each taking its own
        room, and the reductions each goes out as."""
        return [(piece.nbytes, access.reductions(g, owner, piece, isa.piece_data(data, region, piece)))
                for piece in isa.pieces(region, piece_unit)]

    def sm_state(sm: int) -> tuple[RequestSlots, SmPort, int]:
        """The SM's store window, port and request piece, made for its first tile."""
        if sm not in per_sm:
            slots = RequestSlots(Bound(m.sim, limit), bound)
            per_sm[sm] = (slots, isa.sm_port(), min(unit, slots.piece))
        return per_sm[sm]

    if mem is None and access.epilogue_hook:  # timing mode, each TB's plan made here (see epilogue_out)
        form = access.red_form()
        tiles_py: dict[tuple[int, int, int], list[Any]] = plans.setdefault(("epilogue py", access, reduced, shape, eb),
                                                                           {})

        def red_plan(i: int, j: int, piece_unit: int) -> RedPlan:
            """Tile (i, j)'s epilogue plan, made once and shared by the GPUs that run it."""
            key = (i, j, piece_unit)
            hit = tiles_py.get(key)
            if hit is None:
                hit = tiles_py[key] = [users, RedPlan.tile(m.fabric.interleave, form,
                                                           (reduced.shard, reduced.rows_l, reduced.cols),
                                                           shape.rows(i), shape.cols(j), eb, piece_unit,
                                                           None if users > 1 else g)]
            hit[0] -= 1
            if hit[0] == 0:  # every GPU running the GEMM has it: drop it (memory)
                del tiles_py[key]
            return hit[1]

        def timed(t: int, i: int, j: int, sm: int, busy: int) -> TbPlan:
            """Tile (i, j)'s TB as ``ReduceTbs`` makes it, then :meth:`RemoteAccess.epilogue_out`."""
            plan = TbPlan()
            early = access.register_early(g, t)
            access.plan_sync(plan, g, t, 0)
            plan.phase(phases.of(busy))
            access.plan_sync(plan, g, t, 1)
            if early is not None:
                plan.wait_sync(early)
            slots, port, piece_unit = sm_state(sm)
            plan.begin(isa.new_red_stream(g, red_plan(i, j, piece_unit), slots.sm, slots.gpu, port))
            plan.begin(port)
            plan.call(partial(access.epilogue_out, g, shape, i, j))
            return plan

        kernel.tbs = [partial(timed, t, i, j) for t, (i, j) in enumerate(order)]
        _gate(kernel, access, g, lambda: [[] for _ in order], m.cfg.gpu.sms)
        return kernel, drain

    if mem is None:  # timing mode: the core makes each TB's plan (ReduceTbs)
        def sm_of(sm: int) -> tuple[Bound, Bound, SmPort, int]:
            slots, port, piece_unit = sm_state(sm)
            return slots.sm, slots.gpu, port, piece_unit

        if drain is not None:  # the owners its tiles reduce into, read when the kernel has ended
            for i in sorted({i for i, _ in order}):
                for owner, _, _ in reduced.owners(*shape.rows(i)):
                    if owner != g:
                        drain.issue(owner)
        # the tiles' plans, shared by the GPUs that run this GEMM (what they depend on: the key)
        tiles = plans.setdefault(("epilogue", access, reduced, shape, eb), TilePlans())
        # a tile's epilogue plan, made in the core for the GPUs that run it (only this GPU
        # sends in mirror mode): its blocks of partial rows, one per owner, as ``red_form`` says
        factory = ReduceTbs(m.gpus[g], g, m.fabric.interleave, access.sync_groups(), phases, sm_of, tiles,
                            access.red_form(), (reduced.shard, reduced.rows_l, reduced.cols),
                            (shape.m, shape.n, shape.bm, shape.bn), eb, users, None if users > 1 else g,
                            access.early_access())
        kernel.tbs = factory.tbs(order)
        _gate(kernel, access, g, lambda: [[] for _ in order], m.cfg.gpu.sms)
        return kernel, drain

    def epilogue(i: int, j: int, slots: RequestSlots, port: SmPort, piece_unit: int) -> RedStream:
        """Tile (i, j)'s epilogue as a stream to start, in functional mode: its partial
        rows with their data, in the epilogue's order (its own rows added locally)."""
        assert mem is not None
        r0, nr = shape.rows(i)
        c0, nc = shape.cols(j)
        tile = tile_product(mem, gemm.ops, shape, i, j)
        items: list[StreamItem] = []
        for owner, t0, cnt in reduced.owners(r0, nr):
            region = Region.block(reduced.shard, reduced.cols, t0 - owner * reduced.rows_l, cnt, c0, nc, eb)
            data = tile[t0 - r0:t0 - r0 + cnt]
            if region.rows == 1:  # whole rows: a contiguous run
                data = data.reshape(-1)
            if owner == g:
                items.append(partial(access.add_own, g, region, data))
                continue
            if drain is not None:
                drain.issue(owner)
            items += cut(owner, region, data, piece_unit)
        return isa.new_red_stream(g, items, slots.sm, slots.gpu, port)

    def planned(t: int, i: int, j: int, sm: int, busy: int) -> TbPlan:
        """Tile (i, j)'s TB (the ``t``-th launched) as a plan the core executes, in
        functional mode (``ReduceTbs`` makes the same in timing mode): its syncs, its
        mainloop (an HBM phase), its epilogue's reductions, and its SM free once it has
        pushed them out."""
        plan = TbPlan()
        early = access.register_early(g, t)
        access.plan_sync(plan, g, t, 0)
        plan.phase(phases.of(busy))
        access.plan_sync(plan, g, t, 1)
        if early is not None:
            plan.wait_sync(early)
        slots, port, piece_unit = sm_state(sm)
        plan.begin(epilogue(i, j, slots, port, piece_unit))
        plan.begin(port)
        if access.epilogue_hook:
            plan.call(partial(access.epilogue_out, g, shape, i, j))
        return plan

    # one small object per TB (a closure per TB is several, each walked by every collection)
    kernel.tbs = [partial(planned, t, i, j) for t, (i, j) in enumerate(order)]
    _gate(kernel, access, g, lambda: [[] for _ in order], m.cfg.gpu.sms)
    return kernel, drain


def _gate(kernel: Kernel, access: RemoteAccess, g: int, data: Callable[[], list[list[Signal]]], sms: int) -> None:
    """Launch on ready: ``kernel``'s TBs on GPU ``g`` are placed once their ``data``
    gates and whatever ``access`` registers before dispatch (:meth:`RemoteAccess.launch_gates`)
    are in; the registrar's window is one wave of the kernel's SMs (all ``sms`` without a set)."""
    window = len(kernel.sms) if kernel.sms else sms
    kernel.gates = lambda: access.launch_gates(g, data(), window)


# ---- AG-GEMM and weight gradients: operands loaded from their owners ---------------------
def _load_layout(shape: GemmShape, ops: list[Operand], steps: list[tuple[int, int]], access: RemoteAccess,
                 reuse: RemoteReuse) -> tuple[list[tuple[int, int]], list[tuple[tuple[tuple[int, int], ...], int]],
                                              Counter[tuple[tuple[tuple[int, int], ...], int]],
                                              Counter[tuple[tuple[int, int], ...]]]:
    """A load GEMM's tiles in launch order; each TB's tile plan, (its operands' rows or
    columns, the K step its mainloop starts at: a cluster's CTAs walk K in step, each
    from where the cluster's first does); how many tiles take each plan; and how many
    plans share each span (a tile's loads are its K steps' from its first step round:
    the tiles with the same spans share them)."""
    order = reuse.launch_order(access.tile_order(shape, any(op.which == "a" and not op.k_is_tokens for op in ops)),
                               shape)
    lead = reuse.leaders(order, shape)
    wheres = [(tuple(op.tile_span(shape, i, j) for op in ops),
               access.k_start(steps, t if lead is None else lead[(i, j)])) for t, (i, j) in enumerate(order)]
    takers = Counter(wheres)
    return order, wheres, takers, Counter(span for span, _ in takers)


def load_gemm(m: Machine, cm: ComputeModel, g: int, gemm: Gemm, shape: GemmShape, floor_ps: int, eb: int,
              ops: list[Operand], access: RemoteAccess, sm_set: frozenset[int] | None = None,
              mem: Memory | None = None, plans: dict[tuple, Any] | None = None, keep: bool = False
              ) -> Kernel:
    """GPU ``g``'s GEMM whose tiles load their sharded operands ``ops`` (at least one)
    from their owners; ``mem``: the GPU's memory in functional mode; ``plans``: the
    tiles' planned loads, shared by the GPUs that run this GEMM (a layer's); ``keep``:
    the tiles write the rows they load to the gathered tensor's local copy as well
    (the remote share of each operand written to HBM once, :func:`kept_shares`)."""
    plans = {} if plans is None else plans
    users = 1 if m.fabric.mirror else m.n  # the GPUs that run this GEMM's programs, each planning each tile once
    steps = k_steps(shape, ops, eb, access.load_bytes)
    biggest = max(kk for _, kk in steps) * sum(op.side(shape) for op in ops) * eb
    unit = access.load_unit(biggest)
    limit = access.window()
    isa = m.isa
    bound = isa.request_bound(g)
    loaded = [op.which for op in ops]
    reuse = RemoteReuse.of(m.cfg, loaded)
    tile_bytes = tile_hbm_bytes(shape, eb, **kept_shares(reuse.local_shares(loaded, m.n), m.n, keep))
    store = store_epilogue(mem, gemm.ops, shape) if mem is not None else None
    # remote lines already fetched (or on their way) that later TBs of the same scope
    # (this kernel, or one TB cluster) share; keyed by (scope, home GPU, request piece)
    kept = KeptLines() if reuse.shares else None
    gemm_key = _plan_key(plans, (shape, tuple(ops), eb, access.load_bytes, unit))  # all its tiles read
    # the kernel's tiles in launch order, what each TB's loads depend on (its tile plan),
    # how many of the kernel's tiles take each plan and each span's rotations: the same
    # on every GPU that runs the GEMM with this access, worked out by the first
    layout = plans.get(("layout", gemm_key, access))
    if layout is None:
        layout = plans[("layout", gemm_key, access)] = _load_layout(shape, ops, steps, access, reuse)
    order, wheres, takers, rotations = layout

    def walked(i: int, j: int) -> list[tuple[bool, str, int, int, int, int]]:
        """Tile (i, j)'s operands as the core walks their stored blocks (``tile_loads``)."""
        return [(op.k_is_tokens, op.src.shard, op.src.rows_l, op.src.cols, *op.tile_span(shape, i, j)) for op in ops]

    def by_step(i: int, j: int) -> list[list[Load]]:
        """Tile (i, j)'s loads, step by step in K order: each operand's stored block of
        the step on its owners (the block split where an owner's rows end)."""
        return [[Load(*ld) for ld in step] for step in LoadPlan.tile_loads(walked(i, j), steps, eb)]

    def rotated(i: int, j: int, span: tuple[tuple[int, int], ...], first: int, cut: bool) -> list[Any]:
        """Tile (i, j)'s steps from step ``first`` round, each a list of loads, or with
        ``cut`` a :class:`LoadPlan` (timing mode): made once for the plans with these
        spans."""
        key = (gemm_key, span, cut)
        hit = plans.get(key)
        if hit is None:
            per_step: list[Any]
            if cut:  # each step's loads cut into pieces and trains in the core
                skip = None if users > 1 else g  # in mirror mode only this GPU's are issued
                per_step = LoadPlan.cut_steps(m.fabric.interleave, walked(i, j), steps, eb, piece_unit, unit, skip)
            else:
                per_step = by_step(i, j)
            hit = plans[key] = [rotations[span], per_step]
        hit[0] -= 1
        if hit[0] == 0:  # every plan with these spans is made: drop it (memory)
            del plans[key]
        return hit[1][first:] + hit[1][:first]

    def plan(i: int, j: int, span: tuple[tuple[int, int], ...], first: int) -> list[Load]:
        return [ld for step in rotated(i, j, span, first, False) for ld in step]

    def tile_plan(i: int, j: int, t: int, piece_unit: int) -> TilePlan:
        """Tile (i, j)'s plan (the ``t``-th launched) with request pieces of at most
        ``piece_unit`` bytes, for every home: the same on every GPU and for every tile
        with the same operand spans and first K step, so they share it through
        ``plans``."""
        where = wheres[t]
        key = (gemm_key, where, piece_unit)
        hit = plans.get(key)
        if hit is None:
            hit = plans[key] = TilePlan(plan(i, j, *where), piece_unit, unit, users * takers[where], users > 1)
        hit.users -= 1
        if hit.users == 0:  # every GPU running the GEMM has it: drop it (memory)
            del plans[key]
        return hit

    phases = TilePhases(cm, shape, floor_ps, tile_bytes, overlapped=True)
    piece_unit = min(unit, limit, bound.limit)  # the largest request a TB's slots admit, cut to the unit
    if mem is None:  # timing mode: the core makes each TB's plan (LoadTbs)
        # a tile plan's key: a small int, the same on every GPU that runs the GEMM
        ids: dict[tuple, int] = plans.setdefault(("load plan ids", gemm_key, piece_unit), {})
        keys = [ids.setdefault(where, len(ids)) for where in wheres]
        some = {key: (i, j, where) for key, (i, j), where in zip(keys, order, wheres)}  # a tile that takes it

        def built(key: int, _b: int, _c: int) -> tuple[LoadPlan, int]:
            """Tile plan ``key``'s loads, for every home, and how many TBs take it."""
            i, j, where = some[key]
            return LoadPlan.chain(rotated(i, j, *where, True)), users * takers[where]

        cais, quorum = access.load_mode()
        kind, assemble = isa.ld_stream_form(cais)
        factory = LoadTbs(m.gpus[g], g, m.fabric.interleave, access.sync_groups(),
                          partial(access.operands_ready, g, shape), phases, limit, bound, kind, quorum, assemble, kept,
                          plans.setdefault(("load plans", gemm_key, piece_unit), TilePlans()), built,
                          (SLICE_K, shape.k), access.early_access())
        scopes = [reuse.scope(tile, shape) for tile in order] if kept is not None else [0] * len(order)
        kernel = Kernel(gemm.name, factory.tbs([i for i, _ in order], keys, scopes), sm_set, hbm_phases=True)
        _gate(kernel, access, g, partial(_operand_gates, access, g, shape, order), m.cfg.gpu.sms)
        return kernel

    def planned(t: int, i: int, j: int, sm: int, busy: int) -> TbPlan:
        """Tile (i, j)'s TB (the ``t``-th launched) as a plan the core executes, in
        functional mode (``LoadTbs`` makes the same in timing mode): its sync, the
        operands it waits for, its mainloop (an HBM phase it times itself), its own rows
        read, its remote loads placed as they land, the compute left after the last,
        and the tile computed and stored."""
        assert mem is not None and store is not None
        plan = TbPlan()
        early = access.register_early(g, t)
        access.plan_sync(plan, g, t, 0)
        for ready in access.operands_ready(g, shape, i):
            plan.wait(ready)
        plan.mark()
        plan.phase(phases.of(busy))  # the mainloop's time, stretched by the HBM share at its start
        slots = RequestSlots(Bound(m.sim, limit), bound)
        tp = tile_plan(i, j, t, piece_unit)
        access.plan_sync(plan, g, t, 1)
        if early is not None:
            plan.wait_sync(early)
        blocks = _blocks(shape, ops, i, j)
        plan.call(partial(_read_own, mem, g, tp.loads, blocks))
        # the core issues them in order, under the TB's slots; where a load may join
        # another TB's of its scope (an L2 that keeps peer reads, a TMA multicast to
        # the cluster, a staged block), one this GPU already asked for is joined
        remote = tp.stream(isa, g, blocks)
        loads = remote.loads(g)
        arrived = Countdown(loads)
        scope = reuse.scope((i, j), shape) if kept is not None else 0
        plan.begin(access.load_stream(g, remote, slots, arrived, kept, scope))
        if loads:
            plan.wait(arrived)
        # the mainloop computes each K-slice once it has landed: after the last
        # load, one slice of compute remains
        plan.rest(SLICE_K if loads else 0, shape.k)
        if keep:
            plan.call(partial(_keep_copy, mem, gemm, shape, ops, blocks, i, j))
        plan.call(partial(_store_tile, store, mem, gemm, shape, ops, blocks, i, j))
        return plan

    kernel = Kernel(gemm.name, [partial(planned, t, i, j) for t, (i, j) in enumerate(order)], sm_set, hbm_phases=True)
    _gate(kernel, access, g, partial(_operand_gates, access, g, shape, order), m.cfg.gpu.sms)
    return kernel


def _operand_gates(access: RemoteAccess, g: int, shape: GemmShape, order: list[tuple[int, int]]) -> list[list[Signal]]:
    """What each TB of a remote-loading GEMM on ``g`` (tiles in ``order``) waits for
    before its first step: the ready flags of the operand blocks its row tile reads
    (its gates, launch on ready)."""
    by_row: dict[int, list[Signal]] = {}
    out = []
    for i, _ in order:
        if i not in by_row:
            by_row[i] = access.operands_ready(g, shape, i)
        out.append(by_row[i])
    return out


def k_steps(shape: GemmShape, ops: list[Operand], eb: int, load_bytes: int) -> list[tuple[int, int]]:
    """(k0, count) of the K ranges one ld each (per owner) brings in: whole K-slices of
    about ``load_bytes``; where K runs over tokens (weight gradients), each owner's
    shard is cut into equal steps so that no ld straddles two owners."""
    side = sum(op.side(shape) for op in ops) * eb  # bytes per K element of the loaded operands
    if any(op.k_is_tokens for op in ops):
        rows_l, steps = ops[0].src.rows_l, []
        for s0 in range(0, shape.k, rows_l):
            n = min(rows_l, shape.k - s0)
            parts = max(1, round(n * side / load_bytes))
            steps += [(s0 + a, c) for a, c in split(0, n, parts) if c > 0]
        return steps
    step = max(1, load_bytes // (side * SLICE_K)) * SLICE_K
    return [(k0, min(step, shape.k - k0)) for k0 in range(0, shape.k, step)]



def _placer(ld: Load, piece: Region, blocks: list[np.ndarray]) -> Callable[[np.ndarray | None], None]:
    """Where a load's data goes (functional mode)."""

    def placed(data: np.ndarray | None) -> None:
        if data is not None:
            _place(blocks, ld, piece, data)
    return placed




def _read_own(mem: Memory, g: int, loads: list[Load], blocks: list[np.ndarray]) -> None:
    """A TB's loads whose home is its own GPU ``g``: read locally into the blocks."""
    for ld in loads:
        if ld.home == g:
            _place(blocks, ld, ld.region, mem.read(ld.region))


def kept_shares(shares: dict[str, float], n: int, keep: bool) -> dict[str, float]:
    """The loaded operands' shares of a tile's HBM traffic (``RemoteReuse.local_shares``)
    when the GEMM also keeps a local copy of what it loads: at least its own rows read
    and every other GPU's written once (a staging buffer already is that copy)."""
    return {w: max(s, 1.0) for w, s in shares.items()} if keep else shares


def _keep_copy(mem: Memory, gemm: Gemm, shape: GemmShape, ops: list[Operand], blocks: list[np.ndarray],
               i: int, j: int) -> None:
    """Tile (i, j)'s loaded blocks written to their gathered tensors' local copies."""
    for op, blk in zip(ops, blocks):
        t0, nt, c0, nc = op.physical(shape, i, j, 0, shape.k)
        name = gemm.ops.a if op.which == "a" else gemm.ops.b
        mem.matrix(name, op.src.cols)[t0:t0 + nt, c0:c0 + nc] = blk


def _store_tile(store: Callable[[int, int, np.ndarray], None], mem: Memory, gemm: Gemm, shape: GemmShape,
                ops: list[Operand], blocks: list[np.ndarray], i: int, j: int) -> None:
    """Tile (i, j) computed from its loaded blocks, stored by the GEMM's epilogue."""
    store(i, j, _tile(mem, gemm, shape, ops, blocks, i, j))


def _blocks(shape: GemmShape, ops: list[Operand], i: int, j: int) -> list[np.ndarray]:
    """Empty stored blocks of each loaded operand for tile (i, j)."""
    out = []
    for op in ops:
        _, nt, _, ncol = op.physical(shape, i, j, 0, shape.k)
        out.append(np.zeros((nt, ncol)))
    return out


def _place(blocks: list[np.ndarray], ld: Load, piece: Region, data: np.ndarray) -> None:
    """Put the data of ``piece`` (of ``ld.region``) where the load's block goes."""
    view = blocks[ld.op][ld.row:ld.row + ld.nrows, ld.col:ld.col + ld.ncols]
    if ld.region.rows > 1:  # a block: the piece is some of its rows
        first = (piece.start - ld.region.start) // ld.region.stride
        view[first:first + piece.rows] = np.reshape(data, (piece.rows, ld.ncols))
    else:  # a run over the block's rows (whole rows, or part of one)
        off = piece.start - ld.region.start
        flat = view.reshape(-1).copy()
        flat[off:off + piece.count] = np.reshape(data, -1)
        view[...] = flat.reshape(view.shape)


def _tile(mem: Memory, gemm: Gemm, shape: GemmShape, ops: list[Operand], blocks: list[np.ndarray] | None,
          i: int, j: int) -> np.ndarray | None:
    """The tile computed from the loaded blocks (and local operands)."""
    if blocks is None:
        return None
    r0, nr = shape.rows(i)
    c0, nc = shape.cols(j)
    got = {op.which: op.logical(blk) for op, blk in zip(ops, blocks)}
    if "a" in got:
        a_blk = got["a"]
    else:
        a = mem.matrix(gemm.ops.a, shape.m if gemm.ops.ta else shape.k)
        a_blk = a[:, r0:r0 + nr].T if gemm.ops.ta else a[r0:r0 + nr, :]
    if "b" in got:
        b_blk = got["b"]
    else:
        b = mem.matrix(gemm.ops.b, shape.k if gemm.ops.tb else shape.n)
        b_blk = b[c0:c0 + nc, :].T if gemm.ops.tb else b[:, c0:c0 + nc]
    return a_blk @ b_blk
