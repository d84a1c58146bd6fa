"""What the scored larger-batch decode rows (src/cais/data/published/decode_token.csv)
would gain in ours if the CUDA graph's batch padding of vLLM 0.6 were run: vLLM 0.6.0
and 0.6.1 capture decode graphs for 1, 2 and 4 sequences and then every multiple of 8,
and pad a decode batch up to the next captured size (``_get_graph_batch_size`` in
``vllm/worker/model_runner.py`` at both tags), so a batch of 6 runs the graph of 8.
What the graph holds (the embedding, the layers, the final norm) runs at the padded
batch; the lm_head, the logits gather and the sampler run outside it on the real
sequences only (``_prune_hidden_states`` in ``logits_processor.py`` keeps the selected
rows). A what-if beside the model, not the model: ``validate_token.py`` runs every row
at its own batch (docs/validation.md, "What grows with the batch, from the sources").

One Markdown row per scored row above batch 1: the graph's batch, the published time
and its growth from the same model's batch-1 row, ours at the row's batch and with the
graph's batch in the graph, and what is still missing per layer. Under the table, the
scored rows' mean |error| both ways (the batch-1 rows as they are), and per model ours'
one-shot all-reduce per call and the period's segments at batch 1 and at the padded
batch 8.

    .venv/bin/python scripts/decode_batch_growth.py
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType

from cais.experiments.layer import LayerResult

#: the tail parts that run inside vLLM 0.6's decode graph (the rest run outside it)
IN_GRAPH_TAIL = ("embedding", "final_norm")


def _validate_token() -> ModuleType:
    """scripts/validate_token.py, whose rows and runs this what-if reuses (imported
    from this script's folder, where it lives beside it)."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    return importlib.import_module("validate_token")


def graph_batch(batch: int) -> int:
    """The decode batch vLLM 0.6's CUDA graph runs for ``batch`` sequences: 1, 2 and 4
    as they are, 3 as 4, above 4 the next multiple of 8 (vllm/worker/model_runner.py,
    ``_get_graph_batch_size``, v0.6.0 and v0.6.1)."""
    if batch < 1:
        raise ValueError(f"batch {batch}: at least 1 sequence")
    if batch <= 2:
        return batch
    if batch <= 4:
        return 4
    return -(-batch // 8) * 8


def padded_token_us(real: LayerResult, padded: LayerResult) -> float:
    """The step per output token with the graph's contents at the padded batch (the
    layers, the embedding and the final norm of ``padded``) and the rest of the tail at
    the real batch (``real``'s lm_head, logits gather and sampling)."""
    assert real.token is not None and padded.token is not None
    inside = sum(padded.token.tail[k] for k in IN_GRAPH_TAIL)
    outside = sum(v for k, v in real.token.tail.items() if k not in IN_GRAPH_TAIL)
    return padded.token.layers * padded.token.layer_us + inside + outside


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
          "ours, graph's batch in the graph (us) | padding adds (us) | ours' growth, padded (us) | "
          "still missing per layer (us) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    errors: dict[str, list[tuple[float, float]]] = {}  # use -> (|error| as run, |error| padded), each row
    for row in scored:
        if row.batch == 1:
            e = abs(token_us(vt.ours(row)) / row.time_us - 1)
            errors.setdefault(row.use, []).append((e, e))
    for row in sorted((r for r in scored if r.batch > 1 and r.model in base), key=lambda r: (r.model, r.batch)):
        real = vt.ours(row)
        g = graph_batch(row.batch)
        t = token_us(real)
        tp = padded_token_us(real, vt.ours(replace(row, batch=g))) if g != row.batch else t
        grown = row.time_us - base[row.model].time_us
        ours_grown = tp - base_us[row.model]
        errors.setdefault(row.use, []).append((abs(t / row.time_us - 1), abs(tp / row.time_us - 1)))
        print(f"| {row.model} | {row.batch} | {g} | {row.time_us:,.0f} | {grown:+,.0f} | {t:,.0f} | {tp:,.0f} | "
              f"{tp - t:+,.0f} | {ours_grown:+,.0f} | {(grown - ours_grown) / vt.load_model(row.model).layers:+.1f} |")
    print()
    for use, pairs in sorted(errors.items()):
        run, padded = (100 * sum(p[i] for p in pairs) / len(pairs) for i in (0, 1))
        print(f"{use} rows: {len(pairs)}, mean |error| {run:.1f} % as run, {padded:.1f} % with the graph's batch "
              "in the graph")
    for model, row in sorted(base.items()):
        one, eight = vt.ours(row), vt.ours(replace(row, batch=8))
        a1, a8 = all_reduce_per_call_us(one), all_reduce_per_call_us(eight)
        print(f"ours' one-shot all-reduce per call, {model}: {a1:.2f} us at 1 sequence, {a8:.2f} us at 8 "
              f"({a8 - a1:+.2f} us per call, {2 * (a8 - a1):+.2f} us per layer)")
        moved = ", ".join(f"{k} {one.segments[k]:.1f} -> {eight.segments[k]:.1f}" for k in one.segments)
        print(f"ours' period segments, {model}, 1 -> 8 sequences (us): {moved}")


if __name__ == "__main__":
    main()
