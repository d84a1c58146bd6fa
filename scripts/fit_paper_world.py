"""Fit the `paper-world` system preset, openly, to the paper's stated world and to
nothing of CAIS's (docs/reproduce.md, "paper-world").

Targets (never a CAIS number):
  1. Fig. 2: communication / computation = 1.6 for LLaMA-7B on 8 GPUs (TP-NVLS, the
     bulk-synchronous scheme, full 132-SM GPUs): fixes the compute speed, a uniform
     ``gpu_slowdown`` s (every GPU's TB compute time x s). With collectives
     bandwidth-bound, comm/compute scales about as 1/s: s = r0 / 1.6, then secant
     steps (memory-bound kernels stay held to the HBM bandwidth, so it curves).
  2. The nine baselines' time ratios to TP-NVLS implied by Fig. 11 (paper_ratio):
     with s fixed, the SM copy bandwidth per SM (``gpu.sm_copy_bandwidth_GBps``: the
     load/store path of every SM-issued remote access, ring and NVLS collectives,
     T3's reductions, FuseLib's and LADM's copies; not CAIS's loads) is chosen from a
     grid by the least squared log error over the eight ratios, on LLaMA-7B prefill
     (one sequence of 3072 tokens, to keep the fit minutes long) at 66 SMs. It was
     meant as the ring-against-NVLS cost; it is not one (it slows NVLS too), and the
     simulator has no knob that is (docs/reproduce.md).
Held fixed (assumptions, named in the preset): everything else of dgx-h100, and
``gpu.l2_keeps_peer_reads = true`` (the paper's CAIS loads need it; docs/validation.md §7).

    PYTHONPATH=src python scripts/fit_paper_world.py --out /tmp/fit [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from cais.experiments.baselines import PAPER_CAIS_SPEEDUP, paper_ratio
from cais.sweep.runner import run_sweep

LAYER = "cais.reproduce.points:layer_point"
BASE = "dgx-h100"
FIXED = {"gpu.l2_keeps_peer_reads": "true"}
COPY_GRID = (200.0, 50.0, 25.0, 12.5)


def _sets(s: float, copy: float | None = None) -> str:
    sets = {**FIXED, "gpu_slowdown": json.dumps({str(g): s for g in range(8)})}
    if copy is not None:
        sets["gpu.sm_copy_bandwidth_GBps"] = str(copy)
    return json.dumps(sets, sort_keys=True)


def fig2_ratio(s: float, out: Path, workers: int | None) -> float:
    p = {"system": BASE, "sets": _sets(s), "model": "paper-llama-7b", "scheme": "tp-nvls", "mode": "prefill",
         "sms": 132}
    t = run_sweep([p], out / "fit.parquet", fn=LAYER, workers=workers, desc="fig2")  # the whole table
    r = t[(t["point.sets"] == p["sets"]) & (t["point.sms"] == 132)].iloc[0]
    return float(r["comm_kernel_us"] / r["compute_kernel_us"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/fit_paper_world")
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # secant steps in log space (log r = a - b log s locally; memory-bound kernels held
    # to the HBM bandwidth make it curve), until within 0.5 % of 1.6
    tried = [(1.0, fig2_ratio(1.0, out, args.workers))]
    s = round(tried[0][1] / 1.6, 3)
    for _ in range(6):
        tried.append((s, fig2_ratio(s, out, args.workers)))
        (s0, r0), (s1, r1) = tried[-2], tried[-1]
        if abs(r1 / 1.6 - 1) < 0.005:
            break
        b = (math.log(r0) - math.log(r1)) / (math.log(s1) - math.log(s0)) if s1 != s0 else 1.0
        s = round(math.exp(math.log(s1) + (math.log(r1) - math.log(1.6)) / b), 3)
    s, r = tried[-1]
    print("fig2: " + "  ".join(f"r({si:.3f})={ri:.3f}" for si, ri in tried) + " (target 1.6)")
    pts = [{"system": BASE, "sets": _sets(s, c), "model": "paper-llama-7b", "batch": 1, "scheme": sch,
            "mode": "prefill", "sms": 66} for c in COPY_GRID for sch in PAPER_CAIS_SPEEDUP]
    rows = run_sweep(pts, out / "fit.parquet", fn=LAYER, workers=args.workers, desc="baselines")
    rows = rows[rows["point.sets"].isin({q["sets"] for q in pts}) & (rows["point.sms"] == 66)]  # these points only
    rows["copy"] = rows["point.sets"].map(lambda x: float(json.loads(x)["gpu.sm_copy_bandwidth_GBps"]))
    errs = {}
    for c, g in rows.groupby("copy"):
        t = g.set_index("point.scheme")["total_us"]
        e = [(math.log(t[x] / t["tp-nvls"]) - math.log(paper_ratio(x, "prefill"))) ** 2
             for x in PAPER_CAIS_SPEEDUP if x != "tp-nvls"]
        errs[c] = sum(e)
        print(f"sm_copy {c:6.1f} GB/s: " + ", ".join(f"{x} {t[x] / t['tp-nvls']:.2f} ({paper_ratio(x, 'prefill'):.2f})"
                                                      for x in PAPER_CAIS_SPEEDUP if x != "tp-nvls")
              + f"; squared log error {errs[c]:.3f}")
    best = min(errs, key=errs.get)
    print(f"chosen: gpu_slowdown {s} (compute {1 / s:.2f}x faster), sm_copy_bandwidth_GBps {best}")
    preset = {"name": "paper-world", "base": BASE,
              "description": (f"The paper's world, fitted (scripts/fit_paper_world.py) to Fig. 2's 1.6x and the nine "
                              f"baselines' Fig. 11 ratios only: compute {1 / s:.2f}x faster than calibrated "
                              f"(gpu_slowdown {s}), SM copy bandwidth {best:g} GB/s per SM; L2 keeps peer reads. "
                              f"Fig. 2 ratio reached {r:.2f}; baseline squared log error {errs[best]:.2f}"),
                    "gpu": {"sm_copy_bandwidth_GBps": best, "l2_keeps_peer_reads": True},
                    "gpu_slowdown": {str(g): s for g in range(8)}}
    path = Path(__file__).resolve().parents[1] / "src/cais/data/systems/paper-world.json"
    path.write_text(json.dumps(preset, indent=2) + "\n")
    # presets give every field (tests/test_system_files.py): write the merged system out whole
    from cais.config import load_system

    full = load_system(str(path)).model_dump(mode="json")
    full["gpu_slowdown"] = {str(g): v for g, v in full["gpu_slowdown"].items()}
    path.write_text(json.dumps(full) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
