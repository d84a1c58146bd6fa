"""FP8 dispatch in a MoE layer (``moe.dispatch_dtype``; docs/moe.md, "FP8 dispatch"): the
BF16 default is the layer path as it was, bit for bit; FP8 sends the forward dispatch's
rows at 1 B per element plus one FP32 scale per 128, counted, while the combine and the
backward's exchanges stay BF16; kernels whose stack sends the model's dtype refuse it in
one line."""

from __future__ import annotations

import pytest

from cais.config import apply_overrides, load_system
from cais.errors import UserError
from cais.experiments.layer import check_layer, mode_notes, run_layer
from cais.kernels.ep_registry import EP_KERNELS, dispatch_dtypes
from cais.schemes import get_scheme
from cais.workload.moe import load_moe_model

#: recorded at main 66d7f11, before moe.dispatch_dtype existed: (total_us, events, dispatch_us,
#: combine_us) of ``run_layer(dgx-h100, load_moe_model(model, seq=32, batch=2), scheme, mode)``, with
#: DeepSeek's MLA timed by the MHA stand-in (the default then; ``moe.mla_timing=mha`` now)
BEFORE = {("deepseek-v3", "ep-deepep", "train"): (3724.160058, 359105, 14.135238000000001, 430.226467),
          ("qwen3-30b-a3b", "ep-deepep-ll", "decode"): (235.622296, 15131, 19.183817, 27.752115),
          ("mixtral-8x7b", "ep-switch", "prefill"): (352.999927, 55369, 0.0, 0.0),
          ("qwen3-30b-a3b", "ep-nccl", "prefill"): (324.241378, 36267, 22.170554, 9.689197)}


def _run(model: str, scheme: str, mode: str, dtype: str | None = None, **shape: int):
    cfg = apply_overrides(load_system("dgx-h100"), {"moe.mla_timing": "mha"})
    if dtype is not None:
        cfg = apply_overrides(cfg, {"moe.dispatch_dtype": dtype})
    return run_layer(cfg, load_moe_model(model, **(shape or {"seq": 32, "batch": 2})), scheme, mode)


@pytest.mark.parametrize("key", sorted(BEFORE))
def test_bf16_default_is_the_layer_path_as_it_was(key: tuple[str, str, str]) -> None:
    r = _run(*key)
    assert r.moe is not None
    assert (r.total_us, r.events, r.moe["dispatch_us"], r.moe["combine_us"]) == BEFORE[key]
    assert r.moe["dispatch_dtype"] == "bf16"
    again = _run(*key, dtype="bf16")
    assert again.total_us == r.total_us and again.moe == r.moe


def _row_bytes(h: int, dtype: str) -> int:
    return h + 4 * (h // 128) if dtype == "fp8" else 2 * h


@pytest.mark.parametrize("scheme", ["ep-deepep", "ep-deepep-ll", "ep-switch"])
def test_fp8_sends_a_byte_per_element_plus_the_scales_and_keeps_the_combine(scheme: str) -> None:
    h = 7168
    a, b = (_run("deepseek-v3", scheme, "prefill", dt, seq=256, batch=1) for dt in ("bf16", "fp8"))
    ma, mb = a.moe, b.moe
    assert ma is not None and mb is not None and mb["dispatch_dtype"] == "fp8"
    rows = ma["dispatch_bytes"] // _row_bytes(h, "bf16")
    assert rows > 0 and ma["dispatch_bytes"] == rows * 2 * h
    assert mb["dispatch_bytes"] == rows * (h + 4 * h // 128)  # 7,392 B a row against 14,336
    assert mb["combine_bytes"] == ma["combine_bytes"] > 0
    if scheme == "ep-deepep":  # one row per (token, other rank): the routing's send matrix, GPU 0's row
        m = ma["send_matrix_rank"]
        assert rows == sum(m[0]) - m[0][0]
    if scheme != "ep-switch":  # the fused in-switch kernel reports its block, not the dispatch apart
        assert mb["dispatch_us"] < ma["dispatch_us"]
    assert b.total_us != a.total_us


def test_training_backward_exchanges_stay_bf16() -> None:
    h = 7168
    a, b = (_run("deepseek-v3", "ep-deepep", "train", dt) for dt in ("bf16", "fp8"))
    ma, mb = a.moe, b.moe
    assert ma is not None and mb is not None
    fwd = ma["dispatch_bytes"] // 2  # the forward dispatch and the combine's backward (a BF16 dispatch) alike
    assert fwd > 0 and mb["dispatch_bytes"] == fwd // (2 * h) * _row_bytes(h, "fp8") + fwd
    assert mb["combine_bytes"] == ma["combine_bytes"]


@pytest.mark.parametrize("scheme", ["ep-nccl", "ep-allgather"])
def test_kernels_that_send_the_model_dtype_refuse_fp8_in_one_line(scheme: str) -> None:
    cfg = apply_overrides(load_system("dgx-h100"), {"moe.dispatch_dtype": "fp8"})
    model = load_moe_model("qwen3-30b-a3b", seq=32, batch=2)
    for call in (lambda: run_layer(cfg, model, scheme, "prefill"), lambda: check_layer(cfg, model, scheme, "prefill")):
        with pytest.raises(UserError) as e:
            call()
        msg = str(e.value)
        assert msg.startswith("moe.dispatch_dtype:") and "\n" not in msg
        assert "deepep, deepep-ll" in msg and scheme.removeprefix("ep-") in msg


def test_the_registry_says_who_takes_fp8() -> None:
    takes = {k for k, mod in EP_KERNELS.items() if "fp8" in dispatch_dtypes(mod)}
    assert {"deepep", "deepep-ll", "ep-switch"} <= takes and not {"nccl", "allgather"} & takes
    assert all("bf16" in dispatch_dtypes(mod) for mod in EP_KERNELS.values())


def test_cli_refusal_and_bad_value_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from cais.cli import main

    base = ["run", "--model", "qwen3-30b-a3b", "--scheme", "ep-nccl", "--mode", "prefill", "--seq", "32"]
    assert main(base + ["--set", "moe.dispatch_dtype=fp8"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("cais: error: moe.dispatch_dtype:") and "\n" not in err
    assert main(base + ["--set", "moe.dispatch_dtype=fp4"]) == 2
    err = capsys.readouterr().err.strip()
    assert "moe.dispatch_dtype" in err and "bf16" in err and "fp8" in err and "\n" not in err


def test_json_reports_the_dtype_and_bytes(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from cais.cli import main

    assert main(["run", "--model", "qwen3-30b-a3b", "--scheme", "ep-deepep-ll", "--mode", "decode", "--batch", "16",
                 "--seq", "64", "--set", "moe.dispatch_dtype=fp8", "--json"]) in (0, None)
    mo = json.loads(capsys.readouterr().out)["moe"]
    assert mo["dispatch_dtype"] == "fp8" and mo["dispatch_bytes"] > 0 and mo["combine_bytes"] > 0
    assert mo["dispatch_bytes"] % (2048 + 4 * 2048 // 128) == 0 and mo["combine_bytes"] % (2 * 2048) == 0


def test_a_dispatch_dtype_on_a_dense_run_is_a_warning() -> None:
    cfg = apply_overrides(load_system("dgx-h100"), {"moe.dispatch_dtype": "fp8"})
    notes = mode_notes(get_scheme("tp-nvls"), cfg, "prefill")
    assert "dispatch" in notes["moe.dispatch_dtype"] and "dense" in notes["moe.dispatch_dtype"]
