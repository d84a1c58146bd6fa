"""Merging-aware TB scheduling (paper §III-B.1, part of the compiler-guided TB
grouping): the order in which the coordinated schemes launch the tiles of a
sequence-parallel sub-layer's GEMMs, so that the TB groups running at any moment
spread their mergeable requests over every home GPU.

Why. The TBs with the same launch index on every GPU form one TB group and touch the
same addresses, so the requests one GPU keeps outstanding are, with coordination,
the requests every GPU does: the merge table a switch port needs is one GPU's
outstanding requests for the GPU behind that port. The paper's 40 KB per port
(1,280 KB per GPU over 32 ports) assumes those requests spread over all the homes.
CUTLASS's row raster, the same on every GPU, does the opposite: the running tiles of
GEMM-RS all reduce into one or two row owners, and those of AG-GEMM all load from one
or two, so one port per chip holds nearly all sessions.

What. Row tiles are taken in *owner-interleaved* order: the first row tile of every
owner's shard, then the second of every owner's, and so on; they are launched in
bands of ``n`` such row tiles (one per owner), column by column inside a band (a
swizzle as wide as the GPU count). The running TBs then cover every owner, and each
owner's first rows are finished first, which is what the fused pipeline needs: the
LN row blocks (which run in row order on each owner) become ready in the same order
on every owner, and the AG-GEMM reads them in that order. A weight-gradient GEMM,
whose K runs over the token rows, starts tile ``t``'s mainloop at owner ``t mod n``
instead of owner 0 (:func:`k_start_owner`).

How wide a band. One row tile per owner spreads the homes best, but the fused chain
can only start on a band once the GEMM-RS has finished all of it: the LN row blocks
need every GPU's partial sums of their rows, and an AG-GEMM tile needs its LN rows.
Where a GEMM has no more row tiles than GPUs (weak scaling: 3,072 tokens are 24 row
tiles, fewer than 32 GPUs; an owner's 96 rows are less than one tile), bands of ``n``
are one band, the whole GEMM-RS, and nothing downstream starts before it ends: on
LLaMA-7B at 32 GPUs an FC1 TB held its SM for up to 909 us, against 85 us
for the median one. So a band is also at most ``1/bands`` of the row tiles
(``cais.bands``, default 2), which leaves every GEMM of at least ``2n`` row tiles (the
Table I layers on 8 GPUs) as it was (docs/cais.md, "How wide a band").

The same order on every GPU keeps TB groups aligned: group ``t`` is one tile, every
GPU's copy of it.
"""

from __future__ import annotations

from cais.kernels.gemm import GemmShape


def owner_interleaved_order(shape: GemmShape, rows_l: int, n: int, bands: int = 1) -> list[tuple[int, int]]:
    """Tile launch order of a GEMM whose rows are token rows owned ``rows_l`` to a GPU
    (owner ``o`` holds rows ``o*rows_l ..``): row tiles by (place in their owner's
    shard, owner), launched in bands of :func:`band_rows` row tiles, column-major in a
    band."""
    def key(i: int) -> tuple[int, int]:
        owner, row = divmod(shape.rows(i)[0], rows_l)
        return row, owner

    rows = sorted(range(shape.tiles_m), key=key)
    width = band_rows(shape.tiles_m, n, bands)
    order = []
    for b in range(0, len(rows), width):
        band = rows[b:b + width]
        order += [(i, j) for j in range(shape.tiles_n) for i in band]
    return order


def band_rows(tiles_m: int, n: int, bands: int) -> int:
    """Row tiles per band: one per GPU (``n``), but no more than makes ``bands`` bands of
    the ``tiles_m`` row tiles (``cais.bands``), and at least one."""
    return max(1, min(n, -(-tiles_m // bands)))


def k_start_owner(t: int, n: int) -> int:
    """The owner whose token rows tile ``t`` (in launch order) of a GEMM with K over
    the tokens loads first: launch-order neighbours start at different owners."""
    return t % n
