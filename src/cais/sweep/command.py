"""``cais sweep SPEC.yaml --out FILE.parquet|FILE.csv``: expand and check the spec, run it, and
print a summary table (the keys that vary, the status and the main metric) and where
the table is."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from rich.console import Console
from rich.table import Table

from cais.results.fit import print_table
from cais.sweep.grid import Point, expand, load_spec, point_id
from cais.sweep.point import kind_of
from cais.sweep.runner import run_sweep, summary

MAX_ROWS = 40
METRICS = (("total_us", "total (us)"), ("time_us", "time (us)"), ("busbw_GBps", "busbw (GB/s)"))


def varied_keys(points: Sequence[Point]) -> list[str]:
    """The keys whose value is not the same in every point, in first-seen order."""
    keys = list(dict.fromkeys(k for p in points for k in p))
    return [k for k in keys if len({json.dumps(p.get(k), sort_keys=True) for p in points}) > 1]


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return ""
    if isinstance(value, float):
        return f"{value:,.1f}"
    return str(value)


def summary_table(table: pd.DataFrame, points: Sequence[Point], title: str) -> Table:
    """``points`` (at most :data:`MAX_ROWS`, all of one kind) with the keys that vary
    among them, their status and main metric: ``total_us`` of a layer period,
    ``time_us`` and ``busbw_GBps`` of a collective; the error where one failed."""
    rows = table.drop_duplicates("point_id", keep="last").set_index("point_id")
    mine = rows.loc[[point_id(p) for p in points[:MAX_ROWS]]]
    keys = [k for k in varied_keys(points) if k != "kind"]
    layer = kind_of(points[0]) == "layer"
    metrics = [(c, h) for c, h in METRICS if c in rows.columns and (c == "total_us") == layer]
    out = Table(title=title)
    for k in keys:
        out.add_column(k.removeprefix("set."), justify="right")
    out.add_column("status")
    for _, head in metrics:
        out.add_column(head, justify="right")
    errors = bool(mine["status"].ne("ok").any())
    if errors:
        out.add_column("error", overflow="fold")
    for p, (_, r) in zip(points, mine.iterrows()):
        cells = [_cell(p.get(k)) for k in keys] + [str(r["status"])] + [_cell(r[c]) for c, _ in metrics]
        out.add_row(*cells, *([_cell(r["error"])] if errors else []))
    return out


def sweep_command(spec_path: str, out: str, workers: int | None, ray: str | None, keep_errors: bool,
                  progress: bool, command: str = "", console: Console | None = None) -> None:
    """The ``cais sweep`` command (UserError for a bad spec or output, before any runs).
    It prints through ``console`` (the command's, which turns a closed stdout into
    exit code 141; a plain rich Console if None)."""
    spec = load_spec(spec_path)
    points = expand(spec)
    table = run_sweep(points, out, workers=workers, ray_address=ray, progress=progress, keep_errors=keep_errors,
                      desc=Path(spec_path).stem, command=command)
    ok, failed = summary(table, points)
    console = console or Console()
    for kind in dict.fromkeys(kind_of(p) for p in points):
        some = [p for p in points if kind_of(p) == kind]
        shown = f", first {MAX_ROWS} shown" if len(some) > MAX_ROWS else ""
        print_table(console, summary_table(table, some, f"{Path(spec_path).name}: {len(some)} {kind} points{shown}"))
    console.print(f"{ok} ok, {failed} failed" + (" (see the status and error columns)" if failed else ""))
    reader = "read_csv" if Path(out).suffix.lower() == ".csv" else "read_parquet"
    console.print(f"results: {out} ({len(table)} rows; pandas.{reader})")
