"""Past the paper: how close each scheme gets to the optimum. Per sub-layer of the
Fig. 11 runs the lower bound is max(compute on all SMs, least bytes per link direction
/ NVLink bandwidth); the share of it a scheme reaches is the sum of bounds over the
sum of sub-layer times (geomean over models)."""

from __future__ import annotations

import pandas as pd

from cais.reproduce import plots
from cais.reproduce.experiments.common import Context, Experiment, fig11_points, geomean, ok_rows
from cais.reproduce.report import Section
from cais.reproduce.verdict import span


def bound_analyse(ctx: Context, rows: pd.DataFrame) -> tuple[pd.DataFrame, Section]:
    """Per run the bound, the time and their ratio; per mode and scheme the geomean
    share, its chart, and CAIS's against the closest scheme's."""
    df = ok_rows(rows)
    out = []
    for _, r in df.iterrows():
        subs = [L for L in ("L1", "L2", "L3", "L4") if r[f"{L}_time_us"] == r[f"{L}_time_us"]]
        bound = sum(r[f"{L}_bound_us"] for L in subs)
        time = sum(r[f"{L}_time_us"] for L in subs)
        out.append({"model": r["model"], "mode": r["mode"], "scheme": r["scheme"], "bound_us": bound,
                    "time_us": time, "share_of_bound": bound / time})
    t = pd.DataFrame(out)
    g = t.groupby(["mode", "scheme"], sort=False)["share_of_bound"].apply(lambda s: geomean(list(s))).reset_index()
    plots.bars(ctx.out / "bound.png", [f"{m[:3]} {s}" for m, s in zip(g["mode"], g["scheme"])],
               {"share of the lower bound reached": list(g["share_of_bound"])},
               "lower bound / time (1 = optimal, unitless)",
               "Past the paper: how close each scheme gets to the sub-layers' lower bound", hline=1.0)
    sec = Section("bound", "Past the paper: the lower bound and the share of it each scheme reaches")
    sec.p("Per sub-layer the lower bound is max(compute on all SMs, least bytes per link direction / NVLink "
          "bandwidth); the share is the sum of bounds over the sum of sub-layer times (geomean over models).")
    best = g.loc[g["share_of_bound"].idxmax()] if len(g) else None
    cb = g[g["scheme"] == "cais"]["share_of_bound"]
    if best is not None:
        sec.says(f"CAIS reaches {span(cb, '')} of the sub-layers' lower bound (per mode; no paper figure).",
                 f"The closest scheme to the bound is {best['scheme']} ({best['mode']}) at "
                 f"{float(best['share_of_bound']):.2f}.")
    sec.img("bound.png").table(g, summary=True)
    return t, sec


EXPERIMENT = Experiment("bound", "bound", fig11_points, bound_analyse)
