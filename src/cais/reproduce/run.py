"""Run reproduction experiments end to end: their points through the sweep runner
(one resumable Parquet table per point function under ``out/runs/``), then each
experiment's CSV, figures and report section, then ``report.md`` and ``report.html``."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from cais.errors import UserError
from cais.config import apply_overrides, load_system
from cais.provenance import Provenance, collect
from cais.reproduce import paper as P
from cais.reproduce.claims import lead_with_full, shipped, write_claims
from cais.reproduce.experiments import EXPERIMENTS, PAPER_SET, Context
from cais.reproduce.points import same_run
from cais.reproduce.report import Front, Section, write_report
from cais.reproduce.verdict import quick_warning, why_links
from cais.sweep.grid import point_id
from cais.sweep.runner import run_sweeps
from cais.sweep.store import read_table

ALL = tuple(EXPERIMENTS)


class ReproduceError(UserError):
    """An unknown experiment name."""


@dataclass
class Outcome:
    """What a reproduction produced: per experiment its table, section and seconds (its
    runs' wall times added up, and its analysis), and the whole reproduction's wall
    time; ``points_run``: the points it simulated, ``points_shared``: those given the
    run of another point that is theirs event for event (:func:`cais.reproduce.points.same_run`),
    ``points_reused``: those whose row was already in ``runs/`` (a resumed or
    ``--cached`` reproduction reuses them)."""

    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    sections: list[Section] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    report_md: Path | None = None
    report_html: Path | None = None
    wall_s: float = 0.0
    points_run: int = 0
    points_shared: int = 0
    points_reused: int = 0


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


def runs_table(ctx: Context, fn: str) -> Path:
    """Where the runs of the point function ``fn`` (``module:function``) are kept."""
    return ctx.out / "runs" / f"{fn.rsplit(':', 1)[-1]}.parquet"


def rows_of(tables: Mapping[str, pd.DataFrame], points: list[tuple[str, dict]]) -> pd.DataFrame:
    """The rows of ``points`` ((fn, point) pairs) in ``tables`` (each function's runs),
    in the order of the points (the same on every run, whatever order they finished in);
    points with no row are left out."""
    frames = []
    for fn in dict.fromkeys(f for f, _ in points):
        table = tables.get(fn)
        if table is None or table.empty:
            continue
        order = {pid: i for i, pid in enumerate(point_id(p) for f, p in points if f == fn)}
        mine = table[table["point_id"].isin(order)]
        frames.append(mine.iloc[mine["point_id"].map(order).argsort(kind="stable")])
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def runs_of_other_code(tables: Mapping[str, pd.DataFrame], plans: list[tuple[str, list[tuple[str, dict]]]],
                       commit: str) -> str | None:
    """A sentence when some of the runs the report uses were made by another commit
    than ``commit`` (a resumed ``runs/`` keeps a point's row whatever code made it;
    rows of an unknown or uncommitted tree compare as they are); None when all were
    made by this one."""
    rows = rows_of(tables, [job for _, points in plans for job in points])
    if rows.empty or "provenance.commit" not in rows:
        return None
    other = rows[rows["provenance.commit"] != commit]
    if other.empty:
        return None
    made = ", ".join(sorted(str(c)[:12] for c in other["provenance.commit"].unique()))
    return (f"{len(other)} of {len(rows)} runs in runs/ were made by other code (commit {made}, this is "
            f"{commit[:12]}); their rows are reused as they are: delete runs/ to run them again.")


def reproduce(names: list[str], ctx: Context, workers: int | None = None,
              log: Callable[[str], None] = print, cached: bool = False,
              on_section: Callable[[Section], None] | None = None,
              provenance: Provenance | None = None, progress: bool = True) -> Outcome:
    """Run the experiments ``names`` in ``ctx`` and write their CSVs (each row with
    ``provenance``'s columns), PNGs and the report (verdict and provenance first);
    ``cached``: simulate nothing, analyse the runs already in ``ctx.out/runs``;
    ``on_section``: called with each experiment's section as it is done;
    ``provenance``: default, this library call; ``progress``: the runs' progress on stderr.

    Every experiment's points run in one pool of ``workers`` processes, in the order of
    the experiments, a point that two experiments share once; each experiment is
    analysed as soon as its own points are done (in the order of ``names``), while the
    later experiments' points run on."""
    names = expand(names)
    if provenance is None:
        cfg = apply_overrides(load_system(ctx.system), dict(ctx.sets))
        provenance = collect(f"cais.reproduce.run.reproduce({names!r})", ctx.system, cfg.model_dump(), ctx.sets)
    ctx.out.mkdir(parents=True, exist_ok=True)
    (ctx.out / "runs").mkdir(exist_ok=True)
    res = Outcome()
    t_all = time.perf_counter()
    plans = [(name, EXPERIMENTS[name].points(ctx)) for name in names]
    fns = list(dict.fromkeys(f for _, points in plans for f, _ in points))
    outs = {fn: runs_table(ctx, fn) for fn in fns}
    left = list(plans)

    def analyse_ready(tables: Mapping[str, pd.DataFrame], pending: set[tuple[str, str]]) -> None:
        """Analyse, in order, the experiments none of whose points is still running."""
        while left and not any((f, point_id(p)) in pending for f, p in left[0][1]):
            name, points = left.pop(0)
            _analyse(name, points, rows_of(tables, points), ctx, cached, provenance, res, log, on_section)

    if cached:
        tables = {fn: read_table(out) for fn, out in outs.items()}
        analyse_ready(tables, set())
        ids = {(f, point_id(p)) for _, points in plans for f, p in points}
        res.points_reused = sum((fn, pid) in ids for fn, t in tables.items()
                                for pid in t.loc[t["status"] == "ok", "point_id"].unique())
    else:
        tables = run_sweeps([job for _, points in plans for job in points], outs, workers=workers, progress=progress,
                            desc="reproduce", on_batch=analyse_ready, same_run=same_run)
        res.points_run = sum(t.attrs["points_run"] for t in tables.values())
        res.points_shared = sum(t.attrs["points_shared"] for t in tables.values())
        res.points_reused = sum(t.attrs["points_reused"] for t in tables.values())
    older = runs_of_other_code({fn: read_table(out) for fn, out in outs.items()}, plans, provenance.commit)
    if older:
        log(f"note: {older}")
    facts = [f"System preset: {ctx.system}" + (f", with --set {' '.join(f'{k}={v}' for k, v in ctx.sets.items())}"
                                                if ctx.sets else "") + (". Quick grid (reduced)." if ctx.quick
                                                                         else ". Full grid."),
             "Every comparison puts our number beside the paper's (arXiv 2605.05628; each number with its section "
             "and figure in src/cais/reproduce/paper.py) with the ratio, and says why where they differ by more "
             "than 10 %. No simulator constant was tuned to a paper figure.",
             ("Analysed from the runs already in runs/ (--cached); each run's simulation time is its wall_s "
              "there." if cached else
              "Simulation time per experiment (s; its points' runs added up, a point two experiments share "
              "in each, and its analysis; the points run in parallel, so these add up to more than the "
              "wall time): " + ", ".join(f"{k} {v:.0f}" for k, v in res.seconds.items())
              + f"; wall time in all {time.perf_counter() - t_all:.0f}; {res.points_run} points simulated now, "
              + (f"{res.points_shared} given the run of a point that is theirs event for event (a production "
                 "all-reduce scheme handing every AllReduce to NCCL runs as tp-nvls), " if res.points_shared else "")
              + f"{res.points_reused} reused from runs/.")] + ([older] if older else [])
    res.wall_s = time.perf_counter() - t_all
    verdict = [(s.title, s.lines) for s in res.sections if s.lines] or [("No experiment produced a verdict.", [])]
    models = [str(m) for t in res.tables.values() if "model" in t for m in t["model"].unique()]
    # the quick-grid warning is about the paper's numbers: only where an experiment compares with them
    paper = any(EXPERIMENTS[name].paper for name in names)
    warning = quick_warning(ctx.quick and paper, list(dict.fromkeys(models)))
    if paper and ctx.quick and (ctx.sets or shipped(ctx.system) is None):
        unchecked = (f"no full grid of {ctx.system} is shipped (src/cais/data/full-grid/; "
                     "scripts/full_grid_claims.py adds one)" if not ctx.sets else
                     "the shipped full grids have no --set")
        warning += f" Its claims are not checked against a full grid: {unchecked}."
        log(f"note: quick claims not checked against a full grid: {unchecked}")
    measured = [s.facts["comm_over_compute"] for s in res.sections if "comm_over_compute" in s.facts]
    front = Front(verdict, warning, facts, provenance.lines(),
                  why_links(ctx.out, measured[0] if measured else float("nan"), P.FIG2_COMM_OVER_COMPUTE_8GPU))
    res.report_md, res.report_html = write_report(ctx.out, res.sections, front)
    write_claims(ctx.out, res.sections, {"system": ctx.system, "sets": ctx.sets, "grid": "quick" if ctx.quick
                                         else "full", "commit": provenance.commit, "date": provenance.date})
    return res


def _analyse(name: str, points: list[tuple[str, dict]], rows: pd.DataFrame, ctx: Context, cached: bool,
             provenance: Provenance, res: Outcome, log: Callable[[str], None],
             on_section: Callable[[Section], None] | None) -> None:
    """Experiment ``name``'s table, CSV and section from the ``rows`` of its ``points``,
    into ``res``; its seconds are its runs' wall times added up and its analysis."""
    exp = EXPERIMENTS[name]
    t0 = time.perf_counter()
    if points and (rows.empty or not (rows.get("status") == "ok").any()):
        table, section = pd.DataFrame(), Section(name, exp.title).p(
            "No runs of this experiment" + (" in the cache." if cached else " succeeded."))
    else:
        try:
            table, section = exp.analyse(ctx, rows)
        except Exception as exc:  # noqa: BLE001 - partial runs: the report says so, the rest goes on
            table, section = pd.DataFrame(), Section(name, exp.title).p(
                f"ANALYSIS FAILED on these runs ({len(rows)} rows): {type(exc).__name__}: {exc}")
    full = shipped(ctx.system) if ctx.quick and not ctx.sets else None
    if full is not None:
        lead_with_full(section, full, exp.quick_grid)
    table.assign(**provenance.columns()).to_csv(ctx.out / f"{name}.csv", index=False)
    runs_s = float(pd.to_numeric(rows["wall_s"], errors="coerce").sum()) if "wall_s" in rows else 0.0
    res.tables[name], res.seconds[name] = table, runs_s + time.perf_counter() - t0
    res.sections.append(section)
    log(f"[reproduce] {name}: {res.seconds[name]:.0f} s")
    if on_section is not None:
        on_section(section)
