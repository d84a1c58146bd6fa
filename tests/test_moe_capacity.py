"""A capacity factor in MoE layers under ``cais run`` (``moe.capacity_factor``,
``moe.capacity``; docs/moe.md, "Capacity padding"): the default is the layer path as it
was, bit for bit; ``drop`` leaves each GPU's selections past capacity out of the
exchanges and the grouped GEMMs; ``pad`` fills every expert up to capacity, the padding
rows computed by the GEMMs and, under ``ep-nccl``, sent both ways (the backward's
exchanges too); kernels without capacity padding refuse ``pad`` in one line; functional
mode stays exact."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from cais.config import ConfigError, apply_overrides, load_system
from cais.errors import UserError
from cais.experiments import ep
from cais.experiments.layer import check_layer, run_layer
from cais.kernels.ep_common import EpCall
from cais.workload.moe import MoeSpec, load_moe_model
from cais.workload.moe_dataflow import build_moe_period

#: recorded at main 6bfc4a2, before moe.capacity existed: (total_us, events, dispatch_us, combine_us,
#: grouped_gemm_us) of ``run_layer(dgx-h100, load_moe_model(model, seq=32, batch=2), scheme, mode, **kw)``,
#: with DeepSeek's MLA timed by the MHA stand-in (the default then; ``moe.mla_timing=mha`` now)
BEFORE = {("qwen3-30b-a3b", "ep-nccl", "train", 1): (919.266515, 79515, 33.573901, 20.913168, 152.595483),
          ("qwen3-30b-a3b", "ep-allgather", "prefill", 1): (313.987293, 53863, 11.323731, 11.421561,
                                                             50.789663000000004),
          ("deepseek-v3", "ep-deepep", "prefill", 1): (1315.361118, 127959, 6.674641, 156.716878, 1039.012979),
          ("mixtral-8x7b", "ep-switch", "decode", 1): (309.653057, 7618, 0.0, 0.0, 0.0),
          ("qwen3-30b-a3b", "ep-nccl", "prefill", 2): (334.145751, 46738, 20.853888, 8.030258, 51.061531)}

TINY = {"name": "tiny-moe", "family": "test", "hidden": 128, "heads": 8, "kv_heads": 8, "head_dim": 16, "layers": 2,
        "dense_ffn_hidden": 256, "experts": 16, "topk": 4, "expert_ffn_hidden": 64, "shared_experts": 1,
        "n_group": 4, "topk_group": 2, "seq": 24, "batch": 2}


def _cfg(**settings: str):
    return apply_overrides(load_system("dgx-h100"), {f"moe.{k}": v for k, v in settings.items()})


def _key(r) -> tuple:
    assert r.moe is not None
    return r.total_us, r.events, r.moe["dispatch_us"], r.moe["combine_us"], r.moe["grouped_gemm_us"]


@pytest.mark.parametrize("key", sorted(BEFORE))
def test_no_capacity_is_the_layer_path_as_it_was(key: tuple[str, str, str, int]) -> None:
    model, scheme, mode, etp = key
    mm = load_moe_model(model, seq=32, batch=2)
    r = run_layer(_cfg(mla_timing="mha"), mm, scheme, mode, expert_tp=etp)
    assert _key(r) == BEFORE[key]
    assert r.moe is not None and (r.moe["capacity"], r.moe["capacity_factor"]) == ("none", None)
    assert r.moe["dropped"] == 0 and r.moe["padded_rows"] == 0
    again = run_layer(_cfg(capacity="none", mla_timing="mha"), mm, scheme, mode, expert_tp=etp)
    assert _key(again) == BEFORE[key] and again.moe == r.moe


def _skewed(scheme: str, mode: str = "prefill", **settings: str):
    """qwen3-30b-a3b (128 experts, top-8) over 256 tokens, power-law routing."""
    return run_layer(_cfg(routing="powerlaw", **settings), load_moe_model("qwen3-30b-a3b", seq=256, batch=1), scheme,
                     mode)


def test_a_factor_alone_drops_as_megatron_does() -> None:
    alone, drop = _skewed("ep-nccl", capacity_factor="1.0"), _skewed("ep-nccl", capacity_factor="1.0", capacity="drop")
    assert alone.moe is not None and alone.moe["capacity"] == "drop" and alone.moe["capacity_factor"] == 1.0
    assert _key(alone) == _key(drop) and alone.moe == drop.moe


@pytest.mark.parametrize("scheme", ["ep-nccl", "ep-allgather", "ep-deepep", "ep-deepep-ll"])
def test_drop_at_a_low_factor_lowers_rows_and_time_under_skew(scheme: str) -> None:
    full, drop = _skewed(scheme), _skewed(scheme, capacity_factor="1.0", capacity="drop")
    a, b = full.moe, drop.moe
    assert a is not None and b is not None
    tokens, topk, experts, n = a["tokens_per_rank"], a["topk"], a["experts"], full.gpus
    cap = math.ceil(1.0 * tokens * topk / experts)
    assert b["dropped"] > 0 and b["padded_rows"] == 0
    assert sum(b["received_rows"]) == sum(a["received_rows"]) - b["dropped"] == n * tokens * topk - b["dropped"]
    assert max(b["received_rows"]) < max(a["received_rows"]) and max(b["received_rows"]) <= cap * experts
    assert b["grouped_gemm_us"] < a["grouped_gemm_us"]
    assert drop.total_us < full.total_us
    if scheme != "ep-allgather":  # the all-gather dispatcher moves every token whatever its experts
        assert b["dispatch_bytes"] < a["dispatch_bytes"] and b["combine_bytes"] < a["combine_bytes"]


def test_dropped_selections_leave_the_other_experts_and_the_shared_ones() -> None:
    mm = MoeSpec.model_validate(TINY)
    full = build_moe_period(mm, 8, "prefill", "dp", routing="powerlaw", alpha=1.5)
    drop = build_moe_period(mm, 8, "prefill", "dp", routing="powerlaw", alpha=1.5, capacity_factor=0.5,
                            capacity="drop")
    a, b = full.routing, drop.routing
    assert a is not None and b is not None
    gone = (b.topk_idx < 0) & (a.topk_idx >= 0)
    assert gone.sum() == b.dropped() > 0
    kept = b.topk_idx >= 0
    assert np.array_equal(b.topk_idx[kept], a.topk_idx[kept])  # a token keeps its other experts
    assert np.array_equal(b.weights[kept], a.weights[kept]) and not b.weights[gone].any()
    assert any(kept[g, t].any() for g, t, _ in zip(*np.nonzero(gone)))  # tokens that lost one keep others
    shared = [(s.name, s.gemm.m) for s in drop.segments if getattr(s, "side", False) and getattr(s, "gemm", None)]
    assert shared and shared == [(s.name, s.gemm.m) for s in full.segments  # type: ignore[union-attr]
                                 if getattr(s, "side", False) and getattr(s, "gemm", None)]


@pytest.mark.parametrize("scheme", ["ep-nccl", "ep-allgather"])
def test_pad_equalizes_the_rows_per_expert(scheme: str) -> None:
    drop, pad = (_skewed(scheme, capacity_factor="1.0", capacity=c) for c in ("drop", "pad"))
    a, b = drop.moe, pad.moe
    assert a is not None and b is not None and b["capacity"] == "pad"
    tokens, topk, experts, n = b["tokens_per_rank"], b["topk"], b["experts"], pad.gpus
    cap = math.ceil(1.0 * tokens * topk / experts)
    assert b["dropped"] == a["dropped"] > 0
    assert b["received_rows"] == [cap * experts] * n  # each of a rank's experts: capacity rows from every GPU
    assert b["padded_rows"] == n * cap * experts - sum(a["received_rows"]) > 0
    # nccl sends the padding both ways; allgather pads after its exchange, nothing more sent
    assert (b["dispatch_bytes"] > a["dispatch_bytes"]) == (scheme == "ep-nccl")
    assert (b["combine_bytes"] > a["combine_bytes"]) == (scheme == "ep-nccl")


def test_the_grouped_gemms_take_the_padded_rows() -> None:
    mm = load_moe_model("qwen3-30b-a3b", seq=256, batch=1)
    period = build_moe_period(mm, 8, "prefill", "tp", routing="powerlaw", capacity_factor=1.0, capacity="pad")
    rt = period.routing
    assert rt is not None and rt.pad_rows.any()
    from cais.schemes.ep import _received

    rows = _received(rt)
    assert np.array_equal(rows.reshape(-1), rt.expert_rows().sum(axis=0))
    assert len(set(rows.reshape(-1).tolist())) == 1  # every expert the same rows: 8 GPUs x capacity


def test_training_backward_exchanges_carry_the_padding() -> None:
    """Megatron's backward all-to-all is the forward's with the splits swapped: the
    combine's backward (a dispatch) and the dispatch's backward (a combine) move the
    forward's rows, padding included."""
    for capacity in ("drop", "pad"):
        fwd, train = (_skewed("ep-nccl", mode, capacity_factor="1.0", capacity=capacity)
                      for mode in ("prefill", "train"))
        assert fwd.moe is not None and train.moe is not None
        assert train.moe["dispatch_bytes"] == 2 * fwd.moe["dispatch_bytes"] > 0
        assert train.moe["combine_bytes"] == 2 * fwd.moe["combine_bytes"] > 0
        assert train.moe["padded_rows"] == fwd.moe["padded_rows"]
        assert (train.moe["padded_rows"] > 0) == (capacity == "pad")


@pytest.mark.parametrize("scheme", ["ep-deepep", "ep-deepep-ll", "ep-switch"])
def test_kernels_without_capacity_padding_refuse_pad_in_one_line(scheme: str) -> None:
    cfg = _cfg(capacity_factor="1.0", capacity="pad")
    mm = load_moe_model("qwen3-30b-a3b", seq=32, batch=2)
    for call in (lambda: run_layer(cfg, mm, scheme, "prefill"), lambda: check_layer(cfg, mm, scheme, "prefill")):
        with pytest.raises(UserError) as e:
            call()
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith("moe.capacity: ") and "nccl, allgather" in msg
    r = run_layer(_cfg(capacity_factor="1.0", capacity="drop"), mm, scheme, "prefill")  # drop runs everywhere
    assert r.moe is not None and r.moe["capacity"] == "drop"


@pytest.mark.parametrize("settings, key, words", [
    ({"moe.capacity": "pad"}, "moe.capacity", "needs moe.capacity_factor"),
    ({"moe.capacity": "drop"}, "moe.capacity", "allowed without one: none"),
    ({"moe.capacity": "bogus"}, "moe.capacity", "'none', 'drop' or 'pad'"),
    ({"moe.capacity_factor": "0"}, "moe.capacity_factor", "greater than 0"),
    ({"moe.capacity_factor": "-1.5"}, "moe.capacity_factor", "greater than 0"),
    ({"moe.capacity_factor": "Infinity"}, "moe.capacity_factor", "finite"),
    ({"moe.capacity_factor": "many"}, "moe.capacity_factor", "valid number")])
def test_bad_settings_are_one_line_config_errors(settings: dict[str, str], key: str, words: str) -> None:
    with pytest.raises(ConfigError) as e:
        apply_overrides(load_system("dgx-h100"), settings)
    msg = str(e.value)
    assert isinstance(e.value, UserError) and "\n" not in msg and key in msg and words in msg


def test_the_cli_refuses_in_one_line_and_reports_in_json() -> None:
    base = [sys.executable, "-m", "cais.cli", "run", "--model", "qwen3-30b-a3b", "--mode", "prefill", "--seq", "256",
            "--batch", "1", "--set", "moe.routing=powerlaw", "--set", "moe.capacity_factor=1.0"]
    bad = subprocess.run([*base, "--scheme", "ep-deepep", "--set", "moe.capacity=pad"], capture_output=True,
                         check=False, text=True, timeout=300)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and "moe.capacity: " in bad.stderr
    ok = subprocess.run([*base, "--scheme", "ep-nccl", "--set", "moe.capacity=pad", "--json"], capture_output=True,
                        check=False, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    mo = json.loads(ok.stdout)["moe"]
    assert mo["capacity"] == "pad" and mo["capacity_factor"] == 1.0 and mo["dropped"] > 0 and mo["padded_rows"] > 0


@pytest.mark.parametrize("scheme, capacity", [("ep-nccl", "pad"), ("ep-nccl", "drop"), ("ep-allgather", "pad"),
                                              ("ep-deepep", "drop"), ("ep-deepep-ll", "drop"), ("ep-switch", "drop")])
@pytest.mark.parametrize("attention", ["tp", "dp"])
def test_functional_expert_block_stays_exact(scheme: str, capacity: str, attention: str) -> None:
    cfg = _cfg(routing="powerlaw", capacity_factor="0.5", capacity=capacity)
    r = run_layer(cfg, MoeSpec.model_validate(TINY), scheme, "prefill", functional=True, seed=3, attention=attention)
    assert r.checked == 1 and r.mismatches == []
    assert r.moe is not None and r.moe["dropped"] > 0 and (r.moe["padded_rows"] > 0) == (capacity == "pad")


def test_functional_check_sees_a_reference_that_keeps_the_dropped_selections() -> None:
    """The kernels compute nothing for a dropped selection: against the block that keeps
    them (the routing without capacity) the dropped run's output differs."""
    mm = MoeSpec.model_validate(TINY)
    full, drop = (build_moe_period(mm, 8, "prefill", "dp", routing="powerlaw", capacity_factor=cf,
                                   capacity="drop" if cf else "none").routing for cf in (None, 0.5))
    assert full is not None and drop is not None and drop.dropped() > 0
    cfg, h = load_system("dgx-h100"), mm.hidden
    a, b = ep._exact_weights(full, 0), ep._exact_weights(drop, 0)
    rng = np.random.default_rng(1)
    x = rng.integers(-4, 5, size=(8, full.tokens, h)).astype(np.float64)
    mats = rng.integers(-2, 3, size=(mm.experts, h, h)).astype(np.float64)

    def expert(e: int, row: np.ndarray) -> np.ndarray:
        return row @ mats[e]
    ref = np.zeros((8, full.tokens, h))
    for g, t, k in zip(*np.nonzero(a.topk_idx >= 0)):
        ref[g, t] += a.weights[g, t, k] * expert(int(a.topk_idx[g, t, k]), x[g, t])
    call = EpCall("dispatch", b, h, "bf16")
    assert ep.functional_check(cfg, "nccl", call, 0, x, expert)
    assert not ep.functional_check(cfg, "nccl", call, 0, x, expert, reference=ref)


def test_functional_pad_with_expert_tp_is_refused_in_one_line() -> None:
    cfg = _cfg(routing="powerlaw", capacity_factor="0.5", capacity="pad")
    with pytest.raises(UserError) as e:
        run_layer(cfg, MoeSpec.model_validate(TINY), "ep-nccl", "prefill", functional=True, expert_tp=2)
    assert "\n" not in str(e.value) and str(e.value).startswith("moe.capacity: ")


def test_a_dense_run_notes_the_capacity_has_no_effect() -> None:
    from cais.experiments.layer import mode_notes
    from cais.schemes import get_scheme

    notes = mode_notes(get_scheme("tp-nvls"), _cfg(capacity_factor="1.5", capacity="pad"), "prefill")
    assert set(notes) >= {"moe.capacity_factor", "moe.capacity"}
    assert all("expert capacity" in notes[k] and "dense" in notes[k] for k in ("moe.capacity_factor", "moe.capacity"))
