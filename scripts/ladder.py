"""CAIS's gain in parts (docs/cais.md, "What each part buys"): paper-llama-7b, 8 GPUs x
66 SMs, one layer period per rung of the ladder, prefill and train, in three worlds:
the H100 as sold (copy-engine shard copies), the same with staged remote reads (the
upper bound, which the paper's L2 assumption gives too) and paper-world. Prints a
Markdown table of the period (us) and the speedup over TP-NVLS.

    .venv/bin/python scripts/ladder.py [--workers 2]
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor

from cais.config import apply_overrides, load_system
from cais.experiments.layer import run_layer
from cais.workload.models import load_model

MODEL = "paper-llama-7b"
#: (label, scheme, overrides, what the rung has)
RUNGS = (
    ("`tp-nvls`", "tp-nvls", {}, "NVLS AllReduce, no overlap"),
    ("`cais-base`", "cais-base", {}, "merge unit; LADM's kernels in SP order"),
    ("`cais-wo-coord`", "cais-wo-coord", {}, "+ fused pipeline, SM split, traffic control; CUTLASS order"),
    ("`cais-sw`", "cais-sw", {}, "fused pipeline, SM split, CAIS order, plain `ld`/`red`, no merging switch"),
    ("`cais`, empty table", "cais", {"switch.merge.entries": "0"}, "`cais` with nothing merged"),
    ("`cais-partial`", "cais-partial", {}, "`cais` with loads and reductions on one VC"),
    ("`cais`", "cais", {}, "everything, 40 KB table"),
)
#: (label, system, overrides)
WORLDS = (
    ("dgx-h100 (as sold)", "dgx-h100", {}),
    ("dgx-h100, staged (upper bound)", "dgx-h100", {"remote_read.strategy": "staged"}),
    ("paper-world", "paper-world", {}),
)
MODES = ("prefill", "train")


def one(job: tuple[int, int, str]) -> tuple[int, int, str, float]:
    w, r, mode = job
    _, system, wsets = WORLDS[w]
    _, scheme, rsets, _ = RUNGS[r]
    cfg = apply_overrides(load_system(system), {**wsets, **rsets})
    return w, r, mode, run_layer(cfg, load_model(MODEL), scheme, mode, sms=66).total_us


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args(argv)
    jobs = [(w, r, m) for w in range(len(WORLDS)) for r in range(len(RUNGS)) for m in MODES]
    with ProcessPoolExecutor(a.workers) as pool:
        got = {(w, r, m): t for w, r, m, t in pool.map(one, jobs)}
    head = " | ".join(f"{label} {m}" for label, _, _ in WORLDS for m in MODES)
    print(f"| rung | what it has | {head} |")
    print("|---|---|" + "---|" * (len(WORLDS) * len(MODES)))
    for r, (label, _, _, has) in enumerate(RUNGS):
        cells = [f"{got[(w, r, m)]:,.1f} ({got[(w, 0, m)] / got[(w, r, m)]:.2f}x)"
                 for w in range(len(WORLDS)) for m in MODES]
        print(f"| {label} | {has} | " + " | ".join(cells) + " |")
    sw, cais = 3, len(RUNGS) - 1
    parts = [f"{label} {m} {got[(w, sw, m)] / got[(w, cais, m)]:.2f}x"
             for w, (label, _, _) in enumerate(WORLDS) for m in MODES]
    print(f"\n{MODEL}, 8 GPUs x 66 SMs, us per layer period (x: over TP-NVLS). The in-switch merging, `cais` "
          f"over `cais-sw`: {'; '.join(parts)}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
