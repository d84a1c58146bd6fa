"""Simulator speed and memory for a whole layer: one LLaMA-7B (paper Table I)
training period on 8 GPUs x 66 SMs under every scheme (cais-base included: every
scheme ``cais.schemes.schemes()`` finds), each in its own process so its peak memory
is its own.

    .venv/bin/python benchmarks/bench_layers.py [--model paper-llama-7b] [--mode train [prefill ...]]
        [--scheme cais-base [tp-nvls ...]]

``--mode`` takes one or more modes (one row per scheme and mode); ``--scheme`` runs
only the schemes named, e.g. ``--scheme cais-base --mode prefill train`` for CAIS-Base
alone.

Target (issue 3): under 30 s of wall time and under 2 GB of peak memory per scheme
on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

from rich.console import Console
from rich.table import Table


def one(model: str, scheme: str, mode: str, sms: int) -> None:
    from cais.experiments.layer import run_layer
    from cais.config import load_system
    from cais.workload.models import load_model

    t0 = time.perf_counter()
    r = run_layer(load_system("dgx-h100"), load_model(model), scheme, mode, sms)
    wall = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"scheme": scheme, "total_us": r.total_us, "events": r.events, "wall_s": wall, "rss_mb": rss}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="paper-llama-7b")
    ap.add_argument("--mode", nargs="+", default=["train"], choices=["train", "prefill", "decode"])
    ap.add_argument("--scheme", nargs="+", default=None, help="only these schemes (default: all)")
    ap.add_argument("--sms", type=int, default=66)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        one(args.model, args.one, args.mode[0], args.sms)
        return
    from cais.schemes import schemes

    names = list(schemes())
    unknown = [n for n in args.scheme or [] if n not in names]
    if unknown:
        ap.error(f"--scheme: unknown {', '.join(unknown)}; valid: {', '.join(names)}")
    if args.scheme:
        names = [n for n in names if n in args.scheme]
    table = Table(title=f"{args.model} {'/'.join(args.mode)} period, 8 GPUs x {args.sms} SMs: "
                        "simulator cost per scheme")
    for col in ("scheme", "mode", "simulated (us)", "events", "wall (s)", "events/s", "peak RSS (MB)", "target"):
        table.add_column(col, justify="right")
    for name in names:
        for mode in args.mode:
            out = subprocess.run([sys.executable, __file__, "--one", name, "--model", args.model, "--mode", mode,
                                  "--sms", str(args.sms)], capture_output=True, text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            ok = r["wall_s"] < 30 and r["rss_mb"] < 2048
            table.add_row(name, mode, f"{r['total_us']:,.0f}", f"{r['events']:,}", f"{r['wall_s']:.1f}",
                          f"{r['events'] / r['wall_s']:,.0f}", f"{r['rss_mb']:,.0f}", "met" if ok else "MISSED")
    Console(width=130).print(table)


if __name__ == "__main__":
    main()
