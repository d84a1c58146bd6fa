"""`cais reproduce moe`'s second part: the in-switch EP ladder in whole MoE layers
(cais.reproduce.experiments.moe_switch; docs/moe.md, "In-switch expert parallelism"): the
quick grid runs every rung, its table, split and verdict come from its rows, a missing
rung is named, and the group table's telemetry is the routing's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cais.reproduce.experiments import Context
from cais.reproduce.experiments import moe_switch as ms
from cais.reproduce.experiments.common import ok_rows
from cais.reproduce.experiments.moe import split_rows
from cais.reproduce.run import Outcome, reproduce
from cais.sweep.store import read_table


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Outcome]:
    """`cais reproduce moe --quick`, once."""
    out = tmp_path_factory.mktemp("moe")
    return out, reproduce(["moe"], Context(quick=True, out=out), workers=2, log=lambda _: None, progress=False)


def _layer_rows(out: Path) -> pd.DataFrame:
    return ok_rows(split_rows(read_table(out / "runs" / "layer_point.parquet"))["layer"])


def test_the_quick_ladder_runs_every_rung_at_every_case(quick: tuple[Path, Outcome]) -> None:
    out, _ = quick
    cases = ms._grid(Context(quick=True))
    assert cases and {c[0] for c in cases} == {"dgx-h100"}
    t = pd.read_csv(out / "moe_switch.csv")
    assert len(t) == len(cases) * len(ms.ROUTINGS) and set(t["routing"]) == set(ms.ROUTINGS)
    for rung in ms.RUNGS:
        assert t[f"{rung} (us)"].notna().all() and (t[f"{rung} (us)"] > 0).all(), rung
    # each rung's own layer run: the EP kernel it names, the routing the point set
    rows = _layer_rows(out)
    assert set(rows["scheme"]) == set(ms.RUNGS) and set(rows["moe_routing"]) == set(ms.ROUTINGS)
    block = rows["dispatch_us"] + rows["grouped_gemm_us"] + rows["combine_us"] + rows["fused_us"]
    assert (block > 0).all()
    fused = rows["scheme"].isin(["ep-switch-sw", "ep-switch-mcast", "ep-switch-red", "ep-switch"])
    assert fused.any() and (rows.loc[fused, "fused_us"] > 0).all() and (rows.loc[~fused, "fused_us"] == 0).all()
    # a power-law routing loads the busiest rank more than the uniform one, in every case
    load = rows.groupby(["mode", "tokens_per_rank", "moe_routing"])["busiest_rank_load"].max().unstack()
    assert len(load) and (load["powerlaw"] > load["uniform"]).all()


def test_the_gain_split_multiplies_to_the_gain(quick: tuple[Path, Outcome]) -> None:
    t = pd.read_csv(quick[0] / "moe_switch.csv")
    product = t["sw dataflow / best (block)"] * t["multicast (block)"] * t["reduction (block)"] * t["rest (block)"]
    assert np.allclose(product, t["in-switch / best (block)"], rtol=1e-9)
    best = t[["ep-deepep block (us)", "ep-deepep-ll block (us)"]].min(axis=1)
    assert np.allclose(t["in-switch / best (block)"], best / t["ep-switch block (us)"], rtol=1e-9)
    layer = t[["ep-deepep (us)", "ep-deepep-ll (us)"]].min(axis=1)
    assert np.allclose(t["in-switch / best (layer)"], layer / t["ep-switch (us)"], rtol=1e-9)
    assert (t["need entries (p99)"] > 0).all() and (t["group overflows"] == 0).all()


def test_the_verdict_comes_from_the_rows(quick: tuple[Path, Outcome]) -> None:
    """Every claim of the ladder is recomputed from the table, and every world run has
    its line; the claims are in claims.json with the kernel part's."""
    out, res = quick
    t = pd.read_csv(out / "moe_switch.csv")
    sec = next(s for s in res.sections if s.name == "moe")
    claims = {c.name: c for c in sec.claims}
    for mode, part in t.groupby("mode"):
        c = claims[f"the in-switch scheme beats the best software in {mode} on dgx-h100"]
        assert c.holds == bool((part["in-switch / best (layer)"] > 1 + ms.TIE).all())
        assert f"of {len(part)} points" in c.figure
    assert claims["token-centric fusion speeds the layer up"].holds == bool((t["fusion (layer)"] > 1 + ms.TIE).all())
    assert claims["its expert block beats the best software's on dgx-h100"].holds == bool(
        (t["in-switch / best (block)"] > 1 + ms.TIE).all())
    assert claims["the multicast gains more than the reduction"].holds == bool(
        (t["multicast (block)"] > t["reduction (block)"]).all())
    world = [ln for ln in sec.lines if ln.startswith("On dgx-h100 (EP 8), ep-switch's layer")]
    assert len(world) == 1
    for mode, part in t.groupby("mode"):
        assert f"{mode} {ms._tally(part['in-switch / best (layer)'])}" in world[0]
    stored = json.loads((out / "claims.json").read_text())["claims"]["moe"]
    assert {c["name"] for c in stored} == set(claims)
    ladder = [n for n in claims if "in-switch" in n or "multicast" in n or "dataflow" in n or "expert block" in n
              or "fusion" in n]
    assert all(len(c.figure) < 70 for c in sec.claims if c.name in ladder)  # a quick line held to the full grid fits
    assert len(ladder) == t["mode"].nunique() + 4  # per mode, the block, multicast vs reduction, sw dataflow, fusion


def test_a_missing_rung_is_named_and_its_points_left_out(quick: tuple[Path, Outcome], tmp_path: Path) -> None:
    rows = _layer_rows(quick[0])
    full, missing = ms.ladder_table(rows)
    assert len(full) and not missing
    for rung in ms.RUNGS:
        t, missing = ms.ladder_table(rows[rows["scheme"] != rung])
        assert t.empty and len(missing) == len(full) and all(f"(no {rung})" in m for m in missing), rung
    sec = ms.Section("moe", "t")
    t, lines = ms.ladder_section(Context(quick=True, out=tmp_path), sec, rows[rows["scheme"] != "ep-switch-red"],
                                 pd.DataFrame())
    assert t.empty and not lines and not sec.claims
    assert any("(no ep-switch-red)" in str(b) for _, b in sec.blocks)


def test_the_runs_group_table_peak_is_the_routings_distinct_sets(quick: tuple[Path, Outcome]) -> None:
    """ep-switch's telemetry (the busiest port's peak entries) equals what the routing
    asks: the busiest sender's distinct remote destination sets of two ranks or more
    (cais.experiments.ep_table), on the run's own routing."""
    from cais.config import apply_overrides, load_system
    from cais.experiments.ep_table import groups_per_port
    from cais.experiments.layer import moe_period
    from cais.workload.moe import load_moe_model

    rows = _layer_rows(quick[0])
    sw = rows[rows["scheme"] == "ep-switch"]
    assert len(sw)
    for _, r in sw.iterrows():
        cfg = apply_overrides(load_system(r["system"]), {"moe.routing": r["moe_routing"]})
        shape = {"batch": int(r["batch"])} | ({"seq": int(r["seq"])} if r.get("seq") == r.get("seq") else {})
        period = moe_period(cfg, load_moe_model(r["model"], **shape), r["mode"], "dp", 0)
        assert period.routing is not None
        assert int(r["group_table_peak"]) == int(groups_per_port(period.routing).max())
