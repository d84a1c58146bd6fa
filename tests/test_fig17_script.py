"""scripts/fig17_nvl72.py, Fig. 17 past the paper on nvl72: the sizes it grows, one
point, and its refusal of bad input."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from cais.workload.models import load_model

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "fig17_nvl72.py"


@pytest.fixture(scope="module")
def fig17() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fig17_nvl72", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_paper_size_is_table_one_llama_as_the_reproduction_grows_it(fig17: ModuleType) -> None:
    llama = load_model("paper-llama-7b")
    assert fig17.base_size("paper") == ("paper-llama-7b", llama.hidden, llama.ffn_hidden, llama.heads)
    assert fig17.base_size("paper")[2] == 11264  # Table I's FFN, not LLaMA's own 11,008
    assert fig17.base_size("quick") == ("paper-mega-gpt-4b", 1024, 4096, 8)


def test_a_point_grows_the_layer_with_the_gpus_and_reports_the_merge_table(fig17: ModuleType) -> None:
    row = fig17.point(8, "cais", seq=512, size="quick")
    assert row["hidden"] == 1024 and row["gpus"] == 8
    assert row["total_us"] > 0 and row["events"] > 0 and row["tflops_per_gpu"] > 0
    assert row["table_peak_kB"] is not None and 0 < row["table_peak_kB"] <= 40.96  # the nvl72 port's table
    assert row["bypassed"] == 0


@pytest.mark.parametrize("argv", [["--gpus", "1"], ["--seq", "0"], ["--set", "novalue"]])
def test_bad_input_is_one_line_and_exit_code_2(fig17: ModuleType, argv: list[str], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert fig17.main([*argv, "--out", str(tmp_path / "t.md")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fig17_nvl72:") and "\n" not in err
    assert not (tmp_path / "t.md").exists()
