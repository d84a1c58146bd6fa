"""The compute model's skinny (decode-sized) GEMMs against published measurements
(src/cais/data/published/small_gemm.csv: cuBLAS through F.linear on an H100, timed as
back-to-back calls in a CUDA graph). Ours is the GEMM kernel every scheme runs
(``kernels.gemm.gemm_kernel``: the tile the model picks, each tile over the whole K,
the operands' HBM bytes as a floor) on one GPU of the row's system, plus the graph's
gap between dependent kernels (``gpu.kernel_gap_us``). A check, not a fit: nothing is
tuned to these rows.

    .venv/bin/python scripts/validate_small_gemm.py
"""

from __future__ import annotations

import csv
from pathlib import Path

from cais.config import PS_PER_US, load_system
from cais.hw.compute import ComputeModel
from cais.kernels.gemm import gemm_kernel, gemm_shape
from cais.machine import Machine

CSV = Path(__file__).resolve().parents[1] / "src/cais/data/published/small_gemm.csv"


def ours_us(system: str, m: int, n: int, k: int) -> tuple[float, str]:
    """Our graph-mode time of C[m,n] = A[m,k] @ B[k,n] (us) and its tiling."""
    cfg = load_system(system, gpus=2)
    cm = ComputeModel.load(cfg.gpu.compute_model, cfg.gpu.hbm_bandwidth_GBps)
    sms = cfg.gpu.sms
    shape = gemm_shape(cm, m, n, k, sms)
    floor = max(0, cm.memory_time_ps(2 * (m * k + k * n + m * n), sms, sms) - cm.memory_time_ps(0, sms, sms))
    floor //= -(-shape.tiles // sms)
    mach = Machine(cfg)
    kernel = gemm_kernel(cm, shape, "gemm", floor_ps=floor)
    mach.gpus[0].launch(kernel, round(cfg.gpu.kernel_gap_us * PS_PER_US))
    mach.run()
    return (kernel.finished_at or 0) / PS_PER_US, f"{shape.tiles} tiles of {shape.bm}x{shape.bn}"


def main() -> None:
    with CSV.open(newline="") as f:
        rows = list(csv.DictReader(f))
    print("| M | N | K | published (us) | ours (us) | ours / published | our tiling | GPU | source |")
    print("|---:|---:|---:|---:|---:|---:|---|---|---|")
    for r in rows:
        m, n, k = int(r["m"]), int(r["n"]), int(r["k"])
        t, tiling = ours_us(r["system"], m, n, k)
        pub = float(r["time_us"])
        src = r["source"].split(" (", 1)[0].replace("vllm-project/", "")
        print(f"| {m} | {n} | {k} | {pub:g} | {t:.1f} | {t / pub:.2f} | {tiling} | {r['gpu']} | {src} |")


if __name__ == "__main__":
    main()
