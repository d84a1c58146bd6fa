"""Fig. 17 beyond the paper: weak scaling of CAIS and CoCoNet-NVLS on the ``nvl72``
preset from 8 to 72 GPUs in the full model (every GPU simulated), with the merge-table
need per port at each size.

The paper stops at 32 GPUs (Fig. 17: LLaMA-7B at 8 GPUs, hidden size grown with the
GPU count, CAIS's per-GPU throughput within 5 % at 32). Simulated events grow about
as the cube of the GPU count under weak scaling (more tiles per GPU, longer K per
tile, more GPUs), so by default this script runs the reproduction's *quick* size, the
one ``cais reproduce fig17 --quick`` uses: hidden 1024, FFN 4096 and 8 heads at 8 GPUs
(grown in proportion), one sequence of 512 tokens, prefill, 66 SMs per GPU.
``--size paper`` runs the paper's own size instead: Table I's LLaMA-7B at 8 GPUs
(hidden 4096, FFN 11264, 32 heads, grown the same way), with the tokens given. With
``--seq 3072 --set gpu.l2_keeps_peer_reads=true`` (the paper's traffic model) CAIS at
72 GPUs is 0.3 billion events, about 11 minutes; without the flag every column tile
reloads its rows and 32 GPUs alone are 0.27 billion (72 GPUs: about 3 billion).

    [CAIS_MAX_EVENTS=400000000] .venv/bin/python scripts/fig17_nvl72.py [--gpus 8 16 32 64 72] [--seq 512]
        [--size quick|paper] [--schemes cais coconet-nvls] [--set KEY=VALUE ...] [--workers 2] [--out FILE.md]

``--seq``: the tokens of the one sequence (512: the quick size; more tiles per GPU,
and about proportionally more events, with more). ``--set``: system overrides, as
``cais run --set`` takes them (e.g. ``gpu.l2_keeps_peer_reads=true``, the paper's
traffic model).

Each point runs in its own process (its peak memory is its own). Prints a table and
writes it, with the command, to ``--out`` (default
docs/reproduce-results/fig17_nvl72.md).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
N0 = 8  # the GPU count the sizes below are given at
SIZES = ("quick", "paper")  # `cais reproduce fig17 --quick`'s size; the paper's (Table I's LLaMA-7B)
SCHEMES = ("cais", "coconet-nvls")


def base_size(size: str) -> tuple[str, int, int, int]:
    """The model a ``--size`` grows and its hidden, FFN and heads at ``N0`` GPUs."""
    if size == "quick":
        return "paper-mega-gpt-4b", 1024, 4096, 8
    from cais.workload.models import load_model

    llama = load_model("paper-llama-7b")  # as `cais reproduce fig17` grows it
    return "paper-llama-7b", llama.hidden, llama.ffn_hidden, llama.heads


def point(gpus: int, scheme: str, seq: int = 512, sets: tuple[tuple[str, str], ...] = (),
          size: str = "quick") -> dict[str, object]:
    """One weak-scaling point: its time, GEMM throughput per GPU and merge metrics."""
    from cais.experiments.spec import LayerSpec, SystemSpec

    model, hidden0, ffn0, heads0 = base_size(size)
    k = gpus // N0 if gpus % N0 == 0 else gpus / N0
    shape = (("hidden", int(hidden0 * k)), ("ffn_hidden", int(ffn0 * k)), ("heads", int(heads0 * k)))
    spec = LayerSpec(model=model, scheme=scheme, mode="prefill",
                     system=SystemSpec("nvl72", gpus=gpus, sets=sets, set_label="--set"),
                     sms=66, batch=1, seq=seq, shape=shape)
    t0 = time.perf_counter()
    r = spec.run()
    j = r.as_json()
    hidden, ffn = shape[0][1], shape[1][1]
    flops = 2 * r.tokens * (4 * hidden ** 2 + 2 * hidden * ffn) / gpus  # the four projections' GEMMs per GPU
    merge = j.get("merge_table_peak_kB") or {}
    return {"gpus": gpus, "scheme": scheme, "hidden": hidden, "total_us": r.total_us,
            "tflops_per_gpu": flops / r.total_us / 1e6, "events": r.events,
            "wall_s": time.perf_counter() - t0, "rss_MB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
            "table_peak_kB": merge.get("max"), "table_mean_kB": (j.get("merge_table_mean_kB") or {}).get("max"),
            "bypassed": (j.get("merge") or {}).get("bypassed")}


def _fmt(v: object, spec: str) -> str:
    return "–" if v is None else format(v, spec)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, nargs="+", default=[8, 16, 32, 64, 72])
    ap.add_argument("--seq", type=int, default=512, help="tokens of the one sequence (default: 512, the quick size)")
    ap.add_argument("--size", default="quick", choices=SIZES,
                    help="the model grown with the GPUs (quick: hidden 1024 at 8 GPUs; paper: LLaMA-7B)")
    ap.add_argument("--schemes", nargs="+", default=list(SCHEMES), choices=SCHEMES)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a system override (repeatable)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "reproduce-results" / "fig17_nvl72.md")
    args = ap.parse_args(argv)
    if args.workers < 1 or any(g < 2 or g > 72 for g in args.gpus) or args.seq < 1:
        print("fig17_nvl72: --workers and --seq must be at least 1 and --gpus each in 2..72", file=sys.stderr)
        return 2
    sets = tuple(tuple(s.split("=", 1)) for s in args.set)
    if any(len(s) != 2 for s in sets):
        print("fig17_nvl72: --set takes KEY=VALUE", file=sys.stderr)
        return 2
    if not args.out.parent.is_dir():
        print(f"fig17_nvl72: --out: no such directory: {args.out.parent}", file=sys.stderr)
        return 2
    from cais.errors import UserError

    jobs = [(g, s) for g in sorted(args.gpus, reverse=True) for s in args.schemes]  # the longest first
    try:
        with ProcessPoolExecutor(args.workers, max_tasks_per_child=1) as pool:
            rows = list(pool.map(point, *zip(*jobs), [args.seq] * len(jobs), [sets] * len(jobs),
                                 [args.size] * len(jobs)))
    except UserError as e:  # a size the model refuses (heads or tokens that do not split over the GPUs)
        print(f"fig17_nvl72: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fig17_nvl72: interrupted; nothing written", file=sys.stderr)
        return 130
    rows.sort(key=lambda r: (r["scheme"], r["gpus"]))
    first = rows[0]["scheme"]  # the reference: the first scheme's smallest size
    ref = next(r["tflops_per_gpu"] for r in rows if r["scheme"] == first and r["gpus"] == min(args.gpus))
    cols = ["scheme", "GPUs", "hidden", "time (us)", "TFLOP/s per GPU", f"vs smallest {first}", "table peak (kB/port)",
            "table mean (kB/port)", "bypassed", "events", "wall (s)", "RSS (MB)"]
    lines = [[str(r["scheme"]), str(r["gpus"]), f"{r['hidden']:,}", f"{r['total_us']:,.1f}",
              f"{r['tflops_per_gpu']:.1f}", f"{r['tflops_per_gpu'] / ref:.3f}", _fmt(r["table_peak_kB"], ".1f"),
              _fmt(r["table_mean_kB"], ".2f"), _fmt(r["bypassed"], ","), f"{r['events']:,}", f"{r['wall_s']:.0f}",
              str(r["rss_MB"])] for r in rows]
    model, hidden0, ffn0, heads0 = base_size(args.size)
    size = ("quick size" if args.seq == 512 else f"{args.seq:,} tokens") if args.size == "quick" \
        else f"LLaMA-7B, {args.seq:,} tokens"
    table = Table(title=f"Fig. 17 on nvl72 ({size}): weak scaling, full model")
    for c in cols:
        table.add_column(c, justify="right")
    for line in lines:
        table.add_row(*line)
    Console().print(table)
    seq_flag = ("" if args.seq == 512 else f" --seq {args.seq}") + ("" if args.size == "quick" else f" --size {args.size}")
    seq_flag += "".join(f" --set {k}={v}" for k, v in sets)
    if args.schemes != list(SCHEMES):
        seq_flag += " --schemes " + " ".join(args.schemes)
    limit = os.environ.get("CAIS_MAX_EVENTS")  # the larger sizes pass the default event limit
    env = f"CAIS_MAX_EVENTS={limit} " if limit else ""
    md = [f"# Fig. 17 on `nvl72`, {min(args.gpus)} to {max(args.gpus)} GPUs ({size}, full model)", "",
          f"`{env}.venv/bin/python scripts/fig17_nvl72.py --gpus {' '.join(map(str, args.gpus))}{seq_flag}`: prefill, 66 "
          f"SMs per GPU, one sequence of {args.seq:,} tokens, `{model}` with hidden {hidden0} / FFN {ffn0} / {heads0} "
          f"heads at {N0} GPUs grown with the GPU count"
          + (" (`scripts/fig17_nvl72.py` says why not the paper's LLaMA-7B size)." if args.size == "quick" else "."),
          "",
          "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    md += ["| " + " | ".join(line) + " |" for line in lines]
    args.out.write_text("\n".join(md) + "\n")
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
