"""The compiled event core against the pure-Python engine, side by side in one run:
each row runs in its own process under this tree and under a git revision (by
default the last commit before the core, ``ea63d9d``), alternating, and reports
wall time, events per second, peak memory, the speed-up and whether both computed
the same result (simulated time and event count).

    .venv/bin/python benchmarks/bench_core.py [--against REV] [--rounds 2] [--full] [--rows TEXT ...]

``--full`` adds the long rows (the LLaMA-7B training period, 1 GiB NVLS AllReduce
on all 72 GPUs of ``nvl72`` in the full model). The revision is checked out once
into a temporary git worktree and imported from there (``PYTHONPATH``), with this
environment's dependencies; a revision with a compiled core of its own (``rust/``) has
it built there once with ``cargo``, so the run can also compare two versions of the
core (e.g. ``--against 852d1c2``, the core before its units' state moved into
GIL-guarded cells).

Targets (issue 20): 1 GiB NVLS AllReduce events/s at least 10x the pure-Python
engine's and at least 2x a bare ``heapq`` loop's; LLaMA-7B ``cais`` period under 5 s
(prefill) and 20 s (train); NVL72 1 GiB NVLS in the full model under 60 s; peak
memory no higher than before.
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
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
BEFORE = "ea63d9d"  # the last commit whose event loop, channels and credits were Python

# name -> (what it sets up, what it runs and times, in a child process; a long row?)
_LAYER = ("from cais.experiments.layer import run_layer\n"
          "from cais.hw.config import load_system\n"
          "from cais.workload.models import load_model\n"
          "cfg, model = load_system('dgx-h100'), load_model('paper-llama-7b')\n")
ROWS: dict[str, tuple[str, str, bool]] = {
    "NVLS AllReduce 1 GiB, 8 x H100": (
        "from cais.experiments.collective import run_collective\n"
        "from cais.hw.config import apply_overrides, load_system\n"
        "cfg = apply_overrides(load_system('dgx-h100'), {'collective.nvls_buffers': 'registered'})\n",
        "r = run_collective(cfg, 'allreduce', 'nvls', 1 << 30)\n"
        "result = (r.time_us, r.events)", False),
    "paper-llama-7b cais prefill, 8 x 66 SMs": (
        _LAYER, "r = run_layer(cfg, model, 'cais', 'prefill', 66)\nresult = (r.total_us, r.events)", False),
    "paper-llama-7b cais train, 8 x 66 SMs": (
        _LAYER, "r = run_layer(cfg, model, 'cais', 'train', 66)\nresult = (r.total_us, r.events)", True),
    "NVLS AllReduce 1 GiB, nvl72 x 72, full model": (
        "import os\n"
        "os.environ['CAIS_MAX_EVENTS'] = '60000000'\n"
        "from cais.experiments.collective import run_collective\n"
        "from cais.hw.config import apply_overrides, load_system\n"
        "# the zero-copy kernel on the preset as it was at the revision compared against\n"
        "cfg = apply_overrides(load_system('nvl72'), {'collective.nvls_buffers': 'registered',\n"
        "                                             'collective.nvls_channels': '16', 'switch.reduce_GBps': '1690'})\n",
        "r = run_collective(cfg, 'allreduce', 'nvls', 1 << 30)\n"
        "result = (r.time_us, r.events)", True),
}

CHILD = """
import json, resource, sys, time
{setup}
t0 = time.perf_counter()  # the run alone, not the imports
{code}
wall = time.perf_counter() - t0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({{"wall_s": wall, "rss_mb": rss, "result": list(result)}}))
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


def run_row(setup: str, code: str, src: Path) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run([sys.executable, "-c", CHILD.format(setup=setup, code=code)], capture_output=True,
                         text=True, env=env, cwd=src.parent)
    if out.returncode:
        last = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
        print(f"bench_core: a row failed under {src}: {last}", file=sys.stderr)
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
    as ``pip install`` would (release, the extension module's features)."""
    ext = tree / "src" / "cais" / f"_core{sysconfig.get_config_var('EXT_SUFFIX')}"
    if not (tree / "rust" / "Cargo.toml").is_file() or ext.is_file():
        return
    target = tree / "rust" / "target"
    r = subprocess.run(["cargo", "build", "--release", "--locked", "--features", "extension-module",
                        "--manifest-path", str(tree / "rust" / "Cargo.toml")],
                       capture_output=True, text=True, env={**os.environ, "CARGO_TARGET_DIR": str(target)})
    if r.returncode:
        print(f"bench_core: cannot build the core of {tree}: {r.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        raise SystemExit(2)
    shutil.copy(target / "release" / "lib_core.so", ext)


def _rounds(text: str) -> int:
    n = int(text) if text.isdigit() else 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}")
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", default=BEFORE, help=f"git revision to compare with (default {BEFORE})")
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
    base = worktree(args.against)
    kind = "its compiled core" if (base / "rust" / "Cargo.toml").is_file() else "pure Python"
    table = Table(title=f"compiled core (this tree) against {args.against} ({kind}), best of {args.rounds}")
    for col in ("workload", "events", "wall before (s)", "wall now (s)", "speed-up", "events/s now",
                "RSS before (MB)", "RSS now (MB)", "same result"):
        table.add_column(col, justify="right")
    rates: dict[str, float] = {}
    for name, (setup, code, long) in ROWS.items():
        if not chosen(name) or (long and not args.full and not args.rows):
            continue
        best: dict[str, dict[str, object]] = {}
        for _ in range(args.rounds):
            for side, src in (("before", base / "src"), ("now", ROOT / "src")):
                r = run_row(setup, code, src)
                if side not in best or r["wall_s"] < best[side]["wall_s"]:  # type: ignore[operator]
                    best[side] = r
        b, n = best["before"], best["now"]
        events = int(n["result"][1])  # type: ignore[index]
        wall_b, wall_n = float(b["wall_s"]), float(n["wall_s"])  # type: ignore[arg-type]
        rates[name] = events / wall_n
        table.add_row(name, f"{events:,}", f"{wall_b:.2f}", f"{wall_n:.2f}", f"{wall_b / wall_n:.2f}x",
                      f"{rates[name]:,.0f}", f"{b['rss_mb']:,.0f}", f"{n['rss_mb']:,.0f}",
                      "yes" if b["result"] == n["result"] else "NO")
    Console(width=160).print(table)
    rate = max(heapq_rate() for _ in range(args.rounds))  # after the rows, alone, best of the rounds as they are
    first = next(iter(rates))
    print(f"bare heapq loop: {rate:,.0f} events/s; {first}: {rates[first] / rate:.2f}x of it")


if __name__ == "__main__":
    main()
