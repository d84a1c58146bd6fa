"""MLA timed as MLA in MoE layers (``moe.mla_timing``; docs/moe.md, "Models"): under
``mla`` the decode attention reads the latent cache, the projections are MLA's GEMMs with
their shapes, the decode prologue writes the latent, DeepSeek-V3's decode period gets
faster, prefill and train run; the default (``mha``, the stand-in) is the run as it was,
a non-MLA model ignores the setting, a bad value is one line, and the functional expert
block stays exact."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cais.config import SystemConfig, load_system
from cais.experiments.layer import run_layer
from cais.kernels import mla as mla_kernels
from cais.schemes.base import LayerRun
from cais.workload.graph import Chain, Local
from cais.workload.moe import MoeSpec, load_moe_model
from cais.workload.moe_dataflow import build_moe_graph, build_moe_period

V3 = "deepseek-v3"
# a tiny MLA MoE model for the functional check (DeepSeek's field names, small widths)
TINY_MLA = {"name": "tiny-mla", "family": "test", "hidden": 128, "heads": 8, "kv_heads": 8, "head_dim": 24,
            "layers": 2, "dense_ffn_hidden": 256, "experts": 16, "topk": 4, "expert_ffn_hidden": 64,
            "shared_experts": 1, "n_group": 4, "topk_group": 2, "seq": 24, "batch": 2, "attention": "mla",
            "q_lora_rank": 48, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16}


def _cfg(timing: str | None = None, **gpu: Any) -> SystemConfig:
    cfg = load_system("dgx-h100")
    if timing is not None:
        cfg = cfg.with_overrides(moe={**cfg.moe.model_dump(), "mla_timing": timing})
    if gpu:
        cfg = cfg.with_overrides(gpu={**cfg.gpu.model_dump(), **gpu})
    return cfg


def _gemms(period: Any) -> dict[str, tuple[int, int, int]]:
    """Every GEMM of the period by name: (m, n, k)."""
    out = {}
    for s in period.segments:
        if isinstance(s, Local) and s.gemm is not None:
            out[s.name] = (s.gemm.m, s.gemm.n, s.gemm.k)
        elif isinstance(s, Chain):
            for g in (s.gemm1, s.gemm2):
                out[g.name] = (g.m, g.n, g.k)
    return out


@pytest.mark.parametrize("attention, heads_l", [("dp", 128), ("tp", 16)])
def test_decode_attention_reads_the_latent_cache(attention: str, heads_l: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Per GPU, the attention reads its sequences' latent cache once for all its heads
    (kv_len x 576 x 2 B x batch: every GPU of a TP group the group's whole batch), plus
    the absorbed query read and the latent output written."""
    seen: list[tuple[str, float]] = []
    real = mla_kernels.even_kernel

    def spy(name, work, tbs, sms, body, sm_set=None, hbm_bytes=0.0):  # type: ignore[no-untyped-def]
        seen.append((name, hbm_bytes))
        assert body is None  # it carries no data
        return real(name, work, tbs, sms, body, sm_set, hbm_bytes)
    monkeypatch.setattr(mla_kernels, "even_kernel", spy)
    batch, kv_len = 8, 1024
    model = load_moe_model(V3, seq=kv_len, batch=batch)
    run_layer(_cfg("mla"), model, "ep-deepep", "decode", attention=attention)
    attn = [b for name, b in seen if name == "attention"]
    assert len(attn) == 8  # one per GPU: the path under test ran
    cache = kv_len * (512 + 64) * 2 * batch
    q, o = batch * heads_l * (512 + 64) * 2, batch * heads_l * 512 * 2
    assert all(b == cache + q + o for b in attn)
    assert {name for name, _ in seen} >= {"q_a_norm", "kv_a_norm"}  # memory-bound norms under the fitted launch


def test_the_gemms_are_mlas_with_their_shapes() -> None:
    model = load_moe_model(V3, seq=1024, batch=8)
    h, q_lora, kv_lora, rope, nope, v = 7168, 1536, 512, 64, 128, 128
    dec = _gemms(build_moe_period(model, 8, "decode", "dp", mla_timing="mla"))
    heads = 128
    assert dec["qkv_a"] == (8, q_lora + kv_lora + rope, h)  # replicated: its whole width on every GPU
    assert dec["q_b"] == (8, heads * (nope + rope), q_lora)
    assert dec["q_absorb"] == (8, heads * kv_lora, nope)  # W_UK: every head's weights as one GEMM
    assert dec["v_absorb"] == (8, heads * v, kv_lora)  # W_UV
    assert dec["out_proj"] == (8, h, heads * v)
    assert "qkv" not in dec and "kv_b" not in dec
    tp = _gemms(build_moe_period(model, 8, "decode", "tp", mla_timing="mla"))  # 16 heads per GPU
    assert tp["qkv_a"] == (8, q_lora + kv_lora + rope, h) and tp["q_b"] == (8, 16 * (nope + rope), q_lora)
    assert tp["out_proj"] == (8, h, 16 * v) and tp["q_absorb"] == (8, 16 * kv_lora, nope)
    pre = _gemms(build_moe_period(load_moe_model(V3, seq=512, batch=1), 8, "prefill", "dp", mla_timing="mla"))
    assert pre["kv_b"] == (512, heads * (nope + v), kv_lora) and "q_absorb" not in pre and "v_absorb" not in pre
    train = _gemms(build_moe_period(load_moe_model(V3, seq=128, batch=1), 8, "train", "tp", mla_timing="mla"))
    assert train["qkv_a_dgrad"] == (128, h, q_lora + kv_lora + rope)
    assert train["q_b_wgrad"] == (q_lora, 16 * (nope + rope), 128) and train["kv_b_wgrad"] == (kv_lora, 16 * 256, 128)
    for mode in ("decode", "prefill", "train"):  # every GEMM's operands have the shapes its m, n, k say
        for attention in ("dp", "tp"):
            assert build_moe_graph(model, 8, mode, attention, mla_timing="mla").problems() == []


def test_the_decode_prologue_writes_the_latent(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the graph launch: rotary on the query's RoPE part and the shared key, then
    the latent (kv_lora + rope) written, read and written each; the latent norms are
    small kernels as they are."""
    seen: list[tuple[str, int]] = []
    real = LayerRun.small_kernel

    def spy(self, name, nbytes):  # type: ignore[no-untyped-def]
        seen.append((name, nbytes))
        return real(self, name, nbytes)
    monkeypatch.setattr(LayerRun, "small_kernel", spy)
    run_layer(_cfg("mla", launch="graph"), load_moe_model(V3, seq=1024, batch=8), "ep-deepep", "decode",
              attention="dp")
    assert seen.count(("rotary", 2 * 8 * (128 + 1) * 64 * 2)) == 8
    assert seen.count(("kv_write", 2 * 8 * 576 * 2)) == 8
    # the latent norms are small kernels of the step too, their latents read and written
    assert seen.count(("q_a_norm", 2 * 8 * 1536 * 2)) == 8 and seen.count(("kv_a_norm", 2 * 8 * 512 * 2)) == 8


def test_deepseek_v3_decode_is_faster_under_mla() -> None:
    model = load_moe_model(V3, seq=1024, batch=8)
    mha = run_layer(_cfg("mha"), model, "ep-deepep", "decode", attention="dp")
    mla = run_layer(_cfg("mla"), model, "ep-deepep", "decode", attention="dp")
    assert mla.total_us < mha.total_us
    assert mla.segments["attention"] < mha.segments["attention"]
    assert "qkv" in mha.segments and "qkv" not in mla.segments
    assert {"qkv_a", "q_a_norm", "kv_a_norm", "q_b", "q_absorb", "v_absorb"} <= set(mla.segments)
    # the expert block is the same period's: the routing and its exchanges do not move
    assert mla.moe is not None and mha.moe is not None
    assert mla.moe["send_matrix_expert"] == mha.moe["send_matrix_expert"]


@pytest.mark.parametrize("mode, attention", [("prefill", "dp"), ("prefill", "tp"), ("train", "dp"), ("train", "tp")])
def test_prefill_and_train_run(mode: str, attention: str) -> None:
    model = load_moe_model(V3, seq=128, batch=1)
    r = run_layer(_cfg("mla"), model, "ep-deepep", mode, attention=attention)
    assert r.total_us > 0 and "kv_b" in r.segments and r.segments["attention"] > 0
    if mode == "train":
        assert {"attention_bwd", "kv_b_dgrad", "q_b_dgrad", "qkv_a_dgrad", "qkv_a_wgrad", "q_b_wgrad",
                "kv_b_wgrad", "q_a_norm_bwd", "kv_a_norm_bwd"} <= set(r.segments)


@pytest.mark.parametrize("mode, attention, scheme", [("decode", "dp", "ep-deepep"), ("prefill", "tp", "ep-nccl"),
                                                     ("train", "dp", "ep-deepep")])
def test_the_default_is_mla_and_the_stand_in_is_asked_for(mode: str, attention: str, scheme: str) -> None:
    model = load_moe_model(V3, seq=128, batch=8 if mode == "decode" else 1)
    unset = run_layer(_cfg(), model, scheme, mode, attention=attention)
    mla = run_layer(_cfg("mla"), model, scheme, mode, attention=attention)
    mha = run_layer(_cfg("mha"), model, scheme, mode, attention=attention)
    assert _cfg().moe.mla_timing == "mla"
    assert (unset.total_us, unset.events, unset.segments) == (mla.total_us, mla.events, mla.segments)
    assert "qkv_a" in unset.segments and "qkv" not in unset.segments
    assert "qkv" in mha.segments and "qkv_a" not in mha.segments and mha.total_us != mla.total_us
    assert build_moe_period(model, 8, mode, attention).mla is not None
    assert build_moe_period(model, 8, mode, attention, mla_timing="mha").mla is None


@pytest.mark.parametrize("mode", ["decode", "prefill"])
def test_a_model_without_mla_ignores_it(mode: str) -> None:
    model = load_moe_model("qwen3-30b-a3b", seq=128, batch=8)
    a = run_layer(_cfg("mha"), model, "ep-deepep", mode, attention="dp")
    b = run_layer(_cfg("mla"), model, "ep-deepep", mode, attention="dp")
    assert (a.total_us, a.events, a.segments) == (b.total_us, b.events, b.segments)
    assert build_moe_period(model, 8, mode, "dp", mla_timing="mla").mla is None


def test_a_bad_value_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from cais.cli import main

    assert main(["run", "--model", V3, "--scheme", "ep-deepep", "--mode", "decode", "--batch", "8", "--seq", "64",
                 "--set", "moe.mla_timing=x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "moe.mla_timing" in err and "'mha' or 'mla'" in err and "Traceback" not in err


@pytest.mark.parametrize("mode", ["prefill", "decode"])
@pytest.mark.parametrize("attention", ["tp", "dp"])
def test_functional_expert_block_stays_exact(mode: str, attention: str) -> None:
    model = MoeSpec.model_validate(TINY_MLA)
    r = run_layer(_cfg("mla"), model, "ep-deepep", mode, functional=True, seed=3, attention=attention)
    assert r.checked == 1 and r.mismatches == []
    assert "q_b" in r.segments and "qkv" not in r.segments  # MLA's ops ran


def test_cli_json_reports_mla_segments(capsys: pytest.CaptureFixture[str]) -> None:
    from cais.cli import main

    assert main(["run", "--model", V3, "--scheme", "ep-deepep", "--mode", "decode", "--attention", "dp", "--batch",
                 "8", "--seq", "1024", "--set", "moe.mla_timing=mla", "--json"]) in (0, None)
    seg = json.loads(capsys.readouterr().out)["segments_us"]
    assert {"qkv_a", "q_b", "q_absorb", "v_absorb"} <= set(seg) and "qkv" not in seg


def test_the_pages_prose_holds_against_its_table() -> None:
    """docs/moe.md's "MLA timed as MLA" quotes its generated table (re-run by
    tests/test_samples.py) and the weights it compares; both as the code gives them."""
    from pathlib import Path

    from cais.hw.compute import ComputeModel
    from cais.workload.mla import mla_dims

    page = (Path(__file__).resolve().parents[1] / "docs" / "moe.md").read_text()
    block = page.split("<!-- table: python scripts/mla_timing_doc.py -->", 1)[1].split("<!-- /table -->", 1)[0]
    prose = " ".join(page.split("<!-- table: python scripts/mla_timing_doc.py -->", 1)[1].split(
        "<!-- /table -->", 1)[1].split("\n### ", 1)[0].split())
    rows = [[c.strip() for c in r.split("|")[1:-1]] for r in block.strip().splitlines()[2:]]
    assert len(rows) == 8
    vs = {(r[0], r[2]): r[9] for r in rows if r[3] == "mla"}
    assert "0.70x of the stand-in's at KV 1,024 and 0.50x at 4,096" in prose
    assert (vs[("decode", "1,024")], vs[("decode", "4,096")]) == ("0.70x", "0.50x")
    assert f"({vs[('prefill', '512')]}, {vs[('train', '512')]})" == "(0.75x, 0.72x)" and "(0.75x, 0.72x)" in prose
    other = {(r[0], r[2], r[3]): float(r[8].replace(",", "")) for r in rows}
    for mode, seq in (("decode", "1,024"), ("decode", "4,096"), ("prefill", "512"), ("train", "512")):
        assert abs(other[(mode, seq, "mla")] / other[(mode, seq, "mha")] - 1) < 0.002
    model = load_moe_model(V3)
    lat = mla_dims(model, model.heads)
    assert lat is not None
    stand_in = model.hidden * (model.heads + 2 * model.kv) * model.head_dim
    mla_in = model.hidden * lat.qkv_a + lat.q_lora * lat.q_width + lat.nope * lat.heads_l * lat.kv_lora
    assert f"7,168 x 73,728: {stand_in / 1e6:.1f} M values" in prose
    assert f"W_UK: {mla_in / 1e6:.1f} M, {stand_in / mla_in:.1f}x fewer" in prose
    cm = ComputeModel.for_gpu(load_system("dgx-h100").gpu)
    assert f"({cm.attn_efficiency_fwd:.3f} of the tensor-core peak;" in " ".join(page.split())
    roof = {r[2]: float(r[11]) for r in rows if r[0] == "decode" and r[3] == "mla"}
    attn = {r[2]: float(r[5]) for r in rows if r[0] == "decode" and r[3] == "mla"}
    assert all(attn[kv] >= roof[kv] - 0.05 for kv in roof) and len(roof) == 2  # never below its FLOPs' time
    assert abs(attn["4,096"] - roof["4,096"]) < 0.05  # "compute-bound at long caches (KV 4,096 under dp)"


@pytest.mark.parametrize("mode", ["decode", "prefill", "train"])
def test_without_a_query_latent_the_query_is_q_proj(mode: str) -> None:
    """DeepSeek-V2-Lite's form (no q_lora_rank): a column-parallel q_proj from the normed
    rows, no query norm; the replicated projection is the KV latent's alone."""
    model = MoeSpec.model_validate({**TINY_MLA, "q_lora_rank": None})
    period = build_moe_period(model, 8, mode, "tp", mla_timing="mla")
    gemms = _gemms(period)
    assert gemms["qkv_a"] == (8 if mode == "decode" else 48, 32 + 8, 128)  # decode: 2 sequences padded to 8 rows
    assert gemms["q_proj"][1:] == (1 * (16 + 8), 128) and "q_b" not in gemms
    assert not any(isinstance(s, Local) and s.kind.startswith("q_a_norm") for s in period.segments)
    assert build_moe_graph(model, 8, mode, "tp", mla_timing="mla").problems() == []
    r = run_layer(_cfg("mla"), model, "ep-deepep", mode)
    assert "q_proj" in r.segments and r.total_us > 0


def test_the_report_says_mla_was_timed(capsys: pytest.CaptureFixture[str]) -> None:
    """--json's ``moe.mla`` and the text report's attention say whether MLA's own ops ran."""
    from cais.cli import main

    args = ["run", "--model", V3, "--scheme", "ep-deepep", "--mode", "decode", "--batch", "2", "--seq", "256",
            "--attention", "dp"]
    main([*args, "--json"])
    assert json.loads(capsys.readouterr().out)["moe"]["mla"] is True
    main([*args, "--set", "moe.mla_timing=mha", "--json"])
    assert json.loads(capsys.readouterr().out)["moe"]["mla"] is False
    main(args)
    assert "attention dp (MLA's own ops)" in " ".join(capsys.readouterr().out.split())  # however it wraps
