"""Fig. 12 of the paper (§V-A.2): CAIS's speedup on each sub-layer (L1-L4: the GEMM-RS
+ LN + AG-GEMM chains) over every scheme, from the Fig. 11 runs, as a geomean over
models, modes and sub-layers beside the paper's."""

from __future__ import annotations

import pandas as pd

from cais.reproduce import paper as P
from cais.reproduce import plots
from cais.reproduce.experiments.common import (Context, Experiment, compare, fig11_points, geomean, grid_words,
                                               ok_rows, why_measured)
from cais.reproduce.report import Section
from cais.reproduce.verdict import count_faster, span


def fig12_analyse(ctx: Context, rows: pd.DataFrame) -> tuple[pd.DataFrame, Section]:
    """Per (model, mode, scheme, sub-layer) the time, bound and CAIS's speedup; the
    geomean per scheme beside the paper's, and its chart."""
    df = ok_rows(rows)
    out = []
    for (model, mode), g in df.groupby(["model", "mode"], sort=False):
        c = g[g["scheme"] == "cais"].iloc[0]
        for _, r in g.iterrows():
            for L in ("L1", "L2", "L3", "L4"):
                if r[f"{L}_time_us"] == r[f"{L}_time_us"]:
                    out.append({"model": model, "mode": mode, "scheme": r["scheme"], "sublayer": L,
                                "time_us": r[f"{L}_time_us"], "bound_us": r[f"{L}_bound_us"],
                                "speedup_of_cais": r[f"{L}_time_us"] / c[f"{L}_time_us"]})
    t = pd.DataFrame(out)
    sec = Section("fig12", "Fig. 12: sub-layer (L1-L4) speedup of CAIS")
    comp = []
    why_base, why_cais = why_measured(df)
    for s in P.SCHEMES:
        if s == "cais":
            continue
        ours = geomean(list(t[t["scheme"] == s]["speedup_of_cais"]))
        pp = P.FIG12_GEOMEAN.get(s, P.FIG12_OVER_BASE if s == "cais-base" else None)
        comp.append({"scheme": s, **compare(f"CAIS over {s}, sub-layers", ours, pp,
                                            why_cais if s in P.CAIS_VARIANTS else why_base)})
    c = pd.DataFrame(comp).drop(columns=["quantity"])
    subs = sorted(set(t["sublayer"]))
    schemes = [s for s in P.SCHEMES if s != "cais"]
    series = {L: [geomean(list(t[(t["scheme"] == s) & (t["sublayer"] == L)]["speedup_of_cais"])) for s in schemes]
              for L in subs}
    plots.bars(ctx.out / "fig12.png", schemes, series, "speedup of CAIS on the sub-layer (x, log)",
               f"Fig. 12, {ctx.system}: geomean over models of CAIS's sub-layer speedup",
               [P.FIG12_GEOMEAN.get(s) for s in schemes], "paper, geomean of L1-L4 (§V-A.2, Fig. 12)", ratio=True)
    b = c[c["scheme"].isin(P.BASELINES)]
    k, n = count_faster(b["ours"])
    every = sec.claim("CAIS beats every baseline on the sub-layers", k == n, f"{k} of {n} baselines")
    sec.says(f"Grid: {grid_words(ctx, t)}.",
             f"CAIS beats every baseline on the sub-layers (paper's claim): {every}; it beats {k} of {n}, geomean "
             f"{span(b['ours'])} (paper {span(b['paper'])}).")
    sec.p("Each sub-layer's span (GEMM-RS + LN + AG-GEMM chain) per scheme, from the Fig. 11 runs; geomean over "
          "models, modes and sub-layers, beside §V-A.2.")
    sec.img("fig12.png").table(c, summary=True)
    return t, sec


EXPERIMENT = Experiment("fig12", "Fig. 12", fig11_points, fig12_analyse)
