"""The layer's dataflow graph (cais.workload.dataflow): the period derived from it is
the one graph.py used to build by hand, for every preset and test model, mode and
option; its invariants hold (every read is of a period input or of something written
earlier; GEMM operands have the shapes M, N, K say); chains are found."""

from __future__ import annotations

import itertools

import pytest

from cais.workload.dataflow import LayerGraph, Op, build_graph
from cais.workload.graph import Chain, build_period
from cais.workload.models import ModelSpec, list_models, load_model

from legacy_period import legacy_period
from test_schemes import GPT, LLAMA
from test_t3 import MID

TINY = [GPT, LLAMA, MID, GPT.with_run(batch=8)]
CASES = [(m, 4) for m in TINY] + [(load_model(name), 8) for name in sorted(list_models())]
OPTIONS = list(itertools.product(["train", "prefill", "decode"], [True, False], [True, False]))


def _ids(case: tuple[ModelSpec, int]) -> str:
    return f"{case[0].name}-b{case[0].batch}-n{case[1]}"


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_period_from_the_graph_is_the_hand_built_one(case: tuple[ModelSpec, int]) -> None:
    model, n = case
    built = 0
    for mode, sp, regather in OPTIONS:
        for kv_len in ([None, 96] if mode == "decode" else [None]):
            try:
                want = legacy_period(model, n, mode, sp, seed=5, regather=regather, kv_len=kv_len)
            except ValueError as e:  # a layer the legacy builder could not split
                with pytest.raises(ValueError, match=str(e)[:30]):
                    build_period(model, n, mode, sp, seed=5, regather=regather, kv_len=kv_len)
                continue
            got = build_period(model, n, mode, sp, seed=5, regather=regather, kv_len=kv_len)
            assert got == want, (mode, sp, regather)
            assert got.segments == want.segments
            assert list(got.buffers.items()) == list(want.buffers.items())  # same order too
            assert got.graph is not None
            built += 1
    assert built >= 8


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_graph_invariants(case: tuple[ModelSpec, int]) -> None:
    model, n = case
    for mode, sp, regather in OPTIONS:
        try:
            g = build_graph(model, n, mode, sp, regather=regather)
        except ValueError:
            continue
        assert g.problems() == []
        written: set[str] = set()
        inputs = set(g.inputs())
        for op in g.ops:
            for t in op.reads:
                assert t in written or t in inputs, f"{op.name} reads {t}"
            written |= set(op.writes)
            if op.kind == "gemm":  # operand shapes agree with M, N, K
                a, b, c = (g.tensors[t].local for t in (op.operands.a, op.operands.b, op.operands.c))
                assert (a[::-1] if op.operands.ta else a) == (op.m, op.k)
                assert (b[::-1] if op.operands.tb else b) == (op.k, op.n)
                assert c == (op.m, op.n)
        assert {"x1", "qkv", "wo", "w1", "w2", "wqkv_next"} <= inputs
        assert all(t in g.tensors for op in g.ops for t in op.reads + op.writes)


def test_sharding_and_global_shapes() -> None:
    g = build_graph(LLAMA, 4, "train", True)
    d = g.dims
    t = g.tensors
    assert (t["x1"].sharding, t["x1"].shape, t["x1"].local) == ("rows", (d.tokens, 256), (d.tokens // 4, 256))
    assert (t["zo_p"].sharding, t["zo_p"].local) == ("partial", (d.tokens, 256))
    assert (t["n2g"].sharding, t["n2g"].local) == ("replicated", (d.tokens, 256))
    assert t["f"].sharding == "cols" and t["f"].shape == (d.tokens, 2 * 384) and t["f"].local == (d.tokens, 192)
    # 4 kv heads over 4 GPUs: one each; q is 8 heads of 32
    assert t["qkv"].shape == (d.tokens, (8 + 8) * 32) and t["qkv"].local == (d.tokens, (2 + 2) * 32)
    assert (t["wo"].sharding, t["wo"].shape, t["wo"].local) == ("rows", (256, 256), (64, 256))
    nosp = build_graph(LLAMA, 4, "prefill", False)
    assert nosp.tensors["x2"].sharding == "replicated" and "n2g" not in nosp.tensors
    dec = build_graph(GPT.with_run(batch=8), 4, "decode", True, kv_len=40)
    assert dec.tensors["kcache"].sharding == "heads" and dec.op("attention").reads == ("qkv", "kcache", "vcache")


def test_chains_found() -> None:
    g = build_graph(GPT, 4, "train", True)
    chains = g.chains()
    assert [c.name for c in chains] == ["L1", "L2", "L4", "L3"]
    l1 = chains[0]
    assert [o.name for o in l1.ops] == ["out_proj", "L1.reduce", "dropout_add_ln2", "L1.gather", "fc1"]
    assert (l1.partial, l1.reduced, l1.feed, l1.gathered) == ("zo_p", "zo", "n2", "n2g")
    assert l1.reduce.kernel == "reducescatter" and l1.gather is not None and l1.gather.kernel == "allgather"
    l4 = g.chain("L4")
    assert (l4.feed, l4.gathered, l4.gemm2.name) == ("dzf", "dzfg", "fc2_dgrad")
    assert [o.name for o in g.producers("n1g")] == ["L2.gather", "regather_n1"]
    assert [o.name for o in g.consumers("n1g")] == ["qkv", "qkv_wgrad"]
    nosp = build_graph(GPT, 4, "train", False).chains()
    assert [(c.gather, c.reduce.kernel, c.feed, c.gathered) for c in nosp][:1] == [(None, "allreduce", "n2", "n2")]
    p = build_period(GPT, 4, "train", True)
    assert [c.name for c in p.chains] == ["L1", "L2", "L4", "L3"] and isinstance(p.segments[1], Chain)


def test_broken_graphs_are_reported() -> None:
    g = build_graph(GPT, 4, "prefill", True)
    late = LayerGraph(g.dims, g.mode, [g.ops[1], g.ops[0]] + g.ops[2:], g.tensors)  # out-proj before attention
    assert late.problems() == ["out_proj reads a before it is written"]
    bad = Op.gemm("bad", 7, 8, 9, g.op("fc1").operands, "fwd")
    broken = LayerGraph(g.dims, g.mode, g.ops + [bad], g.tensors)
    assert len(broken.problems()) == 3
    with pytest.raises(ValueError, match="undeclared"):
        g.add(Op("x", "activation", {"f": "nope"}, {"g": "g"}, "act"))
    with pytest.raises(ValueError, match="unknown kind"):
        Op("x", "softmax", {}, {})
