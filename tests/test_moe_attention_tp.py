"""Attention TP groups smaller than the GPUs in MoE layers under ``cais run`` (docs/moe.md,
"Attention TP groups"): the flag through the CLI, LayerSpec and the sweep; N = GPUs is
``tp`` and N = 1 is ``dp`` exactly; the groups' collectives run within each group (the
rings the run built, and real data through them); the decode tail split over the group;
the functional expert block with groups; the refusals, one line each; the docs table."""

from __future__ import annotations

import importlib
import json
from typing import Any

import numpy as np
import pytest

from cais.config import load_system
from cais.errors import UserError
from cais.experiments.layer import moe_period, run_layer
from cais.experiments.spec import LayerSpec
from cais.hw.compute import ComputeModel
from cais.kernels import collectives
from cais.kernels.collectives import build
from cais.machine import Machine
from cais.schemes import get_scheme
from cais.schemes.base import LayerRun
from cais.sweep.point import check_points, prepare, run_point
from cais.workload.moe import load_moe_model
from cais.workload.moe_dataflow import attention_model, build_moe_period

TINY = {"name": "tiny-moe", "family": "test", "hidden": 128, "heads": 8, "kv_heads": 8, "head_dim": 16, "layers": 2,
        "dense_ffn_hidden": 256, "experts": 16, "topk": 4, "expert_ffn_hidden": 64, "shared_experts": 1,
        "n_group": 4, "topk_group": 2, "seq": 24, "batch": 2}
GROUPS_OF_2 = ((0, 1), (2, 3), (4, 5), (6, 7))


def small(name: str = "mixtral-8x7b"):
    """A MoE preset with a short prompt: 64 tokens (2 sequences of 32)."""
    return load_moe_model(name, seq=32, batch=2)


def _same(a: Any, b: Any) -> dict[str, Any]:
    """The --json fields of two results that differ (their wall times aside)."""
    x, y = a.as_json(), b.as_json()
    return {k: (x.get(k), y.get(k)) for k in set(x) | set(y) if k != "wall_s" and x.get(k) != y.get(k)}


@pytest.mark.parametrize("mode", ["prefill", "decode", "train"])
def test_n_equal_to_the_gpus_is_tp_and_one_is_dp_exactly(mode: str) -> None:
    cfg, mm = load_system("dgx-h100"), small()
    tp, dp = run_layer(cfg, mm, "ep-deepep", mode), run_layer(cfg, mm, "ep-deepep", mode, attention="dp")
    assert _same(tp, run_layer(cfg, mm, "ep-deepep", mode, attention_tp=8)) == {}
    assert _same(dp, run_layer(cfg, mm, "ep-deepep", mode, attention_tp=1)) == {}
    assert _same(dp, run_layer(cfg, mm, "ep-deepep", mode, attention="dp", attention_tp=1)) == {}
    assert tp.moe is not None and dp.moe is not None
    assert (tp.moe["attention"], tp.moe["attention_tp"], dp.moe["attention"], dp.moe["attention_tp"]) == \
        ("tp", 8, "dp", 1)
    groups = run_layer(cfg, mm, "ep-deepep", mode, attention_tp=4)  # the path under test is another run
    assert groups.moe is not None and groups.moe["attention_tp"] == 4
    assert groups.total_us not in (tp.total_us, dp.total_us)
    if mode != "decode":  # each GPU routes its T / 4 rows of its group's 64 tokens
        assert (tp.moe["tokens_per_rank"], groups.moe["tokens_per_rank"], dp.moe["tokens_per_rank"]) == (8, 16, 64)


def _rings_built(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, tuple[int, ...]]]:
    """Record (op, send buffer, ring) of every ring TB the run builds."""
    seen: list[tuple[str, str, tuple[int, ...]]] = []
    real = collectives._ring_tb

    def spy(m, spec, ring, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append((spec.op, spec.send, tuple(ring)))
        return real(m, spec, ring, *args, **kwargs)
    monkeypatch.setattr(collectives, "_ring_tb", spy)
    return seen


@pytest.mark.parametrize("mode", ["prefill", "train"])
def test_the_groups_collectives_run_within_each_group(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's attention ReduceScatters and AllGathers are rings over each pair of
    GPUs, and only those: the participants of every ring built are one group."""
    seen = _rings_built(monkeypatch)
    r = run_layer(load_system("dgx-h100"), small(), "ep-nccl", mode, attention_tp=2)
    attention = [(op, send, ring) for op, send, ring in seen if send in ("zo_p", "n1", "dn1_p", "dzo")]
    ops = {op for op, _, _ in attention}
    assert ops == {"reducescatter", "allgather"}
    assert {ring for _, _, ring in attention} == set(GROUPS_OF_2)
    assert sum(r.collectives_ran.values()) == (4 if mode == "train" else 2)
    assert all(key.startswith("ring/") for key in r.collectives_ran)


def test_without_groups_the_ring_spans_every_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The spy can tell: under ``tp`` (NCCL's ring at this size) the ring is all 8 GPUs."""
    seen = _rings_built(monkeypatch)
    r = run_layer(load_system("dgx-h100"), small(), "ep-nccl", "prefill")
    assert "ring/ll" in r.collectives_ran or "ring/simple" in r.collectives_ran
    assert {ring for _, send, ring in seen if send in ("zo_p", "n1")} == {tuple(range(8))}


def test_a_groups_reduce_scatter_sums_its_own_gpus_only() -> None:
    """Real data through the scheme's group collective: each GPU's shard is the sum of
    its pair's inputs, not of every GPU's."""
    cfg, mm = load_system("dgx-h100"), small()
    sch = get_scheme("ep-nccl")
    # the module's class as it is now: tests/test_moe_layer.py reloads cais.schemes.ep, so a class imported
    # when this file was collected can be an older one than the scheme's
    assert isinstance(sch, importlib.import_module("cais.schemes.ep").EpScheme)
    period = moe_period(cfg, mm, "prefill", "tp", 0, attention_tp=2)
    m = Machine(cfg, functional=True)
    run = LayerRun(m, attention_model(mm), period, ComputeModel.for_gpu(cfg.gpu))
    spec = sch.attention_group_spec(run, "reducescatter", "x", "y")
    assert spec is not None and spec.groups == GROUPS_OF_2 and spec.algo == "ring"
    n = 256  # a small buffer through the same spec: its rings and protocol
    spec = type(spec)(**{**spec.__dict__, "count": n})
    for g in range(8):
        m.gpus[g].memory.alloc("x", n, fill=np.full(n, float(g + 1)))
        m.gpus[g].memory.alloc("y", n // 2)
    for gpu, k in zip(m.gpus, build(m, spec)):
        gpu.launch(k, m.launch_ps)
    m.run()
    for g in range(8):
        first = g - g % 2
        assert m.gpus[g].memory.buffers["y"].tolist() == [float(2 * first + 3)] * (n // 2)
    assert sch.attention_group_spec(LayerRun(m, attention_model(mm), moe_period(cfg, mm, "prefill", "tp", 0),
                                             ComputeModel.for_gpu(cfg.gpu)), "reducescatter", "x", "y") is None


def test_the_period_is_the_groups() -> None:
    """Each GPU routes T / N of its group's tokens; the period carries N."""
    mm = small()
    for n, rows in ((8, 8), (4, 16), (2, 32), (1, 64)):
        period = build_moe_period(mm, 8, "prefill", attention_tp=n)
        assert period.attention_tp == n and period.routing is not None and period.routing.tokens == rows
        assert period.dims.n == n and period.dims.sp == (n > 1)


def test_decode_tail_is_split_over_the_group() -> None:
    """lm_head over vocabulary / N per GPU for the group's batch; the logits gather runs
    over the group's GPUs (none at N = 1)."""
    cfg, mm = load_system("dgx-h100"), load_moe_model("mixtral-8x7b", batch=8, seq=256)
    tails = {n: run_layer(cfg, mm, "ep-deepep", "decode", attention_tp=n).token for n in (8, 4, 2, 1)}
    assert all(t is not None for t in tails.values())
    lm = [tails[n].tail["lm_head"] for n in (8, 4, 2, 1)]  # type: ignore[union-attr]
    assert lm == sorted(lm) and lm[0] < lm[-1]
    assert tails[1].tail["logits_gather"] == 0.0 and tails[4].tail["logits_gather"] > 0.0  # type: ignore[union-attr]
    assert tails[4].tail != tails[8].tail  # type: ignore[union-attr]


@pytest.mark.parametrize("scheme", ["ep-nccl", "ep-deepep", "ep-allgather", "ep-deepep-ll"])
def test_functional_expert_block_with_groups_is_exact(scheme: str, tmp_path) -> None:
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY))
    r = LayerSpec(str(path), scheme, "prefill", attention_tp=2).run(functional=True, seed=3)
    assert r.checked == 1 and r.mismatches == []
    assert r.moe is not None and r.moe["attention_tp"] == 2 and r.moe["tokens_per_rank"] == 24  # 48 tokens / 2


def test_layer_spec_and_sweep_point_thread_it() -> None:
    point = {"model": "mixtral-8x7b", "scheme": "ep-nccl", "mode": "prefill", "batch": 2, "seq": 32,
             "attention_tp": 4, "expert_tp": 2}
    spec = prepare(point)
    assert isinstance(spec, LayerSpec) and spec.attention_tp == 4 and spec.expert_tp == 2
    plain = prepare({k: v for k, v in point.items() if k not in ("attention_tp", "expert_tp")})
    assert isinstance(plain, LayerSpec) and plain.attention_tp is None and plain.expert_tp == 1
    row = run_point(point)
    assert row["moe.attention_tp"] == 4 and row["moe.expert_tp"] == 2 and row["moe.tokens_per_rank"] == 16
    with pytest.raises(UserError) as err:
        check_points([{**point, "attention_tp": 3}])
    assert "attention_tp: 3 does not divide the 8 GPUs; allowed: 1, 2, 4, 8" in str(err.value)
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match=r"^key 'expert_tp': expected a whole number"):
        prepare({**point, "expert_tp": "two"})


ERRORS = [
    ({"attention_tp": 3}, "attention_tp: 3 does not divide the 8 GPUs; allowed: 1, 2, 4, 8"),
    ({"attention_tp": 0}, "attention_tp: 0 does not divide the 8 GPUs; allowed: 1, 2, 4, 8"),
    ({"attention_tp": -2}, "attention_tp: -2 does not divide the 8 GPUs; allowed: 1, 2, 4, 8"),
    ({"attention": "dp", "attention_tp": 4}, ("attention_tp: 4 runs attention TP over groups of 4 GPUs, but "
                                              "attention is 'dp'")),
]


@pytest.mark.parametrize("kwargs,message", ERRORS)
def test_a_bad_value_is_one_line_naming_attention_tp(kwargs: dict, message: str) -> None:
    for call in (run_layer, lambda cfg, mm, scheme, mode, **kw: LayerSpec(
            "mixtral-8x7b", scheme, mode, batch=2, seq=32, **kw).check()):
        with pytest.raises(UserError) as err:
            call(load_system("dgx-h100"), small(), "ep-nccl", "prefill", **kwargs)
        assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_heads_the_groups_cannot_split_are_refused(tmp_path) -> None:
    path = tmp_path / "tiny12.json"
    path.write_text(json.dumps({**TINY, "heads": 12, "kv_heads": 4}))
    with pytest.raises(UserError) as err:
        LayerSpec(str(path), "ep-nccl", "prefill", attention_tp=8).check()
    assert str(err.value) == ("attention_tp: 8 does not divide tiny-moe's heads (12) and kv_heads (4); "
                              "allowed: 1, 2, 4")


def test_a_dense_model_refuses_it() -> None:
    with pytest.raises(UserError, match=r"^attention_tp: it sets a mixture-of-experts layer's attention TP groups"):
        LayerSpec("llama3-8b", "tp-nvls", "prefill", seq=64, attention_tp=4).check()


def test_cli_attention_tp(capsys: pytest.CaptureFixture[str]) -> None:
    from cais.cli import main

    base = ["run", "--model", "mixtral-8x7b", "--scheme", "ep-deepep", "--mode", "prefill", "--seq", "32", "--batch",
            "2"]
    main([*base, "--attention-tp", "4", "--json"])
    mo = json.loads(capsys.readouterr().out)["moe"]
    assert mo["attention_tp"] == 4 and mo["attention"] == "tp" and mo["tokens_per_rank"] == 16
    main([*base, "--attention-tp", "2"])
    assert "attention tp in groups of 2 GPUs" in " ".join(capsys.readouterr().out.split())
    for bad, says in ((["--attention-tp", "3"], "--attention-tp: 3 does not divide the 8 GPUs; allowed: 1, 2, 4, 8"),
                      (["--attention-tp", "0"], "--attention-tp: 0 does not divide"),
                      (["--attention", "dp", "--attention-tp", "2"], "--attention-tp: 2 runs attention TP")):
        assert main([*base, *bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"cais: error: {says}") and err.count("\n") == 1
    assert main(["run", "--model", "llama3-8b", "--scheme", "tp-nvls", "--mode", "prefill", "--attention-tp",
                 "4"]) == 2
    assert capsys.readouterr().err.startswith("cais: error: --attention-tp: it sets a mixture-of-experts")


@pytest.mark.parametrize("n,attention,batch", [(8, "tp", 2), (4, "tp", 4), (2, "tp", 8), (1, "dp", 2)])
def test_the_dense_first_layers_take_the_groups_sequences_together(n: int, attention: str, batch: int,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode step's dense first layers run TP over every GPU with the groups' GPUs / N
    x ``batch`` sequences (under ``dp`` the dense path multiplies by the GPUs itself)."""
    from cais.experiments import layer

    calls: list[tuple[str, int]] = []

    def fake(cfg, model, attention, seed=0):  # type: ignore[no-untyped-def]
        calls.append((attention, model.batch))
        return 1000.0
    monkeypatch.setattr(layer, "dense_first_us", fake)
    run_layer(load_system("dgx-h100"), load_moe_model("deepseek-v3", batch=2, seq=64), "ep-deepep", "decode",
              attention_tp=n)
    assert calls == [(attention, batch)]
