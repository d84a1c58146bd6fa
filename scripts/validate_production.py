"""The production TP all-reduce ops against every published measurement in
src/cais/data/published/production_allreduce.csv: one markdown row per CSV row with
the published time, ours, ours / published, the signed error and the source, then
the mean |error| and the signed bias of each set (``fit``: the rows the constants of scripts/fit_production.py were
chosen on; ``held-out``: rows they never saw; ``beyond``: held-out rows above the fit
set's largest size; ``unscored``: reported, not counted, the note says why), of every scored row together and of
all rows; then the scored rows' error by GPU count and kernel family.

    .venv/bin/python scripts/validate_production.py [--set fit held-out] [--rows 0 5 ...]

Ours is the row's call as its harness times it (``experiments.stack_op.op_loop``):
the row's kernels (its ``plan``: copies into and out of registered buffers are kernels
of their own; ``norm``: the residual add + RMSNorm fused) run back to back by the
schemes' own code under the row's launch mode (eager: the host issues every op;
cuda_graph: a graph replay), the steady-state time per call. The constants are the
system preset's (docs/validation.md, "Production all-reduce kernels").
"""

from __future__ import annotations

import argparse
import csv
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cais.config import SystemConfig, apply_overrides, load_system
from cais.experiments.stack_op import op_loop
from cais.kernels.stacks import Plan, parse_plan

CSV = Path(__file__).resolve().parents[1] / "src/cais/data/published/production_allreduce.csv"
COLUMNS = ("system", "gpus", "op", "algo", "plan", "bytes", "dtype", "hidden", "mode", "time_us", "set", "source",
           "note")
MODES = {"eager": "eager", "cuda_graph": "graph"}  # the CSV's mode -> gpu.launch
SETS = ("fit", "held-out", "beyond", "unscored")
SCORED = ("fit", "held-out", "beyond")
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class Row:
    """One published measurement: the call (system, GPUs, kernels, size, dtype, token
    width), its harness's launch mode, the time and where it comes from."""

    system: str
    gpus: int
    op: str
    algo: str
    plan_text: str
    nbytes: int
    dtype: str
    hidden: int | None
    mode: str
    time_us: float
    set: str
    source: str
    note: str

    @property
    def elem_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def plan(self) -> Plan:
        return parse_plan(self.plan_text, self.gpus, self.nbytes)


def rows(path: Path = CSV) -> list[Row]:
    """The CSV's rows, checked: every column present, a source, a known mode and set,
    a plan that parses."""
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        if tuple(reader.fieldnames or ()) != COLUMNS:
            raise ValueError(f"{path.name}: columns {reader.fieldnames}, expected {list(COLUMNS)}")
        out = []
        for i, r in enumerate(reader):
            for field, allowed in (("mode", tuple(MODES)), ("dtype", tuple(DTYPE_BYTES)), ("set", SETS)):
                if r[field] not in allowed:
                    raise ValueError(f"{path.name} row {i}: {field} '{r[field]}', expected one of {allowed}")
            if not r["source"].strip():
                raise ValueError(f"{path.name} row {i}: no source")
            row = Row(r["system"], int(r["gpus"]), r["op"], r["algo"], r["plan"], int(r["bytes"]), r["dtype"],
                      int(r["hidden"]) if r["hidden"] else None, r["mode"], float(r["time_us"]), r["set"],
                      r["source"], r["note"])
            row.plan  # noqa: B018 -- raises where the plan does not parse
            out.append(row)
        return out


def system_for(row: Row, overrides: Mapping[str, object] | None = None) -> SystemConfig:
    """The row's system at its GPU count and launch mode, with ``overrides`` (dotted
    fields, e.g. ``collective.barrier_us``) applied."""
    cfg = load_system(row.system, gpus=row.gpus)
    pairs = {"gpu.launch": MODES[row.mode], **{k: str(v) for k, v in (overrides or {}).items()}}
    return apply_overrides(cfg, pairs)


def ours_us(row: Row, overrides: Mapping[str, object] | None = None) -> float:
    """Our steady-state time per call of the row's op (us)."""
    return op_loop(system_for(row, overrides), row.plan, row.nbytes, row.elem_bytes, row.hidden).per_call_us


def size(b: int) -> str:
    for unit, k in (("MiB", 20), ("KiB", 10)):
        if b >= 1 << k:
            return f"{b / (1 << k):.3g} {unit}"
    return f"{b} B"


def short_source(source: str) -> str:
    """'repo PR #n' (and the block, for vLLM's per-world-size blocks) from the source text."""
    head = source.split(" (", 1)[0]
    for owner in ("sgl-project/", "vllm-project/", "flagos-ai/", "yifuwang/"):
        head = head.replace(owner, "")
    for block in ("TP=2", "TP=4", "TP=6", "TP=8", "World Size = 2", "world size inferred 8"):
        if block in source:
            return f"{head} ({block.replace('world size inferred 8', 'TP=8?').replace('World Size = 2', 'TP=2')})"
    return head


def table(selected: Sequence[Row], times: Sequence[float]) -> str:
    """One markdown row per CSV row, with its signed error."""
    lines = ["| set | plan | GPUs | size | dtype | mode | published (us) | ours (us) | ours / published | error | source |",
             "|---|---|---:|---:|---|---|---:|---:|---:|---:|---|"]
    for r, t in zip(selected, times):
        lines.append(f"| {r.set} | {r.plan_text} | {r.gpus} | {size(r.nbytes)} | {r.dtype} | {r.mode} | "
                     f"{r.time_us:g} | {t:.2f} | {t / r.time_us:.2f} | {100 * (t / r.time_us - 1):+.0f} % | "
                     f"{short_source(r.source)} |")
    return "\n".join(lines)


def mean_error(selected: Sequence[Row], times: Sequence[float]) -> float:
    """Mean |ours / published - 1| (a fraction)."""
    errs = [abs(t / r.time_us - 1) for r, t in zip(selected, times)]
    return sum(errs) / len(errs)


def bias(selected: Sequence[Row], times: Sequence[float]) -> float:
    """Mean signed ours / published - 1 (a fraction; negative: ours too fast)."""
    errs = [t / r.time_us - 1 for r, t in zip(selected, times)]
    return sum(errs) / len(errs)


def scored_by_gpus(selected: Sequence[Row], times: Sequence[float]) -> dict[str, dict[str, float]]:
    """Mean |error| and signed bias of the scored rows (not ``unscored``) by GPU count
    and kernel family (custom, multimem, fused), rounded to 0.1 %."""
    groups: dict[str, list[tuple[Row, float]]] = {}
    for r, t in zip(selected, times):
        if r.set in SCORED:
            fam = r.algo.split("-")[0]
            groups.setdefault(f"TP={r.gpus} {fam}", []).append((r, t))
    return {k: {"rows": len(v), "mean_error": round(mean_error(*zip(*v)), 3), "bias": round(bias(*zip(*v)), 3)}
            for k, v in sorted(groups.items())}


def summary(selected: Sequence[Row], times: Sequence[float]) -> str:
    """Mean |error| and signed bias per set and, within it, per source; then every
    scored row together, and all rows."""
    lines = ["| set | source | rows | mean \\|ours / published - 1\\| | bias (signed) |", "|---|---|---:|---:|---:|"]

    def line(s: str, src: str, pairs: list[tuple[Row, float]], bold: bool = False) -> str:
        rs, ts = zip(*pairs)
        e, b = f"{100 * mean_error(rs, ts):.0f} %", f"{100 * bias(rs, ts):+.0f} %"
        if bold:
            return f"| **{s}** | {src} | {len(pairs)} | **{e}** | **{b}** |"
        return f"| {s} | {src} | {len(pairs)} | {e} | {b} |"
    for s in SETS:
        mine = [(r, t) for r, t in zip(selected, times) if r.set == s]
        if not mine:
            continue
        by: dict[str, list[tuple[Row, float]]] = {}
        for r, t in mine:
            by.setdefault(short_source(r.source), []).append((r, t))
        for src, pairs in by.items():
            lines.append(line(s, src, pairs))
        lines.append(line(s, "all", mine, bold=True))
    scored = [(r, t) for r, t in zip(selected, times) if r.set in SCORED]
    if scored:
        lines.append(line("scored", "fit + held-out + beyond", scored, bold=True))
    lines.append(line("every row", "scored and unscored", list(zip(selected, times)), bold=True))
    return "\n".join(lines)


def by_gpus_table(selected: Sequence[Row], times: Sequence[float]) -> str:
    """The scored rows' error by GPU count and kernel family."""
    lines = ["| GPUs, kernel | rows | mean \\|error\\| | bias (signed) |", "|---|---:|---:|---:|"]
    for k, v in scored_by_gpus(selected, times).items():
        lines.append(f"| {k} | {v['rows']} | {100 * v['mean_error']:.0f} % | {100 * v['bias']:+.0f} % |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--set", nargs="+", choices=SETS, default=None, help="only these sets (default: all)")
    ap.add_argument("--rows", type=int, nargs="+", default=None, help="CSV row indices (0-based; default: all)")
    args = ap.parse_args()
    every = rows()
    chosen = [every[i] for i in args.rows] if args.rows else every
    if args.set:
        chosen = [r for r in chosen if r.set in args.set]
    times = [ours_us(r) for r in chosen]
    print(table(chosen, times))
    print()
    print(summary(chosen, times))
    print()
    print(by_gpus_table(chosen, times))


if __name__ == "__main__":
    main()
