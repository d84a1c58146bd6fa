"""Interference between a GEMM and a communication kernel sharing a GPU (docs/validation.md §9):
the GEMM alone and beside a resident ring collective, for the tail-effect case and the
GEMM/collective pairs of a TP layer.

    .venv/bin/python scripts/interference.py [--system dgx-h100] [--gpus 4] [--set KEY=VALUE] [--skip-pairs]
"""

from __future__ import annotations

import argparse

from cais.experiments.interference import PAIRS, corun
from cais.config import apply_overrides, load_system


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--system", default="dgx-h100")
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--set", action="append", default=[], help="override, e.g. gpu.interference.hbm=false")
    ap.add_argument("--skip-pairs", action="store_true")
    args = ap.parse_args()
    cfg = load_system(args.system).with_overrides(gpus=args.gpus)
    if args.set:
        cfg = apply_overrides(cfg, dict(s.split("=", 1) for s in args.set))
    print(f"system {args.system}, {args.gpus} GPUs, overrides {args.set or 'none'}\n")
    print("| case | GEMM (MxNxK) | collective | alone (us) | overlapped (us) | slowdown |")
    print("|---|---|---|---|---|---|")
    tail = corun(cfg, 1536, 2816, 4096, "allgather", 24)
    print(f"| tail effect | 1536x2816x4096 (132 tiles) | ring AG, 24 TBs | {tail.alone_us:,.1f} | "
          f"{tail.overlapped_us:,.1f} | {tail.slowdown:+.1%} |", flush=True)
    if args.skip_pairs:
        return
    slow = []
    for m, n, k in PAIRS:
        r = corun(cfg, m, n, k, "allreduce")
        slow.append(r.slowdown)
        print(f"| pair | {m}x{n}x{k} | ring AR, {r.channels} TBs | {r.alone_us:,.1f} | {r.overlapped_us:,.1f} | "
              f"{r.slowdown:+.1%} |", flush=True)
    print(f"\nmean slowdown {sum(slow) / len(slow):+.1%}, max {max(slow):+.1%} over {len(slow)} pairs")


if __name__ == "__main__":
    main()
