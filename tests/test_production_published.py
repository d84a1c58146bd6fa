"""The production all-reduce kernels against published measurements
(src/cais/data/published/production_allreduce.csv, scripts/validate_production.py) and
their calibration (scripts/fit_production.py, production_fit.json): the CSV parses with
a source, a mode and a set per row; the shipped constants are the fit's; and at them
the fit set meets its target (mean |error| at most 15 %) and the held-out set its
target (at most 20 %), computed here from the simulator, not read from a file; the gap
is chosen on the decode step's fit row; a fitted constant at the edge of its grid is
flagged."""

from __future__ import annotations

import csv
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from cais.config import CollectiveConfig, GpuConfig, load_system
from cais.kernels.collectives import PRODUCTION_ALGOS

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def vp() -> ModuleType:
    return _load("validate_production")


@pytest.fixture(scope="module")
def fp(vp: ModuleType) -> ModuleType:
    sys.path.insert(0, str(SCRIPTS))  # fit_production imports validate_production by name
    try:
        return _load("fit_production")
    finally:
        sys.path.remove(str(SCRIPTS))


def test_every_csv_row_parses_with_a_source_a_mode_a_set_and_a_runnable_plan(vp: ModuleType) -> None:
    with vp.CSV.open(newline="") as f:
        raw = list(csv.DictReader(f))
    rows = vp.rows()
    assert len(rows) == len(raw) > 0
    for r in rows:
        assert r.source.strip() and r.note.strip()
        assert r.mode in ("eager", "cuda_graph") and r.set in vp.SETS
        assert r.op == "allreduce" and r.algo in PRODUCTION_ALGOS
        assert r.algo.split("-")[0] in {s.kind for s in r.plan.steps}
        assert r.time_us > 0 and r.nbytes % r.elem_bytes == 0
        assert r.hidden is None or r.nbytes % (r.hidden * r.elem_bytes) == 0  # whole tokens
        assert load_system(r.system, gpus=r.gpus).gpus == r.gpus
        if r.set == "unscored":  # a row left out of the scores says why
            assert r.note.startswith("UNSCORED (")
    # the SGLang PR #2904 sizes are fp32 elements (its test_performance's dtype), 4 bytes each
    sglang = [r for r in rows if "PR #2904" in r.source]
    assert [r.nbytes // 4 for r in sglang] == [512, 4096, 32768, 262144, 524288, 1048576]
    assert {r.dtype for r in sglang} == {"fp32"} and {r.mode for r in sglang} == {"eager"}
    # the sets are chosen by source, never row by row: a source's scored rows share a set
    by_source: dict[str, set[str]] = {}
    for r in rows:
        if r.set != "beyond":
            by_source.setdefault(vp.short_source(r.source), set()).add(r.set)
    assert all(len(s) == 1 for s in by_source.values()), by_source
    assert {"fit", "held-out"} <= {r.set for r in rows}


def test_the_table_has_a_row_per_csv_row(vp: ModuleType) -> None:
    rows = vp.rows()
    firsts = {}
    for i, r in enumerate(rows):
        firsts.setdefault((r.source, r.plan_text), i)
    subset = [rows[i] for i in sorted(firsts.values()) if rows[i].nbytes <= 1 << 20]
    assert {r.mode for r in subset} == {"eager", "cuda_graph"}
    times = [vp.ours_us(r) for r in subset]
    lines = vp.table(subset, times).splitlines()
    assert len(lines) == 2 + len(subset)
    for line, r in zip(lines[2:], subset):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[0] == r.set and cells[1] == r.plan_text and int(cells[2]) == r.gpus
        assert float(cells[6]) == r.time_us and float(cells[7]) > 0
        assert abs(float(cells[8]) - float(cells[7]) / r.time_us) < 0.01


def test_an_eager_custom_call_pays_its_copy_and_the_host(vp: ModuleType) -> None:
    graph = next(r for r in vp.rows() if r.plan_text == "custom-oneshot" and r.mode == "cuda_graph")
    eager = vp.Row(**{**graph.__dict__, "mode": "eager", "plan_text": "copy+custom-oneshot"})
    assert vp.ours_us(graph) < vp.ours_us(eager)
    g = load_system(graph.system).gpu
    assert vp.ours_us(eager) >= g.host_op_us + g.host_launch_us  # the host issues the op and a further launch


def test_the_shipped_constants_are_the_fits(vp: ModuleType, fp: ModuleType) -> None:
    fit = json.loads(fp.OUT.read_text())
    chosen = fit["chosen"]
    assert set(chosen) == {"gpu.kernel_gap_us", *fp.CONSTANTS}
    fields = {"gpu": GpuConfig.model_fields, "collective": CollectiveConfig.model_fields}
    for key, value in chosen.items():
        section, name = key.split(".")
        assert fields[section][name].default == value, key
    assert fit["fit_rows"] == sum(r.set == "fit" for r in vp.rows())
    assert min(fp.GAP_US) <= chosen["gpu.kernel_gap_us"] <= max(fp.GAP_US)  # within its sourced range
    assert 0.5 <= min(fp.FENCE_US) and max(fp.FENCE_US) <= 2.0  # a fence's sourced cost
    assert min(fp.FENCE_US) <= chosen["collective.fence_us"] <= max(fp.FENCE_US)
    assert fit["steps"][-1]["settings"] == {k: CollectiveConfig.model_fields[k.split(".")[1]].default
                                            for k in fit["steps"][-1]["settings"]}  # the shipped mechanisms


def test_a_constant_at_the_edge_of_its_grid_is_flagged(vp: ModuleType, fp: ModuleType) -> None:
    """at_edge names every chosen value at an end of its grid with the error still
    falling there, from the fit's own surfaces; and the rule itself."""
    assert fp.at_edge([1.0, 2.0, 3.0], {1.0: 0.2, 2.0: 0.3, 3.0: 0.4}, 1.0) == "low"
    assert fp.at_edge([1.0, 2.0, 3.0], {1.0: 0.4, 2.0: 0.3, 3.0: 0.2}, 3.0) == "high"
    assert fp.at_edge([1.0, 2.0, 3.0], {1.0: 0.4, 2.0: 0.2, 3.0: 0.3}, 2.0) is None
    fit = json.loads(fp.OUT.read_text())
    gap = fit["chosen"]["gpu.kernel_gap_us"]
    # the gap is chosen on the decode step's fit row: its surface is that row's error
    expect = {"gpu.kernel_gap_us": fp.at_edge(fp.GAP_US, {float(g): v["decode_fit_error"]
                                                          for g, v in fit["per_gap"].items()}, gap)}
    for key in fp.CONSTANTS:
        surface = {x: e for x, e in fit["surface"][f"{key} at kernel_gap_us {gap}"]}
        expect[key] = fp.at_edge(fp.GRIDS[key], surface, fit["chosen"][key])
    assert fit["at_edge"] == {k: v for k, v in expect.items() if v}


def test_each_constant_acts_on_its_own_rows(vp: ModuleType, fp: ModuleType) -> None:
    """The fit's separation holds: raising a constant moves its family's rows and no other."""
    rows = {fam: next(r for r in vp.rows() if r.set == "fit" and fp.family(r) == fam and r.nbytes >= 1 << 19)
            for fam in fp.CONSTANTS.values()}
    for key, fam in fp.CONSTANTS.items():
        for other, row in rows.items():
            moved = vp.ours_us(row, {key: 20.0}) - vp.ours_us(row)
            assert (moved > 1.0) == (other == fam), (key, other, moved)


#: the bound each set is held to: the issue's targets, 15 % on the fit set and 20 % on
#: the held-out set
BOUNDS = {"fit": 0.15, "held-out": 0.20}


@pytest.mark.parametrize("which", sorted(BOUNDS))
def test_the_calibration_holds_its_bound(vp: ModuleType, which: str) -> None:
    selected = [r for r in vp.rows() if r.set == which]
    assert len(selected) >= 20
    err = vp.mean_error(selected, [vp.ours_us(r) for r in selected])
    assert err <= BOUNDS[which], f"{which}: mean |error| {err:.1%} above {BOUNDS[which]:.0%}"


def test_tp8_graph_mode_custom_rows_are_scored(vp: ModuleType) -> None:
    """Decode's case, vLLM's kernel at 8 GPUs under back-to-back launches, is scored."""
    rows = [r for r in vp.rows() if r.gpus == 8 and r.mode == "cuda_graph" and r.algo.startswith("custom")
            and r.set in vp.SCORED]
    assert len(rows) >= 6
    times = [vp.ours_us(r) for r in rows[:2]]
    assert all(t > 0 for t in times)
    assert "TP=8 custom" in vp.scored_by_gpus(rows[:2], times)


def test_the_gap_is_chosen_on_the_decode_steps_fit_row(fp: ModuleType) -> None:
    """The all-reduce fit rows barely tell the gap's values apart (the other three
    constants absorb it); the decode step's fit row does, and the gap is its best."""
    fit = json.loads(fp.OUT.read_text())
    per_gap = {float(g): v for g, v in fit["per_gap"].items()}
    assert set(per_gap) == set(fp.GAP_US) and fit["gap_chosen_on"]
    decode = {g: v["decode_fit_error"] for g, v in per_gap.items()}
    assert fit["chosen"]["gpu.kernel_gap_us"] == min(decode, key=decode.get)
    spread = max(decode.values()) - min(decode.values())
    ar_spread = max(v["fit_mean_error"] for v in per_gap.values()) - min(v["fit_mean_error"] for v in per_gap.values())
    assert spread > 3 * ar_spread  # the decode row is what identifies the gap
    for g, v in per_gap.items():  # each gap's other constants are its own fit
        assert all(v[k] in fp.GRIDS[k] for k in fp.CONSTANTS)
