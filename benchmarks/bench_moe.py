"""Simulator speed of the MoE work (issue 66): the one-node EP sweep of ``cais reproduce
moe`` (every shipped EP kernel's dispatch and combine at tokens per rank 1-8,192 and EP
2, 4, 8 on ``dgx-h100`` and ``hgx-h800``; DeepSeek-V3's rows, BF16; the low-latency
kernel up to its buffer limit, ``LL_MAX_TOKENS``, as the experiment runs it) and whole
MoE layers on nvl72 at EP 72 and on gh200-nvl32 at EP 32 (`cais run`), each with its
wall time and simulated events.

    .venv/bin/python benchmarks/bench_moe.py [--systems dgx-h100 hgx-h800] [--tokens 1 16 128 1024 8192]
        [--ll-all] [--against REV | --against-tree DIR] [--layer-seq 64] [--no-layers] [--no-sweep]

``--against REV`` (or ``--against-tree DIR``, a checkout whose ``src/cais`` has its
compiled core) also runs the sweep under that revision, in a child process
(``PYTHONPATH``, as ``bench_core.py`` does), alternating with this tree system by
system so that both see the same load, and prints the ratio of wall times; the
simulated events of each kernel must be the same (the work is the same). ``--ll-all``
runs the low-latency kernel at every token count.

Targets (issue 66): the one-node sweep in seconds, an nvl72 EP-72 layer in minutes.
The table says for each row whether it met its target (the sweep: under 60 s a kernel);
the sweep's total is the sum of its points run one after the other in one process.
``--workers N`` (default: the machine's CPUs; 0: none) then runs the whole sweep again in
a pool of N processes, as ``cais reproduce moe`` runs its points, and prints its wall
time and its longest point, which bounds it for any number of workers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from cais.config import load_system
from cais.errors import UserError
from cais.experiments.layer import run_layer
from cais.workload.moe import load_moe_model

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

#: the one-node EP degrees of ``cais reproduce moe``
EPS = (2, 4, 8)


def sweep(system: str, tokens: Sequence[int], ll_all: bool) -> dict[str, dict[str, float]]:
    """The one-node sweep on ``system``: per shipped kernel, its points, simulated events
    and wall seconds (dispatch and combine of each point, one after the other)."""
    from cais.experiments.spec import ep_kernels
    from cais.reproduce.experiments.moe import LL_MAX_TOKENS
    from cais.reproduce.points import ep_point
    out: dict[str, dict[str, float]] = {}
    for kernel in ep_kernels(shipped_only=True):
        row = out.setdefault(kernel, {"points": 0, "events": 0, "wall_s": 0.0})
        for ep in EPS:
            for t in tokens:
                if kernel == "deepep-ll" and t > LL_MAX_TOKENS and not ll_all:
                    continue
                t0 = time.perf_counter()
                r = ep_point({"system": system, "gpus": ep, "kernel": kernel, "tokens": t, "sets": "{}"})
                row["wall_s"] += time.perf_counter() - t0
                row["events"] += int(r["events"])
                row["points"] += 1
    return out


def points(systems: Sequence[str], tokens: Sequence[int], ll_all: bool) -> list[dict[str, object]]:
    """The one-node sweep's points over ``systems``, as :func:`sweep` runs them."""
    from cais.experiments.spec import ep_kernels
    from cais.reproduce.experiments.moe import LL_MAX_TOKENS
    return [{"system": system, "gpus": ep, "kernel": kernel, "tokens": t, "sets": "{}"}
            for system in systems for kernel in ep_kernels(shipped_only=True) for ep in EPS for t in tokens
            if not (kernel == "deepep-ll" and t > LL_MAX_TOKENS and not ll_all)]


def _timed_point(point: dict[str, object]) -> tuple[float, int]:
    """One point in a worker: (its wall seconds, its simulated events)."""
    from cais.reproduce.points import ep_point
    t0 = time.perf_counter()
    r = ep_point(point)
    return time.perf_counter() - t0, int(r["events"])


def pooled(systems: Sequence[str], tokens: Sequence[int], ll_all: bool, workers: int) -> dict[str, float]:
    """The whole one-node sweep in a pool of ``workers`` processes, as ``cais reproduce
    moe`` runs its points (one pool, ``--workers``, default the machine's CPUs), the
    longest points first: its wall seconds, points, events and its longest point (no
    pool of any size finishes sooner)."""
    from concurrent.futures import ProcessPoolExecutor
    todo = points(systems, tokens, ll_all)
    todo.sort(key=lambda p: -int(p["tokens"]) * int(p["gpus"]))  # the long points first, as a scheduler would
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=workers) as pool:
        done = list(pool.map(_timed_point, todo))
    return {"wall_s": time.perf_counter() - t0, "points": len(todo), "events": sum(e for _, e in done),
            "longest_s": max(w for w, _ in done)}


def sweep_elsewhere(src: Path, system: str, tokens: Sequence[int], ll_all: bool) -> dict[str, dict[str, float]]:
    """:func:`sweep` in a child process importing ``cais`` from ``src`` (another revision)."""
    code = (f"import bench_moe, json; print(json.dumps(bench_moe.sweep({system!r}, {list(tokens)!r}, {ll_all!r})))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(HERE)])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=src.parent)
    if out.returncode:
        last = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
        print(f"bench_moe: the sweep failed under {src}: {last}", file=sys.stderr)
        raise SystemExit(2)
    return json.loads(out.stdout.strip().splitlines()[-1])


def baseline(args: argparse.Namespace) -> Path | None:
    """The ``src`` folder of the revision to compare with, if any (checked out and built
    by bench_core's helpers for ``--against``)."""
    if args.against_tree:
        src = Path(args.against_tree) / "src"
        if not (src / "cais").is_dir():
            print(f"bench_moe: --against-tree {args.against_tree}: no src/cais there", file=sys.stderr)
            raise SystemExit(2)
        return src
    if args.against:
        from bench_core import worktree
        return worktree(args.against) / "src"
    return None


def sweep_table(args: argparse.Namespace) -> Table:
    """The one-node sweep per system and kernel (and against the baseline, if any)."""
    base = baseline(args)
    title = "One-node EP sweep (this machine, one process)" + (f", against {base.parent}" if base else "")
    table = Table(title=title)
    cols = ["system", "kernel", "points", "events", "wall (s)", "events/s"]
    if base:
        cols += ["wall before (s)", "events before", "speed-up"]
    for col in cols:
        table.add_column(col, justify="right")
    total, total_before, events = 0.0, 0.0, 0
    for system in args.systems:
        before = sweep_elsewhere(base, system, args.tokens, args.ll_all) if base else {}
        now = sweep(system, args.tokens, args.ll_all)
        for kernel, row in now.items():
            cells = [system, kernel, f"{row['points']:.0f}", f"{row['events']:,.0f}", f"{row['wall_s']:.2f}",
                     f"{row['events'] / max(row['wall_s'], 1e-9):,.0f}"]
            total += row["wall_s"]
            events += int(row["events"])
            if base:
                b = before.get(kernel)
                if b is None:
                    cells += ["-", "-", "-"]
                else:
                    total_before += b["wall_s"]
                    same = "" if int(b["events"]) == int(row["events"]) else " (differs)"
                    cells += [f"{b['wall_s']:.2f}", f"{b['events']:,.0f}{same}", f"{b['wall_s'] / row['wall_s']:.2f}x"]
            table.add_row(*cells)
    cells = ["all", "", "", f"{events:,}", f"{total:.2f}", f"{events / max(total, 1e-9):,.0f}"]
    if base:
        cells += [f"{total_before:.2f}", "", f"{total_before / total:.2f}x"]
    table.add_row(*cells)
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--systems", nargs="+", default=["dgx-h100", "hgx-h800"])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 128, 1024, 8192])
    ap.add_argument("--ll-all", action="store_true", help="the low-latency kernel at every token count")
    ap.add_argument("--against", default=None, help="a git revision to run the sweep under too")
    ap.add_argument("--against-tree", default=None, help="a checkout (with its compiled core) to run the sweep under")
    ap.add_argument("--layer-seq", type=int, default=64, help="tokens per sequence of the layer runs (batch 1)")
    ap.add_argument("--no-layers", action="store_true", help="the one-node sweep only")
    ap.add_argument("--no-sweep", action="store_true", help="the layers only")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                    help="also run the whole sweep in a pool of this many processes (default: the CPUs; 0: no)")
    args = ap.parse_args()
    console = Console(width=160)
    if not args.no_sweep:
        console.print(sweep_table(args))
        if args.workers > 0:
            p = pooled(args.systems, args.tokens, args.ll_all, args.workers)
            console.print(f"The whole sweep in a pool of {args.workers} worker(s), as `cais reproduce moe "
                          f"--workers {args.workers}` runs it: {p['wall_s']:.1f} s for {p['points']:.0f} points "
                          f"and {p['events']:,.0f} events; its longest point {p['longest_s']:.1f} s (no pool "
                          f"finishes sooner)")
    table = Table(title="MoE layers (this machine, one process)")
    refused: list[str] = []
    for col in ("what", "events", "wall (s)", "events/s", "target"):
        table.add_column(col, justify="right")
    if not args.no_layers:
        for system, kernel, mode in (("nvl72", "deepep", "prefill"), ("nvl72", "nccl", "prefill"),
                                     ("nvl72", "deepep", "decode"), ("nvl72", "deepep", "train"),
                                     ("nvl72", "deepep-ll", "prefill"), ("nvl72", "deepep-ll", "train"),
                                     ("nvl72", "nccl", "train"),
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
            except UserError as exc:  # a run the simulator refuses (its event limit, a split): said under the table
                refused.append(f"{what}: {exc}")
                table.add_row(what, "-", "-", "-", f"refused ({len(refused)}, below)")
                continue
            wall = time.perf_counter() - t0
            table.add_row(what, f"{layer.events:,}", f"{wall:.1f}", f"{layer.events / wall:,.0f}",
                          "minutes: " + ("met" if wall < 600 else "MISSED"))
        console.print(table)
        for i, why in enumerate(refused, 1):
            console.print(f"refused ({i}) {why}")


if __name__ == "__main__":
    main()
