"""FP8 against BF16 routed experts in a MoE layer (``cais run --set moe.dispatch_dtype=fp8
--set moe.expert_dtype=fp8``): deepseek-v3 on dgx-h100 at EP 8, attention TP 8, uniform
routing (seed 0), its dispatch FP8 in both columns, under DeepEP's normal
(``ep-deepep``) and low-latency (``ep-deepep-ll``) kernels and the in-switch
``ep-switch`` (its fused block: dispatch, experts and combine in one kernel), in
prefill (seq 1,024: 128 tokens per rank) and decode (64 sequences, KV 1,024: 8 tokens
per rank), the system's default launches. Each row is two runs; ``experts`` is the
grouped GEMMs' time (``moe.grouped_gemm_us``), and for the fused kernel the whole fused
block's (``moe.fused_us``: its dispatch and combine too). Prints a Markdown table
(docs/moe.md, "FP8 experts"; checked by tests/test_samples.py).

    PYTHONPATH=src .venv/bin/python scripts/fp8_experts_doc.py
"""

from __future__ import annotations

from cais.config import apply_overrides, load_system
from cais.experiments.layer import LayerResult, run_layer
from cais.workload.moe import load_moe_model

MODEL = "deepseek-v3"
#: (mode, batch, seq): seq is the KV cache's length in decode
SHAPES = (("prefill", 1, 1024), ("decode", 64, 1024))
SCHEMES = ("ep-deepep", "ep-deepep-ll", "ep-switch")


def run(mode: str, batch: int, seq: int, scheme: str, expert_dtype: str) -> LayerResult:
    """One MoE layer period of :data:`MODEL`, FP8 dispatch, its experts in ``expert_dtype``."""
    cfg = apply_overrides(load_system("dgx-h100"), {"moe.dispatch_dtype": "fp8", "moe.expert_dtype": expert_dtype})
    return run_layer(cfg, load_moe_model(MODEL, batch=batch, seq=seq), scheme, mode)


def experts_us(r: LayerResult) -> float:
    """The experts' time in ``r``: its grouped GEMMs, or the fused block holding them."""
    assert r.moe is not None
    return float(r.moe["grouped_gemm_us"]) or float(r.moe["fused_us"])


def main() -> None:
    print("| mode | tokens per rank | scheme | experts, bf16 (us) | experts, fp8 (us) | layer, bf16 (us) | "
          "layer, fp8 (us) | layer fp8 vs bf16 |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for mode, batch, seq in SHAPES:
        for scheme in SCHEMES:
            bf, f8 = (run(mode, batch, seq, scheme, dtype) for dtype in ("bf16", "fp8"))
            assert bf.moe is not None and f8.moe is not None and f8.moe["expert_dtype"] == "fp8"
            per_rank = (batch * (seq if mode == "prefill" else 1)) // bf.gpus
            print(f"| {mode} | {per_rank:,} | {scheme} | {experts_us(bf):,.1f} | {experts_us(f8):,.1f} | "
                  f"{bf.total_us:,.1f} | {f8.total_us:,.1f} | {100 * (f8.total_us / bf.total_us - 1):+.1f} % |")


if __name__ == "__main__":
    main()
