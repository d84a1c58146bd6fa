"""Capacity ``pad`` against ``drop`` and dropless in the EP kernels that take it
(``cais ep --capacity-factor F --capacity pad``): qwen3-30b-a3b's shape (hidden 2,048,
128 experts, top-8) on dgx-h100 at EP 8, 256 tokens per rank, powerlaw routing (alpha
1.2, seed 0), BF16. Each row is one dispatch and one combine run over the same drawn
routing. ``padded rows``: the padding rows of every rank; ``pad bytes sent``: what the
kernel sent of them between GPUs, over every GPU and both ops; ``busiest expert
rows``: the rows the most loaded expert's grouped GEMM computes (padding included).
algbw counts the real rows only (DeepEP's count, docs/moe.md). Prints a Markdown table
(docs/moe.md, "Capacity padding"; checked by tests/test_samples.py).

    PYTHONPATH=src .venv/bin/python scripts/capacity_pad_doc.py
"""

from __future__ import annotations

from cais.config import load_system
from cais.experiments.ep import EpResult, run_ep
from cais.workload.moe import load_moe_model
from cais.workload.routing import generate

MODEL, TOKENS, ALPHA, SEED = "qwen3-30b-a3b", 256, 1.2, 0
#: (capacity, capacity factor)
CASES = (("none", None), ("drop", 1.0), ("pad", 1.0), ("pad", 1.25), ("pad", 2.0))
KERNELS = ("nccl", "allgather")


def run(kernel: str, op: str, capacity: str, cf: float | None) -> EpResult:
    """One ``op`` of ``kernel`` at ``capacity`` / ``cf`` (module doc)."""
    mm = load_moe_model(MODEL)
    return run_ep(load_system("dgx-h100"), kernel, op, TOKENS, mm.hidden, mm.topk, mm.experts, "bf16",
                  routing="powerlaw", seed=SEED, alpha=ALPHA, capacity_factor=cf, capacity=capacity)


def main() -> None:
    mm = load_moe_model(MODEL)
    print("| kernel | capacity | factor | dropped | padded rows | pad bytes sent | busiest expert rows | "
          "dispatch (us) | combine (us) | dispatch algbw (GB/s) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for kernel in KERNELS:
        for capacity, cf in CASES:
            rt = generate("powerlaw", 8, TOKENS, mm.experts, mm.topk, SEED, alpha=ALPHA, capacity_factor=cf,
                          capacity=capacity)
            d, c = run(kernel, "dispatch", capacity, cf), run(kernel, "combine", capacity, cf)
            assert d.padded == c.padded == (int(rt.pad_rows.sum()) if rt.pad_rows.size else 0)
            busiest = int(rt.expert_rows().sum(axis=0).max())
            print(f"| {kernel} | {capacity} | {'-' if cf is None else cf} | {d.dropped:,} | {d.padded:,} | "
                  f"{d.pad_bytes + c.pad_bytes:,} | {busiest:,} | {d.time_us:,.1f} | {c.time_us:,.1f} | "
                  f"{d.algbw_GBps:,.1f} |")


if __name__ == "__main__":
    main()
