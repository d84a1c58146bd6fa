"""What the CUDA graph's batch padding adds to the scored larger-batch decode rows
(src/cais/data/published/decode_token.csv) and what growth with the batch ours still
misses. vLLM 0.6.0 and 0.6.1 capture decode graphs for 1, 2 and 4 sequences and then
every multiple of 8, and pad a decode batch up to the next captured size
(``_get_graph_batch_size`` in ``vllm/worker/model_runner.py`` at both tags), so a batch
of 6 runs the graph of 8; the model runs it so (``decode.graph_padding``,
experiments/token.py): the graph's contents (the layers, the embedding, the final norm)
at the padded batch, the lm_head, the logits gather and the sampler on the real rows.

One Markdown row per scored row above batch 1: the graph's batch, the published time
and its growth from the same model's batch-1 row, ours as run and with the padding off
(``decode.graph_padding=false``), what the padding adds, ours' growth from its batch-1
row and what is still missing per layer. Under the table, the scored rows' mean |error|
both ways, and per model ours' one-shot all-reduce per call and the period's segments
at batch 1 and at the padded batch 8 (docs/validation.md, "What grows with the batch,
from the sources").

    .venv/bin/python scripts/decode_batch_growth.py
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType

from cais.experiments.layer import LayerResult

def _validate_token() -> ModuleType:
    """scripts/validate_token.py, whose rows and runs this what-if reuses (imported
    from this script's folder, where it lives beside it)."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    return importlib.import_module("validate_token")


def token_us(r: LayerResult) -> float:
    """A decode run's time per output token."""
    assert r.token is not None, "not a decode run"
    return r.token.token_us


def all_reduce_per_call_us(r: LayerResult) -> float:
    """Ours' all-reduce time per call in the layer: the period's communication kernels
    over the calls that ran."""
    calls = sum(r.collectives_ran.values())
    assert calls > 0, "no all-reduce ran in the layer"
    return r.kernel_us["communication"] / calls


def main() -> None:
    vt = _validate_token()
    scored = [row for row in vt.rows() if row.use in vt.SCORED]
    base = {row.model: row for row in scored if row.batch == 1}
    base_us = {m: token_us(vt.ours(row)) for m, row in base.items()}
    print("| model | batch | graph's batch | published (us) | published growth from batch 1 (us) | ours (us) | "
          "ours, padding off (us) | padding adds (us) | ours' growth (us) | still missing per layer (us) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    errors: dict[str, list[tuple[float, float]]] = {}  # use -> (|error| as run, |error| padding off), each row
    for row in scored:
        if row.batch == 1:
            e = abs(token_us(vt.ours(row)) / row.time_us - 1)
            errors.setdefault(row.use, []).append((e, e))
    ran = 0
    for row in sorted((r for r in scored if r.batch > 1 and r.model in base), key=lambda r: (r.model, r.batch)):
        run = vt.ours(row)
        assert run.token is not None
        g = run.token.graph_batch or row.batch
        t, off = token_us(run), token_us(vt.ours(row, sets={"decode.graph_padding": "false"}))
        grown = row.time_us - base[row.model].time_us
        ours_grown = t - base_us[row.model]
        errors.setdefault(row.use, []).append((abs(t / row.time_us - 1), abs(off / row.time_us - 1)))
        print(f"| {row.model} | {row.batch} | {g} | {row.time_us:,.0f} | {grown:+,.0f} | {t:,.0f} | {off:,.0f} | "
              f"{t - off:+,.0f} | {ours_grown:+,.0f} | {(grown - ours_grown) / vt.load_model(row.model).layers:+.1f} |")
        ran += 1
    assert ran, "no scored row above batch 1"
    print()
    for use, pairs in sorted(errors.items()):
        run_e, off_e = (100 * sum(p[i] for p in pairs) / len(pairs) for i in (0, 1))
        print(f"{use} rows: {len(pairs)}, mean |error| {run_e:.1f} % as run, {off_e:.1f} % with the padding off")
    for model, row in sorted(base.items()):
        one, eight = vt.ours(row), vt.ours(replace(row, batch=8))
        a1, a8 = all_reduce_per_call_us(one), all_reduce_per_call_us(eight)
        print(f"ours' one-shot all-reduce per call, {model}: {a1:.2f} us at 1 sequence, {a8:.2f} us at 8 "
              f"({a8 - a1:+.2f} us per call, {2 * (a8 - a1):+.2f} us per layer)")
        moved = ", ".join(f"{k} {one.segments[k]:.1f} -> {eight.segments[k]:.1f}" for k in one.segments)
        print(f"ours' period segments, {model}, 1 -> 8 sequences (us): {moved}")


if __name__ == "__main__":
    main()
