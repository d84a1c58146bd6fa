"""LADM with a column-major tile order: the example of a scheme built by choosing a
remote-access strategy for the GEMM kernels (kernels/remote_gemm.py), not by
rewriting them.

Every GEMM launches its tiles down the columns (along M, then across N) on every
GPU, instead of CUTLASS's heuristic (a row raster wherever a GEMM has at least as
many row tiles as column tiles, as the sub-layer GEMMs of the paper's cases; where
it has fewer, both orders agree). A column's tiles cover all token rows in turn, so
the first wave of TBs reads from and reduces into every owner at once rather than
one owner at a time; the ladm notes measure this as a sensitivity (about 2.3x
faster in prefill). Everything
else is LADM: plain ``ld``/``red``, a fence behind the reductions, a barrier at
every kernel boundary.
"""

from __future__ import annotations

from cais.kernels.gemm import GemmShape
from cais.kernels.remote_gemm import RemoteAccess, tile_order
from cais.schemes.base import LayerRun
from cais.schemes.ladm import Ladm


class ColumnMajorAccess(RemoteAccess):
    """Plain ``ld``/``red`` from TBs launched in column-major tile order."""

    def tile_order(self, shape: GemmShape, token_rows: bool) -> list[tuple[int, int]]:
        return tile_order(shape, "col")


class LadmColMajor(Ladm):
    """LADM whose GEMM tiles launch in column-major order on every GPU."""

    name = "ladm-colmajor"
    family = "ablation"
    summary = "LADM with column-major tile order (tiles down M first): every owner's rows in flight at once"

    def access(self, r: LayerRun) -> RemoteAccess:
        return ColumnMajorAccess(r.m)
