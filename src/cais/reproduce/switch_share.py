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


def share_words(over_sw: float, over_tp: float, share: float) -> str:
    """What in-switch merging buys, in plain words: CAIS against its software alone
    (``over_sw``: t(cais-sw) / t(cais)) and the part of CAIS's ``over_tp`` gain over
    TP-NVLS that is (``share``: :func:`switch_share`'s log share)."""
    if abs(over_sw - 1) < 0.005:
        return (f"in-switch merging changes CAIS's time by under 0.5 % (cais-sw, its software alone, gives all of "
                f"its {over_tp:.2f}x over TP-NVLS)")
    if over_sw < 1:
        return (f"in-switch merging makes CAIS {1 / over_sw:.2f}x slower than its software alone (cais-sw), which "
                f"alone is faster than CAIS's {over_tp:.2f}x over TP-NVLS")
    if share == share and share > 1:
        return (f"in-switch merging makes CAIS {over_sw:.2f}x faster than its software alone (cais-sw), more than "
                f"its {over_tp:.2f}x over TP-NVLS: the software alone is {over_tp / over_sw:.2f}x TP-NVLS")
    part = (f": {100 * share:.0f} % of its {over_tp:.2f}x over TP-NVLS (log scale)" if share == share else
            f" (CAIS is {over_tp:.2f}x TP-NVLS: no gain to share)")
    return f"in-switch merging makes CAIS {over_sw:.2f}x faster than its software alone (cais-sw){part}"


def switch_share_lines(worlds: list[tuple[str, pd.DataFrame]]) -> list[str]:
    """One line per world and mode naming the switch's share, from ``(label, the
    world's rows)`` pairs; none where no world ran cais, cais-sw and TP-NVLS."""
    lines = []
    for label, rows in worlds:
        s = switch_share(rows)
        lines += [f"{label}, {r['mode']}: {share_words(r['over cais-sw'], r['over TP-NVLS'], r['switch share'])}."
                  for _, r in s.iterrows()]
    return lines


def world_pairs(ctx: "Context", every: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(world label, its rows) over the context's worlds, from a Fig. 11 run's ok rows
    ``every`` (one world, the context's system, where they carry no ``sets``)."""
    from cais.reproduce.experiments.common import world_rows, worlds

    return ([(w.label, world_rows(ctx, w, every)) for w in worlds(ctx)] if "sets" in every
            else [(ctx.system, every)])


def fig11_switch_lines(ctx: "Context", every: pd.DataFrame) -> list[str]:
    """The lines Fig. 11's verdict ends with (none where no world ran all three):
    :func:`switch_share_lines` over the context's worlds (:func:`world_pairs`)."""
    return switch_share_lines(world_pairs(ctx, every))


def share_claims(ctx: "Context", every: pd.DataFrame) -> list[tuple[str, bool, str]]:
    """(name, holds, figure) per world and mode: whether in-switch merging buys most
    (over half, on the log scale) of CAIS's gain over TP-NVLS, the premise that CAIS's
    gain is the switch's; a claim a quick run is held to the full grid on."""
    out = []
    for label, rows in world_pairs(ctx, every):
        for _, r in switch_share(rows).iterrows():
            share = r["switch share"]
            out.append((f"in-switch merging buys most of CAIS's gain in {r['mode']}, {label}",
                        bool(share == share and share > 0.5),
                        f"{100 * share:.0f} % of {r['over TP-NVLS']:.2f}x" if share == share else
                        f"no gain ({r['over TP-NVLS']:.2f}x)"))
    return out
