"""The switch's share of CAIS's gain (issue 57): from a Fig. 11 run's rows, CAIS's
geomean speedup over TP-NVLS, over ``cais-sw`` (the same dataflow and kernels with
plain ``ld``/``red`` on an NVLS switch, schemes/cais_sw.py), and the fraction of
CAIS's gain over TP-NVLS that the in-switch merging (with the coordination it needs)
buys, as a share of log-ratios:

    share = log(t(cais-sw) / t(cais)) / log(t(tp-nvls) / t(cais))   (geomeans over the models)

1 means the switch buys all of CAIS's gain, 0 none of it, below 0 that the software
alone is faster than CAIS; NaN where CAIS has no gain over TP-NVLS to share (a
speedup of at most 1x: the ratio of logs would then mean nothing)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pandas as pd


if TYPE_CHECKING:
    from cais.reproduce.experiments.common import Context

#: the columns :func:`switch_share` returns
COLUMNS = ["mode", "over TP-NVLS", "over cais-sw", "switch share"]


def _geomean(ratios: list[float]) -> float:
    """The geometric mean of positive ratios (NaN for none)."""
    return math.exp(sum(math.log(x) for x in ratios) / len(ratios)) if ratios else float("nan")


def switch_share(df: pd.DataFrame) -> pd.DataFrame:
    """Per mode of ``df`` (rows of one world's Fig. 11 run: ``model``, ``mode``,
    ``scheme``, ``total_us``): CAIS's geomean speedup over TP-NVLS and over cais-sw
    across the models that ran all three, and the switch's share of the gain (module
    docstring). A mode without all three schemes is left out."""
    out = []
    for mode in dict.fromkeys(df["mode"]) if len(df) else []:
        t = df[df["mode"] == mode].pivot_table(index="model", columns="scheme", values="total_us", aggfunc="first")
        if not {"cais", "cais-sw", "tp-nvls"} <= set(t.columns):
            continue
        t = t.dropna(subset=["cais", "cais-sw", "tp-nvls"])
        if t.empty:
            continue
        over_tp = _geomean(list(t["tp-nvls"] / t["cais"]))
        over_sw = _geomean(list(t["cais-sw"] / t["cais"]))
        share = math.log(over_sw) / math.log(over_tp) if over_tp > 1 else float("nan")
        out.append({"mode": mode, "over TP-NVLS": over_tp, "over cais-sw": over_sw, "switch share": share})
    return pd.DataFrame(out, columns=COLUMNS)


def switch_share_sentence(worlds: list[tuple[str, pd.DataFrame]]) -> str:
    """One sentence naming the switch's share in each world, from ``(label, the
    world's rows)`` pairs; empty where no world ran cais, cais-sw and TP-NVLS."""
    parts = []
    for label, rows in worlds:
        s = switch_share(rows)
        if s.empty:
            continue
        modes = [f"{r['over cais-sw']:.2f}x of CAIS's {r['over TP-NVLS']:.2f}x over TP-NVLS in {r['mode']}"
                 + (f" ({100 * r['switch share']:.0f} % of its gain)" if r["switch share"] == r["switch share"]
                    else "") for _, r in s.iterrows()]
        parts.append(f"{' and '.join(modes)} on {label}")
    if not parts:
        return ""
    return "In-switch merging (CAIS against cais-sw, its software alone) buys " + "; ".join(parts) + "."


def fig11_switch_sentence(ctx: "Context", every: pd.DataFrame) -> str:
    """The sentence Fig. 11's verdict ends with (a leading space; empty where no world
    ran all three): :func:`switch_share_sentence` over the context's worlds, from the
    run's ok rows ``every`` (one world, the context's system, where they carry no
    ``sets``)."""
    from cais.reproduce.experiments.common import world_rows, worlds

    pairs = ([(w.label, world_rows(ctx, w, every)) for w in worlds(ctx)] if "sets" in every
             else [(ctx.system, every)])
    text = switch_share_sentence(pairs)
    return " " + text if text else ""
