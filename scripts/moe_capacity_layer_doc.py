"""A capacity factor in MoE layers under ``cais run`` (``--set moe.capacity_factor=F
--set moe.capacity=drop|pad``): qwen3-30b-a3b (hidden 2,048, 128 experts, top-8) on
dgx-h100, attention TP over the 8 GPUs at seq 1,024 and batch 1 (128 tokens routed per
GPU), EP 8, power-law routing (``moe.routing=powerlaw``, alpha 1.2, seed 0), under
``ep-nccl`` and ``ep-allgather``, prefill and (``ep-nccl``) training. Each row is one
``run_layer``: ``dropped`` the (token, expert) selections capacity dropped and ``padded``
the padding rows it added (over every GPU), ``busiest rows`` the most rows one GPU's
grouped GEMMs take (padding included), ``dispatch`` / ``combine`` bytes what GPU 0
sends in the period's dispatches and combines (the backward's included), then the
period's dispatch, combine and grouped-GEMM spans and the layer's time. Prints a
Markdown table (docs/moe.md, "Capacity padding"; checked by tests/test_samples.py).

    PYTHONPATH=src .venv/bin/python scripts/moe_capacity_layer_doc.py
"""

from __future__ import annotations

from cais.config import apply_overrides, load_system
from cais.experiments.layer import LayerResult, run_layer
from cais.workload.moe import load_moe_model

MODEL, SEQ = "qwen3-30b-a3b", 1024
#: (scheme, mode, capacity, capacity factor)
CASES = (("ep-nccl", "prefill", "none", None), ("ep-nccl", "prefill", "drop", 1.0),
         ("ep-nccl", "prefill", "pad", 1.0), ("ep-nccl", "prefill", "pad", 2.0),
         ("ep-allgather", "prefill", "none", None), ("ep-allgather", "prefill", "drop", 1.0),
         ("ep-allgather", "prefill", "pad", 1.0),
         ("ep-nccl", "train", "none", None), ("ep-nccl", "train", "drop", 1.0), ("ep-nccl", "train", "pad", 1.0))


def run(scheme: str, mode: str, capacity: str, cf: float | None) -> LayerResult:
    """One MoE layer period at ``capacity`` / ``cf`` (module doc)."""
    sets = {"moe.routing": "powerlaw"}
    if cf is not None:
        sets.update({"moe.capacity_factor": str(cf), "moe.capacity": capacity})
    cfg = apply_overrides(load_system("dgx-h100"), sets)
    return run_layer(cfg, load_moe_model(MODEL, seq=SEQ, batch=1), scheme, mode)


def main() -> None:
    print("| scheme | mode | capacity | factor | dropped | padded | busiest rows | dispatch bytes | combine bytes | "
          "dispatch (us) | combine (us) | grouped GEMMs (us) | layer (us) |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for scheme, mode, capacity, cf in CASES:
        r = run(scheme, mode, capacity, cf)
        mo = r.moe
        assert mo is not None and mo["capacity"] == capacity
        print(f"| {scheme} | {mode} | {capacity} | {'-' if cf is None else cf} | {mo['dropped']:,} | "
              f"{mo['padded_rows']:,} | {max(mo['received_rows']):,} | {mo['dispatch_bytes']:,} | "
              f"{mo['combine_bytes']:,} | {mo['dispatch_us']:,.1f} | {mo['combine_us']:,.1f} | "
              f"{mo['grouped_gemm_us']:,.1f} | {r.total_us:,.1f} |")


if __name__ == "__main__":
    main()
