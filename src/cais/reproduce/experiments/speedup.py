"""The analysis the full, nvl72 and decode experiments share: per value of one key
(model or GPU count) each scheme's time and CAIS's speedup over it, a bar chart, and
for how many values CAIS beats every other scheme."""

from __future__ import annotations

import pandas as pd

from cais.reproduce import plots
from cais.reproduce.experiments.common import Context, failures, ok_rows
from cais.reproduce.report import Section
from cais.reproduce.verdict import span


def speedup_section(ctx: Context, rows: pd.DataFrame, name: str, title: str, text: str,
                    key: str) -> tuple[pd.DataFrame, Section]:
    """The table (``key``, scheme, time_us, speedup_of_cais) and section ``name``,
    with ``text`` describing the runs and ``ctx.out/name.png`` its chart."""
    df = ok_rows(rows)
    if key == "gpus":
        df = df.assign(gpus=df["gpus"].astype(int))
    out = []
    for k, g in df.groupby(key, sort=False):
        by = g.set_index("scheme")["total_us"]
        for s in by.index:
            out.append({key: k, "scheme": s, "time_us": by[s],
                        "speedup_of_cais": by[s] / by["cais"] if "cais" in by.index else float("nan")})
    t = pd.DataFrame(out)
    groups = [str(k) for k in dict.fromkeys(t[key])]
    schemes = [s for s in dict.fromkeys(t["scheme"]) if s != "cais"]
    series = {s: [float(t[(t[key].astype(str) == k) & (t["scheme"] == s)]["speedup_of_cais"].iloc[0])
                  if len(t[(t[key].astype(str) == k) & (t["scheme"] == s)]) else float("nan") for k in groups]
              for s in schemes}
    plots.bars(ctx.out / f"{name}.png", groups, series, "CAIS speedup, t(scheme) / t(CAIS) (x, log)",
               title, ratio=True)
    sec = Section(name, title).p(text).img(f"{name}.png").table(t, summary=True)
    others = t[t["scheme"] != "cais"]
    k = sum(bool((g["speedup_of_cais"] >= 1).all()) for _, g in others.groupby(key))
    noun = {"model": "models", "gpus": "GPU counts"}.get(key, f"{key} values")
    every = sec.claim(f"CAIS is faster than every other scheme for every one of the {noun}", k == len(groups),
              f"{k} of {len(groups)} {noun}, speedups {span(list(others['speedup_of_cais']))}")
    sec.says(f"CAIS is faster than every other scheme for every one of the {noun}: {every}; "
             f"{k} of {len(groups)}, speedups {span(list(others['speedup_of_cais']))} (no paper figure).")
    for f in failures(rows):
        sec.p(f"FAILED: {f}")
    return t, sec
