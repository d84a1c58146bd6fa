"""Grouped GEMMs (kernels/grouped_gemm.py) against DeepGEMM's published H800 tables (docs/moe.md)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from cais.errors import UserError
from cais.hw.compute import ComputeModel
from cais.kernels.grouped_gemm import GroupedGemm, grouped_gemm_ps, grouped_tflops

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "validate_grouped_gemm.py"


def _validate():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("validate_grouped_gemm", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_fit_rows_within_15_and_held_out_within_20_percent() -> None:
    v = _validate()
    rows = v.rows()
    assert {r["set"] for r in rows} == {"fit", "held-out"}
    for r in rows:
        err = abs(v.ours(r) / float(r["tflops"]) - 1)
        assert err < (0.15 if r["set"] == "fit" else 0.20), r


def test_fp8_faster_than_bf16_and_empty_groups_cost_nothing() -> None:
    m = ComputeModel.load("h200", 3350)
    bf16 = GroupedGemm((2048,) * 8, 4096, 7168, "bf16")
    fp8 = GroupedGemm((2048,) * 8, 4096, 7168, "fp8")
    assert grouped_tflops(m, fp8, 132) > 1.5 * grouped_tflops(m, bf16, 132)
    with_empty = GroupedGemm((2048,) * 8 + (0,) * 8, 4096, 7168, "bf16", "masked")
    assert grouped_gemm_ps(m, with_empty, 132) == grouped_gemm_ps(m, bf16, 132)


def test_uneven_groups_pay_for_their_partial_tiles() -> None:
    m = ComputeModel.load("h200", 3350)
    even = GroupedGemm((512,) * 8, 2048, 7168, "bf16")
    uneven = GroupedGemm((1,) * 4 + (1020,) * 4, 2048, 7168, "bf16")  # same rows, more tiles
    assert grouped_gemm_ps(m, uneven, 132) > grouped_gemm_ps(m, even, 132)


@pytest.mark.parametrize("kwargs, field", [(dict(dtype="fp4"), "dtype"), (dict(layout="ragged"), "layout")])
def test_bad_input_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(UserError, match=f"^{field}:"):
        GroupedGemm((128,), 128, 128, **kwargs)
