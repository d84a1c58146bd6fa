"""TB-level dependencies of a fused sub-layer (paper §III-C): GEMM-RS -> LN -> AG-GEMM
with sequence parallelism, where

* GEMM1 (row-parallel) writes partial rows of [T, N1]; each output tile's epilogue
  reduces its rows into the GPUs that own them (owner ``o`` holds token rows
  ``o*rows_l ..``);
* the row-wise op (LN) runs as row-block TBs over each owner's shard: one TB per
  ``block_rows`` rows, which may start once every GPU's partial of each of its rows
  has landed (its signal word counts the bytes);
* GEMM2 reads the LN output gathered over all owners as its A rows, so a row tile of
  GEMM2 may start once the LN blocks holding its rows are done on their owners.

:func:`tb_dependencies` computes both mappings from the graph's chain and the two
GEMMs' tile shapes: (a) for each (owner, block) the GEMM1 tile rows that feed it
(the epilogue is cut at block boundaries, and the signal word expects every GPU's
partial of those rows) and (b) for each GEMM2 row tile the (owner, block) pairs it
reads.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from cais.kernels.gemm import GemmShape
from cais.workload.dataflow import GraphChain, LayerGraph

Block = tuple[int, int]  # (owner GPU, row block of its shard)


@dataclass(frozen=True)
class Feed:
    """The rows of GEMM1 row tile ``tile`` that land in row block ``block`` of
    ``owner``'s shard: rows ``row0 .. row0+rows-1`` of that shard."""

    tile: int
    owner: int
    block: int
    row0: int
    rows: int


@dataclass(frozen=True)
class TbDependencies:
    """The TB-level dependencies of one sub-layer ``chain`` on ``n`` GPUs, each owning
    ``rows_l`` token rows of the reduced [T, ``width``] tensor, cut into the LN row
    blocks ``blocks`` ((first row, rows), the same in every owner's shard).

    ``feeds[(owner, block)]``: the GEMM1 tile rows that feed the block, in tile order;
    ``reads[i]``: the (owner, block) pairs GEMM2 row tile ``i`` reads, sorted.
    ``gemm1`` and ``gemm2`` are the tile shapes they were computed for."""

    chain: str
    n: int
    rows_l: int
    width: int
    block_rows: int
    blocks: tuple[tuple[int, int], ...]
    feeds: dict[Block, tuple[Feed, ...]]
    reads: tuple[tuple[Block, ...], ...]
    gemm1: GemmShape
    gemm2: GemmShape

    def signal_bytes(self, owner: int, block: int, elem_bytes: int) -> int:
        """Bytes the LN block's signal word counts before the block may run: every
        GPU's partial (its own included) of every row fed to it, all ``width`` columns."""
        rows = sum(f.rows for f in self.feeds[(owner, block)])
        return self.n * rows * self.width * elem_bytes

    def cut(self, owner: int, row0: int, rows: int) -> list[tuple[int, int, int]]:
        """(block, first row, rows) of the pieces of ``owner``'s rows
        ``row0 .. row0+rows-1`` (one epilogue's share for that owner: the ``feeds``
        of its tile), cut at LN block boundaries."""
        return [(b, r, cnt) for _, b, r, cnt in _spans(self.rows_l, self.block_rows, owner * self.rows_l + row0, rows)]

    def waits(self, tile: int) -> tuple[Block, ...]:
        """The (owner, block) pairs GEMM2 row tile ``tile`` waits for."""
        return self.reads[tile]


def _spans(rows_l: int, block_rows: int, t0: int, nt: int) -> Iterator[tuple[int, int, int, int]]:
    """(owner, block, first row in the owner's shard, rows) of token rows t0 .. t0+nt-1,
    cut where an owner's shard or a row block ends."""
    t = t0
    while t < t0 + nt:
        owner, row = divmod(t, rows_l)
        block = row // block_rows
        stop = min(t0 + nt, owner * rows_l + min(rows_l, (block + 1) * block_rows))
        yield owner, block, row, stop - t
        t = stop


def tb_dependencies(graph: LayerGraph, chain: GraphChain, gemm1: GemmShape, gemm2: GemmShape, block_rows: int,
                    n: int) -> TbDependencies:
    """The TB-level dependencies of ``chain`` (a sequence-parallel sub-layer of
    ``graph``) on ``n`` GPUs, for GEMM1 and GEMM2 tiled as ``gemm1`` / ``gemm2`` and
    LN row blocks of ``block_rows`` rows."""
    reduced = graph.tensors[chain.reduced]
    if reduced.sharding != "rows":
        raise ValueError(f"chain {chain.name}: {reduced.name} is {reduced.sharding}, not token rows sharded over GPUs")
    rows_l, width = reduced.local
    tokens = reduced.shape[0]
    if tokens != n * rows_l:
        raise ValueError(f"chain {chain.name}: {tokens} rows of {reduced.name} are not {n} shards of {rows_l}")
    ops2 = chain.gemm2.operands
    if ops2 is None or ops2.a != chain.gathered or ops2.ta:
        raise ValueError(f"chain {chain.name}: {chain.gemm2.name} does not read {chain.gathered} as its A rows")
    for name, shape, op in (("gemm1", gemm1, chain.gemm1), ("gemm2", gemm2, chain.gemm2)):
        if (shape.m, shape.n, shape.k) != (op.m, op.n, op.k):
            raise ValueError(f"chain {chain.name}: {name} tiles a {shape.m}x{shape.n}x{shape.k} GEMM, "
                             f"{op.name} is {op.m}x{op.n}x{op.k}")
    if gemm1.n != width:
        raise ValueError(f"chain {chain.name}: {chain.gemm1.name} writes {gemm1.n} columns, {reduced.name} has {width}")
    blocks = tuple((r, min(block_rows, rows_l - r)) for r in range(0, rows_l, block_rows))
    feeds: dict[Block, list[Feed]] = {(o, b): [] for o in range(n) for b in range(len(blocks))}
    for i in range(gemm1.tiles_m):
        for owner, b, row0, rows in _spans(rows_l, block_rows, *gemm1.rows(i)):
            feeds[(owner, b)].append(Feed(i, owner, b, row0, rows))
    for (owner, b), fs in feeds.items():
        if sum(f.rows for f in fs) != blocks[b][1]:
            raise ValueError(f"chain {chain.name}: GEMM1 tiles do not cover block {b} of GPU {owner}")
    reads = tuple(tuple(sorted({(o, b) for o, b, _, _ in _spans(rows_l, block_rows, *gemm2.rows(i))}))
                  for i in range(gemm2.tiles_m))
    return TbDependencies(chain.name, n, rows_l, width, block_rows, blocks,
                          {k: tuple(v) for k, v in feeds.items()}, reads, gemm1, gemm2)
