"""A MoE run's per-GPU HBM footprint (cais.workload.moe_footprint; docs/memory.md, "MoE
runs"): each part follows from the model's fields, MLA is counted as itself, over the
capacity the MoE path warns (in --json and on stderr) where the dense path refuses."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from cais.config import apply_overrides, load_system
from cais.experiments.layer import moe_memory, moe_period, run_layer
from cais.workload.footprint import GB, MemoryCapacityError, footprint, stored_activation_bytes
from cais.workload.models import load_model
from cais.workload.moe import MoeSpec, from_hf_moe_config, load_moe_model
from cais.workload.dims import dims_for
from cais.workload.moe_dataflow import dense_layer_model, moe_dims
from cais.workload.moe_footprint import WEIGHT_PARTS, mla_attention_params, moe_footprint, weight_parts

V3_HF = {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
         "moe_intermediate_size": 2048, "n_routed_experts": 256, "num_experts_per_tok": 8, "n_shared_experts": 1,
         "n_group": 8, "topk_group": 4, "first_k_dense_replace": 3, "num_attention_heads": 128,
         "num_key_value_heads": 128, "num_hidden_layers": 61, "q_lora_rank": 1536, "kv_lora_rank": 512,
         "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280,
         "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                 "weight_block_size": [128, 128]}}


def test_the_importer_reads_mla_and_the_fp8_release() -> None:
    hf = from_hf_moe_config(V3_HF, name="deepseek-v3")
    preset = load_moe_model("deepseek-v3")
    for f in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
              "weight_dtype_bytes", "attention", "head_dim"):
        assert getattr(hf, f) == getattr(preset, f), f
    assert preset.weight_dtype_bytes == 1 and preset.kv_lora_rank == 512 and preset.qk_rope_head_dim == 64
    assert load_moe_model("mixtral-8x7b").weight_dtype_bytes == load_moe_model("qwen3-30b-a3b").weight_dtype_bytes == 2
    plain = {k: v for k, v in V3_HF.items() if k != "quantization_config"}
    assert from_hf_moe_config(plain).weight_dtype_bytes == 2
    data = preset.model_dump()
    del data["v_head_dim"]
    with pytest.raises(ValidationError, match="v_head_dim"):
        MoeSpec.model_validate(data)


def test_mla_weights_are_its_projections_not_the_timed_mha() -> None:
    v3 = load_moe_model("deepseek-v3")
    h, heads = 7168, 128
    per_layer = (h * 1536 + h * (512 + 64)  # q_a_proj, kv_a_proj_with_mqa (replicated)
                 + 1536 * heads * (128 + 64) + 512 * heads * (128 + 128) + heads * 128 * h)  # q_b, kv_b, o_proj
    assert mla_attention_params(v3, 1) == per_layer == 187_105_280
    split = 1536 * heads * 192 + 512 * heads * 256 + heads * 128 * h
    assert mla_attention_params(v3, 8) == h * 1536 + h * 576 + split // 8
    mha = h * 3 * heads * 192 + heads * 192 * h  # what the layer times: Q, K, V and out of 128 x 192
    assert per_layer < mha
    # every parameter on one GPU: DeepSeek-V3's 671 G (no MTP module)
    d = moe_dims(v3, 1, "prefill", "dp")
    assert sum(weight_parts(v3, 1, d).values()) / 1e9 == pytest.approx(671.0, abs=0.1)


def test_mla_kv_cache_is_the_latent_whole_on_every_attention_rank() -> None:
    v3 = load_moe_model("deepseek-v3", batch=16, seq=1024)
    tp = moe_footprint(v3, 8, "decode", "tp")
    assert tp.kv_cache == 61 * (512 + 64) * 2 * 16 * 1024
    assert moe_footprint(v3, 8, "decode", "dp").kv_cache == tp.kv_cache  # dp: each GPU its own 16 sequences
    mx = load_moe_model("mixtral-8x7b", batch=16, seq=1024)  # GQA: 8 KV heads over 8 GPUs, one each
    assert moe_footprint(mx, 8, "decode", "tp").kv_cache == 32 * 2 * 1 * 128 * 2 * 16 * 1024
    assert moe_footprint(mx, 8, "train", "tp").kv_cache == 0


def test_doubling_the_experts_grows_the_expert_weights_by_their_bytes() -> None:
    v3 = load_moe_model("deepseek-v3", seq=256)
    big = v3.model_copy(update={"experts": 512})
    a, b = moe_footprint(v3, 8, "prefill"), moe_footprint(big, 8, "prefill")
    one = 3 * 7168 * 2048  # one expert's parameters, FP8
    assert b.weight_parts["experts"] - a.weight_parts["experts"] == 58 * 256 * one // 8
    assert b.weight_parts["router"] == 2 * a.weight_parts["router"] == 2 * 58 * 7168 * 256 * 2  # BF16
    for part in ("attention", "shared", "dense_mlp", "embeddings"):
        assert a.weight_parts[part] == b.weight_parts[part], part
    assert b.weights - a.weights == 58 * 256 * one // 8 + 58 * 7168 * 256 * 2
    assert set(a.weight_parts) == set(WEIGHT_PARTS) and a.weights == sum(a.weight_parts.values())


def test_expert_tp_splits_each_expert_so_a_gpu_holds_the_same_bytes() -> None:
    v3 = load_moe_model("deepseek-v3", seq=256)
    a, b = moe_footprint(v3, 8, "prefill", expert_tp=1), moe_footprint(v3, 8, "prefill", expert_tp=2)
    assert a.weight_parts["experts"] == b.weight_parts["experts"] == 58 * 256 * 3 * 7168 * 2048 // 8


def test_weight_dtype_is_inference_only_and_training_holds_adam_state() -> None:
    v3 = load_moe_model("deepseek-v3", seq=256)
    bf16 = v3.model_copy(update={"weight_dtype_bytes": 2})
    f8, b16 = moe_footprint(v3, 8, "prefill"), moe_footprint(bf16, 8, "prefill")
    for part in ("attention", "experts", "shared", "dense_mlp"):
        assert b16.weight_parts[part] == 2 * f8.weight_parts[part], part
    for part in ("router", "embeddings"):
        assert b16.weight_parts[part] == f8.weight_parts[part], part
    train = moe_footprint(v3, 8, "train")
    params = train.weights // 2
    assert train.weights == b16.weights and train.gradients == 2 * params and train.optimizer == 12 * params
    assert f8.gradients == f8.optimizer == 0


def test_train_activations_grow_with_the_layers_and_the_busiest_gpu() -> None:
    q = load_moe_model("qwen3-30b-a3b", seq=512)
    deeper = q.model_copy(update={"layers": q.layers + 1})
    a, b = moe_footprint(q, 8, "train"), moe_footprint(deeper, 8, "train")
    kept = b.activations - a.activations
    assert 0 < kept < a.activations
    even = moe_footprint(q, 8, "prefill", received=[100] * 8)
    skew = moe_footprint(q, 8, "prefill", received=[100] * 7 + [300])
    assert moe_footprint(q, 8, "prefill").activations == even.activations < skew.activations


def test_the_run_warns_over_capacity_and_reports_memory() -> None:
    cfg = load_system("dgx-h100")
    v3 = load_moe_model("deepseek-v3", seq=32, batch=2)
    r = run_layer(cfg, v3, "ep-deepep", "prefill")
    assert r.memory is not None and r.memory.total > 80 * GB and r.hbm_capacity_GB == 80
    line = r.adjusted["memory"]
    assert "gpu.hbm_capacity_GB" in line and "EP 8" in line and "\n" not in line
    fp, warning = moe_memory(cfg, v3, "prefill", "tp", moe_period(cfg, v3, "prefill", "tp", 0))
    assert warning == line and fp.total == r.memory.total
    roomy = run_layer(apply_overrides(cfg, {"gpu.hbm_capacity_GB": "141"}), v3, "ep-deepep", "prefill")
    assert "memory" not in roomy.adjusted and roomy.memory is not None and roomy.total_us == r.total_us


def test_the_warning_reaches_json_and_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    from cais.cli import main

    args = ["run", "--model", "deepseek-v3", "--scheme", "ep-deepep", "--mode", "decode", "--batch", "8",
            "--seq", "64"]
    assert main(args + ["--json"]) in (0, None)
    cap = capsys.readouterr()
    out = json.loads(cap.out)
    assert out["memory"]["total_GB"] > out["memory"]["capacity_GB"] == 80
    assert set(out["memory"]) == {"weights_GB", "kv_cache_GB", "activations_GB", "gradients_GB", "optimizer_GB",
                                  "total_GB", "capacity_GB"}
    assert "gpu.hbm_capacity_GB" in out["adjusted"]["memory"]
    assert [ln for ln in cap.err.splitlines() if ln.startswith("cais: warning: memory: deepseek-v3 decode")]
    assert main(args + ["--set", "gpu.hbm_capacity_GB=141"]) in (0, None)
    assert "memory" not in capsys.readouterr().err


def test_the_dense_path_still_refuses() -> None:
    cfg = load_system("dgx-h100")
    big = load_model("llama3-70b", batch=1, seq=10_000_000)
    with pytest.raises(MemoryCapacityError, match=r"at TP 8, beyond the 80 GB"):
        run_layer(cfg, big, "tp-nvls", "decode")
    assert footprint(big, 8, "decode", False).total > 80 * GB


def test_the_docs_tables_are_checked_against_their_scripts() -> None:
    """docs/memory.md's MoE table and docs/moe.md's FP8 table are ``<!-- table: -->`` blocks of
    pages tests/test_samples.py reruns (scripts/samples.py ``FILES``); the memory table says
    DeepSeek-V3 is over an H100 and under an H200."""
    import importlib.util
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("samples", root / "scripts" / "samples.py")
    assert spec and spec.loader
    mod = sys.modules.get("samples") or importlib.util.module_from_spec(spec)
    if "samples" not in sys.modules:
        sys.modules["samples"] = mod
        spec.loader.exec_module(mod)
    assert "docs/memory.md" in mod.FILES and "docs/moe.md" in mod.FILES
    found = {s.command for s in mod.samples([root / "docs/memory.md", root / "docs/moe.md"])}
    assert {"python scripts/moe_memory_doc.py", "python scripts/fp8_dispatch_doc.py"} <= found
    page = (root / "docs" / "memory.md").read_text()
    assert "| deepseek-v3 | dgx-h100 | prefill |" in page and "over 80: warned |" in page and "under 141 |" in page


def test_the_activations_follow_mla_timing_and_the_latent_cache_is_kv_not_activation() -> None:
    """``moe.mla_timing=mla`` (the default): an MLA model's activations are its own graph's (they
    differ from the stand-in's), its latent cache stays the KV cache (counted once, not
    again among the activations), and weights and KV cache do not move; a model
    without MLA is the same either way."""
    v3 = load_moe_model("deepseek-v3", batch=16, seq=1024)
    for mode in ("decode", "prefill", "train"):
        mha, mla = moe_footprint(v3, 8, mode, "dp", mla_timing="mha"), moe_footprint(v3, 8, mode, "dp")
        assert mla.activations != mha.activations
        assert (mla.weights, mla.kv_cache) == (mha.weights, mha.kv_cache)
    decode = moe_footprint(v3, 8, "decode", "dp", mla_timing="mla")
    latent = 16 * 1024 * (512 + 64) * 2  # one GPU's 16 sequences of the latent cache, bf16
    assert 0 < decode.activations < latent  # the cache is not among the activations
    q = load_moe_model("qwen3-30b-a3b")
    assert moe_footprint(q, 8, "prefill", mla_timing="mla") == moe_footprint(q, 8, "prefill")
    base = load_system("dgx-h100")
    small = load_moe_model("deepseek-v3", batch=2, seq=256)
    runs = {t: run_layer(apply_overrides(base, {"moe.mla_timing": t}), small, "ep-deepep", "decode", attention="dp")
            for t in ("mha", "mla")}
    assert "qkv_a" in runs["mla"].segments and "qkv_a" not in runs["mha"].segments  # each path was taken
    mems = {t: r.memory for t, r in runs.items()}
    assert mems["mha"] is not None and mems["mla"] is not None
    assert mems["mla"].activations != mems["mha"].activations  # the run's setting reached its footprint
    assert mems["mla"].kv_cache == mems["mha"].kv_cache


def test_train_footprint_counts_dense_layers_that_do_not_split_over_every_gpu() -> None:
    """On 72 GPUs DeepSeek-V3's dense first layers run TP 8 (128 heads do not split over
    72): the training footprint counts their stored activations at that split, one
    group's 8 sequences (attention data parallel), instead of refusing the run."""
    model = load_moe_model("deepseek-v3", seq=64, batch=1, experts=288)
    with_dense = moe_footprint(model, 72, "train", "dp")
    moe_only = model.model_copy(update={"dense_layers": 0, "layers": model.layers - model.dense_layers})
    assert moe_only.moe_layers == model.moe_layers
    dense = with_dense.activations - moe_footprint(moe_only, 72, "train", "dp").activations
    dm = dense_layer_model(model, 8)
    assert dense == model.dense_layers * stored_activation_bytes(dm, dims_for(dm, 8, "train", True)) > 0
