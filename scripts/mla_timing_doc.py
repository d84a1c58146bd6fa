"""The measured table of docs/moe.md, "Models" (MLA timed as MLA): one deepseek-v3 layer
period on dgx-h100 under ep-deepep with attention data parallel, its attention timed as
the MHA stand-in (``moe.mla_timing=mha``, the default) and as MLA's own ops (``mla``), in
decode (batch 8 per GPU at KV lengths 1,024 and 4,096), prefill (batch 1, seq 512) and
train (batch 1, seq 512), uniform routing, seed 0, as

    cais run --model deepseek-v3 --scheme ep-deepep --attention dp --mode MODE --batch B --seq S \\
        --set moe.mla_timing=TIMING --json

runs each. The attention side is split into the attention kernel (with, in decode, its
rotary and KV-cache write), the input projections (the stand-in's QKV GEMM; MLA's qkv_a,
latent norms, q_b and kv_b or q_absorb) and the output side (MLA's v_absorb and the
output projection), each with its backward in train. Prints a Markdown table (a test
re-runs it and compares).

    PYTHONPATH=src .venv/bin/python scripts/mla_timing_doc.py
"""

from __future__ import annotations

from cais.config import load_system
from cais.experiments.layer import run_layer
from cais.hw.compute import ComputeModel
from cais.workload.mla import mla_dims
from cais.workload.moe import load_moe_model

MODEL, SYSTEM, SCHEME, ATTENTION = "deepseek-v3", "dgx-h100", "ep-deepep", "dp"
#: (mode, batch, seq: the KV length in decode)
SHAPES = (("decode", 8, 1024), ("decode", 8, 4096), ("prefill", 1, 512), ("train", 1, 512))
TIMINGS = ("mha", "mla")
#: the attention side's parts: segment names of the period (either timing's), the backward's included
PARTS = {
    "attention": ("attention", "attention_bwd"),
    "input projections": ("qkv", "qkv_dgrad", "qkv_wgrad", "qkv_a", "q_a_norm", "kv_a_norm", "q_b", "q_proj",
                          "kv_b", "q_absorb", "kv_b_dgrad", "q_b_dgrad", "q_proj_dgrad", "q_a_norm_bwd",
                          "kv_a_norm_bwd", "qkv_a_dgrad", "qkv_a_wgrad", "q_b_wgrad", "q_proj_wgrad", "kv_b_wgrad"),
    "output side": ("v_absorb", "out_proj", "out_proj_dgrad", "out_proj_wgrad"),
}


def rows() -> list[dict[str, object]]:
    """One row per (shape, timing): the layer period (us), its attention-side parts (us),
    the sum of its other segments' spans (us: the expert block, the residual norms, the
    router; the shared experts' overlap the dispatch's, so the sums are not the period),
    in decode the time per output token (us) and, for MLA's decode, its attention's FLOPs
    at the fitted forward attention efficiency of the tensor-core peak (us: the kernel
    takes the longer of these and its cache read, kernels/mla.py)."""
    system = load_system(SYSTEM)
    cm = ComputeModel.for_gpu(system.gpu)
    out: list[dict[str, object]] = []
    for mode, batch, seq in SHAPES:
        model = load_moe_model(MODEL, seq=seq, batch=batch)
        for timing in TIMINGS:
            cfg = system.with_overrides(moe={**system.moe.model_dump(), "mla_timing": timing})
            r = run_layer(cfg, model, SCHEME, mode, attention=ATTENTION)
            named = {s for names in PARTS.values() for s in names}
            assert set(PARTS["attention"]) & set(r.segments), "no attention segment: the path was not taken"
            assert timing == "mha" or "qkv_a" in r.segments, "mla asked, the stand-in ran"
            row: dict[str, object] = {"mode": mode, "batch": batch, "seq": seq, "timing": timing,
                                      "layer": r.total_us,
                                      "rest": sum(v for k, v in r.segments.items() if k not in named),
                                      "token": r.token.token_us if r.token is not None else None,
                                      "roof": None}
            lat = mla_dims(model, model.heads)  # attention dp: every head on each GPU
            if timing == "mla" and mode == "decode" and lat is not None:  # the FLOPs' time, beside the read
                flops = cm.mla_decode_flops(lat.heads_l, lat.latent, lat.kv_lora, batch, seq)
                row["roof"] = flops / (cm.attn_efficiency_fwd * cm.peak_tflops) / 1e6  # 1 TFLOP/s = 1 FLOP/ps
            for part, names in PARTS.items():
                row[part] = sum(r.segments.get(s, 0.0) for s in names)
            out.append(row)
    return out


def doc(table: list[dict[str, object]]) -> str:
    """The page's Markdown table of :func:`rows`: each MLA row also says its layer
    period against the stand-in's of the same shape."""
    parts = list(PARTS)
    lines = ["| mode | batch | seq / KV | timing | layer (us) | " + " | ".join(f"{p} (us)" for p in parts)
             + " | other segments (us) | layer vs mha | token (us) | MLA attention's FLOPs' time (us) |",
             "|---|---:|---:|---|---:|" + "---:|" * len(parts) + "---:|---:|---:|---:|"]
    mha: dict[tuple[object, ...], float] = {}
    for row in table:
        key = (row["mode"], row["batch"], row["seq"])
        layer = float(str(row["layer"]))
        if row["timing"] == "mha":
            mha[key] = layer
        vs = f"{layer / mha[key]:.2f}x" if row["timing"] == "mla" and key in mha else "-"
        cells = " | ".join(f"{float(str(row[p])):,.1f}" for p in parts)
        token = "-" if row["token"] is None else f"{float(str(row['token'])):,.0f}"
        roof = "-" if row["roof"] is None else f"{float(str(row['roof'])):,.1f}"
        lines.append(f"| {row['mode']} | {row['batch']} | {int(str(row['seq'])):,} | {row['timing']} | {layer:,.1f} "
                     f"| {cells} | {float(str(row['rest'])):,.1f} | {vs} | {token} | {roof} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(doc(rows()))
