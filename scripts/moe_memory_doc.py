"""The per-GPU HBM footprint of each MoE preset as ``cais run`` counts it
(experiments/layer.py ``moe_memory``, cais.workload.moe_footprint): every preset on
``cais run``'s default system (dgx-h100: 8 H100s, 80 GB) at its default shape (batch 1,
seq 4,096; in decode a KV cache of 4,096), EP 8 with attention TP 8 (the default),
uniform routing (seed 0), mode by mode; DeepSeek-V3 also on dgx-h200 (141 GB). Prints a
Markdown table (docs/memory.md, "MoE runs"; checked by tests/test_samples.py).

    PYTHONPATH=src .venv/bin/python scripts/moe_memory_doc.py
"""

from __future__ import annotations

from cais.config import load_system
from cais.experiments.layer import moe_memory, moe_period
from cais.workload.footprint import GB
from cais.workload.moe import list_moe_models, load_moe_model
from cais.workload.moe_footprint import WEIGHT_PARTS, MoeFootprint

SYSTEM = "dgx-h100"
MODES = ("train", "prefill", "decode")
#: (model, system) runs beyond the default system
EXTRA = (("deepseek-v3", "dgx-h200"),)


def rows() -> list[tuple[str, str, str, MoeFootprint, float, str]]:
    """(model, system, mode, footprint, capacity GB, warning) of every run of the table."""
    runs = [(name, SYSTEM) for name in list_moe_models()] + list(EXTRA)
    out = []
    for name, system in runs:
        cfg = load_system(system)
        model = load_moe_model(name)
        for mode in MODES:
            fp, warning = moe_memory(cfg, model, mode, "tp", moe_period(cfg, model, mode, "tp", 0))
            assert isinstance(fp, MoeFootprint)
            out.append((name, system, mode, fp, cfg.gpu.hbm_capacity_GB, warning))
    return out


def main() -> None:
    parts = " | ".join(p.replace("_", " ") for p in WEIGHT_PARTS)
    print(f"| model | system | mode | {parts} | weights | KV cache | activations | gradients | optimizer | total | "
          "capacity |")
    print("|---|---|---|" + "---:|" * (len(WEIGHT_PARTS) + 6) + "---|")
    for name, system, mode, fp, cap, warning in rows():
        by = " | ".join(f"{fp.weight_parts[p] / GB:,.2f}" for p in WEIGHT_PARTS)
        verdict = f"over {cap:,g}: warned" if warning else f"under {cap:,g}"
        print(f"| {name} | {system} | {mode} | {by} | {fp.weights / GB:,.1f} | {fp.kv_cache / GB:,.2f} | "
              f"{fp.activations / GB:,.2f} | {fp.gradients / GB:,.1f} | {fp.optimizer / GB:,.1f} | "
              f"{fp.total / GB:,.1f} | {verdict} |")


if __name__ == "__main__":
    main()
