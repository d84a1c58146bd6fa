"""FP8 against BF16 dispatch in a MoE layer (``cais run --set moe.dispatch_dtype=fp8``):
deepseek-v3 on dgx-h100 at EP 8, attention TP 8, uniform routing (seed 0), under DeepEP's
normal (``ep-deepep``) and low-latency (``ep-deepep-ll``) kernels, in prefill (seq 4,096:
512 tokens per rank) and decode (8 and 128 tokens per rank: 64 and 1,024 sequences, KV
1,024), the system's default launches. Each row is one run; the bytes are what GPU 0
sends to other GPUs in the period's dispatch and combine (``moe.dispatch_bytes``,
``moe.combine_bytes``). Prints a Markdown table (docs/moe.md, "FP8 dispatch"; checked by
tests/test_samples.py).

    PYTHONPATH=src .venv/bin/python scripts/fp8_dispatch_doc.py
"""

from __future__ import annotations

from cais.config import apply_overrides, load_system
from cais.experiments.layer import LayerResult, run_layer
from cais.workload.moe import load_moe_model

MODEL = "deepseek-v3"
#: (mode, batch, seq): seq is the KV cache's length in decode
SHAPES = (("prefill", 1, 4096), ("decode", 64, 1024), ("decode", 1024, 1024))
SCHEMES = ("ep-deepep", "ep-deepep-ll")
DTYPES = ("bf16", "fp8")


def run(mode: str, batch: int, seq: int, scheme: str, dtype: str) -> LayerResult:
    """One MoE layer period of :data:`MODEL` with its forward dispatch in ``dtype``."""
    cfg = apply_overrides(load_system("dgx-h100"), {"moe.dispatch_dtype": dtype})
    return run_layer(cfg, load_moe_model(MODEL, batch=batch, seq=seq), scheme, mode)


def main() -> None:
    print("| mode | tokens per rank | scheme | dispatch dtype | dispatch (us) | dispatch bytes | combine (us) | "
          "combine bytes | layer (us) | layer vs bf16 |")
    print("|---|---:|---|---|---:|---:|---:|---:|---:|---:|")
    for mode, batch, seq in SHAPES:
        for scheme in SCHEMES:
            base = 0.0
            for dtype in DTYPES:
                r = run(mode, batch, seq, scheme, dtype)
                mo = r.moe
                assert mo is not None and mo["dispatch_dtype"] == dtype
                base = base or r.total_us
                per_rank = (batch * (seq if mode == "prefill" else 1)) // r.gpus
                print(f"| {mode} | {per_rank:,} | {scheme} | {dtype} | {mo['dispatch_us']:,.1f} | "
                      f"{mo['dispatch_bytes']:,} | {mo['combine_us']:,.1f} | {mo['combine_bytes']:,} | "
                      f"{r.total_us:,.1f} | {100 * (r.total_us / base - 1):+.1f} % |")


if __name__ == "__main__":
    main()
