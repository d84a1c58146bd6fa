"""Run reproduction experiments end to end: their points through the sweep runner
(one resumable Parquet table per point function under ``out/runs/``), then each
experiment's CSV, figures and report section, then ``report.md`` and ``report.html``."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from cais.errors import UserError
from cais.hw.config import apply_overrides, load_system
from cais.provenance import Provenance, collect
from cais.reproduce.experiments import EXPERIMENTS, PAPER_SET, Context
from cais.reproduce.report import Front, Section, write_report
from cais.reproduce.verdict import quick_warning, why_links
from cais.sweep.grid import point_id
from cais.sweep.runner import run_sweep

ALL = tuple(EXPERIMENTS)


class ReproduceError(UserError):
    """An unknown experiment name."""


@dataclass
class Outcome:
    """What a reproduction produced: per experiment its table, section and seconds."""

    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    sections: list[Section] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    report_md: Path | None = None
    report_html: Path | None = None


def expand(names: list[str]) -> list[str]:
    """Experiment names with ``all`` (every experiment) and ``paper`` (the paper's
    figures and tables) expanded; ReproduceError for an unknown one."""
    out: list[str] = []
    for n in names:
        if n == "all":
            out += list(ALL)
        elif n == "paper":
            out += list(PAPER_SET)
        elif n in EXPERIMENTS:
            out.append(n)
        else:
            raise ReproduceError(f"experiment: unknown '{n}'; valid: {', '.join(ALL)}, paper, all")
    return list(dict.fromkeys(out))


def run_points(ctx: Context, points: list[tuple[str, dict]], workers: int | None, desc: str,
               cached: bool = False) -> pd.DataFrame:
    """Rows of ``points`` ((fn, point) pairs), run or read back from ``ctx.out/runs``;
    ``cached``: only those already there (the others are left out, not run)."""
    frames = []
    for fn in dict.fromkeys(f for f, _ in points):
        pts = [p for f, p in points if f == fn]
        out = ctx.out / "runs" / f"{fn.rsplit(':', 1)[-1]}.parquet"
        out.parent.mkdir(parents=True, exist_ok=True)
        if cached:
            have = set(pd.read_parquet(out, columns=["point_id"])["point_id"]) if out.exists() else set()
            pts = [p for p in pts if point_id(p) in have]
            if not pts:
                continue
        table = run_sweep(pts, out, fn=fn, workers=workers, progress=True, desc=desc)
        # the table holds every experiment's runs of this function, in the order they
        # finished: keep this one's, in the order of its points (the same on every run)
        order = {pid: i for i, pid in enumerate(point_id(p) for p in pts)}
        mine = table[table["point_id"].isin(order)]
        frames.append(mine.iloc[mine["point_id"].map(order).argsort(kind="stable")])
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def reproduce(names: list[str], ctx: Context, workers: int | None = None,
              log: Callable[[str], None] = print, cached: bool = False,
              on_section: Callable[[Section], None] | None = None,
              provenance: Provenance | None = None) -> Outcome:
    """Run the experiments ``names`` in ``ctx`` and write their CSVs (each row with
    ``provenance``'s columns), PNGs and the report (verdict and provenance first);
    ``cached``: simulate nothing, analyse the runs already in ``ctx.out/runs``;
    ``on_section``: called with each experiment's section as it is done;
    ``provenance``: default, this library call."""
    names = expand(names)
    if provenance is None:
        cfg = apply_overrides(load_system(ctx.system), dict(ctx.sets))
        provenance = collect(f"cais.reproduce.run.reproduce({names!r})", ctx.system, cfg.model_dump(), ctx.sets)
    ctx.out.mkdir(parents=True, exist_ok=True)
    res = Outcome()
    t_all = time.perf_counter()
    for name in names:
        exp = EXPERIMENTS[name]
        t0 = time.perf_counter()
        points = exp.points(ctx)
        rows = run_points(ctx, points, workers, name, cached)
        if points and (rows.empty or not (rows.get("status") == "ok").any()):
            table, section = pd.DataFrame(), Section(name, exp.title).p(
                "No runs of this experiment" + (" in the cache." if cached else " succeeded."))
        else:
            try:
                table, section = exp.analyse(ctx, rows)
            except Exception as exc:  # noqa: BLE001 - partial runs: the report says so, the rest goes on
                table, section = pd.DataFrame(), Section(name, exp.title).p(
                    f"ANALYSIS FAILED on these runs ({len(rows)} rows): {type(exc).__name__}: {exc}")
        table.assign(**provenance.columns()).to_csv(ctx.out / f"{name}.csv", index=False)
        res.tables[name], res.seconds[name] = table, time.perf_counter() - t0
        res.sections.append(section)
        log(f"[reproduce] {name}: {res.seconds[name]:.0f} s")
        if on_section is not None:
            on_section(section)
    facts = [f"System preset: {ctx.system}" + (f", with --set {' '.join(f'{k}={v}' for k, v in ctx.sets.items())}"
                                                if ctx.sets else "") + (". Quick grid (reduced)." if ctx.quick
                                                                         else ". Full grid."),
             "Every comparison puts our number beside the paper's (arXiv 2605.05628; each number with its section "
             "and figure in src/cais/reproduce/paper.py) with the ratio, and says why where they differ by more "
             "than 10 %. No simulator constant was tuned to a paper figure.",
             ("Analysed from the runs already in runs/ (--cached); each run's simulation time is its wall_s "
              "there." if cached else
              "Run time per experiment (s): " + ", ".join(f"{k} {v:.0f}" for k, v in res.seconds.items())
              + f"; total {time.perf_counter() - t_all:.0f}.")]
    verdict = [f"{s.title}: {s.verdict}" for s in res.sections if s.verdict] or ["No experiment produced a verdict."]
    models = [str(m) for t in res.tables.values() if "model" in t for m in t["model"].unique()]
    front = Front(verdict, quick_warning(ctx.quick, list(dict.fromkeys(models))), facts, provenance.lines(),
                  why_links(ctx.out))
    res.report_md, res.report_html = write_report(ctx.out, res.sections, front)
    return res
