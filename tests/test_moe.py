"""MoE models, routing and the EP kernels (issue 66, part 1; docs/moe.md)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cais.config import load_system
from cais.errors import UserError
from cais.experiments.ep import EP_KERNELS, run_ep
from cais.workload.models import ModelError, load_model
from cais.workload.moe import EpPlan, from_hf_moe_config, list_moe_models, load_moe_model
from cais.workload.routing import generate, imbalance

DEEPSEEK_V3_HF = {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
                  "moe_intermediate_size": 2048, "n_routed_experts": 256, "num_experts_per_tok": 8,
                  "n_shared_experts": 1, "n_group": 8, "topk_group": 4, "first_k_dense_replace": 3,
                  "num_attention_heads": 128, "num_key_value_heads": 128, "num_hidden_layers": 61,
                  "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                  "vocab_size": 129280}
MIXTRAL_HF = {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_local_experts": 8,
              "num_experts_per_tok": 2, "num_attention_heads": 32, "num_key_value_heads": 8,
              "num_hidden_layers": 32}
QWEN3_HF = {"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
            "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8, "num_attention_heads": 32,
            "num_key_value_heads": 4, "head_dim": 128, "num_hidden_layers": 48}


def test_presets_match_their_hf_configs() -> None:
    assert set(list_moe_models()) >= {"mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3"}
    for preset, hf in (("deepseek-v3", DEEPSEEK_V3_HF), ("mixtral-8x7b", MIXTRAL_HF), ("qwen3-30b-a3b", QWEN3_HF)):
        a, b = load_moe_model(preset), from_hf_moe_config(hf, name=preset)
        for f in ("hidden", "experts", "topk", "expert_ffn_hidden", "shared_experts", "n_group", "topk_group",
                  "dense_layers", "heads", "kv", "dim", "attention"):
            assert getattr(a, f) == getattr(b, f), (preset, f)


def test_dense_path_unchanged_and_still_refuses_moe(tmp_path) -> None:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(MIXTRAL_HF))
    with pytest.raises(ModelError, match="num_local_experts"):
        load_model(str(p))
    assert load_moe_model(str(p)).experts == 8
    assert load_model("llama3-70b").ffn_hidden == 28672


def test_ep_plan_checks() -> None:
    v3 = load_moe_model("deepseek-v3")
    assert EpPlan(gpus=8, ep=8, attention_tp=1).check(v3).experts_per_rank(v3) == 32
    with pytest.raises(UserError, match="ep: 7"):
        EpPlan(gpus=7, ep=7).check(v3)
    with pytest.raises(UserError, match="expert_tp"):
        EpPlan(gpus=8, ep=4, expert_tp=2).check(load_moe_model("mixtral-8x7b").model_copy(
            update={"expert_ffn_hidden": 15}))


def test_uniform_routing_is_deepeps_draw_and_seeded() -> None:
    a = generate("uniform", 8, 256, 64, 8, seed=3)
    b = generate("uniform", 8, 256, 64, 8, seed=3)
    assert np.array_equal(a.topk_idx, b.topk_idx)
    assert all(len(set(row)) == 8 for row in a.topk_idx.reshape(-1, 8).tolist())  # distinct experts
    # the draw: top-k of |randn| + 1 over the experts, rank by rank
    rng = np.random.default_rng(3)
    s = np.abs(rng.standard_normal((256, 64))) + 1
    assert np.array_equal(a.topk_idx[0], np.argsort(-s, axis=1, kind="stable")[:, :8])


def test_group_limited_routing_stays_in_its_groups() -> None:
    r = generate("uniform", 2, 64, 256, 8, n_group=8, topk_group=4)
    groups = r.topk_idx // 32
    assert max(len(set(g)) for g in groups.reshape(-1, 8).tolist()) <= 4


def test_skewed_routing_is_imbalanced_and_capacity_drops() -> None:
    flat = generate("uniform", 8, 512, 64, 4, seed=1)
    skew = generate("powerlaw", 8, 512, 64, 4, seed=1, alpha=1.5)
    assert imbalance(skew.matrix("expert")) > imbalance(flat.matrix("expert")) + 0.2
    capped = generate("powerlaw", 8, 512, 64, 4, seed=1, alpha=1.5, capacity_factor=1.0, capacity="drop")
    cap = int(np.ceil(512 * 4 / 64))
    assert capped.dropped() > 0 and capped.expert_rows().max() <= cap
    padded = generate("powerlaw", 8, 512, 64, 4, seed=1, alpha=1.5, capacity_factor=1.0, capacity="pad")
    assert (padded.expert_rows() == cap).all()


def test_trace_replay(tmp_path) -> None:
    idx = np.random.default_rng(0).integers(0, 16, size=(8 * 4, 2))
    p = tmp_path / "trace.json"
    p.write_text(json.dumps({"topk_idx": idx.tolist()}))
    r = generate("trace", 8, 4, 16, 2, trace=str(p))
    assert np.array_equal(r.topk_idx.reshape(-1, 2), idx)
    with pytest.raises(UserError, match="trace"):
        generate("trace", 8, 5, 16, 2, trace=str(p))


@pytest.mark.parametrize("kernel", sorted(EP_KERNELS))
def test_functional_moe_layer_is_exact(kernel: str) -> None:
    cfg = load_system("hgx-h800")
    r = run_ep(cfg, kernel, "dispatch", 12, 256, 3, 16, "fp8", functional=True, seed=2)
    assert r.correct is True


def test_deepep_normal_sends_one_copy_per_rank_ll_one_per_expert() -> None:
    cfg = load_system("hgx-h800")
    n = run_ep(cfg, "deepep", "dispatch", 64, 256, 8, 64, "bf16")
    ll = run_ep(cfg, "deepep-ll", "dispatch", 64, 256, 8, 64, "bf16")
    nc = run_ep(cfg, "nccl", "dispatch", 64, 256, 8, 64, "bf16")
    assert n.own_bytes < ll.own_bytes == nc.own_bytes


def test_fewer_sms_is_slower() -> None:
    cfg = load_system("hgx-h800")
    fast = run_ep(cfg, "deepep", "dispatch", 512, 2048, 8, 64, "bf16", sms=24)
    slow = run_ep(cfg, "deepep", "dispatch", 512, 2048, 8, 64, "bf16", sms=8)
    assert slow.time_us > 1.5 * fast.time_us


def test_host_sync_costs_time() -> None:
    cfg = load_system("hgx-h800")
    a = run_ep(cfg, "deepep", "dispatch", 64, 1024, 8, 64, "bf16")
    b = run_ep(cfg, "deepep", "dispatch", 64, 1024, 8, 64, "bf16", host_sync=True)
    assert b.time_us > a.time_us + 5


@pytest.mark.parametrize("kwargs, field", [
    (dict(kernel="x"), "kernel"), (dict(op="x"), "op"), (dict(dtype="fp4"), "dtype"),
    (dict(experts=12), "experts"), (dict(routing="zipf"), "routing"), (dict(sms=3), "sms"),
    (dict(tokens=10**8), "tokens")])  # refused by its event estimate before the routing is drawn
def test_bad_input_names_the_field(kwargs: dict, field: str) -> None:
    args = dict(kernel="deepep", op="dispatch", tokens=8, hidden=256, topk=2, experts=16, dtype="bf16")
    args.update(kwargs)
    cfg = load_system("hgx-h800")
    with pytest.raises(UserError) as exc:
        run_ep(cfg, args.pop("kernel"), args.pop("op"), **args)
    assert str(exc.value).startswith(f"{field}:") and "\n" not in str(exc.value)


def _published() -> list[dict[str, str]]:
    import csv
    import io
    from importlib import resources
    text = (resources.files("cais") / "data" / "published" / "deepep-h800-ep8.csv").read_text()
    return list(csv.DictReader(io.StringIO("\n".join(x for x in text.splitlines() if not x.startswith("#")))))


def _ours(row: dict[str, str]) -> float:
    from cais.experiments.ep import run_ep_tuned
    cfg = load_system(row["system"], gpus=int(row["gpus"]))
    r = run_ep_tuned(cfg, row["kernel"], row["op"], int(row["tokens"]), int(row["hidden"]), int(row["topk"]),
                     int(row["experts"]), row["dtype"], sms=int(row["sms"]) if row["sms"] else None)
    return float(getattr(r, row["metric"]))


@pytest.mark.parametrize("which", [("fit", "deepep", "dispatch"), ("fit", "deepep", "combine"),
                                   ("fit", "deepep-ll", "dispatch")])
def test_fit_set_within_10_percent(which: tuple[str, str, str]) -> None:
    """DeepEP's published H800 EP8 figures (the fit set; data/published/deepep-h800-ep8.csv).
    The low-latency combine row is a documented miss (docs/moe.md) and not asserted."""
    row = next(r for r in _published() if (r["set"], r["kernel"], r["op"]) == which)
    assert abs(_ours(row) / float(row["published"]) - 1) < 0.10


def test_held_out_h800_bf16_dispatch_within_20_percent() -> None:
    row = next(r for r in _published() if r["set"] == "held-out" and r["system"] == "hgx-h800")
    assert abs(_ours(row) / float(row["published"]) - 1) < 0.20


def test_every_published_row_names_its_set_and_source() -> None:
    rows = _published()
    assert {r["set"] for r in rows} == {"fit", "held-out"}
    assert all(r["source"] and float(r["published"]) > 0 for r in rows)


@pytest.mark.parametrize("kernel", ["deepep-ll", "nccl"])
def test_functional_exact_with_dropped_tokens(kernel: str) -> None:
    cfg = load_system("hgx-h800")
    r = run_ep(cfg, kernel, "dispatch", 16, 128, 2, 16, "bf16", routing="powerlaw", alpha=2.0,
               capacity_factor=0.5, capacity="drop", functional=True)
    assert r.dropped > 0 and r.correct is True


def test_cli_ep_json(capsys: pytest.CaptureFixture[str]) -> None:
    from cais.cli import main
    assert main(["ep", "--system", "hgx-h800", "--kernel", "deepep", "--op", "combine", "--tokens", "32",
                 "--hidden", "256", "--topk", "2", "--experts", "16", "--json"]) in (0, None)
    out = json.loads(capsys.readouterr().out)
    assert out["time_us"] > 0 and out["algbw_GBps"] > 0 and len(out["send_matrix"]) == 8


@pytest.mark.parametrize("model", ["mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3"])
def test_every_preset_runs_under_every_kernel(model: str, capsys: pytest.CaptureFixture[str]) -> None:
    from cais.cli import main
    for kernel in sorted(EP_KERNELS):
        for op in ("dispatch", "combine"):
            assert main(["ep", "--model", model, "--kernel", kernel, "--op", op, "--tokens", "8", "--json"]) in (0, None)
            out = json.loads(capsys.readouterr().out)
            assert out["time_us"] > 0 and out["experts"] == load_moe_model(model).experts


def test_nccl_alltoall_matches_nccl_tests_on_h100_within_20_percent() -> None:
    """nccl-tests' alltoall_perf on 4 H100s (data/published/nccl-alltoall-h100.csv; no
    constant fitted on it): the nccl kernel over the same bytes, equal shares."""
    import csv
    import io
    from importlib import resources

    from cais.experiments.ep import run_ep

    text = (resources.files("cais") / "data" / "published" / "nccl-alltoall-h100.csv").read_text()
    rows = list(csv.DictReader(io.StringIO("\n".join(x for x in text.splitlines() if not x.startswith("#")))))
    assert rows and all(r["set"] == "held-out" and r["routing"] == "balanced" for r in rows)
    for row in rows:
        cfg = load_system(row["system"], gpus=int(row["gpus"]))
        r = run_ep(cfg, row["kernel"], row["op"], int(row["tokens"]), int(row["hidden"]), int(row["topk"]),
                   int(row["experts"]), row["dtype"], routing=row["routing"])
        share = int(row["tokens"]) // int(row["gpus"])  # rows every rank sends every rank: equal shares
        assert r.send_matrix == [[share] * int(row["gpus"])] * int(row["gpus"])
        assert abs(r.time_us / float(row["published"]) - 1) < 0.20


def test_balanced_routing_gives_every_rank_and_expert_equal_rows() -> None:
    from cais.workload.routing import generate

    rt = generate("balanced", 4, 64, 16, 4)
    per = rt.expert_rows()
    assert per.shape == (4, 16) and (per == 64 * 4 // 16).all()
    assert all(len(set(rt.topk_idx[0, t])) == 4 for t in range(64))  # distinct experts per token
