"""docs/validation.md's table of CAIS against the production stacks, from the shipped
full-grid reproduction (``docs/reproduce-results/full-grid/production.csv``, written by
``cais reproduce all --out docs/reproduce-results/full-grid``): per world and mode, the
cases, CAIS's geomean speedup over NCCL and over the best stack (with its range), and
in how many cases CAIS is at least 1.02x the best stack or slower than it.

    .venv/bin/python scripts/production_table.py [FOLDER]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from cais.reproduce.experiments.production import AS_GOOD

ROOT = Path(__file__).resolve().parents[1]


def geomean(x: pd.Series) -> float:
    return float(np.exp(np.log(x).mean()))


def table(t: pd.DataFrame) -> str:
    lines = ["| world | mode (launches) | cases | CAIS over NCCL | CAIS over the best stack (range) "
             f"| CAIS >= {AS_GOOD:.2f}x the best | the best faster than CAIS |",
             "|---|---|---:|---:|---|---:|---:|"]
    for (world, mode), d in t.groupby(["world", "mode"], sort=False):
        best = d["cais_over_best"]
        lines.append(f"| {world} | {mode} ({d['launch'].iloc[0]}) | {len(d)} | {geomean(d['cais_over_tp_nccl']):.2f}x "
                     f"| {geomean(best):.2f}x ({best.min():.2f}-{best.max():.2f}x) | {(best >= AS_GOOD).sum()} "
                     f"| {(best < 1).sum()} |")
    return "\n".join(lines)


def main() -> None:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs/reproduce-results/full-grid"
    print(table(pd.read_csv(folder / "production.csv")))


if __name__ == "__main__":
    main()
