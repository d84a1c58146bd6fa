"""Simulator speed of the MoE work (issue 66): a one-node EP sweep (every EP kernel's
dispatch and combine at tokens per rank 1-8,192 and EP 2, 4, 8; DeepSeek-V3's rows, BF16,
as `cais reproduce moe` runs them) and whole MoE layers on nvl72 at EP 72 and on
gh200-nvl32 at EP 32 (`cais run`), each with its wall time and simulated events.

    .venv/bin/python benchmarks/bench_moe.py [--system dgx-h100] [--tokens 1 16 128 1024 8192]
        [--layer-seq 64] [--no-layers]

Targets (issue 66): the one-node sweep in seconds, an nvl72 EP-72 layer in minutes.
The table says for each row whether it met its target; the sweep's total is the sum of
its points run one after the other in this process.
"""

from __future__ import annotations

import argparse
import time

from rich.console import Console
from rich.table import Table

from cais.config import load_system
from cais.errors import UserError
from cais.experiments.layer import run_layer
from cais.kernels.ep_registry import EP_KERNELS
from cais.reproduce.points import ep_point
from cais.workload.moe import load_moe_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--system", default="dgx-h100")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 128, 1024, 8192])
    ap.add_argument("--layer-seq", type=int, default=64, help="tokens per sequence of the layer runs (batch 1)")
    ap.add_argument("--no-layers", action="store_true", help="the one-node sweep only")
    ap.add_argument("--no-sweep", action="store_true", help="the layers only")
    args = ap.parse_args()
    table = Table(title="MoE simulator speed (this machine, one process)")
    for col in ("what", "points", "events", "wall (s)", "events/s", "target"):
        table.add_column(col, justify="right")
    for kernel in () if args.no_sweep else EP_KERNELS:
        events, t0 = 0, time.perf_counter()
        for ep in (2, 4, 8):
            for tokens in args.tokens:
                r = ep_point({"system": args.system, "gpus": ep, "kernel": kernel, "tokens": tokens, "sets": "{}"})
                events += int(r["events"])
        wall = time.perf_counter() - t0
        table.add_row(f"one-node sweep, {kernel}, {args.system}", str(3 * len(args.tokens)), f"{events:,}",
                      f"{wall:.1f}", f"{events / wall:,.0f}", "seconds: " + ("met" if wall < 60 else "MISSED"))
    if not args.no_layers:
        for system, kernel, mode in (("nvl72", "deepep", "prefill"), ("nvl72", "nccl", "prefill"),
                                     ("nvl72", "deepep", "decode"), ("nvl72", "deepep", "train"),
                                     ("gh200-nvl32", "deepep", "prefill"), ("gh200-nvl32", "deepep", "train")):
            cfg = load_system(system)
            # EP 72 needs an expert count it divides: DeepSeek-V3's 256 plus 32 redundant copies (288, as its
            # EPLB deploys them), routed as 288 experts; each GPU its own sequence (attention data parallel)
            experts = 256 if 256 % cfg.gpus == 0 else 288
            model = load_moe_model("deepseek-v3", seq=args.layer_seq, batch=1, experts=experts)
            what = (f"deepseek-v3 ({experts} experts) {mode} layer, ep-{kernel}, {system} EP {cfg.gpus}, "
                    f"{args.layer_seq if mode != 'decode' else 1} token(s) per GPU")
            t0 = time.perf_counter()
            try:
                layer = run_layer(cfg, model, f"ep-{kernel}", mode, attention="dp")
            except UserError as exc:  # a run the simulator's event limit refuses: say so, with its estimate
                table.add_row(what, "1", "-", "-", "-", f"refused: {str(exc).split(' (')[0][-60:]}")
                continue
            wall = time.perf_counter() - t0
            table.add_row(what, "1", f"{layer.events:,}", f"{wall:.1f}", f"{layer.events / wall:,.0f}",
                          "minutes: " + ("met" if wall < 600 else "MISSED"))
    Console(width=150).print(table)


if __name__ == "__main__":
    main()
