"""A MoE model's decode time per output token (``token_us``): its MoE layers at the
simulated MoE period, its dense first layers at their own simulated period (none where
``dense_layers`` is 0), and the tail with the model's vocabulary split over the
attention's TP group (experiments/layer.py ``moe_decode_token``, experiments/token.py;
docs/moe.md, "The decode step per output token")."""

from __future__ import annotations

import json
import math

import pytest

import cais.experiments.layer as layer
from cais.cli import main
from cais.config import apply_overrides, load_system
from cais.experiments.layer import DENSE_FIRST_SCHEME, run_layer
from cais.experiments.token import PARTS, MoeTokenTime
from cais.workload.moe import load_moe_model
from cais.workload.moe_dataflow import dense_layer_model, dense_tp_group

KV = 256


def _graph():
    return apply_overrides(load_system("dgx-h100"), {"gpu.launch": "graph"})


def _sum(tok: dict) -> float:
    return tok["moe_layers"] * tok["layer_us"] + tok["dense_layers"] * tok["dense_layer_us"] + tok["tail_us"]


def test_deepseek_token_is_moe_layers_plus_dense_layers_plus_tail() -> None:
    """DeepSeek-V3 (3 dense first layers): token_us is the sum of its reported parts,
    the MoE part at the run's own period and the dense part at a dense layer's period
    simulated under the dense scheme (the same run made here on its own)."""
    cfg = _graph()
    model = load_moe_model("deepseek-v3", batch=8, seq=KV)
    r = run_layer(cfg, model, "ep-deepep-ll", "decode")
    assert isinstance(r.token, MoeTokenTime)
    tok = r.as_json()["token"]
    assert isinstance(tok, dict)
    assert (tok["moe_layers"], tok["dense_layers"], tok["dense_scheme"]) == (58, 3, DENSE_FIRST_SCHEME)
    assert tok["layer_us"] == r.total_us
    assert math.isclose(r.as_json()["token_us"], _sum(tok), rel_tol=1e-12)
    assert math.isclose(tok["tail_us"], sum(tok["tail"].values()), rel_tol=1e-12)
    assert set(tok["tail"]) == set(PARTS) and all(v > 0 for v in tok["tail"].values())
    dense = run_layer(cfg, dense_layer_model(model), DENSE_FIRST_SCHEME, "decode")
    assert tok["dense_layer_us"] == dense.total_us  # timed, not guessed
    assert dense.total_us != r.total_us  # a dense layer's period, not the MoE one's


@pytest.mark.parametrize("name", ["mixtral-8x7b", "qwen3-30b-a3b"])
def test_no_dense_layers_runs_no_dense_period(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("a dense period was run for a model without dense layers")

    monkeypatch.setattr(layer, "dense_first_us", refuse)
    r = run_layer(_graph(), load_moe_model(name, batch=8, seq=KV), "ep-deepep-ll", "decode")
    assert r.token is not None
    tok = r.as_json()["token"]
    assert (tok["dense_layers"], tok["dense_layer_us"], tok["dense_scheme"]) == (0, 0.0, "")
    assert tok["moe_layers"] == load_moe_model(name).layers
    assert math.isclose(tok["token_us"], tok["moe_layers"] * r.total_us + tok["tail_us"], rel_tol=1e-12)


def test_dense_layers_run_the_dense_period_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, str]] = []

    def fake(cfg, model, attention, seed=0):  # type: ignore[no-untyped-def]
        calls.append((model.name, attention))
        return 1000.0

    monkeypatch.setattr(layer, "dense_first_us", fake)
    r = run_layer(_graph(), load_moe_model("deepseek-v3", batch=8, seq=KV), "ep-deepep", "decode")
    assert calls == [("deepseek-v3", "tp")]
    assert r.token is not None and math.isclose(r.token.token_us - r.token.tail_us,
                                                58 * r.total_us + 3 * 1000.0, rel_tol=1e-12)


def test_attention_dp_holds_the_whole_vocabulary_per_gpu() -> None:
    """Under data-parallel attention each GPU runs lm_head over the whole vocabulary for
    its own sequences, and nothing gathers the logits; under TP the vocabulary is split
    over the GPUs and the logits gathered."""
    cfg = _graph()
    tp = run_layer(cfg, load_moe_model("qwen3-30b-a3b", batch=8, seq=KV), "ep-deepep-ll", "decode")
    dp = run_layer(cfg, load_moe_model("qwen3-30b-a3b", batch=1, seq=KV), "ep-deepep-ll", "decode", attention="dp")
    assert tp.token is not None and dp.token is not None
    assert tp.token.tail["logits_gather"] > 0 and dp.token.tail["logits_gather"] == 0.0
    assert dp.token.tail["lm_head"] > 2 * tp.token.tail["lm_head"]  # 8x the columns, 1/8 of the rows


def test_no_token_outside_decode() -> None:
    r = run_layer(_graph(), load_moe_model("mixtral-8x7b", batch=1, seq=64), "ep-deepep", "prefill")
    assert r.token is None and "token_us" not in r.as_json()


@pytest.mark.parametrize("name", ["mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3"])
def test_cli_decode_reports_token_us(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["run", "--model", name, "--scheme", "ep-deepep-ll", "--mode", "decode", "--batch", "8", "--seq", str(KV),
            "--launch", "graph"]
    assert main(args + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["token_us"] > out["total_us"] and math.isclose(out["token_us"], _sum(out["token"]), rel_tol=1e-12)
    assert main(args) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "per output token:" in text and "MoE layers x" in text
    assert ("dense layers x" in text) == (name == "deepseek-v3")


def test_a_too_big_dense_first_layer_leaves_the_layer_without_token_us(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the dense first layers' run is beyond the event limit (a MoE decode on many
    GPUs with data-parallel attention runs them over every GPU's sequences), the MoE
    layer's result stands, without ``token_us``, and says why in ``adjusted``."""
    from cais.limits import TooBig

    ran = []

    def too_big(*args: object, **kwargs: object) -> float:
        ran.append(1)
        raise TooBig("deepseek-v3 decode under sp-nccl is estimated at 1e9 simulated events (a run of hours)")

    monkeypatch.setattr(layer, "dense_first_us", too_big)
    r = run_layer(_graph(), load_moe_model("deepseek-v3", batch=8, seq=KV), "ep-deepep-ll", "decode")
    assert ran and r.token is None and r.total_us > 0
    assert r.adjusted["token"].startswith("token_us not computed") and "1e9" in r.adjusted["token"]
    assert "token_us" not in r.as_json() and r.as_json()["adjusted"]["token"] == r.adjusted["token"]


def test_dense_layers_that_do_not_split_over_every_gpu_run_in_groups() -> None:
    """DeepSeek-V3's 128 heads do not split over nvl72's 72 GPUs: its dense first layers
    run TP over groups of 8 (the largest it splits over that divides 72), and one
    group's period is the dense layer's on 8 GPUs of the system with its share of the
    sequences (8 GPUs' under data-parallel attention)."""
    model = load_moe_model("deepseek-v3", batch=1, seq=KV, experts=288)
    assert dense_tp_group(model, 72) == 8 and dense_tp_group(model, 64) == 64
    nvl72 = load_system("nvl72")
    us = layer.dense_first_us(nvl72, model, "dp")
    group = run_layer(nvl72.with_overrides(gpus=8, decode={**nvl72.decode.model_dump(), "graph_padding": False}),
                      dense_layer_model(model, 8), DENSE_FIRST_SCHEME, "decode", check_hbm=False)
    assert us == group.total_us > 0
