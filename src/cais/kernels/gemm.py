"""A tiled GEMM as a grid of thread blocks: one TB per output tile, as CUTLASS and
cuBLAS kernels on Hopper do. A TB's duration comes from the calibrated compute model
and depends on how many SMs are busy when it starts; a memory floor keeps skinny
GEMMs (decode) from running faster than HBM can stream their operands.

In functional mode a TB reads its A rows and B columns from local memory when it
finishes its mainloop and hands the tile to an *epilogue*: by default a local store
(or add) into C; overlap schemes replace it (push the tile to its owner, reduce it
in the switch, ...). A TB may also wait for signals before it starts (TB-level
dependencies) and fire a signal when its epilogue has issued.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from cais.engine import Signal, TbPlan
from cais.hw.compute import ComputeModel
from cais.hw.gpu import Kernel
from cais.hw.hbm import HbmPhase
from cais.hw.memory import Memory
from cais.workload.graph import GemmOperands


@dataclass(frozen=True)
class GemmShape:
    """C[M,N] = A[M,K] @ B[K,N] on one GPU, tiled into BM x BN output tiles."""

    m: int
    n: int
    k: int
    bm: int
    bn: int
    #: CTAs sharing the tiles' K (split-K / stream-K, ComputeModel.split_units); 0: one per tile
    units: int = 0

    @property
    def tiles_m(self) -> int:
        return -(-self.m // self.bm)

    @property
    def tiles_n(self) -> int:
        return -(-self.n // self.bn)

    @property
    def tiles(self) -> int:
        return self.tiles_m * self.tiles_n

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    def rows(self, i: int) -> tuple[int, int]:
        r0 = i * self.bm
        return r0, min(self.bm, self.m - r0)

    def cols(self, j: int) -> tuple[int, int]:
        c0 = j * self.bn
        return c0, min(self.bn, self.n - c0)


def nominal_tiles(m: int, n: int) -> int:
    """Output tiles of an ``m`` x ``n`` GEMM at 128 x 128, the size a work estimate
    counts a GEMM's thread blocks by (its real tile shape depends on the SMs)."""
    return -(-m // 128) * -(-n // 128)


def gemm_shape(model: ComputeModel, m: int, n: int, k: int, sms: int) -> GemmShape:
    """The tile the model picks on ``sms`` SMs and, for less than half a wave of tiles,
    the stream-K units that share their K (ComputeModel.split_units)."""
    bm, bn = model.tile_shape(m, n, k, sms)
    tiles = -(-m // bm) * -(-n // bn)
    return GemmShape(m, n, k, bm, bn, model.split_units(tiles, k, sms))


Epilogue = Callable[[int, int, "np.ndarray | None"], None]


def tile_product(mem: Memory, ops: GemmOperands, shape: GemmShape, i: int, j: int) -> np.ndarray | None:
    """The value of output tile (i, j), computed from the operands now in ``mem``."""
    if not mem.functional:
        return None
    r0, nr = shape.rows(i)
    c0, nc = shape.cols(j)
    a = mem.matrix(ops.a, shape.m if ops.ta else shape.k)
    b = mem.matrix(ops.b, shape.k if ops.tb else shape.n)
    a_blk = a[:, r0:r0 + nr].T if ops.ta else a[r0:r0 + nr, :]
    b_blk = b[c0:c0 + nc, :].T if ops.tb else b[:, c0:c0 + nc]
    return a_blk @ b_blk


def store_epilogue(mem: Memory, ops: GemmOperands, shape: GemmShape, accumulate: bool = False) -> Epilogue:
    """Write (or add) the tile into C in local memory."""

    def epilogue(i: int, j: int, tile: np.ndarray | None) -> None:
        if tile is None:
            return
        r0, nr = shape.rows(i)
        c0, nc = shape.cols(j)
        c = mem.matrix(ops.c, shape.n)
        if accumulate:
            c[r0:r0 + nr, c0:c0 + nc] += tile
        else:
            c[r0:r0 + nr, c0:c0 + nc] = tile
    return epilogue


def raster(shape: GemmShape, order: str = "row") -> list[tuple[int, int]]:
    """Tile launch order: ``row`` (all N tiles of a row block, then the next) or
    ``col``."""
    if order == "row":
        return [(i, j) for i in range(shape.tiles_m) for j in range(shape.tiles_n)]
    if order == "col":
        return [(i, j) for j in range(shape.tiles_n) for i in range(shape.tiles_m)]
    raise ValueError(f"tile order: unknown '{order}'; valid: row, col")


class TilePhases:
    """A GEMM's tile phase (its mainloop's time alone, never below the GEMM's memory
    floor, and its HBM bytes) by how many SMs are busy when it starts, made once per
    count: the TBs of a kernel share the phase objects."""

    __slots__ = ("cm", "shape", "floor_ps", "nbytes", "overlapped", "_by_busy")

    def __init__(self, cm: ComputeModel, shape: GemmShape, floor_ps: int, nbytes: float,
                 overlapped: bool = False) -> None:
        self.cm, self.shape, self.floor_ps, self.nbytes, self.overlapped = cm, shape, floor_ps, nbytes, overlapped
        self._by_busy: dict[int, HbmPhase] = {}

    def of(self, busy: int) -> HbmPhase:
        hit = self._by_busy.get(busy)
        if hit is None:
            s = self.shape
            hit = self._by_busy[busy] = HbmPhase(max(self.floor_ps, tile_work_ps(self.cm, s, busy)),
                                                 self.nbytes, overlapped=self.overlapped)
        return hit


def tile_work_ps(cm: ComputeModel, shape: GemmShape, busy: int) -> int:
    """One output tile's compute time with ``busy`` SMs busy: over the whole K on one SM,
    or, where the GEMM is split, its units' share of K and the fix-up that reduces the
    partial sums before the tile's epilogue (ComputeModel.work_tile_ps). Every GEMM of
    every scheme is timed by this, so no scheme gets a split the others lack."""
    return cm.work_tile_ps(shape.bm, shape.bn, shape.k, shape.tiles, shape.units, busy)


def gemm_kernel(model: ComputeModel, shape: GemmShape, name: str = "gemm", sms: frozenset[int] | None = None,
                mem: Memory | None = None, ops: GemmOperands | None = None, epilogue: Epilogue | None = None,
                order: Sequence[tuple[int, int]] | None = None,
                waits: Callable[[int, int], Sequence[Signal]] | None = None,
                floor_ps: int = 0, hbm_bytes: float | None = None) -> Kernel:
    """A kernel with one TB per output tile, launched in ``order`` (default row
    raster). ``waits(i, j)`` lists signals tile (i, j) waits for before its mainloop;
    ``floor_ps`` is the least time one tile may take (memory bound). Each tile's
    mainloop is an HBM phase moving its share of the GEMM's HBM traffic
    (:func:`tile_hbm_bytes`, or ``hbm_bytes`` per tile)."""
    phases = TilePhases(model, shape, floor_ps, tile_hbm_bytes(shape) if hbm_bytes is None else hbm_bytes)
    tiles = list(order) if order is not None else raster(shape)
    if mem is not None and ops is not None and epilogue is None:
        epilogue = store_epilogue(mem, ops, shape)

    def finish(i: int, j: int) -> None:
        """The tile's epilogue, with its product in functional mode."""
        assert epilogue is not None
        tile = tile_product(mem, ops, shape, i, j) if (mem is not None and ops is not None) else None
        epilogue(i, j, tile)

    def planned(i: int, j: int, sm: int, busy: int) -> TbPlan:
        """Tile (i, j)'s TB as a plan the core executes: its waits, its mainloop (an
        HBM phase), its epilogue."""
        plan = TbPlan()
        if waits is not None:
            for sig in waits(i, j):
                plan.wait(sig)
        plan.phase(phases.of(busy))
        if epilogue is not None:
            plan.call(partial(finish, i, j))
        return plan

    # one small object per TB (a closure per TB is several, each walked by every collection)
    kernel = Kernel(name, [partial(planned, i, j) for i, j in tiles], sms, hbm_phases=True)
    if waits is not None:  # launch on ready: a tile is placed once the signals it waits for have fired
        kernel.gates = lambda: [list(waits(i, j)) for i, j in tiles]
    return kernel


def tile_hbm_bytes(shape: GemmShape, elem_bytes: int = 2, a: float = 1.0, b: float = 1.0, c: float = 1.0) -> float:
    """HBM bytes one output tile accounts for: the GEMM's compulsory traffic (A and B
    read once, C written once; the L2 serves every other reuse, as the memory floor
    assumes) spread evenly over its tiles. ``a``, ``b``, ``c``: the share of each
    operand that is in this GPU's HBM (a fused kernel loads a sharded operand from
    its owners, or sends its output to them: those bytes cross the fabric and are
    counted where they are read or land, hw/hbm.py)."""
    return elem_bytes * (a * shape.m * shape.k + b * shape.k * shape.n + c * shape.m * shape.n) / shape.tiles
