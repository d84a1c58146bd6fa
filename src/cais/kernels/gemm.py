"""A tiled GEMM as a grid of thread blocks: one TB per output tile, as CUTLASS and
cuBLAS kernels on Hopper do. A TB's duration comes from the calibrated compute model
and depends on how many SMs are busy when it starts."""

from __future__ import annotations

from dataclasses import dataclass

from cais.engine.sim import ProgramGen
from cais.hw.compute import ComputeModel
from cais.hw.gpu import Kernel, TbProgram


@dataclass(frozen=True)
class GemmShape:
    """C[M,N] = A[M,K] @ B[K,N] on one GPU, tiled into BM x BN output tiles."""

    m: int
    n: int
    k: int
    bm: int
    bn: int

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


def gemm_shape(model: ComputeModel, m: int, n: int, k: int, sms: int) -> GemmShape:
    bm, bn = model.tile_shape(m, n, k, sms)
    return GemmShape(m, n, k, bm, bn)


def gemm_kernel(model: ComputeModel, shape: GemmShape, name: str = "gemm",
                sms: frozenset[int] | None = None) -> Kernel:
    """A kernel with one TB per output tile, in row-major raster order."""

    def tile(sm: int, busy: int) -> ProgramGen:
        yield model.tile_time_ps(shape.bm, shape.bn, shape.k, busy)

    tbs: list[TbProgram] = [tile] * shape.tiles
    return Kernel(name, tbs, sms)
