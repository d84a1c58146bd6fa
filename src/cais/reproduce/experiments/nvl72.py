"""Past the paper: an NVL72-class system (the nvl72 preset: NVLink5, one link to each
of 18 switch chips) at TP 8 to 72, 132 SMs, on a Llama-3-70B-like shape whose heads
and FFN split over every TP degree; TP-NVLS, FuseLib-NVLS and CAIS."""

from __future__ import annotations

import pandas as pd

from cais.reproduce import paper as P
from cais.reproduce.experiments.common import LAYER, Context, Experiment
from cais.reproduce.experiments.speedup import speedup_section
from cais.reproduce.report import Section
from cais.sweep.grid import Point


def nvl72_points(ctx: Context) -> list[tuple[str, Point]]:
    """Each scheme at TP 8, 18, 36, 72 (quick: Mega-GPT-4B with 32 heads, TP 8 and 16)."""
    counts = (8, 16) if ctx.quick else (8, 18, 36, 72)
    # head and FFN counts that split over every TP degree: 32 heads (quick), or a Llama-3-70B-like shape
    # with 72 heads of 128 and FFN 27,648 (= 72 x 384)
    m = {"model": "paper-mega-gpt-4b", "batch": 1, "seq": 256, "heads": 32} if ctx.quick else \
        {"model": "llama3-70b", "batch": 1, "seq": 2048, "hidden": 9216, "heads": 72, "kv_heads": 72,
         "ffn_hidden": 27648}
    return [(LAYER, {**ctx.base("nvl72"), **m, "gpus": n, "scheme": s, "mode": "prefill", "sms": P.SMS_FULL})
            for n in counts for s in (("tp-nvls", "cais") if ctx.quick else ("tp-nvls", "fuselib-nvls", "cais"))]


def nvl72_analyse(ctx: Context, rows: pd.DataFrame) -> tuple[pd.DataFrame, Section]:
    """CAIS's speedup per TP degree (:func:`speedup_section`)."""
    return speedup_section(ctx, rows, "nvl72", "Past the paper: an NVL72-class system at TP 8 to 72",
                           f"nvl72 preset (NVLink5, 50 GB/s per link, one link to each of 18 chips), {P.SMS_FULL} "
                           "SMs; a Llama-3-70B-like shape whose heads (72 x 128) and FFN (27,648) split over TP 8, "
                           "18, 36 and 72 (quick: Mega-GPT-4B with 32 heads, TP 8 and 16).", "gpus")


EXPERIMENT = Experiment("nvl72", "nvl72", nvl72_points, nvl72_analyse,
                        quick_grid="Mega-GPT-4B with 32 heads at TP 8 and 16 for a 70B-like model at TP 8-72")
