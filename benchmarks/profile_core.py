"""Where a run's time goes (issue 40): one ``cais`` command under cProfile, in this
process, with the top functions by cumulative and by own time, the Python functions
the compiled core enters most, and the counters the core already exposes (events, and
events by kind, trains sent per channel hop, NVLS multicasts and absorbed reductions,
HBM phases, TBs finished).

    .venv/bin/python benchmarks/profile_core.py [--top 15] [--out FILE.prof] -- \\
        collective --op allreduce --algo nvls --bytes 1G --system dgx-h100
    .venv/bin/python benchmarks/profile_core.py -- \\
        run --model paper-llama-7b --scheme cais --mode prefill --sms 66 --system dgx-h100

cProfile times every Python call and return and not the core's own work between
them, so it inflates the Python side: read its shares against each other, and a
run's wall time from ``benchmarks/bench_core.py``. The core counts its events by kind
(``Simulator.events_by_kind``: Python calls, channel arbitrations, train arrivals,
program steps, units' own timed events); "entered from the core" counts the calls (a generator's resumes
included) whose caller, as cProfile sees it, is a method of a ``cais._core`` class
(``Simulator.run`` above all): each is one event, or one step of one, that leaves
the core for Python.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def where(func: tuple[str, int, str]) -> str:
    """``file:line(name)``, the file relative to the package, or a builtin's name."""
    file, line, name = func
    if file == "~":
        return name
    path = Path(file)
    for base in (ROOT / "src", Path(sys.prefix)):
        try:
            return f"{path.relative_to(base)}:{line}({name})"
        except ValueError:
            pass
    return f"{path.name}:{line}({name})"


def top(stats: pstats.Stats, key: int, n: int) -> list[str]:
    """The ``n`` functions with the largest ``key`` (2: own time, 3: cumulative)."""
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][key], reverse=True)[:n]  # type: ignore[attr-defined]
    return [f"{nc:>11,} {tt:9.2f} {ct:9.2f}  {where(f)}" for f, (cc, nc, tt, ct, _) in rows]


def from_core(stats: pstats.Stats, n: int) -> tuple[int, list[str]]:
    """Calls of Python functions whose caller is a ``cais._core`` method, in all and
    the ``n`` functions entered most."""
    counts: dict[tuple[str, int, str], int] = {}
    for func, (_, _, _, _, callers) in stats.stats.items():  # type: ignore[attr-defined]
        if func[0] == "~":
            continue
        k = sum(c[1] for caller, c in callers.items() if caller[0] == "~" and "cais._core" in caller[2])
        if k:
            counts[func] = k
    rows = sorted(counts.items(), key=lambda kv: kv[1], reverse=True)[:n]
    return sum(counts.values()), [f"{k:>11,}  {where(f)}" for f, k in rows]


def counters(m: Any) -> dict[str, int]:
    """What the core counts of a machine's run."""
    sws = m.fabric.switches
    return {
        "events": m.sim.events,
        **{f"events: {kind}": n for kind, n in m.sim.events_by_kind.items()},
        "trains sent (channel hops)": sum(ch.trains for ch in m.fabric.channels()),
        "payload bytes sent": sum(ch.payload_bytes for ch in m.fabric.channels()),
        "NVLS multicast bytes created": sum(sw.ledger.multicast_created for sw in sws),
        "bytes absorbed by switch reductions": sum(sw.ledger.reduction_absorbed for sw in sws),
        "HBM phases": sum(g.hbm.phases for g in m.gpus),
        "TBs finished": sum(g.tbs_finished for g in m.gpus),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--top", type=int, default=15, help="functions per list (default 15)")
    ap.add_argument("--out", default=None, help="also write the raw profile here (pstats format)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the cais command line, after --")
    args = ap.parse_args()
    argv = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not argv:
        ap.error("give the cais command after --")

    from cais import cli
    from cais.machine import Machine

    machines: list[Machine] = []
    init = Machine.__init__

    def keep(self: Machine, *a: Any, **k: Any) -> None:
        init(self, *a, **k)
        machines.append(self)

    Machine.__init__ = keep  # type: ignore[method-assign]
    prof = cProfile.Profile()
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    with open(os.devnull, "w") as null:
        real, sys.stdout = sys.stdout, null
        try:
            prof.runcall(cli.main, argv)
        finally:
            sys.stdout = real
    wall = time.perf_counter() - t0
    Machine.__init__ = init  # type: ignore[method-assign]
    if args.out:
        prof.dump_stats(args.out)
    stats = pstats.Stats(prof, stream=io.StringIO())
    total_tt = sum(v[2] for v in stats.stats.values())  # type: ignore[attr-defined]
    core_tt = sum(v[2] for f, v in stats.stats.items() if f[0] == "~" and "cais._core" in f[2])  # type: ignore[attr-defined]

    print(f"cais {' '.join(argv)}")
    print(f"wall under cProfile {wall:.1f} s; load {load0:.2f} -> {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print(f"own time: {total_tt:.1f} s in all, {core_tt:.1f} s ({core_tt / total_tt:.0%}) inside cais._core's methods "
          f"(the core's work plus cProfile's hooks on its calls), the rest in Python")
    for i, m in enumerate(machines):
        print(f"machine {i}: " + "; ".join(f"{k} {v:,}" for k, v in counters(m).items()))
    head = f"{'calls':>11} {'own (s)':>9} {'cum (s)':>9}  function"
    print(f"\ntop {args.top} by cumulative time\n{head}")
    print("\n".join(top(stats, 3, args.top)))
    print(f"\ntop {args.top} by own time\n{head}")
    print("\n".join(top(stats, 2, args.top)))
    n, rows = from_core(stats, args.top)
    print(f"\nentered from the core: {n:,} calls; top {args.top}\n{'calls':>11}  function")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
