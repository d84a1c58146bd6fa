"""Past the paper: decode with a KV cache. One new token per sequence over a KV cache
of the sequence length, 132 SMs, where the collectives are small and latency-bound;
CAIS against TP-NVLS, SP-NVLS, FuseLib-NVLS and T3-NVLS."""

from __future__ import annotations

import pandas as pd

from cais.reproduce import paper as P
from cais.reproduce.experiments.common import LAYER, Context, Experiment
from cais.reproduce.experiments.speedup import speedup_section
from cais.reproduce.report import Section
from cais.sweep.grid import Point


def decode_points(ctx: Context) -> list[tuple[str, Point]]:
    """LLaMA-7B, 64 sequences x 3,072 (quick: Mega-GPT-4B, 16 x 1,024), each scheme."""
    m = {"model": "paper-mega-gpt-4b", "batch": 16, "seq": 1024} if ctx.quick else \
        {"model": "paper-llama-7b", "batch": 64, "seq": 3072}
    return [(LAYER, {**ctx.base(), **m, "scheme": s, "mode": "decode", "sms": P.SMS_FULL})
            for s in (("tp-nvls", "fuselib-nvls", "cais") if ctx.quick else
                      ("tp-nvls", "sp-nvls", "fuselib-nvls", "t3-nvls", "cais"))]


def decode_analyse(ctx: Context, rows: pd.DataFrame) -> tuple[pd.DataFrame, Section]:
    """CAIS's speedup per model (:func:`speedup_section`)."""
    return speedup_section(ctx, rows, "decode", "Past the paper: decode with a KV cache",
                           f"One new token per sequence over a KV cache of the sequence length, {P.SMS_FULL} SMs: "
                           "the collectives are small and latency-bound.", "model")


EXPERIMENT = Experiment("decode", "decode", decode_points, decode_analyse,
                        quick_grid="Mega-GPT-4B, 16 x 1,024 for LLaMA-7B, 64 x 3,072; three schemes")
