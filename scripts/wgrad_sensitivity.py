"""How the weight gradients' gathered operands are fed (``train.wgrad_inputs``,
``train.wgrad_grads``; docs/schemes.md, "Weight gradients") moves a training period:
every choice a scheme can run, on the Table I models at 8 GPUs x 66 SMs, in one world
per run. Prints a Markdown table (the period per model, the geomean against TP-NVLS,
the bytes delivered to the GPUs) and writes it, with the command, to ``--out``.

    .venv/bin/python scripts/wgrad_sensitivity.py [--system paper-world] [--schemes cais sp-nvls]
        [--workers 2] [--out docs/reproduce-results/wgrad_sensitivity_paper-world.md]
"""

from __future__ import annotations

import argparse
import math
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from cais.experiments.layer import run_layer
from cais.config import apply_overrides, load_system
from cais.provenance import git_commit, now_utc
from cais.schemes import get_scheme
from cais.workload.models import load_model

MODELS = ("paper-llama-7b", "paper-mega-gpt-4b", "paper-mega-gpt-8b")
REMOTE = ("refetch", "refetch-overlap", "keep", "keep-overlap")
COLLECTIVE = ("refetch", "refetch-overlap", "keep")


def choices(scheme: str) -> list[tuple[str, str]]:
    """(inputs, grads) pairs the scheme can run, its own first."""
    sch = get_scheme(scheme)
    if not sch.sp:
        return [("scheme", "scheme")]
    pairs = ([(i, g) for i in REMOTE for g in REMOTE] if sch.loads_remote else [(i, "keep") for i in COLLECTIVE])
    own = (sch.wgrad_inputs, sch.wgrad_grads)
    return [own] + [p for p in pairs if p != own]


def one(job: tuple[str, str, str, str, str]) -> tuple[str, str, str, str, float, float]:
    system, model, scheme, inputs, grads = job
    cfg = apply_overrides(load_system(system), {"train.wgrad_inputs": inputs, "train.wgrad_grads": grads})
    r = run_layer(cfg, load_model(model), scheme, "train", sms=66)
    down = sum(v["down"] for v in r.as_json()["wire_bytes"].values()) / 1e9
    return model, scheme, inputs, grads, r.total_us, down


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--system", default="paper-world")
    ap.add_argument("--schemes", nargs="+", default=["cais", "sp-nvls"])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    jobs = [(a.system, m, "tp-nvls", "scheme", "scheme") for m in MODELS]
    jobs += [(a.system, m, s, i, g) for s in a.schemes for i, g in choices(s) for m in MODELS]
    with ProcessPoolExecutor(a.workers) as pool:
        got = list(pool.map(one, jobs))
    tp = {m: t for m, s, _, _, t, _ in got if s == "tp-nvls"}
    rows: dict[tuple[str, str, str], dict[str, tuple[float, float]]] = {}
    for m, s, i, g, t, down in got:
        rows.setdefault((s, i, g), {})[m] = (t, down)
    head = ("| scheme | inputs | grads | " + " | ".join(f"{m} (us)" for m in MODELS)
            + " | over TP-NVLS (geomean) | delivered (GB, sum) |")
    lines = [head, "|" + "---|" * (6 + len(MODELS) - 1)]
    for (s, i, g), by in rows.items():
        speed = math.exp(sum(math.log(tp[m] / by[m][0]) for m in MODELS) / len(MODELS))
        own = " (its own)" if (i, g) == (get_scheme(s).wgrad_inputs, get_scheme(s).wgrad_grads) else ""
        lines.append(f"| {s}{own} | {i} | {g} | " + " | ".join(f"{by[m][0]:,.1f}" for m in MODELS)
                     + f" | {speed:.3f}x | {sum(by[m][1] for m in MODELS):,.2f} |")
    table = "\n".join(lines)
    print(table)
    if a.out:
        cmd = "python scripts/wgrad_sensitivity.py " + " ".join(sys.argv[1:] if argv is None else argv)
        Path(a.out).write_text(f"# Weight gradients' gathered operands on {a.system}: every choice, train, "
                               f"8 GPUs x 66 SMs\n\nMade by `{cmd}` at commit {git_commit()} "
                               f"({now_utc()}).\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
