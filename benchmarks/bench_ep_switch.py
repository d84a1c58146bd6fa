"""Simulator speed of the in-switch EP family (kernels/ep_switch.py): wall time and
simulated events of one dispatch and one combine per kernel, against DeepEP normal on
the same routing. ``st.mc.dyn`` trains pass a Python handler in the switch (its group
table, hw/ep_switch.py), so the multicast kernels cost more wall time per event; on a
system with many chips (nvl72: 18) every row is cut into as many trains.

    .venv/bin/python benchmarks/bench_ep_switch.py [--system dgx-h100] [--gpus N] [--tokens 1024]
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from cais.config import load_system
from cais.experiments.ep import run_ep

KERNELS = ("deepep", "ep-switch-sw", "ep-switch-mcast", "ep-switch-red", "ep-switch")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--system", default="dgx-h100")
    ap.add_argument("--gpus", type=int, default=None)
    ap.add_argument("--tokens", type=int, default=1024)
    args = ap.parse_args()
    cfg = load_system(args.system)
    if args.gpus:
        cfg = cfg.with_overrides(gpus=args.gpus)
    table = Table(title=f"in-switch EP kernels, {args.tokens} tokens per rank, hidden 7168, top-8 of 256, "
                        f"{cfg.name} ({cfg.gpus} GPUs)")
    for col in ("kernel", "op", "simulated (us)", "events", "wall (s)", "events/s"):
        table.add_column(col, justify="right")
    for k in KERNELS:
        for op, dtype in (("dispatch", "fp8"), ("combine", "bf16")):
            r = run_ep(cfg, k, op, args.tokens, 7168, 8, 256, dtype)
            table.add_row(k, op, f"{r.time_us:,.1f}", f"{r.events:,}", f"{r.wall_s:.2f}",
                          f"{r.events / max(r.wall_s, 1e-9):,.0f}")
    Console().print(table)


if __name__ == "__main__":
    main()
