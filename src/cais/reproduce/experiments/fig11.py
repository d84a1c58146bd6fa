"""Fig. 11 of the paper (§V-A.1): the end-to-end speedup of CAIS over every baseline
and every CAIS ablation, one layer period per (Table I model, mode, scheme) at 8 GPUs
x 66 SMs, and per scheme and mode the geomean over the models beside the paper's.

Its table (:func:`fig11_table`) and geomeans (:func:`geomean_table`) serve the
worlds experiment too."""

from __future__ import annotations

import json

import pandas as pd

from cais.reproduce import paper as P
from cais.reproduce import plots
from cais.reproduce.experiments.common import (WHY_BOTH, WHY_CAIS, Context, Experiment, compare, failures,
                                               WORLD_TEXT, comm_weight, geomean, grid_words, ok_rows, own_world, why_measured, world_rows,
                                               worlds)
from cais.sweep.grid import Point
from cais.reproduce.report import Section
from cais.reproduce.switch_share import fig11_switch_lines, share_claims, switch_share
from cais.reproduce.verdict import count_faster, holds, span


def fig11_table(df: pd.DataFrame) -> pd.DataFrame:
    """model, mode, scheme, time_us, speedup_of_cais (= time(scheme) / time(cais))."""
    out = []
    for (model, mode), g in df.groupby(["model", "mode"], sort=False):
        cais = g[g["scheme"] == "cais"]["total_us"]
        c = float(cais.iloc[0]) if len(cais) else float("nan")
        for _, r in g.iterrows():
            out.append({"model": model, "mode": mode, "scheme": r["scheme"], "time_us": float(r["total_us"]),
                        "speedup_of_cais": float(r["total_us"]) / c})
    t = pd.DataFrame(out, columns=["model", "mode", "scheme", "time_us", "speedup_of_cais"])
    order = {s: i for i, s in enumerate(P.SCHEMES)}
    return t.sort_values(["mode", "model", "scheme"], key=lambda c: c.map(order) if c.name == "scheme" else c,
                         kind="stable").reset_index(drop=True)


def geomean_table(t: pd.DataFrame, why: tuple[str, str] = (WHY_BOTH, WHY_CAIS)) -> pd.DataFrame:
    """Per scheme and mode: CAIS's geomean speedup over the models, beside the paper's,
    with ``why`` (a baseline's reason, a CAIS variant's: :func:`why_measured`)."""
    rows = []
    for mode in dict.fromkeys(t["mode"]):
        for s in P.SCHEMES:
            g = t[(t["mode"] == mode) & (t["scheme"] == s)]
            if g.empty or s == "cais":
                continue
            ours = geomean(list(g["speedup_of_cais"]))
            pp = P.fig11_paper(s, mode)
            reason = why[1] if s in P.CAIS_VARIANTS else why[0]
            rows.append({"mode": mode, "scheme": s, **compare(f"CAIS over {s}", ours, pp, reason)})
    return pd.DataFrame(rows).drop(columns=["quantity"])


def reread_factor(df: pd.DataFrame, l2: pd.DataFrame | None) -> float:
    """Bytes delivered to a GPU by CAIS's runs in ``df`` over those of the same runs in
    ``l2`` (the paper's L2 assumption: each remote row block reaches a GPU once): how
    often a remote block is delivered again (NaN without both)."""
    if l2 is None or "wire_down_GB" not in df or "wire_down_GB" not in l2:
        return float("nan")
    key = ["model", "mode"]
    a = df[df["scheme"] == "cais"].set_index(key)["wire_down_GB"]
    b = l2[l2["scheme"] == "cais"].set_index(key)["wire_down_GB"]
    both = a.index.intersection(b.index)
    return geomean(list(a[both] / b[both])) if len(both) else float("nan")


def first_reason(df: pd.DataFrame, l2: pd.DataFrame | None = None) -> str:
    """The first reason the runs ``df`` (layer_point rows of CAIS and TP-NVLS) give for
    CAIS winning less than in the paper, with its number: merge-table overflow, else
    remote rows delivered again (against the runs ``l2`` with the paper's L2
    assumption), else the weight of communication against computation, else how busy
    CAIS keeps the links."""
    c, tp = df[df["scheme"] == "cais"], df[df["scheme"] == "tp-nvls"]
    merged, bypassed = float(c["merged"].sum()) if "merged" in c else 0.0, \
        float(c["bypassed"].sum()) if "bypassed" in c else 0.0
    if merged + bypassed > 0 and bypassed / (merged + bypassed) > 0.10:
        return (f"{100 * bypassed / (merged + bypassed):.0f} % of CAIS's mergeable requests found no room in the "
                "merge table and went through unmerged")
    again = reread_factor(df, l2)
    if again == again and again > 1.5:
        return (f"CAIS delivers {again:.1f}x the bytes to each GPU that it would if each remote row block "
                "reached a GPU once (the paper's L2 traffic model): its column tiles load their remote rows again")
    ratio = geomean(list(tp["comm_kernel_us"] / tp["compute_kernel_us"])) if len(tp) else float("nan")
    if ratio == ratio and ratio < P.FIG2_COMM_OVER_COMPUTE_8GPU:
        return (f"TP-NVLS spends {ratio:.2f}x as long in collectives as in other kernels here, against "
                f"{P.FIG2_COMM_OVER_COMPUTE_8GPU}x in the paper's Fig. 2, so there is less communication for CAIS "
                "to remove")
    util = float(c["link_util_mean"].mean()) if len(c) else float("nan")
    return (f"CAIS keeps the links {100 * util:.0f} % busy on average against the paper's "
            f"{P.FIG15_UTIL['cais']:.0f} %")


SUBLAYERS = ("L1", "L2", "L3", "L4")


def segment_times(df: pd.DataFrame, scheme: str, mode: str = "train") -> dict[str, float]:
    """Each segment's span (us: its first kernel's start to its last kernel's end,
    over the GPUs) in ``scheme``'s runs of ``mode`` in ``df``, summed over the models;
    ``period`` is the periods' sum. Empty where the runs have no segment spans."""
    rows = df[(df["scheme"] == scheme) & (df["mode"] == mode)]
    if rows.empty or "segments_us" not in rows or rows["segments_us"].isna().any():
        return {}
    out: dict[str, float] = {}
    for _, r in rows.iterrows():
        for name, us in json.loads(r["segments_us"]).items():
            out[name] = out.get(name, 0.0) + float(us)
    out["period"] = float(rows["total_us"].sum())
    return out


def best_baseline(g: pd.DataFrame, mode: str) -> str | None:
    """The baseline CAIS beats by the least in ``mode`` (the geomean table ``g``)."""
    b = g[(g["mode"] == mode) & g["scheme"].isin(P.BASELINES)].dropna(subset=["ours"])
    return None if b.empty else str(b.loc[b["ours"].idxmin(), "scheme"])


def train_breakdown(df: pd.DataFrame, best: str | None) -> pd.DataFrame:
    """The training period kernel by kernel: each segment's span summed over the
    models for CAIS, TP-NVLS and the best baseline, the sub-layers L1-L4 together, and
    the period. Segments that run beside others overlap them, so the spans add up to
    more than the period where a scheme overlaps."""
    names = ["cais", "tp-nvls"] + ([best] if best and best != "tp-nvls" else [])
    times = {s: segment_times(df, s) for s in names}
    if not all(times.values()):
        return pd.DataFrame()
    order = list(dict.fromkeys(k for s in names for k in times[s] if k != "period"))
    rows = []
    for seg in order + ["L1-L4", "period"]:
        row: dict[str, object] = {"segment": seg}
        for s in names:
            t = times[s]
            v = sum(t.get(x, 0.0) for x in SUBLAYERS) if seg == "L1-L4" else t.get(seg)
            row[f"{s} (us)"] = v if v is not None else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


def train_reason(b: pd.DataFrame) -> list[str]:
    """What the training breakdown ``b`` says of CAIS against TP-NVLS, with its
    numbers, as verdict lines: the period's speedup beside the paper's and how long
    the sub-layers L1-L4 span; how long the rest of the period takes (the period less
    the sub-layers' spans), each against TP-NVLS's."""
    if b.empty:
        return []
    t = b.set_index("segment")
    c, tp = t["cais (us)"], t["tp-nvls (us)"]
    rest_c, rest_tp = float(c["period"] - c["L1-L4"]), float(tp["period"] - tp["L1-L4"])
    rest = (f"the rest of the period takes {rest_c:,.0f} us against TP-NVLS's {rest_tp:,.0f}" if rest_c >= 0 else
            f"CAIS's segments overlap, spanning {-rest_c:,.0f} us more than its period (TP-NVLS's rest of the "
            f"period: {rest_tp:,.0f} us)")
    return [f"Training: CAIS's period is {float(tp['period'] / c['period']):.2f}x TP-NVLS's (paper "
            f"{P.fig11_paper('tp-nvls', 'train'):.2f}x); its sub-layers L1-L4 span {float(c['L1-L4']):,.0f} us "
            f"against {float(tp['L1-L4']):,.0f} ({float(tp['L1-L4'] / c['L1-L4']):.2f}x).",
            f"Training: {rest} (summed over the models; weight gradients run beside the sub-layers count in them)."]


def fig11_verdict(g: pd.DataFrame, df: pd.DataFrame, grid: str, l2: pd.DataFrame | None = None) -> list[str]:
    """Fig. 11 in words, one claim a line: the grid; per mode how many baselines CAIS
    beats, by how much beside the paper, and whether the headline claim holds; the
    first reason from the runs; and in training where the time goes."""
    lines = [f"Grid: {grid}."]
    for mode in dict.fromkeys(g["mode"]):
        b = g[(g["mode"] == mode) & g["scheme"].isin(P.BASELINES)]
        k, n = count_faster(b["ours"])
        lines.append(f"CAIS beats every baseline in {mode} (paper's claim): {holds(k == n)}; it beats {k} of {n}, "
                     f"geomean {span(b['ours'])} (paper {span(b['paper'])}).")
    lines.append(f"First reason from the runs: {first_reason(df, l2)}.")
    if "train" in set(g["mode"]):
        lines += train_reason(train_breakdown(df, best_baseline(g, "train")))
    return lines


def fig11_points(ctx: Context) -> list[tuple[str, Point]]:
    """The Fig. 11 grid in each of the three worlds (:func:`worlds`)."""
    return [p for w in worlds(ctx) for p in w.points(ctx)]


#: the columns of :func:`world_answers` (and of fig11_worlds.csv)
WORLD_COLUMNS = ["world", "mode", "over TP-NVLS", "best baseline", "over the best", "over cais-sw",
                 "paper over TP-NVLS"]


def world_answers(ctx: Context, df: pd.DataFrame) -> pd.DataFrame:
    """Per world and mode: CAIS's geomean speedup over TP-NVLS and over the best
    baseline (the one CAIS beats by the least), from the world's own runs."""
    out = []
    for w in worlds(ctx):
        rows = world_rows(ctx, w, df)
        if rows.empty:
            continue
        g = geomean_table(fig11_table(rows))
        for mode in dict.fromkeys(g["mode"]):
            b = g[(g["mode"] == mode) & g["scheme"].isin(P.BASELINES)].dropna(subset=["ours"])
            if b.empty:
                continue
            tp = b[b["scheme"] == "tp-nvls"]["ours"]
            best = b.loc[b["ours"].idxmin()]
            share = switch_share(rows)
            sw = share[share["mode"] == mode]["over cais-sw"]
            out.append({"world": w.label, "mode": mode, "over TP-NVLS": float(tp.iloc[0]) if len(tp) else float("nan"),
                        "best baseline": str(best["scheme"]), "over the best": float(best["ours"]),
                        "over cais-sw": float(sw.iloc[0]) if len(sw) else float("nan"),
                        "paper over TP-NVLS": P.fig11_paper("tp-nvls", mode)})
    return pd.DataFrame(out, columns=WORLD_COLUMNS)


def answers_lines(a: pd.DataFrame) -> list[str]:
    """One answer per world and mode, a line each."""
    return [f"{r['world']}, {r['mode']}: CAIS {r['over TP-NVLS']:.2f}x TP-NVLS (paper {r['paper over TP-NVLS']:.2f}x), "
            f"{r['over the best']:.2f}x the best baseline ({r['best baseline']})." for _, r in a.iterrows()]


def fig11_analyse(ctx: Context, rows: pd.DataFrame, name: str = "fig11",
                  world: str = "") -> tuple[pd.DataFrame, Section]:
    """The Fig. 11 table of the context's world, its bar charts per mode (the paper's
    geomean as a diamond), the time per scheme and model, the geomeans beside the
    paper's, and CAIS against TP-NVLS and the best baseline in each world."""
    every = ok_rows(rows)
    df = world_rows(ctx, own_world(ctx), every) if "sets" in every else every
    t = fig11_table(df)
    g = geomean_table(t, why_measured(df))
    answers = world_answers(ctx, every) if "sets" in every else pd.DataFrame()
    l2 = world_rows(ctx, worlds(ctx)[1], every) if "sets" in every else None
    sec = Section(name, f"Fig. 11: end-to-end speedup of CAIS over every scheme{world}")
    sec.facts["comm_over_compute"] = comm_weight(df)
    for mode in dict.fromkeys(g["mode"]):
        b = g[(g["mode"] == mode) & g["scheme"].isin(P.BASELINES)]
        k, n = count_faster(b["ours"])
        sec.claim(f"CAIS beats every baseline in {mode}", k == n, f"{k} of {n} baselines")
    for _, a in answers.iterrows():
        sec.claim(f"CAIS beats TP-NVLS in {a['mode']}, {a['world']}", a["over TP-NVLS"] >= 1,
                  f"{a['over TP-NVLS']:.2f}x")
    for claim, ok, figure in share_claims(ctx, every):
        sec.claim(claim, ok, figure)
    sec.says(*fig11_verdict(g, df, grid_words(ctx, t), l2), *answers_lines(answers),
             *fig11_switch_lines(ctx, every))  # the switch's share per world (issue 57)
    sec.p(f"One layer period per (model, mode, scheme) on {ctx.system}, 8 GPUs x {P.SMS_HALF} SMs"
          + (" (quick grid: Mega-GPT-4B with one sequence of 1,024 tokens)" if ctx.quick else "")
          + f"; models: {', '.join(dict.fromkeys(t['model']))}; modes: {', '.join(dict.fromkeys(t['mode']))}"
          + ". speedup_of_cais = time(scheme) / time(CAIS); > 1: CAIS is faster. The paper's geomean is the black "
            "diamond.")
    schemes = [s for s in P.SCHEMES if s != "cais"]
    for mode in dict.fromkeys(t["mode"]):
        tm = t[t["mode"] == mode]
        series = {m: [float(tm[(tm["model"] == m) & (tm["scheme"] == s)]["speedup_of_cais"].iloc[0])
                      if len(tm[(tm["model"] == m) & (tm["scheme"] == s)]) else float("nan") for s in schemes]
                  for m in dict.fromkeys(tm["model"])}
        png = f"{name}_{mode}.png"
        plots.bars(ctx.out / png, schemes, series, "CAIS speedup, t(scheme) / t(CAIS) (x, log)",
                   f"Fig. 11 ({mode}), {ctx.system}: CAIS speedup over each scheme",
                   [P.fig11_paper(s, mode) for s in schemes], "paper, geomean (§V-A.1, Fig. 11)", ratio=True)
        sec.img(png)
    sec.p("Time of one layer period per scheme and model (us):")
    sec.table(t.pivot_table(index=["mode", "scheme"], columns="model", values="time_us", sort=False)
              .reset_index().rename_axis(None, axis=1).rename(columns=lambda c: c if c in ("mode", "scheme")
                                                              else f"{c} (us)"))
    sec.p("Geomean over the models of CAIS's speedup per scheme and mode, beside the paper's (§V-A.1; x):")
    sec.table(g, summary=True)
    if len(answers):
        answers.to_csv(ctx.out / f"{name}_worlds.csv", index=False)  # (claims.json beside it: its commit)
        sec.p("One answer per world: CAIS's geomean speedup over TP-NVLS and over the best baseline (the one it "
              "beats by the least). " + " ".join(f"({i}) {WORLD_TEXT[w.key]}." for i, w in
                                                 zip(("i", "ii", "iii"), worlds(ctx))))
        sec.table(answers)
    if "train" in set(t["mode"]):
        b = train_breakdown(df, best_baseline(g, "train"))
        if len(b):
            sec.p("The training period kernel by kernel: each segment's span (its first kernel's start to its last "
                  "kernel's end, over the GPUs), summed over the models, for CAIS, TP-NVLS and the best baseline "
                  "(us). A segment that runs beside others (a weight gradient CAIS overlaps, a re-gather beside "
                  "its dgrad) spans their time too, so the spans add up to more than the period:")
            sec.table(b)
    for f in failures(rows):
        sec.p(f"FAILED: {f}")
    return t, sec


EXPERIMENT = Experiment("fig11", "Fig. 11", fig11_points, fig11_analyse)
