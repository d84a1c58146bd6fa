"""Table II of the paper (§V-E): the full set-up (Table II full model, 132 SMs)
against the half, scaled-down one (66 SMs) that the rest of the evaluation uses: CAIS's
speedup over TP-NVLS in each, prefill, beside the paper's."""

from __future__ import annotations

import pandas as pd

from cais.reproduce import paper as P
from cais.reproduce import plots
from cais.reproduce.experiments.common import LAYER, WHY_CAIS, Context, Experiment, compare, ok_rows
from cais.reproduce.report import Section
from cais.sweep.grid import Point


def table2_points(ctx: Context) -> list[tuple[str, Point]]:
    """TP-NVLS and CAIS on the full model at 132 SMs and the half model at 66 SMs."""
    extra = {"batch": 1, "seq": 128} if ctx.quick else {}
    return [(LAYER, {**ctx.base(), "model": m, **extra, "scheme": s, "mode": "prefill", "sms": sms})
            for m, sms in (("paper-full", P.SMS_FULL), ("paper-half", P.SMS_HALF)) for s in ("tp-nvls", "cais")]


def table2_analyse(ctx: Context, rows: pd.DataFrame) -> tuple[pd.DataFrame, Section]:
    """CAIS's speedup per set-up beside the paper's, and whether half reproduces full."""
    df = ok_rows(rows)
    out = []
    for m, g in df.groupby("model"):
        tp = float(g[g["scheme"] == "tp-nvls"]["total_us"].iloc[0])
        ca = float(g[g["scheme"] == "cais"]["total_us"].iloc[0])
        out.append({"setup": "full" if m == "paper-full" else "half", "model": m, "sms": int(g["sms"].iloc[0]),
                    "tp_nvls_us": tp, "cais_us": ca, "cais_speedup": tp / ca})
    t = pd.DataFrame(out).sort_values("setup").reset_index(drop=True)
    comp = [compare(f"CAIS over TP-NVLS, {r.setup}", r.cais_speedup, P.TABLE2[r.setup], WHY_CAIS)
            for r in t.itertuples()]
    plots.bars(ctx.out / "table2.png", list(t["setup"]), {"cais-sim": list(t["cais_speedup"])},
               "CAIS speedup over TP-NVLS (x, log)",
               f"Table II: full ({P.SMS_FULL} SMs) vs half ({P.SMS_HALF} SMs) set-up",
               [P.TABLE2[s] for s in t["setup"]], "paper (§V-E, Table II)", ratio=True)
    sec = Section("table2", "Table II: the full set-up against the half (scaled-down) one")
    sp = dict(zip(t["setup"], t["cais_speedup"]))
    if {"full", "half"} <= set(sp):
        beats = sec.claim("CAIS beats TP-NVLS in the full set-up", sp["full"] >= 1, f"{sp['full']:.2f}x")
        same = sec.claim("the half set-up reproduces the full one within 10 %", abs(sp["half"] / sp["full"] - 1) <= 0.10,
                         f"{sp['full']:.2f}x full, {sp['half']:.2f}x half")
        sec.says(f"CAIS beats TP-NVLS in the full set-up: {beats}; {sp['full']:.2f}x (paper "
                 f"{P.TABLE2['full']:.2f}x).",
                 f"The half set-up reproduces the full one within 10 % (paper's claim): {same}; {sp['half']:.2f}x "
                 f"against {sp['full']:.2f}x (paper {P.TABLE2['half']:.2f}x and {P.TABLE2['full']:.2f}x).")
    sec.p("Prefill, one layer period." + (" Quick grid: 128 tokens." if ctx.quick else "")
          + " The paper's claim is that half reproduces full: compare the two rows of ours with each other.")
    sec.img("table2.png").table(pd.DataFrame(comp), summary=True).table(t)
    return t, sec


EXPERIMENT = Experiment("table2", "Table II", table2_points, table2_analyse,
                        quick_grid="128 tokens for the full sequence")
