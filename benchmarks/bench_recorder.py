"""What recording costs: wall time of the same runs with no recorder and with a full
recorder (link timelines, TB and kernel logs), measured in one process, interleaved,
each the best of ``--repeat`` runs; plus the time and size of building the trace.

    .venv/bin/python benchmarks/bench_recorder.py [--repeat 3] [--system dgx-h100]

Cases: a 1 GiB NVLS AllReduce and a 256 MiB ring AllReduce on 8 GPUs, and one
LLaMA-7B (paper Table I) prefill layer period under TP-NVLS at 66 SMs.
Target (issue 6): recorder off costs nothing measurable (no hooks on hot paths).
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections.abc import Callable

from rich.console import Console
from rich.table import Table

from cais.experiments.collective import run_collective
from cais.experiments.layer import run_layer
from cais.config import SystemConfig, load_system
from cais.report.trace import build_trace
from cais.results import Recorder
from cais.workload.models import load_model

Run = Callable[[Recorder | None], tuple[float, int]]  # -> (simulated us, events)


def cases(cfg: SystemConfig) -> dict[str, Run]:
    llama = load_model("paper-llama-7b")

    def collective(algo: str, nbytes: int) -> Run:
        def run(rec: Recorder | None) -> tuple[float, int]:
            r = run_collective(cfg, "allreduce", algo, nbytes, recorder=rec)
            return r.time_us, r.events
        return run

    def layer(rec: Recorder | None) -> tuple[float, int]:
        r = run_layer(cfg, llama, "tp-nvls", "prefill", 66, recorder=rec)
        return r.total_us, r.events

    return {"NVLS AllReduce 1 GiB": collective("nvls", 1 << 30), "ring AllReduce 256 MiB": collective("ring", 256 << 20),
            "LLaMA-7B prefill, tp-nvls, 66 SMs": layer}


def timed(run: Run, rec: Recorder | None) -> tuple[float, tuple[float, int]]:
    gc.collect()
    t0 = time.perf_counter()
    out = run(rec)
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--system", default="dgx-h100")
    args = ap.parse_args()
    cfg = load_system(args.system)
    table = Table(title=f"recorder cost on {cfg.name} (best of {args.repeat}, off/on interleaved)")
    for col in ("run", "simulated (us)", "events", "off (s)", "on (s)", "on / off", "trace build (s)",
                "trace events", "trace (MB)"):
        table.add_column(col, justify="right")
    for name, run in cases(cfg).items():
        off, on = [], []
        for _ in range(args.repeat):
            wall, (sim_us, events) = timed(run, None)
            off.append(wall)
            rec = Recorder()
            wall, on_result = timed(run, rec)
            on.append(wall)
            assert on_result == (sim_us, events), "recording changed the run"
        t0 = time.perf_counter()
        trace = build_trace(rec)
        build = time.perf_counter() - t0
        size = len(json.dumps(trace, separators=(",", ":"))) / 1e6
        table.add_row(name, f"{sim_us:,.1f}", f"{events:,}", f"{min(off):.2f}", f"{min(on):.2f}",
                      f"{min(on) / min(off):.3f}", f"{build:.2f}", f"{len(trace['traceEvents']):,}", f"{size:.1f}")
    Console(width=150).print(table)


if __name__ == "__main__":
    main()
