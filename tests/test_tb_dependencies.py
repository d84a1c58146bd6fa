"""The TB-level dependency pass (cais.opt.tb_dependencies) on hand-computed cases, and
against the closed forms the CAIS scheme used before the pass existed."""

from __future__ import annotations

import pytest

from cais.kernels.gemm import GemmShape
from cais.opt.tb_dependencies import Feed, tb_dependencies
from cais.workload.dataflow import LayerGraph, build_graph
from cais.workload.models import ModelSpec


def _model(rows_l: int, n: int) -> ModelSpec:
    """A model whose prefill has ``rows_l`` token rows per GPU on ``n`` GPUs."""
    return ModelSpec(name="t", family="gpt", hidden=128, ffn_hidden=256, heads=n, layers=1, gated_mlp=False,
                     norm="layernorm", activation="gelu", seq=rows_l, batch=n)


def _shapes(g: LayerGraph, chain: str, bm1: int, bm2: int) -> tuple[GemmShape, GemmShape]:
    c = g.chain(chain)
    return (GemmShape(c.gemm1.m, c.gemm1.n, c.gemm1.k, bm1, 128),
            GemmShape(c.gemm2.m, c.gemm2.n, c.gemm2.k, bm2, 128))


def test_tiles_across_an_owner_boundary() -> None:
    """rows_l = 96 on 2 GPUs, 128-row tiles, 64-row blocks: blocks (0, 64), (64, 32) per
    owner. Tile 0 (tokens 0..127) covers all of GPU 0 and rows 0..31 of GPU 1; tile 1
    (tokens 128..191) rows 32..95 of GPU 1."""
    g = build_graph(_model(96, 2), 2, "prefill", True)
    s1, s2 = _shapes(g, "L1", 128, 128)
    d = tb_dependencies(g, g.chain("L1"), s1, s2, 64, 2)
    assert (d.rows_l, d.width, d.blocks) == (96, 128, ((0, 64), (64, 32)))
    assert d.feeds == {(0, 0): (Feed(0, 0, 0, 0, 64),), (0, 1): (Feed(0, 0, 1, 64, 32),),
                       (1, 0): (Feed(0, 1, 0, 0, 32), Feed(1, 1, 0, 32, 32)), (1, 1): (Feed(1, 1, 1, 64, 32),)}
    assert d.reads == (((0, 0), (0, 1), (1, 0)), ((1, 0), (1, 1)))
    assert d.waits(1) == ((1, 0), (1, 1))
    # every GPU's partial (2 of them) of every row, 128 columns of 2 bytes
    assert [d.signal_bytes(o, b, 2) for o in range(2) for b in range(2)] == [2 * r * 128 * 2 for r in (64, 32, 64, 32)]
    # an epilogue's share of an owner, cut at block boundaries = its tile's feeds
    assert d.cut(0, 0, 96) == [(0, 0, 64), (1, 64, 32)]
    assert d.cut(1, 0, 32) == [(0, 0, 32)]
    assert d.cut(1, 32, 64) == [(0, 32, 32), (1, 64, 32)]


def test_small_tiles_and_a_short_shard() -> None:
    """64-row GEMM2 tiles read one or two blocks (the owner boundary at token 96 is not
    a block boundary); rows_l = 40 < 64: one block per owner."""
    g = build_graph(_model(96, 2), 2, "prefill", True)
    s1, s2 = _shapes(g, "L2", 256, 64)
    d = tb_dependencies(g, g.chain("L2"), s1, s2, 64, 2)
    # tokens 0..63; 64..95 of GPU 0 and 0..31 of GPU 1; 32..95 of GPU 1
    assert d.reads == (((0, 0),), ((0, 1), (1, 0)), ((1, 0), (1, 1)))
    assert d.feeds[(1, 1)] == (Feed(0, 1, 1, 64, 32),)  # one 256-row tile holds everything
    g = build_graph(_model(40, 4), 4, "prefill", True)
    s1, s2 = _shapes(g, "L1", 128, 128)
    d = tb_dependencies(g, g.chain("L1"), s1, s2, 64, 4)
    assert d.blocks == ((0, 40),)
    assert d.reads == (((0, 0), (1, 0), (2, 0), (3, 0)), ((3, 0),))  # tokens 0..127, 128..159
    assert d.feeds[(3, 0)] == (Feed(0, 3, 0, 0, 8), Feed(1, 3, 0, 8, 32))


@pytest.mark.parametrize("rows_l,n", [(96, 2), (40, 4), (256, 4), (200, 8), (64, 8)])
@pytest.mark.parametrize("bm", [64, 128, 256])
def test_matches_the_closed_forms(rows_l: int, n: int, bm: int) -> None:
    """What schemes/cais.py computed by hand: a tile waits for the blocks of each of its
    rows; a block expects n x rows x width x bytes; an epilogue is cut every ``per``
    owner-local rows (per = the first block's rows)."""
    g = build_graph(_model(rows_l, n), n, "train", True)
    for chain in ("L1", "L2", "L3", "L4"):
        s1, s2 = _shapes(g, chain, bm, 128 if bm == 256 else 256)
        d = tb_dependencies(g, g.chain(chain), s1, s2, 64, n)
        per = d.blocks[0][1]
        for i in range(s2.tiles_m):
            r0, nr = s2.rows(i)
            assert list(d.reads[i]) == sorted({(t // rows_l, t % rows_l // per) for t in range(r0, r0 + nr)})
        for b, (_, nr) in enumerate(d.blocks):
            assert d.signal_bytes(n - 1, b, 2) == n * s1.n * 2 * nr
        for i in range(s1.tiles_m):  # the pass's cut of each (tile, owner) piece is the old loop's
            r0, nr = s1.rows(i)
            for owner in range(r0 // rows_l, (r0 + nr - 1) // rows_l + 1):
                lo, hi = max(r0, owner * rows_l) - owner * rows_l, min(r0 + nr, (owner + 1) * rows_l) - owner * rows_l
                old, t = [], lo
                while t < hi:
                    stop = min(hi, (t // per + 1) * per)
                    old.append((t // per, t, stop - t))
                    t = stop
                assert d.cut(owner, lo, hi - lo) == old
                assert old == [(f.block, f.row0, f.rows) for fs in d.feeds.values() for f in fs
                               if f.tile == i and f.owner == owner]


def test_rejects_what_it_does_not_model() -> None:
    nosp = build_graph(_model(96, 2), 2, "prefill", False)
    s1, s2 = _shapes(nosp, "L1", 128, 128)
    with pytest.raises(ValueError, match="not token rows"):
        tb_dependencies(nosp, nosp.chain("L1"), s1, s2, 64, 2)
    g = build_graph(_model(96, 2), 2, "prefill", True)
    s1, s2 = _shapes(g, "L1", 128, 128)
    with pytest.raises(ValueError, match="shards"):
        tb_dependencies(g, g.chain("L1"), s1, s2, 64, 4)
    with pytest.raises(ValueError, match="tiles a"):
        tb_dependencies(g, g.chain("L1"), s2, s2, 64, 2)


def test_fusion_absorbs_the_collectives_and_the_split_follows_the_gemm_times() -> None:
    from cais.opt.fusion import asymmetric_split, fuse
    from cais.workload.graph import build_period
    from cais.workload.models import load_model

    period = build_period(load_model("paper-llama-7b"), 8, "prefill", True, 0, True)
    plan = fuse(period.graph.chain("L1"))
    assert [op.kind for op in plan.kernels] == ["gemm", "rowop", "gemm"]
    assert [op.kind for op in plan.absorbed] == ["reduce", "gather"]
    rs, ag = asymmetric_split(100, 300, 66, "work")
    assert (len(rs), len(ag)) == (16, 50) and not rs & ag  # 66 x 1/4 = 16.5 -> 16
    assert len(asymmetric_split(1, 10**9, 66, "work")[0]) == 1  # each group keeps an SM
    assert len(asymmetric_split(5, 5, 66, 0.25)[0]) == 16
