"""The "production" experiment's analysis (issues 37, 58): CAIS's speedup over TP-NCCL and
over the best production stack per case, which stack is best and its kernels, the
launch each mode runs under, the sensitivity worlds, and the cases left out because
they do not fit in HBM. The end-to-end quick run is in test_reproduce."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cais.reproduce.experiments import production as prod
from cais.reproduce.experiments.common import Context


def _rows() -> pd.DataFrame:
    times = {"tp-nccl": 100.0, "tp-vllm": 80.0, "tp-sglang": 90.0, "tp-trtllm": 70.0, "cais": 75.0}
    out = []
    for world in ("w1", "w2"):
        for s, t in times.items():
            out.append({"status": "ok", "point.world": world, "point.model": "llama3-8b", "point.mode": "decode",
                        "point.batch": 1, "point.seq": 1024, "point.scheme": s,
                        "point.sets": '{"gpu.launch": "graph"}', "gpus_run": 8,
                        "collectives_ran": {"tp-trtllm": "fused-oneshot", "tp-vllm": "fused-oneshot",
                                            "tp-sglang": "push-oneshot"}.get(s, "ring-ll"),
                        "total_us": t if world == "w1" else t * (0.5 if s == "cais" else 1.0),
                        "comm_kernel_us": t / 4, "compute_kernel_us": t / 2})
    return pd.DataFrame(out)


def test_table_picks_the_best_production_kernel_and_divides_by_cais() -> None:
    t = prod.production_table(_rows())
    assert len(t) == 2
    w1 = t[t["world"] == "w1"].iloc[0]
    assert w1["best_production"] == "tp-trtllm" and w1["best_kernels"] == "fused-oneshot"
    assert w1["cais_over_best"] == 70.0 / 75.0 and w1["cais_over_tp_nccl"] == 100.0 / 75.0
    assert w1["case"] == "8b dec b1 1k" and w1["launch"] == "graph"
    w2 = t[t["world"] == "w2"].iloc[0]
    assert w2["cais_over_best"] == 70.0 / 37.5
    # outside any kernel: total less busy time (70 - 17.5 - 35 for the fused kernel)
    assert w1["best_gap_us"] == 70.0 - 17.5 - 35.0 and w2["cais_gap_us"] == 0.0


def test_analysis_gives_a_verdict_per_world_and_judges_the_claim(tmp_path: Path) -> None:
    _, sec = prod.production_analyse(Context(out=tmp_path, quick=True), _rows())
    assert "w1, decode (graph launches): CAIS 1.33x NCCL" in sec.verdict and "w2, decode (graph launches): CAIS 2.67x" \
        in sec.verdict
    assert all(len(ln) <= 200 for ln in sec.lines) and len(sec.lines) >= 3  # one claim a line
    assert (tmp_path / "production.png").is_file()
    assert len(sec.claims) == 1 and not sec.claims[0].holds  # CAIS loses to TensorRT-LLM's fused kernel in w1
    assert "1 of 2 cases" in sec.claims[0].figure
    assert "proposed NVSwitch" in " ".join(str(b) for k, b in sec.blocks if k == "p")
    from cais.reproduce.report import table_md
    for kind, block in sec.blocks:
        if kind == "table":  # readable headers, 80 columns
            assert list(block.columns) == ["case", "NCCL", "vLLM", "SGLang", "TRT-LLM", "CAIS", "best", "CAIS x"]
            assert "times in us" in block.attrs["caption"]
            assert max(len(line) for line in table_md(block).splitlines()) <= 80


def test_sensitivity_worlds_give_the_range_and_stay_out_of_the_claim(tmp_path: Path) -> None:
    rows = _rows()
    sens = rows[rows["point.world"] == "w1"].copy()
    sens["point.world"] = "w1" + prod.SENS + "low"
    sens.loc[sens["point.scheme"] == "cais", "total_us"] = 35.0
    _, sec = prod.production_analyse(Context(out=tmp_path, quick=True), pd.concat([rows, sens]))
    assert "CAIS over the best stack spans decode 0.93-2.00x" in sec.verdict  # nominal 70/75, low 70/35
    assert "2 cases" in sec.claims[0].figure  # the sensitivity world is not a case of the claim


def test_points_run_decode_under_graphs_and_prefill_eager_unless_set() -> None:
    import json

    pts = [p for _, p in prod.production_points(Context(quick=True))]
    launch = {(p["mode"], json.loads(p["sets"]).get("gpu.launch")) for p in pts}
    assert launch == {("decode", "graph"), ("prefill", "eager")}
    forced = [p for _, p in prod.production_points(Context(quick=True, sets={"gpu.launch": "eager"}))]
    assert {json.loads(p["sets"])["gpu.launch"] for p in forced} == {"eager"}
    worlds = {p["world"] for p in pts}
    assert sum(prod.SENS in w for w in worlds) == 2


def test_points_leave_out_what_does_not_fit_and_name_their_world() -> None:
    ctx = Context()
    points = prod.production_points(ctx)
    worlds = {p["world"] for _, p in points}
    assert len(worlds) == 6 and any("paper's L2" in w for w in worlds)
    # Llama-3-70B, 64 sequences over 32k tokens needs ~104 GB per H100 at TP 8: left out there, run on the
    # H200 and at TP 16
    big = [p for _, p in points if p["model"] == "llama3-70b" and p["batch"] == 64 and p["seq"] == 32768]
    assert big and {p["system"] for p in big} == {"dgx-h200", "nvl72"}
    assert prod.left_out(ctx) == 2
    assert {p["scheme"] for _, p in points} == set(prod.SCHEMES)


def test_the_stacks_run_their_own_points() -> None:
    """A stack composes its sub-layer itself (its chain), so no production point
    shares tp-nccl's run, not even where the stack hands every all-reduce to NCCL
    (nvl72, TP 16): the sweep runs each point."""
    from cais.reproduce.experiments.common import LAYER
    from cais.reproduce.points import same_run

    points = [p for _, p in prod.production_points(Context())]
    assert all(same_run(LAYER, p) is p for p in points)
