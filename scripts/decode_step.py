"""The whole decode step per output token, as ``cais run --mode decode --launch graph``
gives it (experiments/token.py): Llama-3-8B and Llama-3-70B at TP 8 on dgx-h100, one
sequence and 1,024 or 8,192 tokens of KV cache, under vLLM's all-reduce (``tp-vllm``):
the layers at the simulated period, the tail's parts, and the layer period's own
segments. Prints a Markdown table (docs/compute-model.md, "The decode step").

    .venv/bin/python scripts/decode_step.py
"""

from __future__ import annotations

from cais.config import apply_overrides, load_system
from cais.experiments.layer import run_layer
from cais.workload.models import load_model

CASES = (("llama3-8b", 1, 1024), ("llama3-8b", 1, 8192), ("llama3-70b", 1, 1024), ("llama3-70b", 1, 8192))


def main() -> None:
    cfg = apply_overrides(load_system("dgx-h100"), {"gpu.launch": "graph"})
    print("| model | batch | KV | token (us) | layers x period (us) | attention seg. | L1 | L2 | embedding | "
          "final norm | lm_head | logits gather | sampling |")
    print("|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, batch, kv in CASES:
        r = run_layer(cfg, load_model(name).with_run(batch, kv), "tp-vllm", "decode", cfg.gpu.sms)
        t = r.token
        assert t is not None
        s, tail = r.segments, t.tail
        print(f"| {name} | {batch} | {kv:,} | {t.token_us:,.0f} | {t.layers} x {t.layer_us:.1f} | "
              f"{s['attention']:.1f} | {s['L1']:.1f} | {s['L2']:.1f} | {tail['embedding']:.1f} | "
              f"{tail['final_norm']:.1f} | {tail['lm_head']:.1f} | {tail['logits_gather']:.1f} | "
              f"{tail['sampling']:.1f} |")


if __name__ == "__main__":
    main()
