"""Past the paper: full-size models at 132 SMs, prefill, no scaling down. TP-NVLS,
FuseLib-NVLS and CAIS on Table II's full model and on Llama-3 70B and 405B shapes
(405B on dgx-h200: its bf16 weights per GPU at TP 8 do not fit an 80 GB H100)."""

from __future__ import annotations

import pandas as pd

from cais.reproduce import paper as P
from cais.reproduce.experiments.common import LAYER, Context, Experiment
from cais.reproduce.experiments.speedup import speedup_section
from cais.reproduce.report import Section
from cais.sweep.grid import Point


def full_points(ctx: Context) -> list[tuple[str, Point]]:
    """Full-size models at 132 SMs; Llama-3 405B on dgx-h200: its 101.5 GB of bf16
    weights per GPU at TP 8 do not fit an 80 GB H100 (docs/memory.md)."""
    ms = [({"model": "paper-full", "batch": 1, "seq": 128}, None)] if ctx.quick else \
        [({"model": "paper-full"}, None), ({"model": "llama3-70b", "batch": 1, "seq": 4096}, None),
         ({"model": "llama3-405b", "batch": 1, "seq": 2048}, "dgx-h200")]
    return [(LAYER, {**ctx.base(system), **m, "scheme": s, "mode": "prefill", "sms": P.SMS_FULL})
            for m, system in ms for s in ("tp-nvls", "fuselib-nvls", "cais")]


def full_analyse(ctx: Context, rows: pd.DataFrame) -> tuple[pd.DataFrame, Section]:
    """CAIS's speedup per model (:func:`speedup_section`)."""
    return speedup_section(ctx, rows, "full", f"Past the paper: full-size models at {P.SMS_FULL} SMs",
                           "Prefill, no scaling down: Table II full, Llama-3 70B and 405B shapes (one sequence; "
                           "4096 and 2048 tokens to stay inside the event limit). 405B runs on dgx-h200: its "
                           "weights (101.5 GB per GPU at TP 8) do not fit an 80 GB H100.", "model")


EXPERIMENT = Experiment("full", "full", full_points, full_analyse,
                        quick_grid="one model of 128 tokens for the three full-size models")
