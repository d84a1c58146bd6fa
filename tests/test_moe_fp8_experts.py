"""FP8 routed experts in a MoE layer (``moe.expert_dtype``; docs/moe.md, "FP8 experts"):
the forward's grouped GEMMs (and the in-switch fused block's) run the compute model's FP8
grouped GEMM, the shared experts stay BF16; training and a BF16 dispatch refuse it in one
line; the page's prose ranges hold against its generated table. (The BF16 default is the
path as it was: tests/test_moe_fp8_dispatch.py's recorded runs.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import cais.kernels.ep_switch as ep_switch_kernels
import cais.schemes.ep as ep_schemes
from cais.config import apply_overrides, load_system
from cais.errors import UserError
from cais.experiments.layer import check_layer, mode_notes, run_layer
from cais.kernels.grouped_gemm import GroupedGemm
from cais.schemes import get_scheme
from cais.workload.moe import load_moe_model

DOC = Path(__file__).resolve().parents[1] / "docs" / "moe.md"


def _cfg(expert: str, dispatch: str = "fp8"):  # type: ignore[no-untyped-def]
    return apply_overrides(load_system("dgx-h100"), {"moe.dispatch_dtype": dispatch, "moe.expert_dtype": expert})


def _spy(monkeypatch: pytest.MonkeyPatch, module: object) -> list[str]:
    """The dtypes of the grouped GEMMs ``module`` times (its own ``grouped_gemm_ps``)."""
    seen: list[str] = []
    real = module.grouped_gemm_ps  # type: ignore[attr-defined]

    def spy(cm, g: GroupedGemm, sms: int, *a, **k):  # type: ignore[no-untyped-def]
        seen.append(g.dtype)
        return real(cm, g, sms, *a, **k)
    monkeypatch.setattr(module, "grouped_gemm_ps", spy)
    return seen


@pytest.mark.parametrize("scheme,module", [("ep-deepep", ep_schemes), ("ep-deepep-ll", ep_schemes),
                                           ("ep-switch", ep_switch_kernels)])
def test_fp8_experts_run_fp8_grouped_gemms_and_halve_them(monkeypatch: pytest.MonkeyPatch, scheme: str,
                                                          module: object) -> None:
    model = load_moe_model("deepseek-v3", batch=64, seq=256)
    bf = run_layer(_cfg("bf16"), model, scheme, "decode")
    seen = _spy(monkeypatch, module)
    f8 = run_layer(_cfg("fp8"), model, scheme, "decode")
    assert seen and set(seen) == {"fp8"}  # every routed grouped GEMM of the run took the FP8 path
    assert bf.moe is not None and f8.moe is not None and f8.moe["expert_dtype"] == "fp8"
    key = "fused_us" if scheme == "ep-switch" else "grouped_gemm_us"
    assert 0.3 < f8.moe[key] / bf.moe[key] < 0.6  # the weights' bytes halved, HBM-bound
    assert f8.total_us < bf.total_us
    assert f8.moe["shared_us"] == pytest.approx(bf.moe["shared_us"], rel=0.05)  # the shared experts stay BF16


def test_training_and_a_bf16_dispatch_refuse_fp8_experts_in_one_line() -> None:
    model = load_moe_model("qwen3-30b-a3b", seq=32, batch=2)
    cases = ((_cfg("fp8"), "train", "training"), (_cfg("fp8", dispatch="bf16"), "prefill", "moe.dispatch_dtype=fp8"))
    for cfg, mode, why in cases:
        for call in (lambda: run_layer(cfg, model, "ep-deepep", mode), lambda: check_layer(cfg, model, "ep-deepep",
                                                                                            mode)):
            with pytest.raises(UserError) as e:
                call()
            msg = str(e.value)
            assert msg.startswith("moe.expert_dtype:") and "\n" not in msg and why in msg


def test_cli_bad_value_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    from cais.cli import main

    base = ["run", "--model", "qwen3-30b-a3b", "--scheme", "ep-deepep", "--mode", "decode", "--batch", "16",
            "--seq", "64", "--set", "moe.dispatch_dtype=fp8"]
    assert main(base + ["--set", "moe.expert_dtype=fp4"]) == 2
    err = capsys.readouterr().err.strip()
    assert "moe.expert_dtype" in err and "bf16" in err and "fp8" in err and "\n" not in err
    assert main(base + ["--set", "moe.expert_dtype=fp8", "--json"]) in (0, None)
    assert json.loads(capsys.readouterr().out)["moe"]["expert_dtype"] == "fp8"


def test_an_expert_dtype_on_a_dense_run_is_a_warning() -> None:
    notes = mode_notes(get_scheme("tp-nvls"), _cfg("fp8"), "prefill")
    assert "experts' GEMMs" in notes["moe.expert_dtype"] and "dense" in notes["moe.expert_dtype"]


def test_the_pages_ranges_hold_against_its_table() -> None:
    page = DOC.read_text()
    block = page.split("<!-- table: python scripts/fp8_experts_doc.py -->", 1)[1].split("<!-- /table -->", 1)[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in block.strip().splitlines()[2:]]
    assert len(rows) == 6
    num = lambda c: float(c.replace(",", "").replace(" %", ""))  # noqa: E731
    deepep = [num(r[4]) / num(r[3]) for r in rows if r[2] != "ep-switch"]
    fused = [num(r[4]) / num(r[3]) for r in rows if r[2] == "ep-switch"]
    falls = [-num(r[7]) for r in rows]
    said = re.search(r"FP8 halves them \((\S+)-(\S+)x under DeepEP's kernels; (\S+)-(\S+)x for the fused block", page)
    assert said is not None
    lo, hi, flo, fhi = (float(x) for x in said.groups())
    assert lo <= round(min(deepep), 2) and round(max(deepep), 2) <= hi
    assert flo <= round(min(fused), 2) and round(max(fused), 2) <= fhi
    fall = re.search(r"the layer falls (\d+)-(\d+) %", page)
    assert fall is not None and int(fall.group(1)) <= round(min(falls)) and round(max(falls)) <= int(fall.group(2))
