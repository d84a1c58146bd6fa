"""Fig. 13 of the paper (§V-B.1): (a) the merge table each port needs (the peak of a
table that never fills) for every Table I model and mode, with and without TB
coordination; (b) the mean first-to-last arrival skew per address at the paper's
40 KB table, one coordination mechanism added at a time."""

from __future__ import annotations

import json

import pandas as pd

from cais.reproduce import paper as P
from cais.reproduce import plots
from cais.reproduce.experiments.common import (LAYER, UNBOUNDED, Context, Experiment, compare, entries_of,
                                               grid_models, grid_modes, ok_rows, one_model)
from cais.reproduce.report import Section
from cais.sweep.grid import Point

#: Fig. 13(b)'s steps of coordination: (step, scheme, overrides); the last is CAIS itself
SKEW_STEPS = (("none", "cais-wo-coord", {}),
              ("pre-launch sync", "cais", {"cais.pre_access_sync": False, "cais.throttle_quorum": 0}),
              ("+ pre-access sync", "cais", {"cais.throttle_quorum": 0}),
              ("+ throttling", "cais", {}))


def steps_of(df: pd.DataFrame) -> pd.Series:
    """Each row's Fig. 13(b) step, from its scheme and overrides ('' when none)."""
    def step(scheme: str, sets: str) -> str:
        got = {k: v for k, v in json.loads(sets).items() if k != "switch.merge.entries"}
        for name, s, extra in SKEW_STEPS:
            if s == scheme and {k: str(v) for k, v in extra.items()} == {k: v for k, v in got.items()
                                                                         if k.startswith("cais.")}:
                return name
        return ""
    return pd.Series([step(a, b) for a, b in zip(df["scheme"], df["sets"])], index=df.index)


def fig13_points(ctx: Context) -> list[tuple[str, Point]]:
    """(a) the table each port needs (an unbounded table's peak) for every Table I model,
    prefill and train, with and without coordination; (b) the arrival skew at the
    paper's 40 KB, one coordination mechanism added at a time."""
    pts = [(LAYER, {**ctx.base(None, **{"switch.merge.entries": UNBOUNDED}), **m, "scheme": s, "mode": mode,
                    "sms": P.SMS_HALF})
           for m in grid_models(ctx) for mode in grid_modes(ctx) for s in ("cais", "cais-wo-coord")]
    m = one_model(ctx)
    pts += [(LAYER, {**ctx.base(None, **{"switch.merge.entries": P.TABLE_ENTRIES, **extra}), **m, "scheme": s,
                     "mode": "prefill", "sms": P.SMS_HALF}) for _, s, extra in SKEW_STEPS]
    return pts


def fig13_analyse(ctx: Context, rows: pd.DataFrame) -> tuple[pd.DataFrame, Section]:
    """(a)'s table need per model and mode and (b)'s skew per step, their charts, and
    both beside the paper's."""
    df = ok_rows(rows)
    df = df[df["scheme"].isin(["cais", "cais-wo-coord"])].copy()
    df["entries"] = entries_of(df)
    df["step"] = steps_of(df)
    cols = ["model", "mode", "scheme", "total_us", "table_peak_kB", "L1_table_peak_kB", "L2_table_peak_kB",
            "L3_table_peak_kB", "L4_table_peak_kB", "table_mean_kB", "ports_holding", "busiest_port_share",
            "skew_mean_us", "skew_max_us"]
    unb = df[(df["entries"] == UNBOUNDED) & (df["step"].isin(["none", "+ throttling"]))]
    t = unb[[c for c in cols if c in unb.columns]].sort_values(["model", "mode", "scheme"]).reset_index(drop=True)
    steps = df[(df["entries"] == P.TABLE_ENTRIES) & (df["step"] != "")].copy()
    steps["order"] = steps["step"].map({name: i for i, (name, _, _) in enumerate(SKEW_STEPS)})
    st = steps.sort_values("order")[["step", "scheme", "total_us", "skew_mean_us", "skew_max_us", "merged",
                                     "bypassed"]].reset_index(drop=True)
    comp = []
    for s in ("cais-wo-coord", "cais"):
        need = t[t["scheme"] == s]["table_peak_kB"]
        if len(need):
            capped = float(need.max()) >= 0.99 * UNBOUNDED * P.LINE_BYTES / 1000
            comp.append(compare(f"{s}: table needed per port, largest over models and modes (kB)"
                                + (", at least: the largest table filled" if capped else ""), float(need.max()),
                                P.FIG13_TABLE_KB[s], "peak of an unbounded table; coordination bounds it by one "
                                "GPU's outstanding requests spread over the homes (docs/validation.md §13)"))
    for name, s in (("none", "cais-wo-coord"), ("+ throttling", "cais")):
        row = st[st["step"] == name]
        if len(row):
            comp.append(compare(f"{name}: mean arrival skew at {P.TABLE_KB:.0f} KB (us)",
                                float(row["skew_mean_us"].iloc[0]), P.FIG13_SKEW_US[s],
                                "without coordination nothing holds the GPUs together: bypassed requests slow some "
                                "GPUs and they drift (docs/validation.md §13)"))
    ours = {s: [float(t[t["scheme"] == s]["table_peak_kB"].max()) if (t["scheme"] == s).any() else float("nan"),
                float(st[st["scheme"] == s]["skew_mean_us"].iloc[-1]) if (st["scheme"] == s).any()
                else float("nan")] for s in ("cais-wo-coord", "cais")}
    names = list(ours)
    plots.bars(ctx.out / "fig13a.png", names, {"cais-sim": [ours[s][0] for s in names]},
               "merge table needed per port (kB, log)", f"Fig. 13(a): merge-table need, {ctx.system}",
               [P.FIG13_TABLE_KB[s] for s in names], "paper (§V-B.1, Fig. 13a)", log=True)
    plots.bars(ctx.out / "fig13b.png", names, {"cais-sim": [ours[s][1] for s in names]},
               "mean first-to-last arrival per address (us, log)",
               f"Fig. 13(b): arrival skew at the {P.TABLE_KB:.0f} KB table, {ctx.system}",
               [P.FIG13_SKEW_US[s] for s in names], "paper (§V-B.1, Fig. 13b)", log=True)
    sec = Section("fig13", "Fig. 13: merge-table need and arrival skew, with and without coordination")
    need_c, need_w = ours["cais"][0], ours["cais-wo-coord"][0]
    skew_c, skew_w = ours["cais"][1], ours["cais-wo-coord"][1]
    cuts = sec.claim("coordination cuts the table need and the arrival skew", need_c < need_w and skew_c < skew_w,
                     f"{need_w:,.0f} -> {need_c:,.0f} kB, {skew_w:.2f} -> {skew_c:.2f} us")
    fits = sec.claim("the coordinated table need fits the paper's table", need_c <= P.TABLE_KB_SIMULATED,
                     f"{need_c:,.0f} kB")
    sec.says(f"Coordination cuts the table need and the arrival skew (paper's claim): {cuts}; {need_w:,.0f} -> "
             f"{need_c:,.0f} kB (paper {P.FIG13_TABLE_KB['cais-wo-coord']:.0f} -> {P.FIG13_TABLE_KB['cais']:.0f} KB).",
             f"Mean arrival skew: {skew_w:.2f} -> {skew_c:.2f} us (paper {P.FIG13_SKEW_US['cais-wo-coord']:.0f} -> "
             f"{P.FIG13_SKEW_US['cais']:.0f} us).",
             f"The coordinated need fits the paper's {P.TABLE_KB:.0f} KB table: {fits}; {need_c:,.0f} kB at the peak of a "
             "table that never fills (what a 40 KB table does at that peak: Fig. 14)." if need_c == need_c else "")
    sec.p(f"(a) 'table needed' is the peak of lines held on any port with a table that never fills ({UNBOUNDED} "
          "entries), per model and mode, over the layer period and per sub-layer (the tensors it reduces into and "
          "gathers; in training the weight gradients' later loads of them count there too; ports_holding: mean "
          "ports per chip holding "
          "sessions while any does; busiest_port_share: the busiest port's share of a chip's table time, 1/8 "
          f"when even). (b) the mean first-to-last arrival per address at the paper's {P.TABLE_KB:.0f} KB on "
          f"{df['model'].iloc[0] if len(df) else ''} prefill, one coordination mechanism added at a time.")
    sec.img("fig13a.png").img("fig13b.png").table(pd.DataFrame(comp), summary=True).table(t).table(st)
    return t, sec


EXPERIMENT = Experiment("fig13", "Fig. 13", fig13_points, fig13_analyse)
