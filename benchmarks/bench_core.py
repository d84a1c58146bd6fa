"""The compiled event core against the pure-Python engine, side by side in one run:
each row runs in its own process under this tree and under a git revision (by
default the last commit before the core, ``ea63d9d``), alternating, and reports
wall time, events per second, peak memory, the speed-up and whether both computed
the same result (simulated time and event count). Every row is also reported
against a bare Python ``heapq`` loop timed in the same run (issue 40's yardstick).

    .venv/bin/python benchmarks/bench_core.py [--against REV] [--rounds 2] [--full] [--rows TEXT ...]
    .venv/bin/python benchmarks/bench_core.py --no-against [--rounds 1] [--full] [--rows TEXT ...]

``--no-against`` runs only this tree's rows, with the yardstick (a few minutes;
``--full`` adds the long rows). ``--full`` adds the long rows (the LLaMA-7B training
periods, 1 GiB NVLS AllReduce on all 72 GPUs of ``nvl72`` in the full model). The
revision is checked out once into a temporary git worktree and imported from there
(``PYTHONPATH``), with this environment's dependencies; a revision with a compiled
core of its own (``rust/``) has it built there once with ``cargo``, so the run can
also compare two versions of the core (e.g. ``--against 852d1c2``, the core before
its units' state moved into GIL-guarded cells). A row the revision cannot run (a
setting it does not know) is shown with ``-`` on its side.

The yardstick (issue 40): 1 M push/pop of ``(time, seq)`` tuples in a ``heapq``
holding 1,000 pending events (the hold model: pop the earliest, push one a
pseudo-random delay later), timed in this process before every row and once at the
end; the fastest timing of the run is the reference. A collective row is reported as
its events/s over the loop's events/s, a layer row as its time over the loop
million's time, both in wall time (the issue's measure) and in CPU time (the
process's own, ``time.process_time``: on a loaded machine the reproducible one; on
an idle one the two agree); a target is judged, and the best of the rounds kept, in
CPU time. The earlier yardstick (the same loop with a ``(time, seq, fn, args)``
entry and a no-op callback per event; issue 20's figures) is printed once at the
end, for converting older numbers, and so is the same loop on Rust's ``BinaryHeap``
(``cais._core.heap_yardstick``): the ceiling of any compiled event loop on the
machine, a queue operation per event and no other work, against which a rate
target reads as a fraction of that ceiling.

Targets (issue 40): 1 GiB NVLS AllReduce, registered and staged, at least 10x the
loop's events/s; LLaMA-7B ``cais`` prefill period within 1x the loop million's wall
time and training period within 3x, both with ``gpu.l2_keeps_peer_reads`` true and
false. Issue 20's: NVL72 1 GiB NVLS in the full model under 60 s; peak memory no
higher than before. The row on 18 GPUs of ``nvl72`` has no target: a machine larger
than the cache, where an event costs mostly its misses (the git history of benchmarks/bench_core.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import tomllib
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
BEFORE = "ea63d9d"  # the last commit whose event loop, channels and credits were Python

# name -> (what it sets up, what it runs and times, in a child process; a long row?)
def _layer(l2: bool) -> str:
    return ("from cais.experiments.layer import run_layer\n"
            "from cais.config import apply_overrides, load_system\n"
            "from cais.workload.models import load_model\n"
            f"cfg = apply_overrides(load_system('dgx-h100'), {{'gpu.l2_keeps_peer_reads': '{str(l2).lower()}'}})\n"
            "model = load_model('paper-llama-7b')\n")


def _nvls(buffers: str) -> str:
    return ("from cais.experiments.collective import run_collective\n"
            "from cais.config import apply_overrides, load_system\n"
            f"cfg = apply_overrides(load_system('dgx-h100'), {{'collective.nvls_buffers': '{buffers}'}})\n")


_NVLS_RUN = "r = run_collective(cfg, 'allreduce', 'nvls', 1 << 30)\nresult = (r.time_us, r.events)"
_PREFILL = "r = run_layer(cfg, model, 'cais', 'prefill', 66)\nresult = (r.total_us, r.events)"
_TRAIN = "r = run_layer(cfg, model, 'cais', 'train', 66)\nresult = (r.total_us, r.events)"
ROWS: dict[str, tuple[str, str, bool]] = {
    "NVLS AllReduce 1 GiB registered, 8 x H100": (_nvls("registered"), _NVLS_RUN, False),
    "NVLS AllReduce 1 GiB staged (default), 8 x H100": (_nvls("staged"), _NVLS_RUN, False),
    "paper-llama-7b cais prefill, 8 x 66 SMs, L2 kept": (_layer(True), _PREFILL, False),
    "paper-llama-7b cais prefill, 8 x 66 SMs, L2 not kept (default)": (_layer(False), _PREFILL, False),
    "paper-llama-7b cais train, 8 x 66 SMs, L2 kept": (_layer(True), _TRAIN, True),
    "paper-llama-7b cais train, 8 x 66 SMs, L2 not kept (default)": (_layer(False), _TRAIN, True),
    # a machine larger than the cache: the nvl72 experiment's layer, shortened (the git history of benchmarks/bench_core.py)
    "Llama-3-70B-like tp-nvls prefill, 256 tokens, nvl72 x 18": (
        "from cais.reproduce.points import layer_spec\n"
        "spec = layer_spec({'system': 'nvl72', 'sets': '{}', 'model': 'llama3-70b', 'batch': 1, 'seq': 256,\n"
        "                   'hidden': 9216, 'heads': 72, 'kv_heads': 72, 'ffn_hidden': 27648, 'gpus': 18,\n"
        "                   'scheme': 'tp-nvls', 'mode': 'prefill', 'sms': 132})\n"
        "built = spec.build()\n",
        "r = spec.run(built)\nresult = (r.total_us, r.events)", False),
    "NVLS AllReduce 1 GiB, nvl72 x 72, full model": (
        "import os\n"
        "os.environ['CAIS_MAX_EVENTS'] = '60000000'\n"
        "from cais.experiments.collective import run_collective\n"
        "from cais.config import apply_overrides, load_system\n"
        "# the zero-copy kernel on the preset as it was at the revision compared against\n"
        "cfg = apply_overrides(load_system('nvl72'), {'collective.nvls_buffers': 'registered',\n"
        "                                             'collective.nvls_channels': '16', 'switch.reduce_GBps': '1690'})\n",
        _NVLS_RUN, True),
}

# issue 40's target per row: ("rate", x) events/s at least x times the loop's; ("wall", x) wall time
# within x times the loop million's; None: no issue-40 target
TARGETS: dict[str, tuple[str, float] | None] = {
    name: (("rate", 10.0) if name.startswith("NVLS AllReduce 1 GiB registered")
           or name.startswith("NVLS AllReduce 1 GiB staged")
           else ("wall", 1.0) if name.startswith("paper-llama-7b cais prefill")
           else ("wall", 3.0) if name.startswith("paper-llama-7b cais train") else None)
    for name in ROWS
}


def against(target: tuple[str, float] | None, events: int, wall_s: float, loop_s: float,
            loop_n: int = 1_000_000) -> tuple[str, str, str]:
    """A row against the yardstick (``loop_n`` push/pops in ``loop_s``): the measure
    the row's target is in (events/s as a multiple of the loop's for a ``rate``
    target, wall time as a multiple of the loop's for a ``wall`` target or none), the
    target in words, and whether it is met ("yes", "no" or "-")."""
    rate_x = (events / wall_s) / (loop_n / loop_s)
    wall_x = wall_s / loop_s
    if target is None:
        return f"{rate_x:.2f}x its rate; {wall_x:.1f}x its time", "-", "-"
    kind, x = target
    if kind == "rate":
        return f"{rate_x:.2f}x its rate", f">= {x:g}x its rate", "yes" if rate_x >= x else "no"
    return f"{wall_x:.1f}x its time", f"<= {x:g}x its time", "yes" if wall_x <= x else "no"


CHILD = """
import json, resource, sys, time
{setup}
t0, c0 = time.perf_counter(), time.process_time()  # the run alone, not the imports
{code}
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({{"wall_s": wall, "cpu_s": cpu, "rss_mb": rss, "result": list(result)}}))
"""


def heapq_rate(n: int = 1_000_000, pending: int = 1_000) -> float:
    """Events per second of a bare Python event loop, the classic hold model of
    event-queue benchmarks: ``pending`` events wait in a ``heapq`` of (time, seq, fn,
    args); each step pops the earliest, calls its callback (which does nothing) and
    schedules one more a pseudo-random delay later. The floor any Python engine pays
    per event."""
    import heapq

    def noop() -> None:
        return None

    queue: list[tuple[int, int, object, tuple]] = [((i * 7919) % 10_007, i, noop, ()) for i in range(pending)]
    heapq.heapify(queue)
    push, pop = heapq.heappush, heapq.heappop
    t0 = time.perf_counter()
    for seq in range(pending, pending + n):
        now, _, fn, args = pop(queue)
        fn(*args)  # type: ignore[operator]
        push(queue, (now + (seq * 7919) % 10_007, seq, noop, ()))
    return n / (time.perf_counter() - t0)


def heapq_million(n: int = 1_000_000, pending: int = 1_000) -> tuple[float, float]:
    """Wall and CPU seconds for issue 40's yardstick: ``n`` push/pop of ``(time,
    seq)`` tuples in a ``heapq`` that holds ``pending`` events (pop the earliest, push
    one a pseudo-random delay later), nothing else per event."""
    import heapq

    queue = [((i * 7919) % 10_007, i) for i in range(pending)]
    heapq.heapify(queue)
    push, pop = heapq.heappush, heapq.heappop
    t0, c0 = time.perf_counter(), time.process_time()
    for seq in range(pending, pending + n):
        now, _ = pop(queue)
        push(queue, (now + (seq * 7919) % 10_007, seq))
    return time.perf_counter() - t0, time.process_time() - c0


def rust_heap_million(n: int = 1_000_000, pending: int = 1_000) -> tuple[float, float]:
    """Wall and CPU seconds for the same loop on Rust's ``BinaryHeap``
    (``cais._core.heap_yardstick``): the ceiling of a compiled event loop here, one
    queue operation per event and no other work."""
    from cais._core import heap_yardstick

    t0, c0 = time.perf_counter(), time.process_time()
    heap_yardstick(n, pending)
    return time.perf_counter() - t0, time.process_time() - c0


def load_average() -> str:
    """The one-minute load average and the cores, for the figures' context."""
    try:
        return f"load {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"
    except OSError:
        return "load unknown"


def run_row(setup: str, code: str, src: Path, may_fail: bool = False) -> dict[str, object] | None:
    """One row in a child process under ``src``; a failure stops the run (one line,
    exit 2), or, with ``may_fail`` (the revision compared against), is said and gives
    None."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run([sys.executable, "-c", CHILD.format(setup=setup, code=code)], capture_output=True,
                         text=True, env=env, cwd=src.parent)
    if out.returncode:
        last = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
        print(f"bench_core: a row failed under {src}: {last}", file=sys.stderr)
        if may_fail:
            return None
        raise SystemExit(2)
    return json.loads(out.stdout.strip().splitlines()[-1])


def worktree(rev: str) -> Path:
    """``rev`` checked out once into a temporary git worktree (one line and exit 2 if
    it is not a revision of this repository)."""
    known = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                           capture_output=True, text=True)
    if known.returncode:
        print(f"bench_core: --against {rev!r}: not a commit of this repository (try a hash from git log)",
              file=sys.stderr)
        raise SystemExit(2)
    path = Path(tempfile.gettempdir()) / f"cais-bench-{known.stdout.strip()[:12]}"
    if not (path / "src" / "cais").is_dir():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(path), rev], check=True,
                       capture_output=True)
    compiled(path)
    return path


def compiled(tree: Path) -> None:
    """Build the compiled core of a checked-out revision that has one (``rust/``), once,
    as ``pip install`` would: maturin's ``cargo rustc`` of the library as a ``cdylib``
    (release, the extension module's features), with the revision's own ``rustc-args``
    (its profile-guided build, where it has one)."""
    ext = tree / "src" / "cais" / f"_core{sysconfig.get_config_var('EXT_SUFFIX')}"
    if not (tree / "rust" / "Cargo.toml").is_file() or ext.is_file():
        return
    maturin = tomllib.loads((tree / "pyproject.toml").read_text()).get("tool", {}).get("maturin", {})
    target = tree / "rust" / "target"
    r = subprocess.run(["cargo", "rustc", "--release", "--locked", "--lib", "--features", "extension-module",
                        "--crate-type", "cdylib", "--manifest-path", str(tree / "rust" / "Cargo.toml"),
                        "--", *maturin.get("rustc-args", [])],
                       capture_output=True, text=True, env={**os.environ, "CARGO_TARGET_DIR": str(target)})
    if r.returncode:
        print(f"bench_core: cannot build the core of {tree}: {r.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        raise SystemExit(2)
    shutil.copy(target / "release" / "lib_core.so", ext)


def profile_state(tree: Path) -> str:
    """Whether ``tree``'s core profile (``rust/pgo``, its profile-guided build) was made
    from the core's sources as they are (``scripts/pgo_workload.py --state``); a stale
    one only costs speed."""
    script = tree / "scripts" / "pgo_workload.py"
    if not script.is_file():
        return "no profile-guided build"
    return subprocess.run([sys.executable, str(script), "--state"], capture_output=True, text=True,
                          check=True).stdout.strip()


def _rounds(text: str) -> int:
    n = int(text) if text.isdigit() else 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}")
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", default=BEFORE, help=f"git revision to compare with (default {BEFORE})")
    ap.add_argument("--no-against", action="store_true",
                    help="only this tree's rows, with the heapq yardstick (no revision, no speed-up)")
    ap.add_argument("--rounds", type=_rounds, default=2, help="runs of each row on each side (best is kept)")
    ap.add_argument("--full", action="store_true", help="also the long rows (LLaMA-7B train, NVL72 x 72)")
    ap.add_argument("--rows", nargs="+", metavar="TEXT", default=None,
                    help="only the rows whose name contains one of these (e.g. NVLS), long ones included")
    args = ap.parse_args()

    def chosen(name: str) -> bool:
        return not args.rows or any(t in name for t in args.rows)

    if not any(chosen(name) for name in ROWS):
        print(f"bench_core: --rows {' '.join(args.rows)}: no row matches; rows: {'; '.join(ROWS)}", file=sys.stderr)
        raise SystemExit(2)
    sides: list[tuple[str, Path]] = [("now", ROOT / "src")]
    if args.no_against:
        title = f"this tree against the bare heapq loop, best of {args.rounds}"
    else:
        base = worktree(args.against)
        kind = "its compiled core" if (base / "rust" / "Cargo.toml").is_file() else "pure Python"
        title = f"compiled core (this tree) against {args.against} ({kind}), best of {args.rounds}"
        sides.insert(0, ("before", base / "src"))
    loops: list[tuple[float, float]] = []  # the yardstick's (wall, CPU), one before each row and one at the end
    loads: list[str] = [load_average()]
    measured: list[tuple[str, int, dict[str, dict[str, object] | None]]] = []
    for name, (setup, code, long) in ROWS.items():
        if not chosen(name) or (long and not args.full and not args.rows):
            continue
        loops.append(heapq_million())
        best: dict[str, dict[str, object] | None] = {}
        for _ in range(args.rounds):
            for side, src in sides:
                if side in best and best[side] is None:
                    continue  # the revision cannot run this row
                r = run_row(setup, code, src, may_fail=side == "before")
                if r is None or side not in best or r["cpu_s"] < best[side]["cpu_s"]:  # type: ignore[index,operator]
                    best[side] = r
        events = int(best["now"]["result"][1])  # type: ignore[index]
        measured.append((name, events, best))
        loads.append(load_average())
    loops.append(heapq_million())
    loop_s, loop_cpu = min(w for w, _ in loops), min(c for _, c in loops)

    table = Table(title=title)
    cols = ["workload", "events", "simulated (us)", "wall before (s)", "wall now (s)", "CPU now (s)",
            "events/s now (CPU)", "speed-up", "RSS before (MB)", "RSS now (MB)", "same result",
            "against the loop (wall)", "against the loop (CPU)", "issue 40 target", "met (CPU)"]
    if args.no_against:
        cols = [c for c in cols if c not in ("wall before (s)", "speed-up", "RSS before (MB)", "same result")]
    for col in cols:
        table.add_column(col, justify="right")
    for name, events, best in measured:
        n, b = best["now"], best.get("before")
        assert n is not None
        wall_n, cpu_n = float(n["wall_s"]), float(n["cpu_s"])  # type: ignore[arg-type]
        by_wall, target, _ = against(TARGETS[name], events, wall_n, loop_s)
        by_cpu, _, met = against(TARGETS[name], events, cpu_n, loop_cpu)
        cell = {"workload": name, "events": f"{events:,}", "simulated (us)": f"{float(n['result'][0]):,.1f}",  # type: ignore[index]
                "wall before (s)": "-", "wall now (s)": f"{wall_n:.2f}", "CPU now (s)": f"{cpu_n:.2f}",
                "events/s now (CPU)": f"{events / cpu_n:,.0f}", "speed-up": "-", "RSS before (MB)": "-",
                "RSS now (MB)": f"{n['rss_mb']:,.0f}", "same result": "-", "against the loop (wall)": by_wall,
                "against the loop (CPU)": by_cpu, "issue 40 target": target, "met (CPU)": met}
        if b is not None:
            wall_b = float(b["wall_s"])  # type: ignore[arg-type]
            cell.update({"wall before (s)": f"{wall_b:.2f}", "speed-up": f"{wall_b / wall_n:.2f}x",
                         "RSS before (MB)": f"{b['rss_mb']:,.0f}",
                         "same result": "yes" if b["result"] == n["result"] else "NO"})
        row = [cell[c] for c in cols]
        table.add_row(*row)
    Console(width=280).print(table)
    print(f"bare heapq loop (1 M push/pop of (time, seq), 1,000 pending): wall {loop_s:.3f} s "
          f"({1_000_000 / loop_s:,.0f} events/s), CPU {loop_cpu:.3f} s ({1_000_000 / loop_cpu:,.0f} events/s); "
          f"fastest of {len(loops)} timings in this run, slowest wall {max(w for w, _ in loops):.3f} s, "
          f"CPU {max(c for _, c in loops):.3f} s")
    print(f"the same loop with a (time, seq, fn, args) entry and a no-op call (issue 20's yardstick): "
          f"{heapq_rate():,.0f} events/s (wall)")
    rust_wall, rust_cpu = min(rust_heap_million() for _ in range(3))
    print(f"the same loop on Rust's BinaryHeap (cais._core.heap_yardstick), the ceiling of a compiled event loop "
          f"here: wall {rust_wall:.3f} s, CPU {rust_cpu:.3f} s, {loop_cpu / rust_cpu:.1f}x the heapq loop's rate "
          f"(CPU): 10x the heapq loop's rate allows {loop_cpu / 10 / rust_cpu:.2f}x this bare queue's time per "
          f"event, for the queue and all the work an event does")
    print(f"load: {' -> '.join(loads + [load_average()])}")
    print(f"this tree's core build: {profile_state(ROOT)}")


if __name__ == "__main__":
    main()
