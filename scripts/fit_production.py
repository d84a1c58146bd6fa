"""Fit the production all-reduce kernels' fixed costs on the fit set of
src/cais/data/published/production_allreduce.csv (its ``set`` column), and only on it:

* ``gpu.kernel_gap_us``: a CUDA graph's gap between dependent kernels, searched
  within its sourced range (1-2 us, NVIDIA/nccl#1984 and SGLang PR #2904); every
  row but the fused ones (launched with PDL) depends on it, but it barely moves
  their error (the other three absorb it), so it is chosen on the decode step's fit
  row in src/cais/data/published/decode_token.csv (a whole Llama-3-70B step at
  batch 1 runs about 960 dependent kernels, so its time moves with the gap), each
  gap with the other three fitted at it;
* ``collective.fence_us``: vLLM's release/acquire flag barrier at system scope
  beyond its packets (its two-shot, between the stages): the custom rows; searched
  only within its sourced range (0.5-2 us, :data:`FENCE_US`);
* ``collective.multimem_sync_us``: PyTorch symmetric memory's signal-pad syncs
  beyond their packets: the multimem rows;
* ``collective.fused_fixed_us``: the fused all-reduce + norm kernel's own fixed
  time: the fused rows.

Each row depends on the gap and on one of the other three, so for every gap the three
are fitted apart, each on its own rows; the gap with the least error on the decode fit
row wins (with no decode fit row, the least error over all fit rows). The search runs
once per step of :data:`STEPS`, the custom kernel's mechanisms added one at a time
(its load window as vLLM's loop runs it, the release's drain of the stage-1 stores),
and reports each step's fit error and its error on every scored row by GPU count; the
last step is the shipped model. A chosen value at an end of its grid with the error
still falling there is listed in ``at_edge``. The objective is the mean |ours /
published - 1| over the fit rows, by grid search over the simulator itself (each point
runs its rows). The other rows are run only to report each step's error, never to
choose a value. The result goes to src/cais/data/published/production_fit.json; the
defaults in cais/config.py carry the chosen values and a test holds them equal.

    .venv/bin/python scripts/fit_production.py [--workers 2]
    .venv/bin/python scripts/fit_production.py --table   # the shipped fit's steps, as Markdown
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from validate_production import CSV, Row, mean_error, ours_us, rows, scored_by_gpus
from validate_token import TokenRow
from validate_token import ours as token_ours
from validate_token import rows as token_rows

OUT = CSV.with_name("production_fit.json")
GAP_US = [1.0, 1.25, 1.5, 1.75, 2.0]  # the sourced range
#: each constant, the rows it acts on (by the plan's kernels) and its grid
CONSTANTS = {"collective.fence_us": "custom", "collective.multimem_sync_us": "multimem",
             "collective.fused_fixed_us": "fused"}
GRID_US = [x / 2 for x in range(0, 21)]
#: a system-scope release/acquire's sourced cost: vLLM csrc/custom_all_reduce.cuh's comment
#: (per-block release/acquire "can save about 1-2us"), vLLM PR #8558 (6-7 us saved on
#: 8 x H100 by replacing __threadfence_system with release/acquire), PR #8690 (1-2 us),
#: torchcomms #3325 (0.7-1 us per MEMBAR.SYS)
FENCE_US = [0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0]
GRIDS = {"collective.fence_us": FENCE_US, "collective.multimem_sync_us": GRID_US,
         "collective.fused_fixed_us": GRID_US}
#: the custom kernel's mechanisms, added one at a time; the last is the shipped model
STEPS = [("fence in its sourced range, the SM's 64 KiB load window",
          {"collective.custom_window": "sm", "collective.release_drain": False}),
         ("+ the load window as vLLM's loop runs it ((n - 1) x 8 KiB per block)",
          {"collective.custom_window": "threads", "collective.release_drain": False}),
         ("+ the release drains the block's last stage-1 stores",
          {"collective.custom_window": "threads", "collective.release_drain": True})]


def family(row: Row) -> str:
    """The production kernel family of the row's call (its plan's non-copy kernel)."""
    kinds = {s.kind for s in row.plan.steps} - {"copy"}
    if len(kinds) != 1:
        raise ValueError(f"row '{row.plan_text}': not one production kernel family")
    return kinds.pop()


def _times(args: tuple[list[Row], dict[str, object]]) -> list[float]:
    selected, overrides = args
    return [ours_us(r, overrides) for r in selected]


def at_edge(grid: list[float], surface: dict[float, float], value: float) -> str | None:
    """'low' or 'high' where ``value`` is an end of its grid and the error there is
    below its neighbour's (it would fall further outside the grid); else None."""
    if value == grid[0] and len(grid) > 1 and surface[grid[0]] < surface[grid[1]]:
        return "low"
    if value == grid[-1] and len(grid) > 1 and surface[grid[-1]] < surface[grid[-2]]:
        return "high"
    return None


def _decode_error(args: tuple[list[TokenRow], dict[str, object]]) -> float:
    """The mean |ours / published - 1| of the decode step over ``rows`` at ``overrides``."""
    selected, overrides = args
    errs = []
    for row in selected:
        t = token_ours(row, sets=overrides).token
        assert t is not None
        errs.append(abs(t.token_us / row.time_us - 1))
    return sum(errs) / len(errs)


def _fit_step(pool: ProcessPoolExecutor, groups: dict[str, list[Row]], mech: dict[str, object],
              cache: dict[tuple[str, float, float], float], decode: list[TokenRow]) -> dict[str, object]:
    """One grid search with the mechanisms ``mech``; ``cache`` keeps the errors of the
    constants they do not touch (multimem, fused) across steps; ``decode``: the decode
    step's fit rows, on which the gap is chosen."""
    jobs = [(key, gap, x) for gap in GAP_US for key in CONSTANTS for x in GRIDS[key]
            if key == "collective.fence_us" or (key, gap, x) not in cache]
    times = list(pool.map(_times, [(groups[key], {**mech, "gpu.kernel_gap_us": gap, key: x})
                                   for key, gap, x in jobs]))
    err = dict(cache)
    for job, t in zip(jobs, times):
        err[job] = mean_error(groups[job[0]], t)
        if job[0] != "collective.fence_us":
            cache[job] = err[job]
    per_gap = {}
    for gap in GAP_US:
        best = {key: min(GRIDS[key], key=lambda x: err[(key, gap, x)]) for key in CONSTANTS}
        n = sum(len(groups[key]) for key in CONSTANTS)
        total = sum(err[(key, gap, best[key])] * len(groups[key]) for key in CONSTANTS) / n
        per_gap[gap] = (total, best)
    decode_err: dict[float, float] = {}
    if decode:
        errs = pool.map(_decode_error, [(decode, {**mech, "gpu.kernel_gap_us": g, **per_gap[g][1]}) for g in GAP_US])
        decode_err = dict(zip(GAP_US, errs))
    gap_surface = decode_err or {g: per_gap[g][0] for g in GAP_US}
    gap = min(GAP_US, key=lambda g: gap_surface[g])
    total, best = per_gap[gap]
    edges = {"gpu.kernel_gap_us": at_edge(GAP_US, gap_surface, gap)}
    for key in CONSTANTS:
        edges[key] = at_edge(GRIDS[key], {x: err[(key, gap, x)] for x in GRIDS[key]}, best[key])
    return {
        "chosen": {"gpu.kernel_gap_us": gap, **best},
        "fit_mean_error": round(total, 4),
        "at_edge": {k: v for k, v in edges.items() if v},
        "per_gap": {str(g): {"fit_mean_error": round(e, 4), **({"decode_fit_error": round(decode_err[g], 4)}
                                                                 if decode_err else {}), **b}
                    for g, (e, b) in per_gap.items()},
        "surface": {f"{key} at kernel_gap_us {g}": [[x, round(err[(key, g, x)], 4)] for x in GRIDS[key]]
                    for g in GAP_US for key in CONSTANTS},
    }


def fit(workers: int = 2) -> dict[str, object]:
    """The grid search, once per step of :data:`STEPS`; the last step's result is the
    shipped one. Returns what production_fit.json holds."""
    every = rows()
    fit_rows = [r for r in every if r.set == "fit"]
    groups = {key: [r for r in fit_rows if family(r) == fam] for key, fam in CONSTANTS.items()}
    decode = [r for r in token_rows() if r.use == "fit"]
    cache: dict[tuple[str, float, float], float] = {}
    steps = []
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for what, mech in STEPS:
            step = _fit_step(pool, groups, mech, cache, decode)
            scored = [r for r in every if r.set != "unscored"]
            overrides = {**mech, **step["chosen"]}
            chunks = [scored[i::workers] for i in range(workers)]
            parts = list(pool.map(_times, [(c, overrides) for c in chunks]))
            times = {id(r): t for c, p in zip(chunks, parts) for r, t in zip(c, p)}
            step["error_by_gpus"] = scored_by_gpus(scored, [times[id(r)] for r in scored])
            steps.append({"mechanisms": what, "settings": mech, **step})
    last = steps[-1]
    return {
        "what": "production all-reduce kernels' fixed costs, fitted on the CSV's fit rows (scripts/fit_production.py)",
        "objective": "mean |ours / published - 1| over the fit rows; the gap: over the decode step's fit rows",
        "gap_chosen_on": [f"{r.model} TP {r.gpus} batch {r.batch}: {r.stack}, {r.source.split(' (')[0]}"
                          for r in decode],
        "chosen": last["chosen"],
        "at_edge": last["at_edge"],
        "fit_rows": len(fit_rows),
        "rows_per_constant": {key: len(groups[key]) for key in CONSTANTS},
        "fit_mean_error": last["fit_mean_error"],
        "grid": {"gpu.kernel_gap_us": GAP_US, **GRIDS},
        "steps": [{k: v for k, v in st.items() if k not in ("per_gap", "surface")} for st in steps],
        "per_gap": last["per_gap"],
        "surface": last["surface"],
    }


def steps_table(result: dict[str, Any]) -> str:
    """The fit's steps as Markdown, from production_fit.json: each step's mechanisms,
    the chosen constants (an edge flag beside a value at the end of its grid with the
    error still falling there), the fit set's error, and every scored row's error by GPU
    count and kernel family."""
    lines = ["| mechanisms | kernel_gap_us | fence_us | multimem_sync_us | fused_fixed_us | fit set | "
             "scored rows by GPUs and kernel: mean \\|error\\| (bias) |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for st in result["steps"]:
        cells = []
        for key in ("gpu.kernel_gap_us", *CONSTANTS):
            edge = st["at_edge"].get(key)
            cells.append(f"{st['chosen'][key]:g}" + (f" (at its {edge} edge)" if edge else ""))
        groups = "; ".join(f"{k} {100 * v['mean_error']:.0f} % ({100 * v['bias']:+.0f} %)"
                           for k, v in st["error_by_gpus"].items())
        lines.append(f"| {st['mechanisms']} | {' | '.join(cells)} | {100 * st['fit_mean_error']:.1f} % | {groups} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--table", action="store_true", help="print the shipped fit's steps (production_fit.json) "
                                                          "as Markdown and stop")
    args = ap.parse_args()
    if args.table:
        print(steps_table(json.loads(OUT.read_text())))
        return
    result = fit(args.workers)
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("chosen", "at_edge", "fit_rows", "fit_mean_error")}, indent=1))
    for st in result["steps"]:
        print(f"{st['mechanisms']}: fit {st['fit_mean_error']:.1%}, chosen {st['chosen']}, edge {st['at_edge']}")
        print("   ", st["error_by_gpus"])
    print(f"written: {OUT.relative_to(Path.cwd()) if OUT.is_relative_to(Path.cwd()) else OUT}")


if __name__ == "__main__":
    main()
