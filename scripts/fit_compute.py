"""Fit the GPU compute-time model (cais.hw.compute) to the H200 measurements, write
src/cais/data/calibration/h200/fit.json and print measured vs predicted for every row.

    python scripts/fit_compute.py            # fit, write fit.json, print the tables
    python scripts/fit_compute.py --check    # only print the tables for the shipped fit.json

numpy least squares and small grid searches only.  Every coefficient is one physical
number shared by all shapes (docs/compute-model.md); nothing is looked up per shape.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from cais.hw.compute import BWD_FLOP_RATIO, REF_TILE, ComputeModel  # noqa: E402

DATA = ROOT / "src" / "cais" / "data" / "calibration" / "h200"
PEAK_TFLOPS = 989.0  # H100/H200 SXM dense bf16 (datasheet)
HBM_PEAK_GBPS = 4800.0  # H200 (datasheet)
MEM_SATURATION_FRACTION = 0.5  # assumed, not measured: the data have no SM sweep
ELEMENTWISE_OPS = ("layernorm", "rmsnorm", "gelu", "add", "dropout")
Row = dict[str, str]


def rows(name: str) -> list[Row]:
    with open(DATA / name) as f:
        return list(csv.DictReader(f))


def ps(ms: str) -> float:
    return float(ms) * 1e9


def rel_lstsq(a: np.ndarray, y: np.ndarray, target: np.ndarray | None = None) -> np.ndarray:
    """Least squares on relative error: minimise sum(((a @ x) - target) / y) ** 2."""
    t = y if target is None else target
    return np.linalg.lstsq(a / y[:, None], t / y, rcond=None)[0]


# ---- memory-bound kernels ---------------------------------------------------------------
def fit_memory(ew: list[Row]) -> dict[str, object]:
    """time = overhead + bytes * traffic_op / bandwidth.  The copy has traffic 1 by
    definition, so its slope is the effective HBM bandwidth; each op's slope relative to
    it is that op's effective traffic per nominal byte."""
    ops = ["copy_d2d", *ELEMENTWISE_OPS]
    a = np.zeros((len(ew), 1 + len(ops)))
    for i, r in enumerate(ew):
        a[i, 0] = 1.0
        a[i, 1 + ops.index(r["op"])] = float(r["bytes_moved"])
    x = rel_lstsq(a, np.array([ps(r["ms_median"]) for r in ew]))
    nominal = {}
    for op in ELEMENTWISE_OPS:
        per = {float(r["bytes_moved"]) / (int(r["M"]) * int(r["N"])) for r in ew if r["op"] == op}
        assert len(per) == 1, f"{op}: bytes per element differ between rows"
        nominal[op] = per.pop()
    return {
        "hbm_peak_GBps": HBM_PEAK_GBPS,
        "hbm_efficiency": 1e3 / x[1] / HBM_PEAK_GBPS,  # ps/byte -> GB/s
        "mem_overhead_ns": x[0] / 1e3,
        "mem_saturation_fraction": MEM_SATURATION_FRACTION,
        "elementwise_bytes": nominal,
        "elementwise_traffic": {op: x[2 + i] / x[1] for i, op in enumerate(ELEMENTWISE_OPS)},
    }


# ---- attention -----------------------------------------------------------------------------
def fit_attention(att: list[Row]) -> dict[str, float]:
    """time = overhead + FLOPs / (efficiency * peak): linear least squares on the fwd rows,
    and on (fwd+bwd - fwd) of each shape for bwd, with 2.5x the forward FLOPs."""
    shapes: dict[tuple[int, ...], dict[str, float]] = {}
    for r in att:
        key = tuple(int(r[c]) for c in ("heads_per_gpu", "kv_heads_per_gpu", "head_dim", "batch", "seq"))
        shapes.setdefault(key, {})[r["pass"]] = ps(r["ms_median"])
    out = {}
    for name, mult in (("fwd", 1.0), ("bwd", BWD_FLOP_RATIO)):
        a = np.array([[1.0, mult * 2 * b * h * s * s * d] for h, _kv, d, b, s in shapes])  # causal: half of 4bhs^2d
        y = np.array([t["fwd"] if name == "fwd" else t["fwd+bwd"] - t["fwd"] for t in shapes.values()])
        over, ps_per_flop = rel_lstsq(a, y)
        out[f"attn_efficiency_{name}"] = 1.0 / (ps_per_flop * PEAK_TFLOPS)
        out[f"attn_overhead_{name}_ns"] = over / 1e3
    return out


# ---- GEMM 1: busy-SM slowdown from the Triton sweep ------------------------------------------
def triton_kernels(base: ComputeModel, tri: list[Row]) -> dict[str, dict[str, float]]:
    """Triton's own mainloop efficiency and per-tile overhead for each of its tiles, from the
    1-SM rows (two K values: slope and intercept).  They describe that kernel, not cuBLAS,
    and serve only to fit the slowdown coefficients, which are the chip's."""
    out = {}
    for bm, bn in sorted({(int(r["BM"]), int(r["BN"])) for r in tri}, reverse=True):
        one = sorted((int(r["K"]), float(r["us_per_tile_per_prog"]) * 1e6) for r in tri
                     if (int(r["BM"]), int(r["BN"]), r["nprog"]) == (bm, bn, "1"))
        (k0, t0), (k1, t1) = one[0], one[-1]
        slope = (t1 - t0) / (k1 - k0)
        out[f"{bm}x{bn}"] = {"mma_efficiency": 2 * bm * bn / (slope * base.peak_tflops / base.sms),
                             "tile_overhead_ns": (t0 - slope * k0) / 1e3 * REF_TILE[0] * REF_TILE[1] / (bm * bn)}
    return out


def triton_time_ps(model: ComputeModel, r: Row) -> int:
    """The Triton kernel's time: its tiles in waves on nprog SMs (launch cost left out)."""
    return model.tiled_gemm_ps(int(r["M"]), int(r["N"]), int(r["K"]), int(r["nprog"]), int(r["BM"]), int(r["BN"]))


def fit_slowdown(base: ComputeModel, tri: list[Row], kernels: dict[str, dict[str, float]]) -> dict[str, float]:
    """Grid search (coarse, then fine) for droop, L2 bandwidth and roofline exponent,
    minimising the squared log error of all 36 Triton kernel times."""
    models = {k: replace(base, gemm_overhead_ns=0.0, **v) for k, v in kernels.items()}
    y = np.log([ps(r["ms_median"]) for r in tri])

    def cost(c: dict[str, float]) -> float:
        pred = [triton_time_ps(replace(models[f"{r['BM']}x{r['BN']}"], **c), r) for r in tri]
        return float(np.sum((np.log(pred) - y) ** 2))

    best = min(({"droop": d, "l2_bandwidth_GBps": b, "roofline_exp": q} for q in (2.0, 3.0, 4.0, 6.0, 8.0)
                for d in np.arange(0.0, 0.201, 0.01) for b in np.arange(8000.0, 14001.0, 250.0)), key=cost)
    best = min(({**best, "droop": best["droop"] + dd, "l2_bandwidth_GBps": best["l2_bandwidth_GBps"] + db}
                for dd in np.arange(-0.01, 0.0101, 0.002) for db in np.arange(-250.0, 251.0, 25.0)), key=cost)
    return {k: round(float(v), 4) for k, v in best.items()}


# ---- GEMM 2: cuBLAS level ------------------------------------------------------------------
def fit_cublas(base: ComputeModel, gemm: list[Row]) -> dict[str, float]:
    """For each mainloop efficiency on a grid, alternate the model's tile choice with a
    non-negative least-squares fit of (kernel overhead, tile overhead) on relative error;
    keep the efficiency with the smallest sum of squared relative errors."""
    shapes = [(int(r["M"]), int(r["N"]), int(r["K"])) for r in gemm]
    y = np.array([ps(r["ms_median"]) for r in gemm])
    sms = base.sms

    def fit_at(eta: float) -> tuple[float, dict[str, float]]:
        coef = {"mma_efficiency": eta, "gemm_overhead_ns": 0.0, "tile_overhead_ns": 0.0}
        for _ in range(10):
            model = replace(base, **coef)
            tiles = [model.tile_shape(*s, sms) for s in shapes]
            bare = replace(model, gemm_overhead_ns=0.0, tile_overhead_ns=0.0)
            mainloop = np.array([bare.tiled_gemm_ps(*s, sms, *t) for s, t in zip(shapes, tiles)])
            tile_units = np.array([math.ceil(math.ceil(m / bm) * math.ceil(n / bn) / sms) * bm * bn
                                   / (REF_TILE[0] * REF_TILE[1]) for (m, n, _), (bm, bn) in zip(shapes, tiles)])
            kernel_ps, tile_ps = nonneg_two(np.column_stack([np.ones_like(y), tile_units]), y, y - mainloop)
            new = {"mma_efficiency": eta, "gemm_overhead_ns": kernel_ps / 1e3, "tile_overhead_ns": tile_ps / 1e3}
            if new == coef:
                break
            coef = new
        model = replace(base, **coef)
        err = np.array([model.gemm_time_ps(*s, sms) for s in shapes]) / y - 1
        return float(np.sum(err ** 2)), coef

    fits = [fit_at(round(float(e), 4)) for e in np.arange(0.70, 1.0001, 0.005)]
    return {k: round(v, 4) for k, v in min(fits, key=lambda f: f[0])[1].items()}


def nonneg_two(a: np.ndarray, y: np.ndarray, target: np.ndarray) -> tuple[float, float]:
    """rel_lstsq for two unknowns, both kept >= 0 (drop the negative one and refit)."""
    x = rel_lstsq(a, y, target)
    if min(x) >= 0:
        return float(x[0]), float(x[1])
    keep = int(np.argmax(x))
    xi = max(float(rel_lstsq(a[:, [keep]], y, target)[0]), 0.0)
    return (xi, 0.0) if keep == 0 else (0.0, xi)


# ---- report ----------------------------------------------------------------------------------
def table(title: str, labels: list[str], meas: list[float], pred: list[float], unit: str = "us",
          scale: float = 1e6) -> dict[str, object]:
    err = np.array(pred) / np.array(meas) - 1
    print(f"\n{title}\n{'':<48}{'measured':>10}{'model':>10}{'error':>8}   ({unit})")
    for lab, y, p, e in zip(labels, meas, pred, err):
        print(f"{lab:<48}{y / scale:>10.3f}{p / scale:>10.3f}{e:>+8.1%}")
    worst = int(np.argmax(abs(err)))
    med, mx = float(np.median(abs(err))), float(abs(err[worst]))
    print(f"{title}: {len(err)} rows, median |error| {med:.1%}, max |error| {mx:.1%} ({labels[worst]})")
    return {"rows": len(err), "median_abs_error": round(med, 4), "max_abs_error": round(mx, 4),
            "worst": labels[worst]}


def report(model: ComputeModel, kernels: dict[str, dict[str, float]]) -> dict[str, object]:
    s = model.sms
    out = {}
    g = rows("gemm_cublas.csv")
    mnk = [(int(r["M"]), int(r["N"]), int(r["K"])) for r in g]
    labels = [f"{r['model']} tp{r['tp']} {r['layer']} {r['pass']} {m}x{n}x{k} "
              f"[{'x'.join(map(str, model.tile_shape(m, n, k, s)))}]" for r, (m, n, k) in zip(g, mnk)]
    out["gemm_cublas"] = table("GEMM, cuBLAS", labels, [ps(r["ms_median"]) for r in g],
                               [model.gemm_time_ps(m, n, k, s) for m, n, k in mnk])

    t = rows("tile_triton.csv")
    labels = [f"triton {r['BM']}x{r['BN']} K={r['K']} nprog={r['nprog']}" for r in t]
    trit = {k: replace(model, gemm_overhead_ns=0.0, **v) for k, v in kernels.items()}
    out["tile_triton"] = table("Triton tile sweep, kernel time (Triton's own 1-SM efficiency)", labels,
                               [ps(r["ms_median"]) for r in t],
                               [triton_time_ps(trit[f"{r['BM']}x{r['BN']}"], r) for r in t])
    # The shipped (cuBLAS) model's per-tile slowdown vs 1 busy SM, in the CSV's own terms:
    # us_per_tile_per_prog = kernel time * nprog / tiles (so it includes wave quantisation).
    bare = replace(model, gemm_overhead_ns=0.0)
    meas, pred = [], []
    for r in t:
        one = next(o for o in t if (o["BM"], o["BN"], o["K"], o["nprog"]) == (r["BM"], r["BN"], r["K"], "1"))
        meas.append(float(r["us_per_tile_per_prog"]) / float(one["us_per_tile_per_prog"]))
        pred.append(triton_time_ps(bare, r) * int(r["nprog"]) / triton_time_ps(bare, one))
    out["tile_slowdown"] = table("Per-tile slowdown vs 1 busy SM, shipped model", labels, meas, pred,
                                 unit="ratio", scale=1.0)

    ew = rows("elementwise.csv")
    out["elementwise"] = table(
        "Memory-bound kernels", [f"{r['op']} {r['M']}x{r['N']}" for r in ew], [ps(r["ms_median"]) for r in ew],
        [model.memory_time_ps(int(r["bytes_moved"]), s, s) if r["op"] == "copy_d2d"
         else model.elementwise_time_ps(r["op"], int(r["M"]), int(r["N"]), s, s) for r in ew])

    a = rows("attention.csv")
    out["attention"] = table(
        "Attention (SDPA, causal, d=128)",
        [f"h{r['heads_per_gpu']} kv{r['kv_heads_per_gpu']} b{r['batch']} s{r['seq']} {r['pass']}" for r in a],
        [ps(r["ms_median"]) for r in a],
        [model.attention_time_ps(int(r["heads_per_gpu"]), int(r["kv_heads_per_gpu"]), int(r["head_dim"]),
                                 int(r["batch"]), int(r["seq"]), r["pass"], s, s) for r in a])
    print("\nsummary")
    for name, e in out.items():
        print(f"  {name:<14} median |error| {e['median_abs_error']:.1%}  max |error| {e['max_abs_error']:.1%}"
              f"  ({e['worst']})")
    return out


def sig(v: object) -> object:
    """Five significant digits for the JSON (more would be noise)."""
    return float(f"{v:.5g}") if isinstance(v, float) else v


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only report on the shipped fit.json")
    args = ap.parse_args()
    if args.check:
        fit = json.loads((DATA / "fit.json").read_text())
        report(ComputeModel.load("h200"), fit["reference"]["triton_kernels"])
        return
    device = json.loads((DATA / "device.json").read_text())
    coef: dict[str, object] = {"sms": device["sms"], "peak_tflops": PEAK_TFLOPS}
    coef.update(fit_memory(rows("elementwise.csv")))
    coef.update(fit_attention(rows("attention.csv")))
    start = {"mma_efficiency": 0.8, "droop": 0.0, "l2_bandwidth_GBps": 1e4, "roofline_exp": 4.0,
             "tile_overhead_ns": 0.0, "gemm_overhead_ns": 0.0}
    base = ComputeModel.from_fit({"name": "h200", "coefficients": {**coef, **start}})
    tri = rows("tile_triton.csv")
    kernels = triton_kernels(base, tri)
    coef.update(fit_slowdown(base, tri, kernels))
    coef.update(fit_cublas(replace(base, **{k: coef[k] for k in start if k in coef}), rows("gemm_cublas.csv")))
    coef = {k: {kk: sig(vv) for kk, vv in v.items()} if isinstance(v, dict) else sig(v) for k, v in coef.items()}
    kernels = {k: {kk: sig(vv) for kk, vv in v.items()} for k, v in kernels.items()}
    fit: dict[str, object] = {
        "name": "h200", "device": device["name"], "made_by": "python scripts/fit_compute.py",
        "coefficients": coef,
        "reference": {"triton_kernels": kernels,
                      "note": "Triton's own mainloop efficiency / tile overhead per tile (1-SM rows); "
                              "used only to fit droop, l2_bandwidth_GBps and roofline_exp"}}
    fit["errors"] = report(ComputeModel.from_fit(fit), kernels)
    (DATA / "fit.json").write_text(json.dumps(fit, indent=2) + "\n")
    print(f"\nwrote {(DATA / 'fit.json').relative_to(ROOT)}\n{json.dumps(coef, indent=2)}")


if __name__ == "__main__":
    main()
