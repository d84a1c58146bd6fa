"""The measured example of docs/moe.md, "Expert tensor parallelism": one deepseek-v3
prefill layer period on dgx-h100 (512 tokens, attention TP with sequence parallelism:
64 token rows per GPU) under ep-nccl, ep-deepep and ep-allgather at expert TP 1 and 2,
as ``cais run --model deepseek-v3 --scheme ep-<kernel> --mode prefill --seq 512
--expert-tp N --json`` runs it. ``--doc`` prints the page's table (a test checks the page
against it)."""

from __future__ import annotations

import sys

from cais.config import load_system
from cais.experiments.layer import run_layer
from cais.workload.moe import load_moe_model

MODEL, SYSTEM, MODE, SEQ = "deepseek-v3", "dgx-h100", "prefill", 512
KERNELS = ("nccl", "deepep", "allgather")
EXPERT_TPS = (1, 2)
COLUMNS = ("layer", "dispatch", "combine", "grouped GEMMs", "expert-TP collectives")


def rows() -> list[dict[str, object]]:
    """One row per (kernel, expert TP): the layer period's time and its expert block's
    parts (us), and the payload one GPU's expert-TP collectives sent (bytes)."""
    cfg, model = load_system(SYSTEM), load_moe_model(MODEL, seq=SEQ)
    out: list[dict[str, object]] = []
    for kernel in KERNELS:
        for tp in EXPERT_TPS:
            r = run_layer(cfg, model, f"ep-{kernel}", MODE, expert_tp=tp)
            mo = r.moe or {}
            out.append({"kernel": kernel, "expert_tp": tp, "ep": mo["ep"], "layer": r.total_us,
                        "dispatch": mo["dispatch_us"], "combine": mo["combine_us"],
                        "grouped GEMMs": mo["grouped_gemm_us"], "expert-TP collectives": mo["expert_tp_us"],
                        "bytes": mo["expert_tp_bytes"]})
    return out


def doc(table: list[dict[str, object]]) -> str:
    """The page's markdown table of :func:`rows`."""
    head = "| scheme | EP x expert TP | " + " | ".join(f"{c} (us)" for c in COLUMNS) + " | expert-TP bytes per GPU |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 3)]
    for row in table:
        cells = " | ".join(f"{float(row[c]):,.1f}" for c in COLUMNS)  # type: ignore[arg-type]
        lines.append(f"| ep-{row['kernel']} | {row['ep']} x {row['expert_tp']} | {cells} | {int(row['bytes']):,} |")
    return "\n".join(lines)


if __name__ == "__main__":
    table = rows()
    print(doc(table) if "--doc" in sys.argv[1:] else table)
