"""The per-GPU HBM footprint of a run and its check against ``gpu.hbm_capacity_GB``
(cais.workload.footprint, docs/memory.md): the issue's llama3-70b decode cases, the
train-mode optimizer state, the escape, the JSON and the bad inputs."""

from __future__ import annotations

import json

import pytest

from cais.cli import main
from cais.errors import UserError
from cais.experiments.layer import check_layer, check_memory
from cais.config import apply_overrides, load_system
from cais.workload.dims import dims_for
from cais.workload.footprint import GB, MemoryCapacityError, footprint, stored_activation_bytes
from cais.workload.models import load_model

LLAMA70 = load_model("llama3-70b")  # batch 1
DECODE = ["run", "--model", "llama3-70b", "--mode", "decode", "--scheme", "tp-nvls"]


def test_presets_give_their_gpus_hbm() -> None:
    caps = {"dgx-h100": 80, "dgx-h100-paper": 80, "h100-nvswitch": 80, "paper-world": 80, "dgx-h200": 141,
            "nvl72": 186}
    assert {name: load_system(name).gpu.hbm_capacity_GB for name in caps} == caps


def test_llama3_70b_decode_of_a_million_tokens_fits_an_h100() -> None:
    fp = footprint(LLAMA70.with_run(seq=1_000_000), 8, "decode", sp=False)
    assert fp.kv_cache == 80 * 2 * 1 * 128 * 2 * 1_000_000  # layers x K,V x one KV head per GPU x dim x bf16 x seq
    assert fp.kv_cache / GB == pytest.approx(40.96)
    assert 17.0 < fp.weights / GB < 18.0  # 70.6B parameters x 2 B / 8, embeddings included
    assert fp.gradients == fp.optimizer == 0
    assert fp.total < 80 * GB
    check_memory(load_system("dgx-h100"), LLAMA70.with_run(seq=1_000_000), "decode", sp=False)


def test_a_kv_head_is_held_whole_where_kv_heads_are_fewer_than_the_gpus() -> None:
    model = LLAMA70.with_run(seq=100_000)
    at8, at16 = (footprint(model, n, "decode", sp=False) for n in (8, 16))
    assert at16.kv_cache == at8.kv_cache  # 8 KV heads: one per GPU at TP 8, one (replicated) per GPU at TP 16
    assert at16.weights < at8.weights


def test_ten_million_tokens_are_refused_in_one_line(capsys) -> None:
    assert main([*DECODE, "--seq", "10000000"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("cais: error: memory: llama3-70b decode with batch 1 and seq 10,000,000 needs 427.2 GB "
                          "per GPU (weights 17.6, KV cache 409.6, activations 0.0 GB) at TP 8, beyond the 80 GB of "
                          "HBM of one H100-SXM; reduce seq or batch, use more GPUs, or set gpu.hbm_capacity_GB")


def test_the_capacity_escape_lets_the_ten_million_case_pass_the_check() -> None:
    model = LLAMA70.with_run(seq=10_000_000)
    h100 = load_system("dgx-h100")
    with pytest.raises(MemoryCapacityError, match="KV cache 409.6"):
        check_layer(h100, model, "tp-nvls", "decode")
    big = apply_overrides(h100, {"gpu.hbm_capacity_GB": "1000"})
    check_layer(big, model, "tp-nvls", "decode")
    assert check_memory(big, model, "decode", sp=False).total / GB == pytest.approx(427.2, abs=0.05)


def test_a_million_tokens_run_and_the_json_carries_memory(capsys) -> None:
    assert main([*DECODE, "--seq", "1000000", "--json"]) == 0
    mem = json.loads(capsys.readouterr().out)["memory"]
    assert set(mem) == {"weights_GB", "kv_cache_GB", "activations_GB", "gradients_GB", "optimizer_GB", "total_GB",
                        "capacity_GB"}
    assert mem["kv_cache_GB"] == pytest.approx(40.96) and mem["capacity_GB"] == 80
    assert mem["total_GB"] == pytest.approx(sum(v for k, v in mem.items() if k not in ("total_GB", "capacity_GB")))


def test_train_adds_gradients_and_adam_state() -> None:
    """Mixed-precision Adam: 2 B weight + 2 B gradient + 12 B fp32 master, m, v per
    parameter. llama3-70b fits 8 H100s for prefill, not for training (141 GB of state
    per GPU): the advice is more GPUs, not a shorter sequence."""
    model = LLAMA70.with_run(batch=1, seq=256)
    h100 = load_system("dgx-h100")
    check_layer(h100, model, "tp-nvls", "prefill")
    fp = footprint(model, 8, "train", sp=False)
    assert fp.kv_cache == 0 and fp.gradients == fp.weights and fp.optimizer == 6 * fp.weights
    assert (fp.weights + fp.gradients + fp.optimizer) / GB == pytest.approx(16 * fp.weights / 2 / GB)
    with pytest.raises(MemoryCapacityError, match=r"^memory: llama3-70b train .* gradients 17\.6, optimizer 105\.8 "
                                                  r"GB\) at TP 8, .*; use more GPUs, or set gpu\.hbm_capacity_GB$"):
        check_layer(h100, model, "tp-nvls", "train")
    fp32 = footprint(load_model("llama3-8b", dtype_bytes=4, seq=256), 8, "train", sp=False)
    assert fp32.optimizer == 2 * fp32.weights  # no master copy in fp32: m and v only


def test_stored_activations_follow_korthikanti() -> None:
    """GPT layer (MHA, FFN 4h), selective recomputation: sbh(10 + 24/t) bytes per layer
    with TP only, sbh * 34/t with sequence parallelism (Korthikanti et al. 2022, Table 2)."""
    model = load_model("gpt3-175b", seq=2048, batch=2)
    s, b, h, t = 2048, 2, 12288, 8
    assert stored_activation_bytes(model, dims_for(model, t, "train", False)) == s * b * h * (10 + 24 // t)
    assert stored_activation_bytes(model, dims_for(model, t, "train", True)) == s * b * h * 34 // t
    tp, sp = (footprint(model.with_run(seq=256), t, "train", sp) for sp in (False, True))
    assert sp.activations < tp.activations


@pytest.mark.parametrize("name", ["paper-llama-7b", "paper-mega-gpt-4b", "paper-mega-gpt-8b"])
@pytest.mark.parametrize("mode", ["prefill", "train", "decode"])
@pytest.mark.parametrize("scheme", ["tp-nvls", "sp-nvls"])
def test_the_papers_runs_fit(name, mode, scheme) -> None:
    check_layer(load_system("dgx-h100"), load_model(name), scheme, mode, 66)


@pytest.mark.parametrize("system, name, over, gpus", [
    ("dgx-h100", "paper-full", {}, 8),
    ("dgx-h100", "llama3-70b", {"seq": 4096}, 8),
    ("dgx-h100", "paper-llama-7b", {"batch": 64}, 8),  # the decode experiment
    ("nvl72", "llama3-70b", {"seq": 2048, "hidden": 9216, "heads": 72, "kv_heads": 72, "ffn_hidden": 27648}, 8),
    ("nvl72", "llama3-405b", {}, 64),
])
def test_the_full_size_runs_fit(system, name, over, gpus) -> None:
    for mode in ("prefill", "decode"):
        for sp in (False, True):  # the memory check alone: some are beyond the event limit in full mode
            check_memory(load_system(system, gpus=gpus), load_model(name, **over), mode, sp)


def _one_line_exit_2(capsys, args: list[str]) -> str:
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("cais: error: ")
    return err


RUN = ["run", "--model", "paper-mega-gpt-4b", "--scheme", "tp-nvls", "--mode", "prefill", "--batch", "1"]


@pytest.mark.parametrize("value, says", [
    ("-1", "greater than 0"), ("0", "greater than 0"), ("abc", "valid number"), ("inf", "finite number"),
    ("nan", "finite number"), ("null", "valid number")])
def test_a_bad_capacity_is_one_line(capsys, value, says) -> None:
    err = _one_line_exit_2(capsys, [*RUN, "--set", f"gpu.hbm_capacity_GB={value}"])
    assert "'gpu.hbm_capacity_GB'" in err and says in err


def test_a_bad_capacity_in_a_system_file_names_the_field(capsys, tmp_path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"base": "dgx-h100", "gpu": {"hbm_capacity_GB": -5}}))
    err = _one_line_exit_2(capsys, [*RUN, "--system", str(path)])
    assert "field 'gpu.hbm_capacity_GB'" in err


def test_an_over_capacity_run_writes_nothing(capsys, tmp_path) -> None:
    out, trace = tmp_path / "runs.parquet", tmp_path / "trace.json"
    err = _one_line_exit_2(capsys, ["run", "--model", "llama3-70b", "--scheme", "sp-nvls", "--mode", "train",
                                    "--batch", "1", "--seq", "256", "--out", str(out), "--trace", str(trace)])
    assert "memory: llama3-70b train" in err and "optimizer" in err
    assert list(tmp_path.iterdir()) == []


def test_a_tiny_capacity_refuses_a_small_run(capsys) -> None:
    err = _one_line_exit_2(capsys, [*RUN, "--set", "gpu.hbm_capacity_GB=0.5"])
    assert "memory: paper-mega-gpt-4b prefill" in err and "beyond the 0.5 GB of HBM" in err
    assert "reduce seq or batch" not in err  # its weights alone (0.8 GB) are over


def test_the_error_is_a_user_error() -> None:
    assert issubclass(MemoryCapacityError, UserError)
