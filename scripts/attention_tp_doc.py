"""The measured table of docs/moe.md, "Attention TP groups": one deepseek-v3 layer
period on dgx-h100 under ep-deepep with its attention in TP groups of N = 8, 4, 2 and 1
GPUs, in prefill, decode and train, at the shapes ``cais run`` uses by default (the
preset's batch 1 and seq 4,096; uniform routing, seed 0), as

    cais run --model deepseek-v3 --scheme ep-deepep --mode MODE --attention-tp N --json

runs each. ``batch`` is per attention group, so the GPUs / N groups run GPUs / N times
the sequences of N = 8: the columns say how many. Prints a Markdown table (a test
re-runs it and compares).

    PYTHONPATH=src .venv/bin/python scripts/attention_tp_doc.py
"""

from __future__ import annotations

from cais.config import load_system
from cais.experiments.layer import run_layer
from cais.workload.moe import load_moe_model

MODEL, SYSTEM, SCHEME = "deepseek-v3", "dgx-h100", "ep-deepep"
MODES = ("prefill", "decode", "train")
GROUPS = (8, 4, 2, 1)
#: the parts reported (us): segments of the period, the backward's included
PARTS = (("attention", ("attention", "attention_bwd")), ("dispatch", ()), ("combine", ()), ("grouped GEMMs", ()))


def rows() -> list[dict[str, object]]:
    """One row per (mode, attention TP N): the attention groups, the sequences over
    them, the token rows each GPU routes, the layer period and its parts (us), the
    attention collectives that ran (algorithm/protocol: count) and, in decode, the time
    per output token (us)."""
    cfg, model = load_system(SYSTEM), load_moe_model(MODEL)
    out: list[dict[str, object]] = []
    for mode in MODES:
        for n in GROUPS:
            r = run_layer(cfg, model, SCHEME, mode, attention_tp=n)
            mo = r.moe or {}
            assert mo.get("attention_tp") == n
            row: dict[str, object] = {
                "mode": mode, "attention_tp": n, "groups": cfg.gpus // n, "sequences": model.batch * cfg.gpus // n,
                "rows": mo["tokens_per_rank"], "layer": r.total_us,
                "attention": sum(r.segments.get(s, 0.0) for s in PARTS[0][1]), "dispatch": mo["dispatch_us"],
                "combine": mo["combine_us"], "grouped GEMMs": mo["grouped_gemm_us"],
                "collectives": ", ".join(f"{k}: {v}" for k, v in r.collectives_ran.items()) or "none",
                "token": r.token.token_us if r.token is not None else None}
            out.append(row)
    return out


def doc(table: list[dict[str, object]]) -> str:
    """The page's Markdown table of :func:`rows`."""
    parts = [name for name, _ in PARTS]
    lines = ["| mode | attention TP | groups | sequences | token rows per GPU | layer (us) | layer per sequence (us) | "
             + " | ".join(f"{p} (us)" for p in parts) + " | attention collectives | token (us) |",
             "|---|---:|---:|---:|---:|---:|---:|" + "---:|" * len(parts) + "---|---:|"]
    for row in table:
        layer, seqs = float(str(row["layer"])), int(str(row["sequences"]))
        cells = " | ".join(f"{float(row[p]):,.1f}" for p in parts)  # type: ignore[arg-type]
        token = "-" if row["token"] is None else f"{float(row['token']):,.0f}"  # type: ignore[arg-type]
        lines.append(f"| {row['mode']} | {row['attention_tp']} | {row['groups']} | {seqs:,} | {row['rows']:,} "
                     f"| {layer:,.1f} | {layer / seqs:,.1f} | {cells} | {row['collectives']} | {token} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(doc(rows()))
