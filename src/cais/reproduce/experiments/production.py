"""Past the paper: CAIS against what production tensor parallelism runs today.

The paper's baselines are research systems. What a TP deployment runs is NCCL's own
choice of algorithm and protocol per call (``tp-nccl``: Megatron, or an inference
stack with no NCCL setting) and each inference stack's own all-reduce: vLLM
(``tp-vllm``: the FlashInfer all-reduce fused with RMSNorm, its custom all-reduce,
PyTorch symmetric memory's multimem all-reduce, NCCL, by size), SGLang
(``tp-sglang``: its custom all-reduce v2) and TensorRT-LLM (``tp-trtllm``: its AUTO
strategy, fused with RMSNorm by its SM90 table, else NCCL), each composed kernel for
kernel from the stack's own tables (kernels/stacks.py, sources and commits there).
CAIS is a proposed NVSwitch with in-switch merging (HPCA 2026): no product runs it.
This experiment runs them on Llama-3-8B and Llama-3-70B at TP 8 (and Llama-3-70B at TP
16 on ``nvl72``), in decode over a grid of batch and context and in prefill, on every
GPU's 132 SMs.

Launches (``gpu.launch``, docs/compute-model.md "Launch modes") as the stacks run
them: decode under CUDA graphs, prefill eager (above the stacks' graph capture
sizes); ``--launch`` / ``--set gpu.launch=...`` runs every point in one mode. The
answer rests on a few constants: the launch constants (the gap between dependent
kernels, its PDL version, the host's issue times; sourced ranges) and the production
kernels' fixed costs (their barriers and the fused kernel's own time, fitted on
published measurements: scripts/fit_production.py, docs/validation.md). The
sensitivity runs the context's world at the low and the high end of their ranges
(:data:`CONSTANTS`) and the verdict gives the range.

Worlds: every system as sold; the context's system also with the paper's L2
assumption (the only world change that touches CAIS's remote loads). Paper-world is
left out: its links and switch are the paper's, not a product that runs these
kernels. A point whose KV cache and weights do not fit in HBM is left out and
counted (no failure). No paper numbers: the report's quick-grid warning does not
apply to it."""

from __future__ import annotations

import json
from importlib.resources import files
from typing import Any

import pandas as pd

from cais.reproduce import plots
from cais.reproduce import paper as P
from cais.reproduce.experiments.common import LAYER, PAPER_L2, Context, Experiment, failures, geomean, ok_rows
from cais.reproduce.report import Section
from cais.reproduce.verdict import span
from cais.sweep.grid import Point

#: the production stacks (each a scheme), then the NCCL baseline and CAIS
PRODUCTION = ("tp-vllm", "tp-sglang", "tp-trtllm")
SCHEMES = ("tp-nccl", *PRODUCTION, "cais")
#: the short names the table and the verdict use
LABEL = {"tp-nccl": "NCCL", "tp-vllm": "vLLM", "tp-sglang": "SGLang", "tp-trtllm": "TRT-LLM", "cais": "CAIS"}
#: decode: sequences per step x KV-cache length; prefill: prompt lengths (one sequence)
DECODE_BATCH, DECODE_KV, PREFILL_SEQ = (1, 8, 64), (1024, 8192, 32768), (2048, 8192)
QUICK_BATCH, QUICK_KV, QUICK_SEQ = (1,), (1024,), (1024,)
#: a production stack is "as good as CAIS" where CAIS is less than this much faster
AS_GOOD = 1.02
#: the launch each mode runs under, as the stacks run it: decode replays CUDA graphs, a prefill
#: above the graph capture sizes is launched op by op
LAUNCH = {"decode": "graph", "prefill": "eager"}
#: how far from the best fit a fitted constant's value may be and still count as plausible:
#: its fit rows' mean |error| within this of the best (production_fit.json's surface)
FIT_BAND = 0.02
#: the launch constants and their sourced ranges (low end, high end): the dependent-kernel
#: gap (~1-2 us), its PDL version (0 up to the gap, an assumption), the host's issue per op
#: (~4-6 us) and per further launch (~4-5 us); sources in the fields' descriptions (config.py)
LAUNCH_CONSTANTS = {"gpu.kernel_gap_us": (1.0, 2.0), "gpu.pdl_gap_us": (0.0, 1.5), "gpu.host_op_us": (4.0, 6.0),
                    "gpu.host_launch_us": (4.0, 5.0)}


def _fit() -> dict[str, Any]:
    return json.loads((files("cais") / "data" / "published" / "production_fit.json").read_text())


def at_edge(fit: dict[str, Any] | None = None) -> dict[str, str]:
    """The fitted constants whose chosen value sits at an end of its allowed grid with
    the fit's error still falling there (production_fit.json's ``at_edge``): the data
    would take them further than their range allows."""
    return dict((fit or _fit()).get("at_edge", {}))


def fitted_ranges(fit: dict[str, Any] | None = None) -> dict[str, tuple[float, float]]:
    """The fitted kernel constants' plausible ranges from production_fit.json: every
    value that is the best fit at some gap of the gap's sourced range, or whose fit
    rows' error at the chosen gap is within :data:`FIT_BAND` of the best."""
    if fit is None:
        fit = _fit()
    gap = fit["chosen"]["gpu.kernel_gap_us"]
    out = {}
    for key in fit["chosen"]:
        if key == "gpu.kernel_gap_us":
            continue
        vals = [b[key] for b in fit["per_gap"].values()]
        surface = fit["surface"][f"{key} at kernel_gap_us {gap}"]
        best = min(e for _, e in surface)
        vals += [x for x, e in surface if e <= best + FIT_BAND]
        out[key] = (min(vals), max(vals))
    return out


#: every constant the answer rests on and its range (low end, high end)
CONSTANTS = {**LAUNCH_CONSTANTS, **fitted_ranges()}
SENS = ", constants "  # marks a sensitivity world's label


def _launch(ctx: Context, mode: str) -> dict[str, str]:
    """The launch setting of a ``mode`` point: the context's where it sets one."""
    return {} if "gpu.launch" in ctx.sets else {"gpu.launch": LAUNCH[mode]}


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


def _runs(ctx: Context) -> list[tuple[str, str, dict[str, str], tuple[str, ...]]]:
    """(world label, system, its extra settings, models it runs): the context's system
    as sold, at the constants' low and high ends and with the paper's L2; on the full
    grid from dgx-h100 also dgx-h200 and nvl72 at TP 16 (Llama-3-70B only: 8 KV heads,
    64 query heads)."""
    system = ctx.system
    runs: list[tuple[str, str, dict[str, str], tuple[str, ...]]] = [(f"{system} (as sold)", system, {}, ())]
    for end, i in (("low", 0), ("high", 1)):
        runs.append((f"{system} (as sold){SENS}{end}", system,
                     {k: str(v[i]) for k, v in CONSTANTS.items() if k not in ctx.sets}, ()))
    runs.append((f"{system} with the paper's L2 assumption", system, dict(PAPER_L2), ()))
    if not ctx.quick and system == "dgx-h100":
        runs += [("dgx-h200 (as sold)", "dgx-h200", {}, ()),
                 ("nvl72, TP 16 (as sold)", "nvl72", {"gpus": "16"}, ("llama3-70b",))]
    return runs


def _point(ctx: Context, system: str, extra: dict[str, str], case: dict[str, Any], world: str) -> Point:
    gpus = extra.get("gpus")
    sets = {k: v for k, v in extra.items() if k != "gpus"}
    base = ctx.base(system, **sets, **_launch(ctx, case["mode"]))
    if gpus:
        base["gpus"] = int(gpus)
    return {**base, **case, "scheme": "tp-nccl", "sms": P.SMS_FULL, "world": world}


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
    for world, system, extra, models in _runs(ctx):
        for case in _cases(ctx):
            if models and case["model"] not in models:
                continue
            probe = _point(ctx, system, extra, case, world)
            if not fits(probe):
                continue
            out += [(LAYER, {**probe, "scheme": s}) for s in SCHEMES]
    return out


def left_out(ctx: Context) -> int:
    """How many world x case pairs do not fit in HBM (and so are not run)."""
    n = 0
    for world, system, extra, models in _runs(ctx):
        if SENS in world:
            continue
        for case in _cases(ctx):
            if not (models and case["model"] not in models):
                n += not fits(_point(ctx, system, extra, case, world))
    return n


def _case_label(r: pd.Series) -> str:
    size = f"b{int(r['batch'])} {int(r['seq']) // 1024}k" if r["mode"] == "decode" else f"{int(r['seq']) // 1024}k"
    mode = "dec" if r["mode"] == "decode" else "pre"
    return f"{r['model'].replace('llama3-', '')} {mode} {size}"


def _gap(by: pd.DataFrame, scheme: str) -> float:
    """The period's time on GPU 0 outside every kernel (launch gaps and waits), at
    least: the total less the kernels' busy time (overlapping kernels both count, so
    for an overlapping scheme this is a lower bound)."""
    r = by.loc[scheme]
    return max(0.0, float(r["total_us"] - r["comm_kernel_us"] - r["compute_kernel_us"]))


def _launch_of(sets: str) -> str:
    import json

    return json.loads(sets or "{}").get("gpu.launch", "fitted")


def production_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (world, case): each scheme's time, CAIS's speedup over TP-NCCL and
    over the best production stack, which stack that is and the kernels it ran, and
    the telemetry that says why (the best stack's communication time against CAIS's
    compute time, the time outside any kernel)."""
    df = ok_rows(rows)
    out = []
    keys = ["world", "model", "mode", "batch", "seq"]
    for key, g in df.groupby(keys, sort=False):
        by = g.set_index("scheme")
        if "cais" not in by.index:
            continue
        row = dict(zip(keys, key))
        row["case"] = _case_label(pd.Series(row))
        first = g.iloc[0]
        row["launch"] = _launch_of(str(first.get("sets", "{}")))
        row["gpus"] = int(first["gpus_run"]) if "gpus_run" in g else 8
        for s in SCHEMES:
            row[f"{s}_us"] = float(by["total_us"][s]) if s in by.index else float("nan")
        prod = [s for s in PRODUCTION if s in by.index]
        best = min(prod, key=lambda s: by["total_us"][s]) if prod else None
        cais = float(by["total_us"]["cais"])
        row["best_production"] = best or ""
        ran = by["collectives_ran"] if "collectives_ran" in by else None
        row["best_kernels"] = str(ran[best]) if best and ran is not None and isinstance(ran[best], str) else ""
        row["cais_over_tp_nccl"] = row["tp-nccl_us"] / cais
        row["cais_over_best"] = float(by["total_us"][best]) / cais if best else float("nan")
        row["best_comm_us"] = float(by["comm_kernel_us"][best]) if best else float("nan")
        row["tp_nccl_comm_us"] = float(by["comm_kernel_us"]["tp-nccl"]) if "tp-nccl" in by.index else float("nan")
        row["cais_compute_us"] = float(by["compute_kernel_us"]["cais"])
        row["best_gap_us"] = _gap(by, best) if best else float("nan")
        row["cais_gap_us"] = _gap(by, "cais")
        out.append(row)
    return pd.DataFrame(out)


def _world_lines(w: str, t: pd.DataFrame) -> list[str]:
    """The verdict of one world, a line per mode: geomean speedups over NCCL's choice
    and over the best stack, their range, and in how many cases CAIS is faster than
    the best stack by :data:`AS_GOOD` or more."""
    lines = []
    for mode in ("decode", "prefill"):
        m = t[t["mode"] == mode]
        if not len(m):
            continue
        wins = int((m["cais_over_best"] >= AS_GOOD).sum())
        launch = "/".join(sorted(set(m["launch"])))
        lines.append(f"{w}, {mode} ({launch} launches): CAIS {geomean(list(m['cais_over_tp_nccl'])):.2f}x NCCL, "
                     f"{geomean(list(m['cais_over_best'])):.2f}x the best stack"
                     + (f" (geomean; {span(list(m['cais_over_best']))})" if len(m) > 1 else "")
                     + f"; {100 * (AS_GOOD - 1):.0f} % faster or more in {wins} of {len(m)} cases.")
    return lines


def _sensitivity(t: pd.DataFrame, sens: pd.DataFrame) -> list[str]:
    """The range of CAIS's speedup over the best stack per mode over the nominal
    constants and both ends of :data:`CONSTANTS`, and what the ranges are, as lines."""
    if not len(sens):
        return []
    parts = []
    nominal = t[~t["world"].str.contains(" with the paper's L2", regex=False)]
    nominal = nominal[nominal["world"] == nominal["world"].iloc[0]]
    for mode in ("decode", "prefill"):
        vals = list(nominal[nominal["mode"] == mode]["cais_over_best"]) + list(
            sens[sens["mode"] == mode]["cais_over_best"])
        if vals:
            parts.append(f"{mode} {span(vals)}")

    def listed(keys: list[str]) -> str:
        return ", ".join(f"{k.split('.')[-1]} {CONSTANTS[k][0]:g}-{CONSTANTS[k][1]:g}" for k in keys)
    launch = [k for k in CONSTANTS if k in LAUNCH_CONSTANTS]
    fitted = [k for k in CONSTANTS if k not in LAUNCH_CONSTANTS]
    return [f"Sensitivity: over the ranges of the constants below, CAIS over the best stack spans "
            + "; ".join(parts) + ".",
            f"Launch constants, not measured here (config.py gives each one's source): {listed(launch)} us.",
            f"Kernel costs fitted on published measurements (docs/validation.md): {listed(fitted)} us.",
            "fence_us is searched only within a fence's sourced 0.5-2 us; fused_fixed_us rests on one source.",
            *([("At the edge of its range with the fit's error still falling there: "
                + ", ".join(f"{k.split('.')[-1]} ({v} end)" for k, v in edges.items())
                + " (docs/validation.md).")] if (edges := at_edge()) else []),
            "Decode's GEMMs are split as CUTLASS splits them (fix-up fitted on published skinny cuBLAS GEMMs); its "
            "small kernels have sourced floors.",
            "The whole decode step is checked against vLLM 0.6's per-token latencies (Llama-3-8B and -70B, TP 8, "
            "batch 1-6; docs/validation.md); its host pass per 10 steps is not modelled."]


def _why(t: pd.DataFrame) -> str:
    """Why, from the runs: which stack and kernels are best, their communication time
    against TP-NCCL's, and each period's time outside any kernel beside CAIS's."""
    notes = []
    for mode in ("decode", "prefill"):
        m = t[t["mode"] == mode]
        if len(m):
            kinds = ", ".join(f"{LABEL[k]} in {n} of {len(m)} cases"
                              for k, n in m["best_production"].value_counts().items())
            kern = ", ".join(f"{k}" for k in dict.fromkeys(m["best_kernels"]) if k) or "its kernels"
            notes.append(f"in {mode} the best stack is {kinds}, running {kern}; its all-reduces take "
                         f"{span(list(m['best_comm_us']), ' us')} per period against NCCL's "
                         f"{span(list(m['tp_nccl_comm_us']), ' us')}; outside any kernel its periods spend "
                         f"{span(list(m['best_gap_us']), ' us')}, CAIS's {span(list(m['cais_gap_us']), ' us')}")
    return ("Why, from the runs' telemetry (GPU 0 per period; time outside any kernel: the period less its "
            "kernels' busy time, launch gaps and waits): " + "; ".join(notes) + ".")


WHOSE = ("Whose kernels: NCCL = NCCL's own algorithm and protocol per call (Megatron, or any stack with no "
         "setting); vLLM = FlashInfer's all-reduce fused with RMSNorm (the TensorRT-LLM kernel, PDL) up to 0.5 MB "
         "at 8 GPUs where vLLM compiles the model, its custom all-reduce below 256 KiB (the input copied into its "
         "registered buffer when eager), PyTorch symmetric memory's multimem all-reduce up to 64 MiB (copy in, "
         "kernel, copy out), NCCL above; SGLang = its custom all-reduce v2 (one-shot push up to 160 KiB, an NVLS "
         "two-shot up to 16 MiB, PDL), NCCL above; TRT-LLM = its AUTO strategy: the all-reduce fused with "
         "RMSNorm, one-shot up to 64 tokens at hidden 4096 (32 at 8192) by its SM90 table, else NCCL. CAIS is a "
         "proposed NVSwitch with in-switch merging (HPCA 2026): no product runs it. Sources and commits: "
         "kernels/stacks.py, docs/schemes/tp-stacks.md.")


def _compact(t: pd.DataFrame) -> pd.DataFrame:
    """The printed table: one world, readable headers, at most 80 columns."""
    out = pd.DataFrame({"case": t["case"]})
    for s in SCHEMES:
        out[LABEL[s]] = t[f"{s}_us"]
    out["best"] = [LABEL.get(b, "") for b in t["best_production"]]
    out["CAIS x"] = t["cais_over_best"]
    out.attrs["caption"] = UNITS
    return out


#: the units and short headers of the printed table
UNITS = "times in us per layer period; best: the fastest production stack; CAIS x: its time over CAIS's"


#: how to read a case label of the production tables
CASE_KEY = ("Case labels: the model (8b: Llama-3-8B, 70b: Llama-3-70B), the mode (dec: one decode step, pre: "
            "prefill), then for decode the sequences per step and the KV-cache length (b8 8k: 8 sequences of "
            "8,192 tokens) and for prefill the prompt length (2k: 2,048 tokens).")


def production_analyse(ctx: Context, rows: pd.DataFrame) -> tuple[pd.DataFrame, Section]:
    """The table per world and case, a chart of the context's own world, a verdict per
    world with the sensitivity's range, and the claim that CAIS beats every production
    stack everywhere."""
    t = production_table(rows)
    sec = Section("production", "Past the paper: CAIS against the production stacks' TP all-reduce")
    sec.p("NCCL's own choice per call, and the all-reduce of vLLM, SGLang and TensorRT-LLM as each stack composes "
          "it by size (kernels, copies, fusion), against CAIS: Llama-3 decode (batch x KV length) and prefill, TP 8 "
          f"(nvl72: TP 16), {P.SMS_FULL} SMs; times per layer period in us.")
    sec.p(WHOSE)
    if not len(t):
        for f in failures(rows):
            sec.p(f"FAILED: {f}")
        return t, sec
    sens = t[t["world"].str.contains(SENS, regex=False)]
    main = t[~t["world"].str.contains(SENS, regex=False)]
    own = main[main["world"] == main["world"].iloc[0]]
    groups = list(own["case"])
    series = {"NCCL's choice": list(own["cais_over_tp_nccl"]), "best production stack": list(own["cais_over_best"])}
    plots.bars(ctx.out / "production.png", groups, series, "CAIS speedup, t(scheme) / t(CAIS) (x, log)",
               f"CAIS against production TP stacks, {own['world'].iloc[0]}", ratio=True)
    sec.img("production.png")
    wins = int((main["cais_over_best"] >= AS_GOOD).sum())
    every = sec.claim("CAIS is faster than every production stack in every case", wins == len(main),
                      f"{wins} of {len(main)} cases {100 * (AS_GOOD - 1):.0f} % faster or more, speedups over the "
                      f"best {span(list(main['cais_over_best']))}")
    sec.says(f"CAIS is faster than every production stack in every case ({100 * (AS_GOOD - 1):.0f} % or more): "
             f"{every}; {wins} of {len(main)} cases.",
             *[ln for w, g in main.groupby("world", sort=False) for ln in _world_lines(str(w), g)],
             *_sensitivity(t, sens))
    sec.p(_why(main))
    n_out = left_out(ctx)
    if n_out:
        sec.p(f"{n_out} world x case pairs are left out: their weights and KV cache do not fit in HBM at this TP.")
    sec.p(CASE_KEY)
    for w, g in main.groupby("world", sort=False):
        sec.p(f"{w} ({UNITS}):")
        sec.table(_compact(g).reset_index(drop=True), summary=(w == own["world"].iloc[0]))
    for f in failures(rows):
        sec.p(f"FAILED: {f}")
    return t, sec


EXPERIMENT = Experiment("production", "production", production_points, production_analyse, paper=False,
                        quick_grid="Llama-3-8B alone, decode at batch 1 and prefill of 1,024 tokens")
