"""The merge unit's cost (issue 57, docs/switch-cost.md): CACTI against the stored run
(skipped where CACTI is absent), what the stored run gives, the break-even search, and
`cais reproduce cost --quick` end to end."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from cais.cost import cacti as C
from cais.cost import merge_unit as MU
from cais.reproduce.experiments.cost import break_even


def test_cacti_gives_the_stored_run() -> None:
    if C.find_cacti() is None:
        pytest.skip("CACTI not installed (scripts/build_cacti.sh, or CAIS_CACTI=path/to/cacti)")
    got, want = MU.run(), MU.stored()
    assert {k: v for k, v in got.items() if k != "arrays"} == {k: v for k, v in want.items() if k != "arrays"}
    for name, a in want["arrays"].items():
        for key, v in a.items():
            assert got["arrays"][name][key] == (pytest.approx(v, rel=1e-6) if isinstance(v, float) else v), (name, key)


def test_the_stored_run_sizes_and_sums() -> None:
    r = MU.stored()
    assert (r["entries"], r["line_bytes"], r["gpus"], r["tag_bits"]) == (320, 128, 8, 42)
    assert r["arrays"]["data"]["bytes"] == 320 * 128 and r["arrays"]["cam"]["search_nJ"] > 0
    t = MU.table(r)
    for n in MU.NODES_NM:
        at = t[t["node_nm"] == n].set_index("array")
        assert at.loc["chip (8 ports)", "area_mm2"] == pytest.approx(8 * at.loc["port", "area_mm2"])
        assert at.loc["port", "area_mm2"] == pytest.approx(at.loc[["cam", "data", "meta"], "area_mm2"].sum())
    t22, t7 = MU.timing(r, 22), MU.timing(r, 7)
    assert t7["latency_ns"] < t22["latency_ns"] < 1 and t7["lookups_per_ns"] > t22["lookups_per_ns"] > 1
    a12 = t[(t["node_nm"] == 12) & (t["array"] == "chip (8 ports)")]["area_mm2"].iloc[0]
    assert 0.1 < a12 < 0.5  # the paper's 0.50 mm^2 for the whole unit, arrays and logic, at 12 nm
    assert MU.cost(fresh=False)[1].startswith("the stored CACTI run")


def test_break_even_interpolates_and_says_where_it_does_not_cross() -> None:
    assert break_even([0, 100, 200], [1.4, 1.2, 0.8]) == (150.0, "150 ns")
    assert math.isnan(break_even([0, 200], [1.4, 1.1])[0])
    assert break_even([0, 200], [0.9, 0.8])[0] == -math.inf
    x, words = break_even([math.inf, 1.0, 0.1], [1.3, 1.1, 0.9], log=True)
    assert x == pytest.approx(math.sqrt(0.1)) and words.endswith("lookups/ns")
    assert break_even([math.inf, 3.0], [1.3, 0.9], log=True) == (3.0, "above 3 lookups/ns")


def test_reproduce_cost_quick(tmp_path: Path) -> None:
    from cais.reproduce.experiments import EXPERIMENTS, Context
    from cais.reproduce.run import reproduce

    assert "cost" in EXPERIMENTS
    reproduce(["cost"], Context(quick=True, out=tmp_path), log=lambda _: None)
    t = pd.read_csv(tmp_path / "cost.csv")
    assert set(t["part"]) == {"ladder", "cost", "break-even", "sweep", "energy"}
    ladder = t[t["part"] == "ladder"]
    assert {"tp-nvls", "cais-base", "cais-sw", "cais-wo-coord", "cais-partial", "cais"} <= set(ladder["rung"])
    md = (tmp_path / "report.md").read_text()
    sec = md.split("## Past the paper: what each part buys")[1]
    for words in ("Area:", "Latency:", "Rate:", "Power:", "CACTI", "switch.merge.cacti_node=7nm"):
        assert words in sec, words
    e = t[t["part"] == "energy"]
    cais = e[e["scheme"] == "cais"]
    assert (cais["merge_lookups"] > 0).all() and (e[e["scheme"] != "cais"]["merge_lookups"] == 0).all()


def test_extrapolate_the_latency_break_even() -> None:
    from cais.reproduce.experiments.cost import extrapolate

    assert extrapolate([0, 100, 200], [1000, 1010, 1020], 1100) == pytest.approx(1000)
    assert math.isnan(extrapolate([0, 100], [1000, 990], 1100))  # no slope to meet it
