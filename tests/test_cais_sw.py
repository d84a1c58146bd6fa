"""cais-sw (issue 57): software-only CAIS. It reproduces the unsharded layer on an
NVLS-only switch (tests/test_schemes.py runs every mode), its bytes are conserved, it
sends nothing the merge unit would take, and its LN row blocks really wait for the
release flags that replace the signal words of ``red.cais``."""

from __future__ import annotations

import pytest

import cais.experiments.layer as layer
from cais.experiments.layer import run_layer
from cais.config import apply_overrides, load_system
from cais.machine import Machine, Stalled
from cais.schemes import get_scheme
from cais.schemes.cais_sw import SoftwareAccess
from cais.workload.models import ModelSpec

GPT = ModelSpec(name="tiny-gpt", family="gpt", hidden=256, ffn_hidden=512, heads=4, layers=2, gated_mlp=False,
                norm="layernorm", activation="gelu", seq=64, batch=4)


def _four(**sets: str):
    return apply_overrides(load_system("dgx-h100"), {"gpus": "4", **sets})


def test_cais_sw_is_an_nvls_ablation() -> None:
    s = get_scheme("cais-sw")
    assert s.family == "ablation" and s.switch == "nvls"
    assert s.switch_model("auto") == "nvls" and s.switch_model("nvls") == "nvls"


@pytest.mark.parametrize("mode", ["prefill", "train"])
def test_cais_sw_is_exact_and_conserves_bytes(monkeypatch, mode: str) -> None:
    made: list[Machine] = []

    class Kept(Machine):
        def __init__(self, *a, **k) -> None:
            super().__init__(*a, **k)
            made.append(self)

    monkeypatch.setattr(layer, "Machine", Kept)
    r = run_layer(_four(), GPT, "cais-sw", mode, functional=True, seed=5)
    assert r.mismatches == [] and r.checked > 0
    assert r.switch == "nvls" and r.metrics.merge is None  # no merge unit
    assert len(made) == 1 and made[0].conservation().ok


def test_on_a_cais_switch_the_merge_unit_sees_none_of_its_requests() -> None:
    r = run_layer(_four(**{"switch.model": "cais"}), GPT, "cais-sw", "train", functional=True, seed=5)
    assert r.mismatches == [] and r.switch == "cais"
    counts = r.as_json()["merge"]
    assert counts["merged"] == counts["bypassed"] == counts["tracked"] == 0  # plain ld/red only: nothing for it
    cais = run_layer(_four(), GPT, "cais", "train", functional=True, seed=5)
    assert cais.as_json()["merge"]["merged"] > 0  # where cais's ld.cais/red.cais do merge


@pytest.mark.parametrize("functional", [True, False])
def test_the_ln_waits_for_the_release_flags(monkeypatch, functional: bool) -> None:
    """Without the release flags behind the reductions, no LN row block's word fills."""
    monkeypatch.setattr(SoftwareAccess, "epilogue_out", lambda self, g, shape, i, j: None)
    with pytest.raises(Stalled):
        run_layer(_four(), GPT, "cais-sw", "prefill", functional=functional, seed=5)
