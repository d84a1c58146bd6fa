"""Time every `cais reproduce` experiment, one after another in a fresh output folder
(so nothing is read back from an earlier run), and print a table of seconds per
experiment and the total; the issue's targets: `all` under 20 minutes and `all
--quick` under 3 minutes on a 2-core machine. Then the same reproduction again in the
same folder: a resume that reads every run back and simulates none (what
tests/test_reproduce.py checks by count; its time is measured here, not there).

    .venv/bin/python benchmarks/bench_reproduce.py [--quick] [--workers 2] [EXPERIMENT ...]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from cais.reproduce.experiments import Context
from cais.reproduce.run import ALL, reproduce

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("experiments", nargs="*", default=list(ALL))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--system", default="dgx-h100")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        res = reproduce(args.experiments, Context(args.system, {}, args.quick, Path(tmp)), args.workers,
                        log=lambda _: None)
        total = time.perf_counter() - t0
        t0 = time.perf_counter()
        again = reproduce(args.experiments, Context(args.system, {}, args.quick, Path(tmp)), args.workers,
                          log=lambda _: None)
        resume = time.perf_counter() - t0
    print(f"| experiment | seconds ({'quick' if args.quick else 'full'} grid, {args.workers} workers) |")
    print("|---|---|")
    for name, s in res.seconds.items():
        print(f"| {name} | {s:.0f} |")
    print(f"| **total** | **{total:.0f}** |")
    print(f"\nresumed in the same folder: {resume:.1f} s, {again.points_run} points simulated, "
          f"{again.points_reused} read back")
