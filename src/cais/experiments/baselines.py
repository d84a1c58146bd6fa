"""The paper's baseline comparison (Fig. 11 / Fig. 12 setting): every baseline scheme
on the three Table I models, 8 GPUs x 66 SMs, inference (prefill) and training, with
the ratios to TP-NVLS that the paper's CAIS speedups imply.

Runs are independent, so they go to a pool of local processes.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ProcessPoolExecutor

from cais.experiments.layer import run_layer
from cais.hw.config import apply_overrides, load_system

TABLE1 = ("paper-mega-gpt-4b", "paper-mega-gpt-8b", "paper-llama-7b")

# CAIS's geomean speedup over each baseline (paper §V-A.1; inference, training).
PAPER_CAIS_SPEEDUP = {
    "tp-nvls": (1.38, 1.37), "sp-nvls": (1.89, 1.89), "coconet": (1.98, 1.96), "fuselib": (1.90, 1.89),
    "t3": (1.61, 1.60), "coconet-nvls": (1.25, 1.23), "fuselib-nvls": (1.21, 1.20), "t3-nvls": (1.45, 1.45),
    "ladm": (7.60, 7.59),
}


# The paper's baselines, then the plain Megatron ones (NCCL ring, no overlap), which
# the paper does not compare against.
BASELINES = tuple(PAPER_CAIS_SPEEDUP) + ("tp-ring", "sp-ring")


def paper_ratio(scheme: str, mode: str) -> float:
    """Time of ``scheme`` over time of TP-NVLS implied by the paper's speedups (nan
    for a scheme the paper does not compare against)."""
    if scheme not in PAPER_CAIS_SPEEDUP:
        return float("nan")
    i = 1 if mode == "train" else 0
    return PAPER_CAIS_SPEEDUP[scheme][i] / PAPER_CAIS_SPEEDUP["tp-nvls"][i]


def _one(job: tuple[str, str, str, int, str, tuple[tuple[str, str], ...]]) -> dict[str, object]:
    model_name, scheme, mode, sms, system, sets = job
    from cais.workload.models import load_model

    cfg = apply_overrides(load_system(system), dict(sets)) if sets else load_system(system)
    r = run_layer(cfg, load_model(model_name), scheme, mode, sms)
    j = r.as_json()
    return {"model": model_name, "scheme": scheme, "mode": mode, "total_us": r.total_us,
            "sublayers": {k: v["time_us"] for k, v in r.sublayers.items()},
            "bounds": {k: v["bound_us"] for k, v in r.sublayers.items()}, "wall_s": r.wall_s,
            "link_util": r.link_util.mean, "merge": j.get("merge"),
            "table_peak_kB": j.get("merge_table_peak_kB", {}).get("max"), "skew_us": j.get("arrival_skew_us")}


def run_grid(models: tuple[str, ...] = TABLE1, schemes: tuple[str, ...] = BASELINES,
             modes: tuple[str, ...] = ("prefill", "train"), sms: int = 66, system: str = "dgx-h100",
             workers: int | None = None, sets: dict[str, str] | None = None) -> list[dict[str, object]]:
    """Every (model, scheme, mode) on ``system`` with the dotted-key overrides
    ``sets``, in a pool of local processes."""
    frozen = tuple(sorted((sets or {}).items()))
    jobs = [(m, s, mode, sms, system, frozen) for m in models for s in schemes for mode in modes]
    with ProcessPoolExecutor(max_workers=workers or os.cpu_count()) as pool:
        return list(pool.map(_one, jobs))


def geomean(xs: list[float]) -> float:
    """Geometric mean of the values that are not NaN (nan when none is left or any is
    not positive)."""
    xs = [x for x in xs if x == x]
    if not xs or min(xs) <= 0:
        return float("nan")
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def markdown(rows: list[dict[str, object]]) -> str:
    """Per model and mode: each scheme's total and sub-layer times and its ratio to
    TP-NVLS; then the geomean ratio over models next to the paper's."""
    out = []
    by = {(r["model"], r["scheme"], r["mode"]): r for r in rows}
    models = sorted({r["model"] for r in rows}, key=lambda m: TABLE1.index(m) if m in TABLE1 else 99)
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    for mode in dict.fromkeys(r["mode"] for r in rows):
        subs = ["L1", "L2", "L3", "L4"] if mode == "train" else ["L1", "L2"]
        out.append(f"\n#### {mode}: one layer period (us), 8 GPUs x 66 SMs\n")
        out.append("| model | scheme | total | " + " | ".join(subs) + " | / TP-NVLS |")
        out.append("|---|---|---|" + "---|" * len(subs) + "---|")
        for m in models:
            base = by[(m, "tp-nvls", mode)]["total_us"]
            for s in schemes:
                r = by[(m, s, mode)]
                cells = " | ".join(f"{r['sublayers'][k]:,.0f}" for k in subs)
                out.append(f"| {m} | {s} | {r['total_us']:,.0f} | {cells} | {r['total_us'] / base:.2f} |")
        out.append(f"\n**{mode}: geomean over the Table I models of time / TP-NVLS time**\n")
        out.append("| scheme | cais-sim end-to-end | cais-sim sub-layers (L1-L4) | paper (implied) |")
        out.append("|---|---|---|---|")
        for s in schemes:
            e2e = geomean([by[(m, s, mode)]["total_us"] / by[(m, "tp-nvls", mode)]["total_us"] for m in models])
            sub = geomean([by[(m, s, mode)]["sublayers"][k] / by[(m, "tp-nvls", mode)]["sublayers"][k]
                           for m in models for k in subs])
            out.append(f"| {s} | {e2e:.2f} | {sub:.2f} | {paper_ratio(s, mode):.2f} |")
    return "\n".join(out)
