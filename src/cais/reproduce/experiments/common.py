"""What several experiments share: the :class:`Context` they run in, the
:class:`Experiment` record, the point functions they name, the comparison row, the
rows that ran and those that failed, and the grids (the Table I models, the modes,
the single model of the one-model figures, the Fig. 11 grid, the merge-table sizes).

An experiment never speaks of command-line flags: it gets a :class:`Context`."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from cais.experiments.baselines import geomean
from cais.reproduce import paper as P
from cais.reproduce.report import Section
from cais.sweep.grid import Point

__all__ = ["LAYER", "TIMELINE", "COLLECTIVE", "WHY_CAIS", "WHY_BOTH", "UNBOUNDED", "Context", "Experiment",
           "geomean", "compare", "ok_rows", "failures", "grid_models", "grid_modes", "one_model",
           "scalable_system", "grid_words", "fig11_points", "no_points", "entries_of", "World", "worlds",
           "world_rows", "own_world", "PAPER_L2", "why_measured", "comm_weight", "GRID_SCHEMES", "QUICK_GRID", "WORLD_TEXT"]

#: the point functions (cais.reproduce.points) an experiment's points name
LAYER = "cais.reproduce.points:layer_point"
TIMELINE = "cais.reproduce.points:timeline_point"
COLLECTIVE = "cais.reproduce.points:collective_point"

#: why our numbers differ from the paper's, from this model's own runs (docs/validation.md §6, §13)
WHY_CAIS = ("without TB coordination and merging-aware TB order the GPUs drift hundreds of us apart and the "
            f"{P.TABLE_KB:.0f} KB table starves; with them CAIS is within 0.4 % of an unbounded table "
            "(docs/validation.md §13)")
WHY_BOTH = ("communication weighs less here than in the paper, so the baselines' overlap already hides most of it "
            "and there is less for CAIS to win (docs/validation.md §6, §13)")

def comm_weight(df: pd.DataFrame) -> float:
    """TP-NVLS's collective time over its other kernels' time in the runs ``df``
    (layer_point rows; geomean over its runs), NaN where they have none: how much
    communication weighs against computation, beside the paper's Fig. 2."""
    tp = df[df["scheme"] == "tp-nvls"] if "scheme" in df else df.iloc[0:0]
    if not len(tp) or not {"comm_kernel_us", "compute_kernel_us"} <= set(tp.columns):
        return float("nan")
    return geomean(list(tp["comm_kernel_us"] / tp["compute_kernel_us"]))


def why_measured(df: pd.DataFrame) -> tuple[str, str]:
    """(why a baseline's speedup differs, why a CAIS variant's does) from the runs
    ``df`` (layer_point rows): TP-NVLS's communication against its computation beside
    the paper's Fig. 2, and the arrival skew without coordination against with it; the
    fixed sentences where the runs lack them."""
    both = WHY_BOTH
    ratio = comm_weight(df)
    if ratio == ratio:
        paper = P.FIG2_COMM_OVER_COMPUTE_8GPU
        if ratio == ratio and ratio < paper:
            both = (f"TP-NVLS's collectives take {ratio:.2f}x its other kernels' time in these runs (this grid's "
                    f"models and SMs), against {paper}x in the paper's Fig. 2, so the baselines' overlap already "
                    "hides more of it and there is less for CAIS to win (docs/validation.md §6, §18)")
        elif ratio == ratio:
            both = (f"TP-NVLS's collectives take {ratio:.2f}x its other kernels' time in these runs (this grid's "
                    f"models and SMs), at least the paper's {paper}x (Fig. 2): communication does not weigh less "
                    "here, so the difference lies in how each scheme moves and overlaps it (docs/validation.md §6, "
                    "§18)")
    cais = WHY_CAIS
    skew = df.groupby("scheme")["skew_mean_us"].mean() if "skew_mean_us" in df else pd.Series(dtype=float)
    if {"cais", "cais-wo-coord"} <= set(skew.index) and skew["cais-wo-coord"] == skew["cais-wo-coord"]:
        cais = (f"without coordination the GPUs walk the owners in CUTLASS's raster and each owner runs ahead "
                f"(mean arrival skew {skew['cais-wo-coord']:.0f} us, {skew['cais']:.1f} us with coordination; the "
                f"paper: 35 and 3 us), so the {P.TABLE_KB:.0f} KB table starves (docs/validation.md §18)")
    return both, cais


#: merge-table entries of a table that never fills here (2.5 MB per port)
UNBOUNDED = 20000


#: what most experiments' quick grid changes (:func:`grid_models`, :func:`grid_modes`)
QUICK_GRID = "one small model (Mega-GPT-4B, 1 sequence of 1,024 tokens) for the Table I models, prefill only"


@dataclass(frozen=True)
class Context:
    """Where and how experiments run: the system preset or file, dotted-key
    overrides, the quick grid or the full one, and the output folder; ``models`` and
    ``modes``, when given, replace the Fig. 11 grid's models and modes (same batch as
    the grid would use)."""

    system: str = "dgx-h100"
    sets: dict[str, str] = field(default_factory=dict)
    quick: bool = False
    out: Path = Path("report")
    models: tuple[str, ...] = ()
    modes: tuple[str, ...] = ()

    def base(self, system: str | None = None, **extra_sets: Any) -> Point:
        """The keys every point carries: system and overrides (as sorted JSON)."""
        sets = {**self.sets, **{k: str(v) for k, v in extra_sets.items()}}
        return {"system": system or self.system, "sets": json.dumps(sets, sort_keys=True)}


@dataclass(frozen=True)
class Experiment:
    """One figure or table: ``points(ctx)`` -> list of (fn, point) to run;
    ``analyse(ctx, rows)`` -> (CSV table, report section), writing its PNGs in ``ctx.out``."""

    name: str
    title: str
    points: Callable[[Context], list[tuple[str, Point]]]
    analyse: Callable[[Context, pd.DataFrame], tuple[pd.DataFrame, Section]]
    #: whether it compares with the paper's numbers (a quick grid then warns that it stands in for the paper's)
    paper: bool = True
    #: what its quick grid changes from the full one, in words (a verdict whose quick reading the
    #: full grid contradicts names it as the reason)
    quick_grid: str = QUICK_GRID


def compare(what: str, ours: float, paper: float | None, why: str, unit: str = "") -> dict[str, Any]:
    """A row of ours beside the paper's, the ratio, and the reason when they differ by
    more than 10 %."""
    ratio = ours / paper if paper else float("nan")
    off = paper is not None and ratio == ratio and abs(ratio - 1) > 0.10
    return {"quantity": what, "ours": ours, "paper": paper if paper is not None else float("nan"),
            "ours / paper": ratio, "why they differ (> 10 %)": why if off else ""}


def ok_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows that ran, with the point keys without their ``point.`` prefix."""
    df = rows[rows["status"] == "ok"].copy() if "status" in rows else rows.copy()
    cols = set(df.columns)
    return df.rename(columns={c: c[len("point."):] for c in df.columns
                              if c.startswith("point.") and c[len("point."):] not in cols})


def failures(rows: pd.DataFrame) -> list[str]:
    """One line per failed point."""
    if "status" not in rows:
        return []
    bad = rows[rows["status"] != "ok"]
    return [f"{r.get('point.scheme', r.get('point.op', '?'))} {r.get('point.model', '')} "
            f"{r.get('point.mode', '')}: {str(r['error']).splitlines()[0]}" for _, r in bad.iterrows()]


# ---- grids ---------------------------------------------------------------------------
def grid_models(ctx: Context) -> list[dict[str, Any]]:
    """The Table I models; quick: Mega-GPT-4B with 1 sequence (1,024 tokens)."""
    if ctx.models:
        return [{"model": m, **({"batch": 1} if ctx.quick else {})} for m in ctx.models]
    if ctx.quick:
        return [{"model": "paper-mega-gpt-4b", "batch": 1}]
    return [{"model": m} for m in P.TABLE1]


def grid_modes(ctx: Context) -> tuple[str, ...]:
    """The modes of the Fig. 11 grid: the paper's (prefill, train); quick: prefill."""
    if ctx.modes:
        return ctx.modes
    return ("prefill",) if ctx.quick else P.MODES


def one_model(ctx: Context, full: str = "paper-llama-7b") -> dict[str, Any]:
    """The one model of the single-model figures (LLaMA-7B; quick: Mega-GPT-4B x 1)."""
    return {"model": "paper-mega-gpt-4b", "batch": 1} if ctx.quick else {"model": full}


def scalable_system(ctx: Context) -> str:
    """The context's system if it can be resized to any GPU count, else h100-nvswitch."""
    from cais.config import load_system

    return ctx.system if load_system(ctx.system).scalable else "h100-nvswitch"


def grid_words(ctx: Context, t: pd.DataFrame) -> str:
    """The grid in words: quick or full, the system and the models."""
    models = ", ".join(dict.fromkeys(t["model"])) if "model" in t and len(t) else "no model"
    return f"the {'quick' if ctx.quick else 'full'} grid on {ctx.system} ({models})"


#: the schemes of the Fig. 11 grid: the paper's 13, and cais-sw, software-only CAIS, whose
#: gap to CAIS is the switch's share of CAIS's gain (issue 57, cais.reproduce.switch_share)
GRID_SCHEMES = (*P.SCHEMES, "cais-sw")


def fig11_points(ctx: Context, system: str | None = None, **extra_sets: Any) -> list[tuple[str, Point]]:
    """The Fig. 11 grid, which Figs. 11, 12, 15, bound and worlds analyse: every model x
    mode x the 14 schemes of :data:`GRID_SCHEMES` at the half set-up's 66 SMs
    (``extra_sets``: a world's overrides on top of the context's)."""
    return [(LAYER, {**ctx.base(system, **extra_sets), **m, "scheme": s, "mode": mode, "sms": P.SMS_HALF})
            for m in grid_models(ctx) for mode in grid_modes(ctx) for s in GRID_SCHEMES]


@dataclass(frozen=True)
class World:
    """One of the three worlds every Fig. 11 verdict names (docs/reproduce.md): the
    system a run uses and the overrides that make the world."""

    key: str
    label: str
    system: str
    sets: tuple[tuple[str, str], ...] = ()

    def points(self, ctx: Context) -> list[tuple[str, Point]]:
        return fig11_points(ctx, self.system, **dict(self.sets))

    def base(self, ctx: Context) -> Point:
        return ctx.base(self.system, **dict(self.sets))


#: what the paper's traffic model needs, and the only change from world (i) to (ii):
#: the requesting GPU's L2 keeps peer reads (each remote row block reaches a GPU once)
PAPER_L2 = (("gpu.l2_keeps_peer_reads", "true"),)


#: what each world is, in the words every page that names it uses (README, docs/reproduce.md,
#: the Fig. 11 report: scripts/worlds_doc.py prints them, tests/test_samples.py holds the pages to it)
WORLD_TEXT = {
    "as-sold": ("the system as it is; on `dgx-h100`, the H100 as sold: peer reads not kept in the reader's L2 "
                "(docs/h100-evidence.md); remote rows copied as an implementer would (docs/remote-access.md, \"The "
                "as-sold rule\"): whole peer shards on the copy engines where the rows are ready at launch, as real "
                "distributed GEMMs do, and on 8 SMs as the producer signals them inside CAIS's fused pipeline; T3's "
                "copy engine pays a copy engine's rate and start; each layer collective in the algorithm its scheme "
                "names (TP-NVLS forced to NVLS), in NCCL's protocol by size; every scheme's thread blocks launched "
                "when their data are ready"),
    "paper-l2": ("the same with the paper's L2 assumption (`gpu.l2_keeps_peer_reads=true`, the only change): each "
                 "remote row block reaches a GPU once, for free, as the paper's traffic model needs"),
    "paper-world": ("`paper-world`, fitted to the paper's Fig. 2 and its baselines' time ratios only (docs/reproduce.md, "
                    "\"The paper's world\"), whose GEMMs run faster than an H100 can (paper-llama-7b's FC1 at 2.4x "
                    "the dense BF16 peak of the SMs it runs on), so CAIS's numbers there are a prediction"),
}


def worlds(ctx: Context) -> list[World]:
    """(i) the context's system as it is (on dgx-h100: the H100 as sold, with the
    evidence's L2 behaviour, CAIS's staged remote reads and NCCL's own choice per
    collective), (ii) the same with the paper's L2 assumption, (iii) paper-world."""
    system = "dgx-h100" if ctx.system == "paper-world" else ctx.system
    return [World("as-sold", f"{system} (as sold)" if system.startswith("dgx-h") else system, system),
            World("paper-l2", f"{system} with the paper's L2 assumption", system, PAPER_L2),
            World("paper-world", "paper-world", "paper-world")]


def own_world(ctx: Context) -> World:
    """The world of the context itself (its system with no world overrides): the one
    whose runs Fig. 11's table and charts show."""
    return next(w for w in worlds(ctx) if w.system == ctx.system and not w.sets)


def world_rows(ctx: Context, world: World, df: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``df`` (ok_rows of layer points) that ran in ``world``."""
    base = world.base(ctx)
    return df[(df["system"] == base["system"]) & (df["sets"] == base["sets"])]


def no_points(ctx: Context) -> list[tuple[str, Point]]:
    """No runs: for an experiment that is analysis only."""
    return []


def entries_of(df: pd.DataFrame) -> pd.Series:
    """Each run's merge-table entries per port: its override, else the paper's 320 (the
    presets' default)."""
    return df["sets"].map(lambda s: int(json.loads(s).get("switch.merge.entries", P.TABLE_ENTRIES)))
