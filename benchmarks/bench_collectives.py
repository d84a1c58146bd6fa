"""Simulator speed: wall time and simulated events per second for a 1 GiB NVLS
AllReduce and a 1 GiB ring AllReduce on 8 GPUs at the default transfer unit.

    .venv/bin/python benchmarks/bench_collectives.py [--bytes 1G] [--system dgx-h100]

Target (issue 2): each under 5 s of wall time on a 2-core machine.
"""

from __future__ import annotations

import argparse
import resource
import time

from rich.console import Console
from rich.table import Table

from cais.cli import _size
from cais.experiments.collective import run_collective
from cais.hw.config import load_system


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bytes", type=_size, default=1 << 30)
    ap.add_argument("--system", default="dgx-h100")
    args = ap.parse_args()
    cfg = load_system(args.system)
    table = Table(title=f"simulator speed, {args.bytes / 2**30:g} GiB AllReduce on {cfg.name}")
    for col in ("algorithm", "simulated time (us)", "busbw (GB/s)", "events", "wall (s)", "events/s",
                "target", "peak RSS (MiB)"):
        table.add_column(col, justify="right")
    for algo in ("nvls", "ring"):
        t0 = time.perf_counter()
        r = run_collective(cfg, "allreduce", algo, args.bytes)
        wall = time.perf_counter() - t0
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        table.add_row(algo, f"{r.time_us:,.1f}", f"{r.busbw_GBps:,.1f}", f"{r.events:,}", f"{wall:.2f}",
                      f"{r.events / wall:,.0f}", "< 5 s: " + ("met" if wall < 5 else "MISSED"), f"{rss:,.0f}")
    Console(width=130).print(table)


if __name__ == "__main__":
    main()
