"""Fig. 16 of the paper (§V-B.2): bandwidth utilisation over time in sub-layer L2 of
LLaMA-7B prefill, CAIS-Base, CAIS-Partial and CAIS, in 5 us bins (quick: 2 us); the
paper shows CAIS near 100 % at steady state."""

from __future__ import annotations

import json

import pandas as pd

from cais.reproduce import paper as P
from cais.reproduce import plots
from cais.reproduce.experiments.common import TIMELINE, Context, Experiment, ok_rows, one_model
from cais.reproduce.report import Section
from cais.sweep.grid import Point


def fig16_points(ctx: Context) -> list[tuple[str, Point]]:
    """One recorded layer period per CAIS variant, binned over L2."""
    m = one_model(ctx)
    return [(TIMELINE, {**ctx.base(), **m, "scheme": s, "mode": "prefill", "sms": P.SMS_HALF, "segment": "L2",
                        "bin_us": 2.0 if ctx.quick else 5.0}) for s in ("cais-base", "cais-partial", "cais")]


def fig16_analyse(ctx: Context, rows: pd.DataFrame) -> tuple[pd.DataFrame, Section]:
    """The utilisation series per variant, its chart, and CAIS's mean and peak beside
    the paper's steady state."""
    df = ok_rows(rows)
    out, series = [], {}
    for _, r in df.iterrows():
        ys = [100 * v for v in json.loads(r["series"])]
        xs = [i * float(r["bin_width_us"]) for i in range(len(ys))]
        series[r["scheme"]] = (xs, ys)
        out += [{"scheme": r["scheme"], "t_us": x, "util_pct": y} for x, y in zip(xs, ys)]
    t = pd.DataFrame(out)
    plots.lines(ctx.out / "fig16.png", series, "time since the start of L2 (us)", "mean link utilisation (%)",
                f"Fig. 16: utilisation over time, L2 of {df['model'].iloc[0]} prefill",
                hline=P.FIG16_CAIS_STEADY,
                hline_label=f"paper: CAIS near {P.FIG16_CAIS_STEADY:.0f} % at steady state (§V-B.2, Fig. 16)")
    summ = t.groupby("scheme")["util_pct"].agg(["mean", "max"]).reset_index().rename(
        columns={"mean": "mean util (%)", "max": "max util (%)"})
    sec = Section("fig16", "Fig. 16: bandwidth utilisation over time (L2)")
    cs = summ[summ["scheme"] == "cais"]
    if len(cs):
        mean, peak = float(cs["mean util (%)"].iloc[0]), float(cs["max util (%)"].iloc[0])
        near = sec.claim("CAIS near 90 % busy at steady state in L2", mean >= 90, f"{mean:.0f} %")
        sec.says(f"CAIS near {P.FIG16_CAIS_STEADY:.0f} % busy at steady state in L2 (paper's claim): {near}; "
                 f"{mean:.0f} % on average, {peak:.0f} % at the busiest bin.")
    sec.p(f"Mean utilisation of all GPU port directions per bin during sub-layer L2. Paper: CAIS near "
          f"{P.FIG16_CAIS_STEADY:.0f} % at steady state, Partial dips, Base lowest and most fluctuating (dashed "
          f"line: {P.FIG16_CAIS_STEADY:.0f} %).")
    sec.img("fig16.png").table(summ, summary=True)
    return t, sec


EXPERIMENT = Experiment("fig16", "Fig. 16", fig16_points, fig16_analyse,
                        quick_grid="Mega-GPT-4B with 1 sequence for LLaMA-7B; 2 us bins")
