"""The merge unit's cost (issues 57, 64; docs/switch-cost.md): CACTI against the stored
run (skipped where CACTI is absent), bit-cell scaling, the datapath and the clocked
rate, the config's design settings, the sweeps' checks (no verdict without data),
`cais reproduce cost --quick` end to end, and the shipped page against its runs."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest

from cais.config import MergeConfig
from cais.cost import cacti as C
from cais.cost import merge_unit as MU
from cais.errors import UserError
from cais.reproduce.experiments import cost as X
from cais.reproduce.experiments.cost import break_even, noise_free_up_to

ROOT = Path(__file__).resolve().parent.parent


def test_cacti_gives_the_stored_run() -> None:
    if C.find_cacti() is None:
        pytest.skip("CACTI not installed (scripts/build_cacti.sh, or CAIS_CACTI=path/to/cacti)")
    got, want = MU.run(), MU.stored()
    assert {k: v for k, v in got.items() if k != "cells"} == {k: v for k, v in want.items() if k != "cells"}
    for cells, arrays in want["cells"].items():
        assert set(got["cells"][cells]) == set(arrays)
        for name, a in arrays.items():
            for key, v in a.items():
                g = got["cells"][cells][name][key]
                assert g == (pytest.approx(v, rel=1e-6) if isinstance(v, float) else v), (cells, name, key)


def test_the_stored_run_sizes_and_sums() -> None:
    r = MU.stored()
    assert (r["entries"], r["line_bytes"], r["gpus"], r["tag_bits"]) == (320, 128, 8, 42)
    assert set(r["cells"]) == set(C.CELLS)
    hp = r["cells"]["itrs-hp"]
    assert hp["data/t1/1rw/bf16"]["bytes"] == 320 * 128 and hp["data/t1/1rw/fp32"]["bytes"] == 2 * 320 * 128
    assert hp["data/t4/1rw/bf16"]["bytes"] == 80 * 128 and hp["cam/t1"]["search_nJ"] > 0
    # a 1R1W array is larger and slower than a one-port one; LSTP cells slower and far less leaky than HP
    assert hp["data/t1/1r1w/bf16"]["area_mm2"] > 2 * hp["data/t1/1rw/bf16"]["area_mm2"]
    lstp = r["cells"]["itrs-lstp"]["data/t1/1rw/bf16"]
    assert lstp["cycle_ns"] > 2 * hp["data/t1/1rw/bf16"]["cycle_ns"]
    assert lstp["leakage_mW"] < hp["data/t1/1rw/bf16"]["leakage_mW"] / 100
    t = MU.table(r)
    for cells in C.CELLS:
        for n in MU.NODES_NM:
            at = t[(t["node_nm"] == n) & (t["cells"] == cells)].set_index("array")
            assert at.loc["chip (8 ports)", "area_mm2"] == pytest.approx(8 * at.loc["port", "area_mm2"])
            assert at.loc["port", "area_mm2"] == pytest.approx(at.loc[["cam", "data", "meta"], "area_mm2"].sum())
    assert MU.cost(fresh=False)[1].startswith("the stored CACTI run")


def test_area_scales_by_bit_cell_and_times_stay_cactis() -> None:
    r = MU.stored()
    a22, a12, a7 = (MU.evaluate(r, MU.Design(node_nm=n)) for n in (22, 12, 7))
    assert MU.cell_ratio(12) == pytest.approx(0.070 / 0.0707)  # a 16 nm-class cell: about CACTI's 22 nm one
    assert a12["arrays_mm2"] == pytest.approx(a22["arrays_mm2"] * MU.cell_ratio(12))
    assert a7["arrays_mm2"] == pytest.approx(a22["arrays_mm2"] * 0.027 / 0.0707)
    assert 0.4 < 8 * a12["arrays_mm2"] < 0.5  # the arrays alone, per chip at 12 nm (issue 64)
    assert 0.1 < 8 * a12["adders_mm2"] < 0.2  # 64 BF16 adders per port (Horowitz, scaled)
    assert a12["latency_ns"] == a7["latency_ns"] and a12["lookups_per_ns"] == a7["lookups_per_ns"]
    for n, (cell, source) in MU.CELL_UM2.items():
        assert cell > 0 and source, n


def test_the_clocked_rate_and_the_reductions_accesses() -> None:
    r = MU.stored()
    base = MU.evaluate(r, MU.Design())
    assert base["red_accesses"] == 2 and base["cycles_per_access"] == 1
    assert base["lookups_per_ns"] == pytest.approx(MU.CLOCK_GHZ)  # clock x one access per cycle
    assert base["latency_ns"] == pytest.approx(6 / MU.CLOCK_GHZ)  # tag, state, data, 2 add, 1 control
    lstp = MU.evaluate(r, MU.Design(cells="itrs-lstp"))
    assert lstp["cycles_per_access"] == 2 and lstp["lookups_per_ns"] == pytest.approx(MU.CLOCK_GHZ / 2)
    assert lstp["leakage_mW"] < base["leakage_mW"] / 100  # rate and leakage from the same choice
    assert MU.evaluate(r, MU.Design(data_ports="1r1w"))["red_accesses"] == 1
    links = MU.evaluate(r, MU.Design(tables=MU.LINK_TABLES))
    assert links["lookups_per_ns"] == pytest.approx(MU.LINK_TABLES * MU.CLOCK_GHZ)
    assert links["arrays_mm2"] > base["arrays_mm2"] and links["adders_mm2"] == pytest.approx(4 * base["adders_mm2"])
    fp32 = MU.evaluate(r, MU.Design(accumulate="fp32"))
    assert fp32["adders_mm2"] > 3 * base["adders_mm2"] and fp32["pJ_max"] > base["pJ_max"]


def test_the_config_takes_a_designs_timing() -> None:
    cfg = MergeConfig(cacti_node="12nm")
    t = MU.preset_timing("12nm")
    assert (cfg.latency_ns, cfg.lookups_per_ns, cfg.red_accesses) == (t["latency_ns"], t["lookups_per_ns"], 2)
    cfg = MergeConfig(cacti_node="12nm", cells="itrs-lstp", clock_GHz=2.0, tables=4)
    assert cfg.lookups_per_ns == pytest.approx(4 * 2.0 / 2)  # 4 tables, LSTP's two cycles an access at 2 GHz
    assert MergeConfig(cacti_node="12nm", data_ports="1r1w").red_accesses == 1
    assert MergeConfig().lookups_per_ns is None and MergeConfig().red_accesses == 2  # the presets: no limit


def test_break_even_interpolates_and_needs_a_sweep() -> None:
    assert break_even([0, 100, 200], [1.4, 1.2, 0.8]) == (150.0, "150 ns")
    assert math.isnan(break_even([0, 200], [1.4, 1.1])[0])
    assert break_even([0, 200], [0.9, 0.8])[0] == -math.inf
    x, words = break_even([math.inf, 1.0, 0.1], [1.3, 1.1, 0.9], log=True)
    assert x == pytest.approx(math.sqrt(0.1)) and words.endswith("slots/ns")
    assert break_even([math.inf, 3.0], [1.3, 0.9], log=True) == (3.0, "above 3 slots/ns")
    for xs, ss in (([0.0], [1.4]), ([], [])):
        with pytest.raises(UserError) as e:
            break_even(xs, ss)
        assert "\n" not in str(e.value) and "at least two" in str(e.value)


def test_no_measurable_effect_inside_the_noise() -> None:
    xs = [0.0, 25.0, 50.0, 100.0]
    assert noise_free_up_to(xs, [100, 100.2, 100.6, 101], 0.5) == 25.0
    assert noise_free_up_to(xs, [100, 99.8, 100.4, 100.1], 0.5) == 100.0
    assert noise_free_up_to(xs, [100, 99.0, 100, 100], 0.5) == 0.0  # faster beyond the noise counts too


def test_a_run_without_lookup_counts_is_an_error() -> None:
    with pytest.raises(UserError) as e:
        X._lookups(pd.Series({"total_us": 10.0}), "paper-world prefill")
    assert "\n" not in str(e.value) and "runs/" in str(e.value)
    with pytest.raises(UserError):
        X._lookups(pd.Series({"merge_lookups": float("nan")}), "x")
    assert X._lookups(pd.Series({"merge_lookups": 12.0}), "x") == 12


def _claim_lines(md: str) -> list[str]:
    sec = md.split("## Past the paper: what each part buys")[1]
    return [ln[2:] for ln in sec.split("\n\n")[2].splitlines()]


def test_reproduce_cost_quick(tmp_path: Path) -> None:
    from cais.reproduce.experiments import EXPERIMENTS, Context
    from cais.reproduce.run import reproduce

    assert "cost" in EXPERIMENTS
    reproduce(["cost"], Context(quick=True, out=tmp_path), log=lambda _: None)
    t = pd.read_csv(tmp_path / "cost.csv")
    assert set(t["part"]) == {"ladder", "cost", "designs", "break-even", "latency", "rate", "design runs", "energy"}
    ladder = t[t["part"] == "ladder"]
    assert {"tp-nvls", "cais-base", "cais-sw", "cais-wo-coord", "cais-partial", "cais"} <= set(ladder["rung"])
    lat = t[t["part"] == "latency"]
    assert (lat["runs"] == len(X.PERTURB_NS) + 1).all() and len(set(lat["latency_ns"])) == len(X.LATENCIES_NS) + 1
    md = (tmp_path / "report.md").read_text()
    assert "ANALYSIS FAILED" not in md and "straight line" not in md
    lines = _claim_lines(md)
    assert len(lines) >= 5 and all(len(ln) <= 220 for ln in lines), lines
    claims = json.loads((tmp_path / "claims.json").read_text())
    names = {c["name"] for c in claims["claims"]["cost"]}
    assert names == {X.CLAIM_AREA, X.CLAIM_RATE, X.CLAIM_OWN, X.CLAIM_LATENCY, X.CLAIM_ENERGY}
    e = t[t["part"] == "energy"]
    cais = e[e["scheme"] == "cais"]
    assert (cais["merge_lookups"] > 0).all() and (e[e["scheme"] != "cais"]["merge_lookups"] == 0).all()
    assert (cais[f"merge share @{X.LINK_LOW:g}"] > cais[f"merge share @{X.LINK_HIGH:g}"]).all()
    # the same runs cached without their lookup counts (as runs made before issue 57): one line, no zero
    runs = tmp_path / "runs" / "layer_point.parquet"
    cached = pd.read_parquet(runs)
    cached.assign(merge_lookups=float("nan")).to_parquet(runs)
    reproduce(["cost"], Context(quick=True, out=tmp_path), log=lambda _: None)
    md = (tmp_path / "report.md").read_text()
    failed = [ln for ln in md.splitlines() if "ANALYSIS FAILED" in ln]
    assert len(failed) == 1 and "has no merge-lookup count" in failed[0], failed


def test_the_page_is_its_runs() -> None:
    """docs/switch-cost.md's numbers are the shipped run's: its block is cost.md (the
    figures' paths moved), its claim lines carry the figures cost.csv gives, and the
    prose outside the block states no result."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("switch_cost_doc", ROOT / "scripts" / "switch_cost_doc.py")
    assert spec and spec.loader
    doc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(doc)
    page = (ROOT / "docs" / "switch-cost.md").read_text()
    head, rest = page.split(doc.BEGIN, 1)
    block, tail = rest.split(doc.END, 1)
    shipped = (ROOT / "docs" / "reproduce-results" / "cost" / "cost.md").read_text().strip()
    assert block.strip() == doc.from_docs(shipped)
    t = pd.read_csv(ROOT / "docs" / "reproduce-results" / "cost" / "cost.csv")
    d = t[(t["part"] == "designs") & (t["node_nm"] == MU.VERDICT_NM)].iloc[0]
    assert f"ours {d['chip_mm2']:.2f} mm^2 per chip at 12 nm ({d['chip_arrays_mm2']:.2f} arrays" in block
    b = t[(t["part"] == "break-even") & (t["knob"] == "switch.merge.lookups_per_ns") & (t["over"] == "TP-NVLS")]
    assert f"break-even {b['break_even'].max():.2f}" in block
    e = t[(t["part"] == "energy") & (t["scheme"] == "cais")]
    assert f"to {100 * e[f'merge share @{X.LINK_LOW:g}'].max():.1f} %" in block
    assert "ANALYSIS FAILED" not in block
    for prose in (head, tail):
        assert not re.search(r"\d\s*(%|mm\^2|mm²|lookups/ns|slots/ns|x TP-NVLS)", prose), "a result typed by hand"
