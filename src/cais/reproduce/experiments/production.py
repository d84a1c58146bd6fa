"""Past the paper: CAIS against what production tensor parallelism runs today.

The paper's baselines are research systems. What a TP deployment runs is NCCL's
own choice of algorithm and protocol per call (``tp-nccl``: Megatron or an inference
stack with no NCCL setting), the custom all-reduce kernels of vLLM, SGLang and TensorRT-LLM
(``tp-custom-ar``), PyTorch symmetric memory's multimem all-reduce (``tp-multimem``)
and an all-reduce fused with the residual add and RMSNorm (``tp-fused-ar-norm``).
This experiment runs them and CAIS on Llama-3-8B and Llama-3-70B at TP 8 (and
Llama-3-70B at TP 16 on ``nvl72``), in decode over a grid of batch and context and in
prefill, on every GPU's 132 SMs.

Worlds: every system as sold; the context's system also with the paper's L2
assumption (the only world change that touches CAIS's remote loads). Paper-world is
left out: its links and switch are the paper's, not a product that runs these
kernels. A point whose KV cache and weights do not fit in HBM is left out and
counted (no failure)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from cais.reproduce import plots
from cais.reproduce import paper as P
from cais.reproduce.experiments.common import LAYER, PAPER_L2, Context, Experiment, failures, geomean, ok_rows
from cais.reproduce.report import Section
from cais.reproduce.verdict import span
from cais.sweep.grid import Point

#: the production kernels (each a scheme), then the NCCL baseline and CAIS
PRODUCTION = ("tp-custom-ar", "tp-multimem", "tp-fused-ar-norm")
SCHEMES = ("tp-nccl", *PRODUCTION, "cais")
#: decode: sequences per step x KV-cache length; prefill: prompt lengths (one sequence)
DECODE_BATCH, DECODE_KV, PREFILL_SEQ = (1, 8, 64), (1024, 8192, 32768), (2048, 8192)
QUICK_BATCH, QUICK_KV, QUICK_SEQ = (1,), (1024,), (1024,)
#: a production kernel is "as good as CAIS" where CAIS is less than this much faster
AS_GOOD = 1.02


def _cases(ctx: Context) -> list[dict[str, Any]]:
    """(model, mode, batch, seq) of every case; quick: Llama-3-8B, decode of one
    sequence over a 1k context and a 1k prefill."""
    models = ("llama3-8b",) if ctx.quick else ("llama3-8b", "llama3-70b")
    batches, kvs, seqs = (QUICK_BATCH, QUICK_KV, QUICK_SEQ) if ctx.quick else (DECODE_BATCH, DECODE_KV, PREFILL_SEQ)
    out = []
    for m in models:
        out += [{"model": m, "mode": "decode", "batch": b, "seq": kv} for b in batches for kv in kvs]
        out += [{"model": m, "mode": "prefill", "batch": 1, "seq": s} for s in seqs]
    return out


def _runs(ctx: Context) -> list[tuple[str, Point, tuple[str, ...]]]:
    """(world label, the point's system keys, models it runs): the context's system as
    sold and with the paper's L2; on the full grid from dgx-h100 also dgx-h200 and
    nvl72 at TP 16 (Llama-3-70B only: 8 KV heads, 64 query heads)."""
    system = ctx.system
    runs: list[tuple[str, Point, tuple[str, ...]]] = [
        (f"{system} (as sold)", ctx.base(system), ()),
        (f"{system} with the paper's L2 assumption", ctx.base(system, **dict(PAPER_L2)), ())]
    if not ctx.quick and system == "dgx-h100":
        runs += [("dgx-h200 (as sold)", ctx.base("dgx-h200"), ()),
                 ("nvl72, TP 16 (as sold)", {**ctx.base("nvl72"), "gpus": 16}, ("llama3-70b",))]
    return runs


def fits(point: Point) -> bool:
    """Whether the point's weights and KV cache fit in its GPUs' HBM (the check a run
    makes first, :mod:`cais.workload.footprint`)."""
    from cais.reproduce.points import layer_spec
    from cais.workload.footprint import MemoryCapacityError, check_fits, footprint

    cfg, _, model = layer_spec(point).build()
    try:
        check_fits(footprint(model, cfg.gpus, point["mode"], sp=False), cfg.gpu.hbm_capacity_GB, cfg.gpu.name)
    except MemoryCapacityError:
        return False
    return True


def production_points(ctx: Context) -> list[tuple[str, Point]]:
    """Every world x case x scheme that fits in HBM."""
    out: list[tuple[str, Point]] = []
    for world, base, models in _runs(ctx):
        for case in _cases(ctx):
            if models and case["model"] not in models:
                continue
            probe = {**base, **case, "scheme": "tp-nccl", "sms": P.SMS_FULL, "world": world}
            if not fits(probe):
                continue
            out += [(LAYER, {**probe, "scheme": s}) for s in SCHEMES]
    return out


def left_out(ctx: Context) -> int:
    """How many world x case pairs do not fit in HBM (and so are not run)."""
    n = 0
    for world, base, models in _runs(ctx):
        for case in _cases(ctx):
            if not (models and case["model"] not in models):
                n += not fits({**base, **case, "scheme": "tp-nccl", "sms": P.SMS_FULL})
    return n


def _case_label(r: pd.Series) -> str:
    size = f"b{int(r['batch'])} kv{int(r['seq']) // 1024}k" if r["mode"] == "decode" else f"{int(r['seq']) // 1024}k"
    return f"{r['model'].replace('llama3-', '')} {r['mode']} {size}"


def _gap(by: pd.DataFrame, scheme: str) -> float:
    """The period's time on GPU 0 outside every kernel (launch gaps and waits), at
    least: the total less the kernels' busy time (overlapping kernels both count, so
    for an overlapping scheme this is a lower bound)."""
    r = by.loc[scheme]
    return max(0.0, float(r["total_us"] - r["comm_kernel_us"] - r["compute_kernel_us"]))


def production_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (world, case): each scheme's time, CAIS's speedup over TP-NCCL and
    over the best production kernel, which kernel that is, and the telemetry that says
    why (the best kernel's collective time against CAIS's compute time)."""
    df = ok_rows(rows)
    out = []
    keys = ["world", "model", "mode", "batch", "seq"]
    for key, g in df.groupby(keys, sort=False):
        by = g.set_index("scheme")
        if "cais" not in by.index:
            continue
        row = dict(zip(keys, key))
        row["case"] = _case_label(pd.Series(row))
        for s in SCHEMES:
            row[f"{s}_us"] = float(by["total_us"][s]) if s in by.index else float("nan")
        prod = [s for s in PRODUCTION if s in by.index]
        best = min(prod, key=lambda s: by["total_us"][s]) if prod else None
        cais = float(by["total_us"]["cais"])
        row["best_production"] = best or ""
        row["cais_over_tp_nccl"] = row["tp-nccl_us"] / cais
        row["cais_over_best"] = float(by["total_us"][best]) / cais if best else float("nan")
        row["best_comm_us"] = float(by["comm_kernel_us"][best]) if best else float("nan")
        row["tp_nccl_comm_us"] = float(by["comm_kernel_us"]["tp-nccl"]) if "tp-nccl" in by.index else float("nan")
        row["cais_compute_us"] = float(by["compute_kernel_us"]["cais"])
        row["best_gap_us"] = _gap(by, best) if best else float("nan")
        row["cais_gap_us"] = _gap(by, "cais")
        out.append(row)
    return pd.DataFrame(out)


def _world_says(w: str, t: pd.DataFrame) -> str:
    """The verdict of one world: geomean speedups per mode, where CAIS wins, where a
    production kernel is already as good."""
    parts = []
    for mode in ("decode", "prefill"):
        m = t[t["mode"] == mode]
        if not len(m):
            continue
        wins = int((m["cais_over_best"] >= AS_GOOD).sum())
        parts.append(f"{mode}: CAIS {geomean(list(m['cais_over_tp_nccl'])):.2f}x TP-NCCL and "
                     f"{geomean(list(m['cais_over_best'])):.2f}x the best production kernel (geomean; "
                     f"{span(list(m['cais_over_best']))}); CAIS is at least {AS_GOOD:.2f}x it in {wins} of {len(m)} "
                     f"cases")
    return f"{w}: " + "; ".join(parts) + "."


def _why(t: pd.DataFrame) -> str:
    """Why, from the runs: the best production kernel's collective time against
    TP-NCCL's, and each period's time outside any kernel (the launch gaps CAIS's
    fused kernels remove) beside CAIS's."""
    notes = []
    for mode in ("decode", "prefill"):
        m = t[t["mode"] == mode]
        if len(m):
            kinds = ", ".join(f"{k} ({n})" for k, n in m["best_production"].value_counts().items())
            notes.append(f"in {mode} the best production kernel is {kinds}; its collectives take "
                         f"{span(list(m['best_comm_us']), ' us')} per period against TP-NCCL's "
                         f"{span(list(m['tp_nccl_comm_us']), ' us')}; outside any kernel its periods spend "
                         f"{span(list(m['best_gap_us']), ' us')}, CAIS's {span(list(m['cais_gap_us']), ' us')}")
    return ("Why, from the runs' telemetry (GPU 0 per period; time outside any kernel: the period less its "
            "kernels' busy time, launch gaps and waits): " + "; ".join(notes) + ".")


def production_analyse(ctx: Context, rows: pd.DataFrame) -> tuple[pd.DataFrame, Section]:
    """The table per world and case, a chart of the context's own world, a verdict per
    world and the claim that CAIS beats every production kernel everywhere."""
    t = production_table(rows)
    sec = Section("production", "Past the paper: CAIS against production TP all-reduce kernels")
    sec.p("NCCL's own choice of algorithm and protocol per call (TP-NCCL), vLLM/SGLang's custom all-reduce, PyTorch's "
          "symmetric-memory multimem all-reduce and an all-reduce fused with residual add + RMSNorm, against CAIS: "
          f"Llama-3 decode (batch x KV length) and prefill, TP 8 (nvl72: TP 16), {P.SMS_FULL} SMs.")
    if not len(t):
        for f in failures(rows):
            sec.p(f"FAILED: {f}")
        return t, sec
    own = t[t["world"] == t["world"].iloc[0]]
    groups = list(own["case"])
    series = {"TP-NCCL (NCCL's choice)": list(own["cais_over_tp_nccl"]),
              "best production kernel": list(own["cais_over_best"])}
    plots.bars(ctx.out / "production.png", groups, series, "CAIS speedup, t(scheme) / t(CAIS) (x, log)",
               f"CAIS against production TP kernels, {own['world'].iloc[0]}", ratio=True)
    sec.img("production.png")
    sec.says(" ".join(_world_says(str(w), g) for w, g in t.groupby("world", sort=False)))
    sec.p(_why(t))
    n_out = left_out(ctx)
    if n_out:
        sec.p(f"{n_out} world x case pairs are left out: their weights and KV cache do not fit in HBM at this TP.")
    wins = int((t["cais_over_best"] >= 1).sum())
    sec.claim("CAIS is faster than every production kernel in every case", wins == len(t),
              f"{wins} of {len(t)} cases, speedups over the best {span(list(t['cais_over_best']))}")
    cols = ["world", "case", *[f"{s}_us" for s in SCHEMES], "best_production", "cais_over_tp_nccl", "cais_over_best"]
    sec.table(t[cols], summary=True)
    for f in failures(rows):
        sec.p(f"FAILED: {f}")
    return t, sec


EXPERIMENT = Experiment("production", "production", production_points, production_analyse)
