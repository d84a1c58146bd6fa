"""The production TP all-reduce kernels (kernels/production_ar.py) against every
published measurement in src/cais/data/published/production_allreduce.csv (issue 37):
one markdown row per CSV row with the published time, ours, ours / published and the
source.

    .venv/bin/python scripts/validate_production.py [--rows 0 5 ...]

Ours is the standalone collective as `cais collective --op allreduce --algo ALGO
--bytes B --system S --gpus N` runs it (`experiments.collective.run_collective`: the
kernel launch, then the kernel, timed from the launch), with two fields the CLI leaves
at their defaults set from the row: a CUDA-graph row of vLLM's custom all-reduce runs
with its input registered (no copy into the registered buffer, as vLLM does in a
graph; the CLI always charges the eager copy), and a fused row splits the buffer into
tokens of the source's hidden size (the CLI assumes 4096 elements). Nothing here is
fitted: the table is a check.
"""

from __future__ import annotations

import argparse
import csv
from dataclasses import dataclass
from pathlib import Path

from cais.experiments.collective import check_collective, run_collective
from cais.config import PS_PER_US, load_system
from cais.kernels.collectives import CollectiveSpec, build
from cais.machine import Machine

CSV = Path(__file__).resolve().parents[1] / "src/cais/data/published/production_allreduce.csv"
COLUMNS = ("system", "gpus", "op", "algo", "bytes", "dtype", "hidden", "mode", "time_us", "source", "note")
MODES = ("eager", "cuda_graph")
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class Row:
    system: str
    gpus: int
    op: str
    algo: str
    nbytes: int
    dtype: str
    hidden: int | None
    mode: str
    time_us: float
    source: str
    note: str

    @property
    def elem_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def gpu_in_doubt(self) -> bool:
        return self.note.startswith("GPU IN DOUBT")

    @property
    def registered(self) -> bool:
        """vLLM's custom all-reduce reads a registered input in a CUDA graph; eager, it
        copies the input into its registered buffer first."""
        return self.mode == "cuda_graph" and self.algo.startswith("custom")


def rows(path: Path = CSV) -> list[Row]:
    """The CSV's rows, checked: every column present, a source and a known mode."""
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        if tuple(reader.fieldnames or ()) != COLUMNS:
            raise ValueError(f"{path.name}: columns {reader.fieldnames}, expected {list(COLUMNS)}")
        out = []
        for i, r in enumerate(reader):
            if r["mode"] not in MODES:
                raise ValueError(f"{path.name} row {i}: mode '{r['mode']}', expected one of {MODES}")
            if r["dtype"] not in DTYPE_BYTES:
                raise ValueError(f"{path.name} row {i}: dtype '{r['dtype']}', expected one of {list(DTYPE_BYTES)}")
            if not r["source"].strip():
                raise ValueError(f"{path.name} row {i}: no source")
            out.append(Row(r["system"], int(r["gpus"]), r["op"], r["algo"], int(r["bytes"]), r["dtype"],
                           int(r["hidden"]) if r["hidden"] else None, r["mode"], float(r["time_us"]),
                           r["source"], r["note"]))
        return out


def ours_us(row: Row) -> float:
    """Our time for the row's call (us): the CLI's run where the CLI's defaults fit the
    row, else the same run with the row's registered input and token size."""
    cfg = load_system(row.system, gpus=row.gpus)
    if not row.registered and row.hidden is None:
        return run_collective(cfg, row.op, row.algo, row.nbytes, elem_bytes=row.elem_bytes).time_us
    count = check_collective(cfg, row.op, row.algo, row.nbytes, row.elem_bytes)
    extra: dict[str, object] = {"registered": row.registered}
    if row.hidden is not None:
        extra["row_elems"] = row.hidden
    spec = CollectiveSpec(row.op, row.algo, count, row.elem_bytes, **extra)
    m = Machine(cfg)
    kernels = build(m, spec)
    for gpu, k in zip(m.gpus, kernels):
        gpu.launch(k, m.launch_ps)
    m.run()
    return max(k.finished_at or 0 for k in kernels) / PS_PER_US


def _kernel_us(row: Row) -> float:
    """The kernel alone (us): its input registered, no launch, no copy."""
    cfg = load_system(row.system, gpus=row.gpus)
    count = check_collective(cfg, row.op, row.algo, row.nbytes, row.elem_bytes)
    extra: dict[str, object] = {"registered": True}
    if row.hidden is not None:
        extra["row_elems"] = row.hidden
    m = Machine(cfg)
    kernels = build(m, CollectiveSpec(row.op, row.algo, count, row.elem_bytes, **extra))
    for gpu, k in zip(m.gpus, kernels):
        gpu.launch(k, 0)
    m.run()
    return max(k.finished_at or 0 for k in kernels) / PS_PER_US


def launched_us(row: Row) -> float:
    """One call of the row's back-to-back loop under the launch model (issue 58,
    docs/compute-model.md "Launch modes", the system's constants): on the GPU, per
    kernel of the call the dependent-kernel gap (PDL's for the fused kernel, launched
    with PDL in its source) and the kernel; a copy into the registered buffer (vLLM's
    custom all-reduce, eager) or into and out of the symmetric buffer (multimem) is a
    kernel of its own at HBM rate; the closing system-scope barrier after every kernel
    but the fused one-shot. Eager, the host issues one op and a launch per further
    kernel, and the slower of host and GPU sets the loop's rate."""
    cfg = load_system(row.system, gpus=row.gpus)
    g = cfg.gpu
    kind = row.algo.split("-")[0]
    copies = 2 if kind == "multimem" else 1 if (kind == "custom" and not row.registered) else 0
    copy = 2 * row.nbytes / g.hbm_bandwidth_GBps / 1000
    fence = 0.0 if row.algo == "fused-oneshot" or (kind == "fused" and row.nbytes // (row.hidden or 4096)
                                                   // row.elem_bytes <= 128) else cfg.collective.fence_us
    gap = g.pdl_gap_us if kind == "fused" else g.kernel_gap_us
    gpu = copies * (g.kernel_gap_us + copy) + gap + _kernel_us(row) + fence
    if row.mode == "eager":
        return max(g.host_op_us + copies * g.host_launch_us, gpu)
    return gpu


def size(b: int) -> str:
    for unit, k in (("MiB", 20), ("KiB", 10)):
        if b >= 1 << k:
            return f"{b / (1 << k):.3g} {unit}"
    return f"{b} B"


def short_source(source: str) -> str:
    """'owner/repo PR #n' from the source text."""
    head = source.split(" (", 1)[0]
    return head.replace("sgl-project/", "").replace("vllm-project/", "").replace("flagos-ai/", "")


def table(selected: list[Row]) -> str:
    """One markdown row per CSV row; a source whose GPU is in doubt (its note says so)
    is marked with a dagger."""
    lines = ["| kernel | system | GPUs | size | dtype | mode | published (us) | ours (us) | ours / published | source "
             "| launched (us) | launched / published |",
             "|---|---|---:|---:|---|---|---:|---:|---:|---|---:|---:|"]
    for r in selected:
        ours, launched = ours_us(r), launched_us(r)
        lines.append(f"| {r.algo} | {r.system} | {r.gpus} | {size(r.nbytes)} | {r.dtype} | {r.mode} | "
                     f"{r.time_us:g} | {ours:.2f} | {ours / r.time_us:.2f} | {short_source(r.source)}"
                     f"{' (GPU in doubt)' if r.gpu_in_doubt else ''} | {launched:.2f} | {launched / r.time_us:.2f} |")
    return "\n".join(lines)


def errors(selected: list[Row]) -> str:
    """Mean |launched / published - 1| per source (and its GPU-certain rows)."""
    by: dict[str, list[float]] = {}
    for r in selected:
        e = abs(launched_us(r) / r.time_us - 1)
        by.setdefault(short_source(r.source) + (" (GPU in doubt)" if r.gpu_in_doubt else ""), []).append(e)
    return "\n".join(f"{k}: mean |error| {100 * sum(v) / len(v):.0f} % over {len(v)} rows" for k, v in by.items())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=None, help="CSV row indices (0-based; default: all)")
    args = ap.parse_args()
    every = rows()
    chosen = [every[i] for i in args.rows] if args.rows else every
    print(table(chosen))
    print()
    print(errors(chosen))


if __name__ == "__main__":
    main()
