"""A MoE model's decode time per output token, as ``cais run --mode decode`` gives it
(experiments/layer.py ``moe_decode_token``): mixtral-8x7b, qwen3-30b-a3b and deepseek-v3
on dgx-h100 at EP 8, attention TP 8 with sequence parallelism, 1, 8 and 64 tokens per
rank (8, 64 and 512 sequences), 1,024 tokens of KV cache, uniform routing (seed 0),
under DeepEP's normal kernels (``ep-deepep``, eager launches: its dispatch waits on the
host for the receive counts, so no stack captures it in a CUDA graph) and its
low-latency kernels (``ep-deepep-ll``, under a CUDA graph, as SGLang runs them in
decode). Prints a Markdown table (docs/moe.md, "The decode step per output token").

    PYTHONPATH=src .venv/bin/python scripts/moe_token.py
"""

from __future__ import annotations

from cais.config import apply_overrides, load_system
from cais.experiments.layer import run_layer
from cais.experiments.token import MoeTokenTime
from cais.workload.moe import load_moe_model

MODELS = ("mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3")
PER_RANK = (1, 8, 64)
KV = 1024
#: scheme -> the launch its stacks run decode under
SCHEMES = (("ep-deepep", "eager"), ("ep-deepep-ll", "graph"))


def main() -> None:
    base = load_system("dgx-h100")
    n = base.gpus
    print("| model | scheme | launch | tokens per rank | token (us) | MoE layers x period (us) | "
          "dense layers x period (us) | tail (us) | lm_head | logits gather | attention | dispatch | combine | "
          "grouped GEMMs |")
    print("|---|---|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in MODELS:
        for scheme, launch in SCHEMES:
            cfg = apply_overrides(base, {"gpu.launch": launch})
            for per in PER_RANK:
                model = load_moe_model(name, batch=per * n, seq=KV)
                r = run_layer(cfg, model, scheme, "decode")
                t, mo = r.token, r.moe
                assert isinstance(t, MoeTokenTime) and mo is not None
                first = f"{t.dense_layers} x {t.dense_layer_us:,.1f}" if t.dense_layers else "-"
                print(f"| {name} | {scheme} | {launch} | {per} | {t.token_us:,.0f} | {t.layers} x {t.layer_us:,.1f} | "
                      f"{first} | {t.tail_us:,.1f} | {t.tail['lm_head']:,.1f} | {t.tail['logits_gather']:,.1f} | "
                      f"{r.segments['attention']:,.1f} | {mo['dispatch_us']:,.1f} | {mo['combine_us']:,.1f} | "
                      f"{mo['grouped_gemm_us']:,.1f} |")
    # the nearest published step (docs/moe.md): SGLang v0.4.1.post2 (PR #2643), DeepSeek-V3 FP8 at TP 8 on one
    # node (GPU not named: more than 80 GB each), experts under TP (not EP), CUDA graph, batch 1, input 128,
    # output 256: 30.29 tokens/s
    published_us = 1e6 / 30.29
    cfg = apply_overrides(load_system("dgx-h200"), {"gpu.launch": "graph"})
    r = run_layer(cfg, load_moe_model("deepseek-v3", batch=1, seq=128 + 256 // 2), "ep-deepep-ll", "decode")
    assert r.token is not None
    print(f"\nnearest published step (unscored): deepseek-v3, dgx-h200, ep-deepep-ll, graph, batch 1, KV 256: ours "
          f"{r.token.token_us:,.0f} us against SGLang PR #2643's {published_us:,.0f} us "
          f"({100 * (r.token.token_us / published_us - 1):+.0f} %)")


if __name__ == "__main__":
    main()
