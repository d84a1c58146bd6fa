"""Scale: how a collective's simulation cost grows with GPUs and bytes.

Each case runs in its own process (so peak memory is its own): wall and CPU time,
simulated events, events per second, peak RSS, the events ``cais.limits`` estimates,
and the work (GPUs x bytes). Cases the estimate puts past ``--max-events`` are not
run; their estimate is printed.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_scale.py \\
        [--system nvl72] [--gpus 8,16,32,72] [--bytes 1M,1G] [--algos nvls,ring] \\
        [--sim full|mirror] [--max-events 2e7] [--json FILE]

The 8-GPU rows can also be taken on dgx-h100 (``--system dgx-h100 --gpus 8``).
docs/validation.md section 10 has the measured table.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import time
from typing import Any

from rich.console import Console
from rich.table import Table


def _one(system: str, gpus: int, algo: str, nbytes: int, sim: str, out: Any) -> None:
    from cais.experiments.collective import run_collective
    from cais.config import load_system

    cfg = load_system(system).with_overrides(gpus=gpus) if gpus != load_system(system).gpus else load_system(system)
    w0, c0 = time.perf_counter(), time.process_time()
    try:
        r = run_collective(cfg, "allreduce", algo, nbytes, sim=sim)
    except Exception as exc:  # noqa: BLE001 - reported in the table, the parent must not wait forever
        out.put({"error": f"{type(exc).__name__}: {exc}"})
        return
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out.put({"time_us": r.time_us, "busbw": r.busbw_GBps, "events": r.events, "wall_s": wall, "cpu_s": cpu,
             "rss_MiB": rss})


def _size(text: str) -> int:
    from cais.cli import _size as parse

    return parse(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--system", default="nvl72")
    ap.add_argument("--gpus", default="8,16,32,72")
    ap.add_argument("--bytes", default="1G")
    ap.add_argument("--algos", default="nvls,ring")
    ap.add_argument("--sim", default="full", choices=("full", "mirror"), help="simulation mode (cais collective --sim)")
    ap.add_argument("--max-events", type=float, default=2e7, help="skip cases estimated beyond this")
    ap.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = ap.parse_args()

    from cais.config import load_system
    from cais.experiments.estimates import collective_events

    table = Table(title=f"AllReduce simulation cost on {args.system}, --sim {args.sim}")
    for col in ("algo", "GPUs", "bytes", "GPUs x GiB", "sim time (us)", "busbw (GB/s)", "events", "estimate",
                "wall (s)", "CPU (s)", "events/CPU s", "peak RSS (MiB)"):
        table.add_column(col, justify="right")
    rows = []
    ctx = mp.get_context("spawn")
    for algo in args.algos.split(","):
        for nbytes in (_size(b) for b in args.bytes.split(",")):
            for gpus in (int(g) for g in args.gpus.split(",")):
                base = load_system(args.system)
                cfg = base.with_overrides(gpus=gpus) if gpus != base.gpus else base
                est = collective_events(cfg, "allreduce", algo, nbytes) / (gpus if args.sim == "mirror" else 1)
                row: dict[str, Any] = {"algo": algo, "gpus": gpus, "bytes": nbytes, "sim": args.sim, "estimate": est}
                if est <= args.max_events:
                    q = ctx.Queue()
                    p = ctx.Process(target=_one, args=(args.system, gpus, algo, nbytes, args.sim, q))
                    p.start()
                    row.update(q.get())
                    p.join()
                rows.append(row)
                work = gpus * nbytes / 2**30
                if "error" in row:
                    table.add_row(algo, str(gpus), f"{nbytes:,}", f"{work:g}", "", "", row["error"][:60], "", "", "",
                                  "", "")
                elif "events" in row:
                    table.add_row(algo, str(gpus), f"{nbytes:,}", f"{work:g}", f"{row['time_us']:,.1f}",
                                  f"{row['busbw']:,.1f}", f"{row['events']:,}", f"{est:,.3g}", f"{row['wall_s']:.1f}",
                                  f"{row['cpu_s']:.1f}", f"{row['events'] / row['cpu_s']:,.0f}",
                                  f"{row['rss_MiB']:,.0f}")
                else:
                    table.add_row(algo, str(gpus), f"{nbytes:,}", f"{work:g}", "", "", "not run", f"{est:,.3g}",
                                  "", "", "", "")
                print(json.dumps(row), flush=True)
    Console(width=160).print(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
