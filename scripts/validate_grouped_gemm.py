"""The grouped-GEMM model against DeepGEMM's published H800 FP8 tables
(src/cais/data/published/deepgemm-h800.csv): ours, published and the error per row
(docs/moe.md). ``--fit`` refits ``fp8_mma_efficiency`` on the fit rows (least squares
of the relative error over a grid) and prints it.

    python scripts/validate_grouped_gemm.py [--fit]
"""

from __future__ import annotations

import csv
import io
import sys
from importlib import resources

from cais.config import load_system
from cais.hw.compute import ComputeModel
from cais.kernels.grouped_gemm import GroupedGemm, grouped_tflops


def rows() -> list[dict[str, str]]:
    text = (resources.files("cais") / "data" / "published" / "deepgemm-h800.csv").read_text()
    return list(csv.DictReader(io.StringIO("\n".join(x for x in text.splitlines() if not x.startswith("#")))))


def ours(row: dict[str, str], eff8: float | None = None) -> float:
    cfg = load_system("hgx-h800")
    model = ComputeModel.load(cfg.gpu.compute_model, cfg.gpu.hbm_bandwidth_GBps)
    layout = "masked" if row["table"] == "masked" else "contiguous"
    g = GroupedGemm((int(row["m"]),) * int(row["groups"]), int(row["n"]), int(row["k"]), "fp8", layout)
    return grouped_tflops(model, g, cfg.gpu.sms, eff8)


def fit() -> float:
    fit_rows = [r for r in rows() if r["set"] == "fit"]
    grid = [0.50 + 0.005 * i for i in range(101)]
    return min(grid, key=lambda e: sum((ours(r, e) / float(r["tflops"]) - 1) ** 2 for r in fit_rows))


if __name__ == "__main__":
    if "--fit" in sys.argv:
        print(f"fp8_mma_efficiency = {fit():.3f}")
    for r in rows():
        o, p = ours(r), float(r["tflops"])
        print(f"{r['set']:8} {r['table']:10} {r['groups']}x{r['m']:>5} n {r['n']:>5} k {r['k']:>5}: "
              f"ours {o:7.0f} published {p:5.0f} TFLOPS, error {100 * (o / p - 1):+.1f} %")
