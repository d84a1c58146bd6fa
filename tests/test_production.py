"""The "production" experiment's analysis (issue 37): CAIS's speedup over TP-NCCL and
over the best production kernel per case, which kernel is best, and the cases left
out because they do not fit in HBM. The end-to-end quick run is in test_reproduce."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cais.reproduce.experiments import production as prod
from cais.reproduce.experiments.common import Context


def _rows() -> pd.DataFrame:
    times = {"tp-nccl": 100.0, "tp-custom-ar": 80.0, "tp-multimem": 90.0, "tp-fused-ar-norm": 70.0, "cais": 75.0}
    out = []
    for world in ("w1", "w2"):
        for s, t in times.items():
            out.append({"status": "ok", "point.world": world, "point.model": "llama3-8b", "point.mode": "decode",
                        "point.batch": 1, "point.seq": 1024, "point.scheme": s,
                        "total_us": t if world == "w1" else t * (0.5 if s == "cais" else 1.0),
                        "comm_kernel_us": t / 4, "compute_kernel_us": t / 2})
    return pd.DataFrame(out)


def test_table_picks_the_best_production_kernel_and_divides_by_cais() -> None:
    t = prod.production_table(_rows())
    assert len(t) == 2
    w1 = t[t["world"] == "w1"].iloc[0]
    assert w1["best_production"] == "tp-fused-ar-norm"
    assert w1["cais_over_best"] == 70.0 / 75.0 and w1["cais_over_tp_nccl"] == 100.0 / 75.0
    assert w1["case"] == "8b decode b1 kv1k"
    w2 = t[t["world"] == "w2"].iloc[0]
    assert w2["cais_over_best"] == 70.0 / 37.5
    # outside any kernel: total less busy time (70 - 17.5 - 35 for the fused kernel)
    assert w1["best_gap_us"] == 70.0 - 17.5 - 35.0 and w2["cais_gap_us"] == 0.0


def test_analysis_gives_a_verdict_per_world_and_judges_the_claim(tmp_path: Path) -> None:
    _, sec = prod.production_analyse(Context(out=tmp_path, quick=True), _rows())
    assert "w1: decode: CAIS 1.33x TP-NCCL" in sec.verdict and "w2: decode: CAIS 2.67x" in sec.verdict
    assert (tmp_path / "production.png").is_file()
    assert len(sec.claims) == 1 and not sec.claims[0].holds  # CAIS loses to the fused kernel in w1
    assert "1 of 2 cases" in sec.claims[0].figure


def test_points_leave_out_what_does_not_fit_and_name_their_world() -> None:
    ctx = Context()
    points = prod.production_points(ctx)
    worlds = {p["world"] for _, p in points}
    assert len(worlds) == 4 and any("paper's L2" in w for w in worlds)
    # Llama-3-70B, 64 sequences over 32k tokens needs ~104 GB per H100 at TP 8: left out there, run on the
    # H200 and at TP 16
    big = [p for _, p in points if p["model"] == "llama3-70b" and p["batch"] == 64 and p["seq"] == 32768]
    assert big and {p["system"] for p in big} == {"dgx-h200", "nvl72"}
    assert prod.left_out(ctx) == 2
    assert {p["scheme"] for _, p in points} == set(prod.SCHEMES)


def test_a_grid_point_whose_kernel_hands_every_allreduce_to_nccl_shares_the_tp_nccl_run() -> None:
    """Of the full grid's production points, those whose scheme falls back to NCCL for
    the period's every AllReduce name the tp-nccl point of their case as their run
    (the sweep runs it once); the others, other point functions and a point that
    cannot be built name themselves."""
    from cais.reproduce.experiments.common import LAYER, TIMELINE
    from cais.reproduce.points import same_run

    points = [p for _, p in prod.production_points(Context())]
    shared = [(p, same_run(LAYER, p)) for p in points if same_run(LAYER, p) is not p]
    assert shared and all(p["scheme"] in ("tp-custom-ar", "tp-multimem") for p, _ in shared)
    assert all(q == {**p, "scheme": "tp-nccl"} and q in points for p, q in shared)
    # Llama-3-70B at TP 16 on nvl72: vLLM runs neither kernel on 16 GPUs
    assert {p["scheme"] for p, _ in shared if p["system"] == "nvl72"} == {"tp-custom-ar", "tp-multimem"}
    assert all(same_run(LAYER, p) is p for p in points if p["scheme"] in ("tp-nccl", "tp-fused-ar-norm", "cais"))
    assert same_run(TIMELINE, shared[0][0]) is shared[0][0]
    bad = {**shared[0][0], "model": "no-such-model"}
    assert same_run(LAYER, bad) is bad
