"""The compute model's skinny (decode-sized) GEMMs against published measurements
(src/cais/data/published/small_gemm.csv: cuBLAS through F.linear on an H100, timed as
back-to-back calls in a CUDA graph). Ours is the GEMM kernel every scheme runs
(``kernels.gemm.gemm_kernel``: the tile the model picks, split-K / stream-K by
CUTLASS's heuristic where less than half a wave of tiles, the operands' HBM bytes as a
floor) on one GPU of the row's system, plus the graph's gap between dependent kernels
(``gpu.kernel_gap_us``). The split's fix-up is fitted on the rows of the fit set
(scripts/fit_split.py); the held-out rows are a check.

    .venv/bin/python scripts/validate_small_gemm.py
"""

from __future__ import annotations

import csv
from pathlib import Path

import dataclasses
import sys

from cais.config import PS_PER_US, load_system
from cais.hw.compute import ComputeModel
from cais.kernels.gemm import gemm_kernel, gemm_shape
from cais.machine import Machine

CSV = Path(__file__).resolve().parents[1] / "src/cais/data/published/small_gemm.csv"


sys.path.insert(0, str(Path(__file__).resolve().parent))
from fit_split import set_of  # noqa: E402  (the fit and held-out sets, by source)


def ours_us(system: str, m: int, n: int, k: int, split: bool = True) -> tuple[float, str]:
    """Our graph-mode time of C[m,n] = A[m,k] @ B[k,n] (us) and its tiling
    (``split``: False for every GEMM data-parallel, the model before splits)."""
    cfg = load_system(system, gpus=2)
    cm = ComputeModel.load(cfg.gpu.compute_model, cfg.gpu.hbm_bandwidth_GBps)
    if not split:
        cm = dataclasses.replace(cm, split_gemms=False)
    sms = cfg.gpu.sms
    shape = gemm_shape(cm, m, n, k, sms)
    floor = max(0, cm.memory_time_ps(2 * (m * k + k * n + m * n), sms, sms) - cm.memory_time_ps(0, sms, sms))
    floor //= -(-shape.tiles // sms)
    mach = Machine(cfg)
    kernel = gemm_kernel(cm, shape, "gemm", floor_ps=floor)
    mach.gpus[0].launch(kernel, round(cfg.gpu.kernel_gap_us * PS_PER_US))
    mach.run()
    how = ("" if not shape.units else f", split-K x {shape.units // shape.tiles}" if shape.units % shape.tiles == 0
           else f", stream-K over {shape.units}")
    return (kernel.finished_at or 0) / PS_PER_US, f"{shape.tiles} tiles of {shape.bm}x{shape.bn}{how}"


def main() -> None:
    with CSV.open(newline="") as f:
        rows = list(csv.DictReader(f))
    print("| M | N | K | published (us) | ours (us) | ours / published | without split | our tiling | GPU | "
          "source | set |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|---|---|---|")
    err: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        m, n, k = int(r["m"]), int(r["n"]), int(r["k"])
        t, tiling = ours_us(r["system"], m, n, k)
        t0, _ = ours_us(r["system"], m, n, k, split=False)
        pub = float(r["time_us"])
        src = r["source"].split(" (", 1)[0].replace("vllm-project/", "")
        which = set_of(r["source"])
        for key in (which, "all"):
            err.setdefault(key, []).append((t / pub - 1, t0 / pub - 1))
        print(f"| {m} | {n} | {k} | {pub:g} | {t:.1f} | {t / pub:.2f} | {t0 / pub:.2f} | {tiling} | {r['gpu']} | "
              f"{src} | {which} |")
    print()
    print("| set | rows | mean abs error | max abs error | signed bias | mean abs error without split |")
    print("|---|---:|---:|---:|---:|---:|")
    for key in ("fit", "held-out", "all"):
        e = err[key]
        mean = sum(abs(a) for a, _ in e) / len(e)
        print(f"| {key} | {len(e)} | {100 * mean:.1f} % | {100 * max(abs(a) for a, _ in e):.1f} % | "
              f"{100 * sum(a for a, _ in e) / len(e):+.1f} % | {100 * sum(abs(b) for _, b in e) / len(e):.1f} % |")


if __name__ == "__main__":
    main()
