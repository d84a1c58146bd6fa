"""scripts/validate_production.py and src/cais/data/published/production_allreduce.csv
(issue 37): the CSV parses, every row names a source and a mode, and the script's
table has a row for every CSV row (run here on a subset: one row per source)."""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from cais.config import load_system
from cais.kernels.collectives import PRODUCTION_ALGOS

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "validate_production.py"


@pytest.fixture(scope="module")
def vp() -> ModuleType:
    spec = importlib.util.spec_from_file_location("validate_production", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


def test_every_csv_row_parses_with_a_source_a_mode_and_a_runnable_call(vp: ModuleType) -> None:
    with vp.CSV.open(newline="") as f:
        raw = list(csv.DictReader(f))
    rows = vp.rows()
    assert len(rows) == len(raw) > 0
    for r in rows:
        assert r.source.strip() and r.note.strip()
        assert r.mode in ("eager", "cuda_graph")
        assert r.op == "allreduce" and r.algo in PRODUCTION_ALGOS
        assert r.time_us > 0 and r.nbytes % r.elem_bytes == 0
        assert r.hidden is None or r.nbytes % (r.hidden * r.elem_bytes) == 0  # whole tokens
        assert load_system(r.system, gpus=r.gpus).gpus == r.gpus
    # the SGLang PR #2904 sizes are fp32 elements (its test_performance's dtype), 4 bytes each
    sglang = [r for r in rows if "PR #2904" in r.source]
    assert [r.nbytes // 4 for r in sglang] == [512, 4096, 32768, 262144, 524288, 1048576]
    assert {r.dtype for r in sglang} == {"fp32"} and {r.mode for r in sglang} == {"eager"}


def test_the_table_has_a_row_per_csv_row(vp: ModuleType) -> None:
    rows = vp.rows()
    firsts = {}
    for i, r in enumerate(rows):
        firsts.setdefault((r.source, r.algo), i)
    subset = [rows[i] for i in sorted(firsts.values()) if rows[i].nbytes <= 1 << 20]
    assert {r.mode for r in subset} == {"eager", "cuda_graph"}
    lines = vp.table(subset).splitlines()
    assert len(lines) == 2 + len(subset)
    for line, r in zip(lines[2:], subset):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[0] == r.algo and cells[1] == r.system and int(cells[2]) == r.gpus
        assert float(cells[6]) == r.time_us and float(cells[7]) > 0
        assert abs(float(cells[8]) - float(cells[7]) / r.time_us) < 0.01
        assert ("GPU in doubt" in cells[9]) == r.gpu_in_doubt


def test_a_graph_row_of_the_custom_kernel_runs_without_the_eager_copy(vp: ModuleType) -> None:
    graph = next(r for r in vp.rows() if r.algo == "custom-oneshot" and r.mode == "cuda_graph")
    eager = vp.Row(**{**graph.__dict__, "mode": "eager", "hidden": None})
    assert graph.registered and not eager.registered
    assert vp.ours_us(graph) < vp.ours_us(eager)
