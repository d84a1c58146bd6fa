"""The weight gradients' gathered operands in the backward pass (``train.wgrad_inputs``,
``train.wgrad_grads``; docs/schemes.md, "Weight gradients"): every choice leaves every
GPU with the unsharded layer's tensors, moves the bytes its closed form says, runs
where it says (beside the dgrad sub-layer, or after it), and each scheme's own choice
is the one its page gives."""

from __future__ import annotations

import pytest

from cais.experiments.layer import run_layer
from cais.config import TrainConfig, apply_overrides, load_system
from cais.machine import Machine
from cais.hw.compute import ComputeModel
from cais.schemes import get_scheme, schemes
from cais.schemes.base import LayerRun, WgradMismatch
from cais.workload.footprint import footprint
from cais.workload.graph import build_period

from test_schemes import GPT

COLLECTIVE = ("sp-nvls", "fuselib-nvls", "t3")
REMOTE = ("ladm", "cais-base", "cais")


def _four(**sets: str):
    return apply_overrides(load_system("dgx-h100"), {"gpus": "4", **sets})


def _train(inputs: str, grads: str = "keep", **sets: str):
    return _four(**{"train.wgrad_inputs": inputs, "train.wgrad_grads": grads, **sets})


CHOICES = ("keep", "keep-overlap", "refetch", "refetch-overlap")
COLLECTIVE_CHOICES = ("keep", "refetch", "refetch-overlap")


@pytest.mark.parametrize("scheme, inputs", [(s, c) for s in COLLECTIVE for c in COLLECTIVE_CHOICES]
                         + [(s, c) for s in REMOTE for c in CHOICES])
def test_every_choice_for_the_inputs_is_exact(scheme: str, inputs: str) -> None:
    r = run_layer(_train(inputs), GPT, scheme, "train", functional=True, seed=3)
    assert r.checked >= 60 and r.mismatches == []


@pytest.mark.parametrize("grads", CHOICES)
@pytest.mark.parametrize("scheme", REMOTE)
def test_every_choice_for_the_gradients_is_exact(scheme: str, grads: str) -> None:
    r = run_layer(_train("refetch", grads), GPT, scheme, "train", functional=True, seed=4)
    assert r.checked >= 60 and r.mismatches == []


def test_each_scheme_runs_its_sourced_choice() -> None:
    own = {name: (s.wgrad_inputs, s.wgrad_grads) for name, s in schemes().items()}
    for name in ("sp-nvls", "sp-ring", "coconet", "coconet-nvls", "fuselib", "fuselib-nvls", "t3", "t3-nvls"):
        assert own[name] == ("refetch-overlap", "keep"), name  # Megatron-LM's backward
    for name in ("cais", "cais-partial", "cais-wo-coord"):
        assert own[name] == ("refetch-overlap", "keep-overlap"), name  # the dataflow optimizer's
    for name in ("ladm", "cais-base"):
        assert own[name] == ("refetch", "refetch"), name  # no optimizer: loaded after the sub-layer
    plan = get_scheme("cais").wgrad_plan(TrainConfig(wgrad_inputs="keep"))
    assert (plan.inputs, plan.grads) == ("keep", "keep-overlap")


@pytest.mark.parametrize("field, value", [("wgrad_grads", "refetch"), ("wgrad_grads", "keep-overlap"),
                                          ("wgrad_inputs", "keep-overlap")])
def test_a_collective_scheme_refuses_what_only_remote_loads_can_run(field: str, value: str) -> None:
    allowed = "scheme, keep" if field == "wgrad_grads" else "scheme, keep, refetch, refetch-overlap"
    with pytest.raises(WgradMismatch, match=rf"^train\.{field}: scheme 'sp-nvls' .* '{value}' .* allowed with this "
                                            rf"scheme: {allowed}$"):
        run_layer(_four(**{f"train.{field}": value}), GPT, "sp-nvls", "train")


def _run(cfg, scheme: str) -> tuple[Machine, LayerRun]:
    """The scheme's training period on ``cfg`` (its switch and VC policy as run_layer
    resolves them), run to the end."""
    sch = get_scheme(scheme)
    cfg = apply_overrides(cfg, {"switch.model": sch.switch_model(cfg.switch.model),
                                "link.vc_policy": sch.vc_policy_for(cfg.link.vc_policy)})
    period = build_period(GPT, cfg.gpus, "train", True)
    m = Machine(cfg)
    run = LayerRun(m, GPT, period, ComputeModel.load(cfg.gpu.compute_model))
    sch.run(run)
    m.run()
    return m, run


def _injected(cfg, scheme: str) -> int:
    return _run(cfg, scheme)[0].fabric.injected


def test_ladm_weight_gradients_move_the_closed_form() -> None:
    """With staged reads a weight gradient brings every remote row of its gathered
    operand once; a kept copy brings none: four weight gradients, each T - T/n rows."""
    cfg = _four()
    d = build_period(GPT, cfg.gpus, "train", True).dims
    per = cfg.gpus * (d.tokens - d.rows_l) * d.hidden * GPT.dtype_bytes  # one gathered operand, every GPU
    loaded = _injected(apply_overrides(cfg, {"train.wgrad_inputs": "refetch", "train.wgrad_grads": "refetch"}),
                       "ladm")
    kept = _injected(apply_overrides(cfg, {"train.wgrad_inputs": "keep", "train.wgrad_grads": "keep"}), "ladm")
    half = _injected(apply_overrides(cfg, {"train.wgrad_inputs": "refetch", "train.wgrad_grads": "keep"}), "ladm")
    assert loaded - kept == 4 * per
    assert loaded - half == 2 * per


@pytest.mark.parametrize("strategy", ["copy-engine", "auto"])
def test_overlap_moves_what_refetch_moves_and_keep_less(strategy: str) -> None:
    """With one copy strategy, a weight gradient beside the work around it moves what
    it moves after it. The as-sold rule (auto) copies the rows of one that runs beside
    other work by comm SMs, whose ld.cais merge in CAIS's switch: less than the copy
    engine's plain reads after the sub-layer, still more than a kept copy."""
    for scheme in ("sp-nvls", "cais"):
        sets = {"remote_read.strategy": strategy}
        moved = {how: _injected(_train(how, **sets), scheme) for how in ("keep", "refetch", "refetch-overlap")}
        if strategy == "auto" and scheme == "cais":
            assert moved["refetch"] > moved["refetch-overlap"] > moved["keep"], (scheme, moved)
        else:
            assert moved["refetch-overlap"] == moved["refetch"] > moved["keep"], (scheme, moved)


def _spans(scheme: str, inputs: str) -> dict[str, tuple[int, int]]:
    """Each segment's (first start, last end) over the GPUs, in ps."""
    _, run = _run(_train(inputs), scheme)
    return {name: (s.start or 0, s.end) for name, s in run.spans.items()}


@pytest.mark.parametrize("scheme, fetch", [("sp-nvls", "regather_n1"), ("cais", "qkv_wgrad")])
def test_overlap_fetches_beside_the_dgrad_sublayer(scheme: str, fetch: str) -> None:
    beside, after = _spans(scheme, "refetch-overlap"), _spans(scheme, "refetch")
    assert beside[fetch][0] < beside["L4"][1]  # started before the dgrad sub-layer ended
    assert after[fetch][0] >= after["L4"][1]
    kept = _spans(scheme, "keep")
    assert "regather_n1" not in kept
    if scheme == "cais":
        assert kept["qkv_wgrad"][0] >= kept["L4"][1]  # a local GEMM, in its place
        assert _spans(scheme, "keep-overlap")["qkv_wgrad"][0] < kept["L4"][1]  # a local GEMM beside the dgrad


def test_kept_inputs_are_counted_by_the_memory_check() -> None:
    model = GPT.with_run(seq=1024)
    plain, kept = footprint(model, 4, "train", True), footprint(model, 4, "train", True, keep_inputs=True)
    d = build_period(model, 4, "train", True).dims
    assert kept.activations - plain.activations == (model.layers - 1) * 2 * d.hidden * model.dtype_bytes * (d.tokens - d.rows_l)
    assert footprint(model, 4, "train", False, keep_inputs=True) == footprint(model, 4, "train", False)


def test_a_period_without_weight_gradients_ignores_the_choice() -> None:
    """Prefill runs the same whatever ``train`` says, and a choice a scheme cannot run
    in training is no error there."""
    for scheme in ("cais", "sp-nvls"):
        runs = [run_layer(_four(**{"train.wgrad_inputs": i, "train.wgrad_grads": g}), GPT, scheme, "prefill")
                for i, g in (("keep", "keep"), ("scheme", "scheme"))]
        assert len({r.total_us for r in runs}) == 1, (scheme, [r.total_us for r in runs])
        # a training-only setting outside training is said to have no effect, naming the field
        assert set(runs[0].adjusted) == {"train.wgrad_inputs", "train.wgrad_grads"} and not runs[1].adjusted
        assert "has no effect" in runs[0].adjusted["train.wgrad_grads"]
    assert run_layer(_train("scheme", "refetch"), GPT, "sp-nvls", "prefill").total_us > 0
