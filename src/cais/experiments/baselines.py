"""The paper's baseline comparison (Fig. 11 / Fig. 12 setting): every baseline scheme
on the three Table I models, 8 GPUs x 66 SMs, inference (prefill) and training, with
the ratios to TP-NVLS that the paper's CAIS speedups imply.

Runs are independent points of a sweep: :func:`grid_points` lists them,
:func:`grid_point` runs one (the sweep runner's point function) and
:func:`grid_rows` reads the rows back.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from cais.experiments.layer import run_layer
from cais.config import apply_overrides, load_system

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


_NESTED = ("sublayers", "bounds", "merge", "skew_us")  # returned as JSON text: one sweep column each


def grid_points(models: tuple[str, ...] = TABLE1, schemes: tuple[str, ...] = BASELINES,
                modes: tuple[str, ...] = ("prefill", "train"), sms: int = 66, system: str = "dgx-h100",
                sets: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Every (model, scheme, mode) on ``system`` with the dotted-key overrides ``sets``,
    as sweep points for :func:`grid_point`."""
    frozen = json.dumps(dict(sorted((sets or {}).items())))
    return [{"model": m, "scheme": s, "mode": mode, "sms": sms, "system": system, "sets": frozen}
            for m in models for s in schemes for mode in modes]


def grid_point(point: Mapping[str, Any]) -> dict[str, Any]:
    """One grid point's period: total, sub-layer times and bounds, link utilisation,
    merge counts, table peak and arrival skew (nested values as JSON text)."""
    from cais.workload.models import load_model

    sets = json.loads(point["sets"])
    cfg = apply_overrides(load_system(point["system"]), sets) if sets else load_system(point["system"])
    r = run_layer(cfg, load_model(point["model"]), point["scheme"], point["mode"], point["sms"])
    j = r.as_json()
    out = {"model": point["model"], "scheme": point["scheme"], "mode": point["mode"], "total_us": r.total_us,
           "sublayers": {k: v["time_us"] for k, v in r.sublayers.items()},
           "bounds": {k: v["bound_us"] for k, v in r.sublayers.items()}, "sim_wall_s": r.wall_s,
           "link_util": r.link_util.mean, "merge": j.get("merge"),
           "table_peak_kB": j.get("merge_table_peak_kB", {}).get("max"), "skew_us": j.get("arrival_skew_us")}
    return {k: json.dumps(v) if k in _NESTED else v for k, v in out.items()}


def grid_rows(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The grid's rows as :func:`grid_point` made them, nested values decoded, each with
    its run's ``wall_s``; RuntimeError naming the first point that failed."""
    out = []
    for r in rows:
        if r["status"] != "ok":
            raise RuntimeError(f"grid point {r['point.model']}/{r['point.scheme']}/{r['point.mode']}: {r['error']}")
        row = {k: json.loads(r[k]) if k in _NESTED else r[k]
               for k in ("model", "scheme", "mode", "total_us", "link_util", "table_peak_kB", *_NESTED)}
        out.append({**row, "wall_s": r["sim_wall_s"]})
    return out


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
