"""Matplotlib (Agg) figures in the style of the paper's: grouped bars with the paper's
values marked, and lines over a swept axis. Bars of a ratio grow up or down from 1
on a log axis, so a 0.7x slowdown reads as a bar below the line as long as a 1.43x
speedup is above it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

PAPER_STYLE = dict(marker="D", color="black", linestyle="none", markersize=6, zorder=5)


#: tick values of a ratio axis, dense near 1 where most speedups lie
RATIO_TICKS = (0.1, 0.2, 0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.7, 2.0, 2.5, 3.0, 4.0, 5.0,
               7.0, 10.0, 15.0, 20.0, 30.0, 50.0, 100.0)


def ratio_ticks(lo: float, hi: float, most: int = 9) -> list[float]:
    """Ticks of :data:`RATIO_TICKS` inside [lo, hi], thinned to at most ``most``,
    always with 1."""
    inside = [t for t in RATIO_TICKS if lo <= t <= hi]
    step = -(-len(inside) // most)
    i1 = inside.index(1.0) if 1.0 in inside else 0
    return sorted({t for i, t in enumerate(inside) if (i - i1) % step == 0} | {1.0})


def bars(path: Path, groups: list[str], series: dict[str, list[float]], ylabel: str, title: str,
         paper: list[float | None] | None = None, paper_label: str = "paper", log: bool = False,
         hline: float | None = None, ratio: bool = False) -> Path:
    """Grouped bars: one group per entry of ``groups``, one bar per series; the paper's
    value of each group (``paper``) as a black diamond; ``hline`` a reference line.
    ``ratio``: the values are ratios (x): bars from 1 on a log axis, a line at 1.
    ``log`` alone (a quantity spanning decades): dots on a log axis, not bars."""
    fig, ax = plt.subplots(figsize=(max(6.0, 0.75 * len(groups) * max(1, len(series)) ** 0.5 + 2), 4.2))
    x = np.arange(len(groups))
    w = 0.8 / max(1, len(series))
    if ratio:
        log, hline = True, 1.0
    for i, (name, vals) in enumerate(series.items()):
        if ratio:
            ax.bar(x - 0.4 + w * (i + 0.5), [v - 1 for v in vals], w, bottom=1.0, label=name)
        elif log:  # a bar on a log axis would start at an arbitrary floor: a dot says only the value
            ax.plot(x - 0.4 + w * (i + 0.5), vals, marker="o", markersize=9, linestyle="none", label=name)
        else:
            ax.bar(x - 0.4 + w * (i + 0.5), vals, w, label=name)
    if paper is not None:
        px = [xi for xi, v in zip(x, paper) if v is not None]
        pv = [v for v in paper if v is not None]
        if pv:
            ax.plot(px, pv, label=paper_label, **PAPER_STYLE)
    if hline is not None:
        ax.axhline(hline, color="black" if ratio else "grey", linestyle="-" if ratio else "--", linewidth=1)
    ax.set_xticks(x, groups, rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if log:
        ax.set_yscale("log")
        fmt = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
        ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(fmt)
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        if ratio:  # room around 1 both ways, so the smallest bar is visible, and labelled ticks however narrow
            vals = [v for vs in series.values() for v in vs if v == v and v > 0]
            vals += [v for v in (paper or []) if v is not None]
            lo = min(min(vals + [1.0]), 1 / 1.1) / 1.15
            hi = max(max(vals + [1.0]), 1.1) * 1.15
            ax.set_ylim(lo, hi)
            ax.yaxis.set_major_locator(matplotlib.ticker.FixedLocator(ratio_ticks(lo, hi)))
            ax.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def lines(path: Path, series: dict[str, tuple[list[float], list[float]]], xlabel: str, ylabel: str, title: str,
          paper: dict[str, tuple[list[float], list[float]]] | None = None, logx: bool = False,
          hline: float | None = None, vlines: dict[str, float] | None = None, hline_label: str | None = None,
          styles: dict[str, dict[str, Any]] | None = None) -> Path:
    """Lines over a swept axis; the paper's points as black markers; ``vlines`` label ->
    x of marked points (e.g. the calibrated and the paper's stated point); ``styles``
    name -> matplotlib line options of that series (e.g. dashed, where it may lie on
    another)."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, (xs, ys) in series.items():
        ax.plot(xs, ys, **{"marker": "o", "markersize": 3, **(styles or {}).get(name, {})}, label=name)
    for i, (name, (xs, ys)) in enumerate((paper or {}).items()):
        ax.plot(xs, ys, label=name, **{**PAPER_STYLE, "marker": "DsX^"[i % 4]})
    if hline is not None:
        ax.axhline(hline, color="grey", linestyle="--", linewidth=1, label=hline_label)
    for i, (name, xv) in enumerate((vlines or {}).items()):
        ax.axvline(xv, color=["tab:red", "tab:purple", "tab:green"][i % 3], linestyle=":", label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if logx:
        ax.set_xscale("log")
        fmt = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
        ax.xaxis.set_major_formatter(fmt)
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
