"""The fast path's error table: each collective in mirror mode (GPU 0 simulated,
the others its images) against the full model (every GPU simulated).

    PYTHONPATH=src .venv/bin/python benchmarks/mirror_vs_full.py [--set dgx|scale|all] [--modes full,mirror]

``--set dgx``: the DGX-H100 cases of docs/validation.md section 1; ``--set scale``:
16- and 32-GPU cases on nvl72. Each run prints one JSON line (time, events, CPU
seconds); the table at the end gives mirror / full - 1. docs/validation.md section 10.
"""

from __future__ import annotations

import argparse
import json
import time

from rich.console import Console
from rich.table import Table

from cais.experiments.collective import run_collective
from cais.config import load_system

G = 1 << 30
M = 1 << 20
DGX = ([("dgx-h100", 8, "allreduce", "nvls", s * G) for s in (1, 2, 4, 8, 16)]
       + [("dgx-h100", 8, "allreduce", "ring", s * G) for s in (1, 2, 4, 8, 16)]
       + [("dgx-h100", 8, op, algo, G) for op in ("allgather", "reducescatter") for algo in ("nvls", "ring")])
SCALE = ([("nvl72", g, "allreduce", algo, s) for g in (16, 32) for algo in ("nvls", "ring") for s in (M, 64 * M)]
         + [("nvl72", 16, op, algo, 64 * M) for op in ("allgather", "reducescatter") for algo in ("nvls", "ring")]
         + [("nvl72", 16, "allreduce", "nvls", G), ("nvl72", 32, "allreduce", "nvls", G)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", choices=("dgx", "scale", "all"), default="all")
    ap.add_argument("--modes", default="full,mirror")
    args = ap.parse_args()
    cases = {"dgx": DGX, "scale": SCALE, "all": DGX + SCALE}[args.set]
    table = Table(title="mirror vs full")
    for col in ("system", "GPUs", "op", "algo", "bytes", "full (us)", "mirror (us)", "error", "events full / mirror"):
        table.add_column(col, justify="right")
    for system, gpus, op, algo, nbytes in cases:
        base = load_system(system)
        cfg = base.with_overrides(gpus=gpus) if gpus != base.gpus else base
        got = {}
        for mode in args.modes.split(","):
            t = time.process_time()
            r = run_collective(cfg, op, algo, nbytes, sim=mode)
            got[mode] = r
            print(json.dumps({"system": system, "gpus": gpus, "op": op, "algo": algo, "bytes": nbytes, "sim": mode,
                              "time_us": r.time_us, "events": r.events, "cpu_s": time.process_time() - t}), flush=True)
        if len(got) == 2:
            f, m = got["full"], got["mirror"]
            table.add_row(system, str(gpus), op, algo, f"{nbytes:,}", f"{f.time_us:,.2f}", f"{m.time_us:,.2f}",
                          f"{100 * (m.time_us / f.time_us - 1):+.2f} %", f"{f.events:,} / {m.events:,}")
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
