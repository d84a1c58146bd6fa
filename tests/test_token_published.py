"""The decode step per output token against published per-token latencies
(src/cais/data/published/decode_token.csv, scripts/validate_token.py): the CSV parses
with a source, a note and what each time includes; the table has a row per CSV row and
its ours is the simulated step's ``token_us``; the breakdown beside it adds up to it."""

from __future__ import annotations

import csv
from collections.abc import Callable
from dataclasses import replace
from types import ModuleType

import pytest

from cais.config import load_system


@pytest.fixture(scope="module")
def vt(load_script: Callable[[str], ModuleType]) -> ModuleType:
    return load_script("validate_token")


def test_every_row_parses_with_its_harness_and_source(vt: ModuleType) -> None:
    with vt.CSV.open(newline="") as f:
        raw = list(csv.DictReader(f))
    rows = vt.rows()
    assert len(rows) == len(raw) > 0
    assert {r.use for r in rows} <= set(vt.USES) and {"fit", "held-out"} <= {r.use for r in rows}
    for r in rows:
        assert r.source.strip() and r.what.strip() and r.time_us > 0
        assert r.launch in ("graph", "eager") and r.batch >= 1 and r.output >= 1
        assert load_system(r.system).gpus >= 2
        assert r.kv == r.prompt + r.output // 2
        if r.use == "unscored":  # a row left out of the score says why
            assert r.note.startswith("UNSCORED (")
        else:
            assert vt.runnable(r)


def test_the_table_scores_the_simulated_step(vt: ModuleType) -> None:
    row = next(r for r in vt.rows() if r.use == "held-out")
    res = vt.ours(row)
    t = res.token
    assert t is not None and t.layers > 0 and t.tail_us > 0
    assert t.token_us == pytest.approx(t.layers * t.layer_us + sum(t.tail.values()))
    lines = vt.table([row], [res]).splitlines()
    assert len(lines) == 3
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[0] == "held-out" and cells[1] == row.model and int(cells[2]) == row.gpus
    assert float(cells[7].replace(",", "")) == pytest.approx(t.token_us, abs=0.5)
    assert float(cells[8]) == pytest.approx(t.token_us / row.time_us, abs=0.005)
    assert cells[10].startswith(f"{t.layers} x {t.layer_us:.1f} (")  # the breakdown beside it


def test_a_row_the_simulator_cannot_run_is_listed_not_scored(vt: ModuleType) -> None:
    tp1 = [r for r in vt.rows() if not vt.runnable(r)]
    assert tp1 and all(r.use == "unscored" for r in tp1)
    line = vt.table(tp1[:1], [None]).splitlines()[2]
    assert "not run" in line


def test_both_models_have_a_scored_tp8_row_on_hopper(vt: ModuleType) -> None:
    scored = [r for r in vt.rows() if r.use in vt.SCORED]
    assert {("llama3-8b", 8), ("llama3-70b", 8)} <= {(r.model, r.gpus) for r in scored}
    assert all(r.system in ("dgx-h100", "dgx-h200") and r.dtype == "bf16" for r in scored)
    # the fit row and one row of each model are batch 1; a larger batch is only ever held out
    assert all(r.batch == 1 for r in scored if r.use == "fit")
    assert {(r.model, 1) for r in scored} <= {(r.model, r.batch) for r in scored}


def test_a_larger_batch_is_simulated_at_its_batch(vt: ModuleType) -> None:
    row = next(r for r in vt.rows() if r.use == "held-out" and r.batch > 1)
    big, single = vt.ours(row).token, vt.ours(replace(row, batch=1)).token
    assert big is not None and single is not None and big.token_us > single.token_us  # row.batch reaches the run


def test_the_source_column_names_a_repository_file_short(vt: ModuleType) -> None:
    assert vt.label("LambdaLabsML/vllm-benchmark results/prompt_10/x/m_tp8.json (commit a4f9f43)") == \
        "vllm-benchmark m_tp8.json"
    assert vt.label("sgl-project/sglang issue #1008 (description)") == "sglang issue #1008"


def test_without_the_split_the_step_is_slower(vt: ModuleType) -> None:
    row = next(r for r in vt.rows() if r.use in vt.SCORED and r.model == "llama3-8b")
    split, whole = vt.ours(row).token, vt.ours(row, split=False).token
    assert split is not None and whole is not None and whole.token_us > split.token_us


def test_each_row_runs_the_scheme_of_its_stack(vt: ModuleType) -> None:
    from cais.schemes import get_scheme

    rows = vt.rows()
    assert all(get_scheme(r.scheme) is not None for r in rows)
    row = next(r for r in rows if r.use == "fit")
    assert vt.ours(row).scheme == row.scheme == "tp-custom-ar"  # vLLM 0.6: custom all-reduce, norm apart


def test_the_step_grows_with_the_kernel_gap(vt: ModuleType) -> None:
    row = next(r for r in vt.rows() if r.use == "fit")
    low, high = (vt.ours(row, sets={"gpu.kernel_gap_us": g}).token for g in (1.0, 2.0))
    assert low is not None and high is not None
    # every dependent kernel of the step waits the gap: at least 10 per layer
    assert high.token_us - low.token_us >= 10 * low.layers * 1.0


def test_the_vllm_06_rows_run_vllm_06s_decode_step(vt: ModuleType) -> None:
    """A row's ``sets`` stand for its stack's own decode step: the vLLM 0.6 rows run
    ``decode.stack=vllm-0.6`` (its tail's parts, the attention output's copy), the
    SGLang rows the generic step; a malformed ``sets`` is refused."""
    from cais.experiments.token import PARTS, VLLM06_PARTS

    rows = vt.rows()
    vllm = [r for r in rows if r.stack.startswith("vLLM 0.6")]
    other = [r for r in rows if not r.stack.startswith("vLLM 0.6") and vt.runnable(r)]
    assert vllm and other
    assert all(r.overrides == {"decode.stack": "vllm-0.6"} for r in vllm)
    assert all(r.overrides == {} for r in other)
    ran = vt.ours(vllm[0])
    assert ran.token is not None and tuple(ran.token.tail) == VLLM06_PARTS and "attn_out_copy" in ran.kernel_tbs
    plain = vt.ours(other[0])
    assert plain.token is not None and tuple(plain.token.tail) == PARTS
    with pytest.raises(ValueError, match="key=value"):
        replace(vllm[0], sets="decode.stack").overrides
