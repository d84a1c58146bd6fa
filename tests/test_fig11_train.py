"""Fig. 11's training breakdown: each segment's span summed over the models for CAIS,
TP-NVLS and the best baseline, and the verdict's training reason from it."""

from __future__ import annotations

import json

import pandas as pd

from cais.reproduce.experiments.fig11 import train_breakdown, train_reason


def _row(model: str, scheme: str, total: float, segs: dict[str, float]) -> dict[str, object]:
    return {"model": model, "mode": "train", "scheme": scheme, "total_us": total, "segments_us": json.dumps(segs)}


def _df() -> pd.DataFrame:
    rows = []
    for model in ("a", "b"):
        rows.append(_row(model, "cais", 100.0, {"L1": 10, "L2": 10, "L3": 10, "L4": 20, "qkv_wgrad": 30}))
        rows.append(_row(model, "tp-nvls", 150.0, {"L1": 20, "L2": 20, "L3": 20, "L4": 20, "qkv_wgrad": 10}))
        rows.append(_row(model, "t3", 120.0, {"L1": 15, "L2": 15, "L3": 15, "L4": 15, "regather_n1": 5}))
    return pd.DataFrame(rows)


def test_the_breakdown_sums_each_segment_over_the_models() -> None:
    b = train_breakdown(_df(), "t3").set_index("segment")
    assert list(b.columns) == ["cais (us)", "tp-nvls (us)", "t3 (us)"]
    assert b.loc["qkv_wgrad", "cais (us)"] == 60 and b.loc["qkv_wgrad", "tp-nvls (us)"] == 20
    assert b.loc["L1-L4", "cais (us)"] == 100 and b.loc["L1-L4", "tp-nvls (us)"] == 160
    assert b.loc["period", "t3 (us)"] == 240
    assert b.loc["regather_n1", "t3 (us)"] == 10 and pd.isna(b.loc["regather_n1", "cais (us)"])


def test_the_reason_gives_the_period_the_sublayers_and_the_rest() -> None:
    lines = train_reason(train_breakdown(_df(), "t3"))
    assert len(lines) == 2 and all(len(ln) <= 200 for ln in lines)
    assert "period is 1.50x TP-NVLS's" in lines[0]
    assert "L1-L4 span 100 us against 160 (1.60x)" in lines[0]
    assert "rest of the period takes 100 us against TP-NVLS's 140" in lines[1]


def test_runs_without_segment_spans_give_no_breakdown() -> None:
    df = _df().drop(columns=["segments_us"])
    assert train_breakdown(df, "t3").empty and train_reason(train_breakdown(df, "t3")) == []


def test_sublayers_that_overlap_one_another_are_said_so() -> None:
    df = _df()
    df.loc[df["scheme"] == "cais", "total_us"] = 40.0  # the spans (50 + 30 per model) exceed the period
    text = " ".join(train_reason(train_breakdown(df, "t3")))
    assert "CAIS's segments overlap, spanning 20 us more than its period" in text and "-20" not in text
