"""README's table of CAIS's answer per world, from the shipped full-grid reproduction
(``docs/reproduce-results/full-grid/fig11_worlds.csv``, written by ``cais reproduce
all --out docs/reproduce-results/full-grid``, and its ``claims.json`` for the commit):
CAIS's geomean speedup over TP-NVLS, over the best baseline and over ``cais-sw`` (what
the in-switch merging buys), prefill / train, beside the paper's.

    .venv/bin/python scripts/world_table.py [FOLDER]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from cais.reproduce import paper as P

ROOT = Path(__file__).resolve().parents[1]


def pair(t: pd.DataFrame, col: str, best: bool = False) -> str:
    """``col`` in prefill / train (with the best baseline's name where ``best``)."""
    out = []
    for mode in ("prefill", "train"):
        r = t[t["mode"] == mode]
        if r.empty or r[col].isna().all():
            out.append("–")
            continue
        v = f"{float(r[col].iloc[0]):.2f}x"
        out.append(f"{v} ({r['best baseline'].iloc[0]})" if best else v)
    return " / ".join(out)


def main(argv: list[str]) -> int:
    folder = Path(argv[0]) if argv else ROOT / "docs" / "reproduce-results" / "full-grid"
    t = pd.read_csv(folder / "fig11_worlds.csv")
    commit = json.loads((folder / "claims.json").read_text()).get("commit", "?")[:7]
    print("| world | CAIS over TP-NVLS, prefill / train | over the best baseline | over `cais-sw` (the switch's part) |")
    print("|---|---|---|---|")
    for world in dict.fromkeys(t["world"]):
        w = t[t["world"] == world]
        print(f"| {world} | {pair(w, 'over TP-NVLS')} | {pair(w, 'over the best', True)} | {pair(w, 'over cais-sw')} |")
    paper = " / ".join(f"{P.fig11_paper('tp-nvls', m):.2f}x" for m in ("prefill", "train"))
    best = " / ".join(f"{min(P.fig11_paper(s, m) for s in P.BASELINES):.2f}x" for m in ("prefill", "train"))
    print(f"| the paper | {paper} | {best} | – |")
    print(f"\nTable I models, 8 GPUs x 66 SMs, geomeans over the models; "
          f"`docs/reproduce-results/full-grid` at commit {commit}.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
