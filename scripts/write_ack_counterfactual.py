"""What NVLink write responses would do to the EP and dense checks (docs/moe.md, "What
the H100 miss says"): the presets post writes (``packet.write_ack_flits`` = 0); with
N > 0 every delivered write packet sends N flits back to its issuer on the reverse
link (response VCs), which an all-to-all loads in both directions.

For each packet format of :data:`VARIANTS` (``apply_overrides``; no preset is edited):

* DeepEP normal (scripts/validate_ep.py's ``deepep`` rows): the SM copy rate refitted
  on the two H800 fit rows only (minimax error, on a 0.5 GB/s grid, by bisection on the
  sum of the two signed errors), then every row, the held-out H800 BF16 and 8xH100 rows
  included, at that rate and at an unbounded rate (1e4 GB/s: the fabric alone). Each
  row is the best NVL chunk as DeepEP's test reports it; the chunk is printed too.
* The NCCL all-to-all held-out row (4xH100, nccl-tests), which has no SM rate to refit.
* The production TP all-reduce rows (scripts/validate_production.py): mean |error|
  and bias per set.
* The dense fabric checks (scripts/validate_fabric.py's ``dgx-h100`` rows: AllReduce
  NVLS and ring at 1-16 GiB, AllGather / ReduceScatter at 1 GiB).

    PYTHONPATH=src .venv/bin/python scripts/write_ack_counterfactual.py [--json]
        [--variants posted ack1 ...] [--only ep|dense|production]
    PYTHONPATH=src .venv/bin/python scripts/write_ack_counterfactual.py --doc RESULTS.json

docs/moe.md's write-response numbers come from this script; tests/test_moe_layer.py
reruns the rows it quotes at the chunk and rate printed here.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from cais.config import SystemConfig, apply_overrides, load_system
from cais.experiments.collective import run_collective
from cais.experiments.ep import run_ep
from cais.kernels import ep_deepep
from cais.kernels.ep_common import ep_constants

UNBOUNDED_GBPS = 1e4
GRID_GBPS = 0.5
BRACKET_GBPS = (8.0, 64.0)
DENSE_REFERENCE = {("allreduce", "nvls"): 475.0, ("allreduce", "ring"): 367.5,
                   ("allgather", "nvls"): 300.0, ("allgather", "ring"): 350.0}


def _script(name: str) -> Any:
    path = Path(__file__).resolve().parent / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def published_rows(kernel: str) -> list[dict[str, str]]:
    """validate_ep.py's published rows of ``kernel``."""
    return [r for r in _script("validate_ep").rows() if r["kernel"] == kernel]


#: the packet formats compared: name -> overrides of the presets' ``packet`` (header + 1
#: byte-enable flit per write packet, posted writes)
VARIANTS: dict[str, dict[str, str]] = {
    "posted": {},
    "ack1": {"packet.write_ack_flits": "1"},
    "ack2": {"packet.write_ack_flits": "2"},
    "hdr_ack1": {"packet.write_extra_flits": "0", "packet.write_ack_flits": "1"},
}


def system(name: str, gpus: int, variant: str) -> SystemConfig:
    """Preset ``name`` on ``gpus`` GPUs with the packet format of ``variant``."""
    cfg = load_system(name, gpus=gpus)
    return apply_overrides(cfg, VARIANTS[variant]) if VARIANTS[variant] else cfg


def run_row(r: dict[str, str], variant: str, rate: float, chunk: int | None = None) -> tuple[float, int | None]:
    """(the row's metric, the chunk that gave it): the best chunk of DeepEP's tuned set
    (``chunk`` None) or that chunk, at SM copy rate ``rate``."""
    cfg = system(r["system"], int(r["gpus"]), variant)
    consts = ep_constants().model_copy(update={"sm_copy_GBps": rate})
    chunks = [chunk] if chunk is not None else list(ep_deepep.TUNED_CHUNKS) if r["kernel"] == "deepep" else [None]
    runs = [(run_ep(cfg, r["kernel"], r["op"], int(r["tokens"]), int(r["hidden"]), int(r["topk"]),
                    int(r["experts"]), r["dtype"], int(r["sms"]) if r.get("sms") else None,
                    routing=r.get("routing") or "uniform", constants=consts, chunk=c), c) for c in chunks]
    best, c = min(runs, key=lambda x: x[0].time_us)
    return float(getattr(best, r["metric"])), c


def _error(r: dict[str, str], ours: float) -> float:
    return ours / float(r["published"]) - 1


def refit(variant: str) -> dict[str, Any]:
    """The SM copy rate fitted on the H800 fit rows under ``variant`` (module doc): the rate,
    its minimax error, and the rate every evaluation tried."""
    fit = [r for r in published_rows("deepep") if r["set"] == "fit"]
    seen: dict[float, list[float]] = {}

    def errors(rate: float) -> list[float]:
        if rate not in seen:
            seen[rate] = [_error(r, run_row(r, variant, rate)[0]) for r in fit]
        return seen[rate]

    lo, hi = (round(b / GRID_GBPS) for b in BRACKET_GBPS)
    if sum(errors(hi * GRID_GBPS)) < 0:  # still too slow at the top: the fabric binds
        lo = hi
    else:
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if sum(errors(mid * GRID_GBPS)) < 0:
                lo = mid
            else:
                hi = mid
    cands = {lo * GRID_GBPS, hi * GRID_GBPS}
    rate = min(cands, key=lambda x: max(abs(e) for e in errors(x)))
    return {"rate": rate, "minimax_error": max(abs(e) for e in errors(rate)), "tried": sorted(seen)}


def ep_table(variant: str) -> dict[str, Any]:
    """DeepEP normal's rows under ``variant``: the refit rate and every row at it and at an
    unbounded rate; the NCCL all-to-all held-out row."""
    fitted = refit(variant)
    rows = []
    for r in published_rows("deepep"):
        ours, chunk = run_row(r, variant, fitted["rate"])
        free, free_chunk = run_row(r, variant, UNBOUNDED_GBPS)
        rows.append({"set": r["set"], "system": r["system"], "op": r["op"], "dtype": r["dtype"],
                     "published": float(r["published"]), "ours": ours, "chunk": chunk, "error": _error(r, ours),
                     "unbounded": free, "unbounded_chunk": free_chunk, "unbounded_error": _error(r, free)})
    nccl = []
    for r in published_rows("nccl"):
        ours, _ = run_row(r, variant, ep_constants().sm_copy_GBps)
        nccl.append({"set": r["set"], "system": r["system"], "op": r["op"], "published": float(r["published"]),
                     "ours": ours, "error": _error(r, ours)})
    return {"variant": variant, "fit": fitted, "deepep": rows, "nccl": nccl}


def dense_busbw(cfg: SystemConfig, op: str, algo: str, gib: int) -> float:
    """A dense collective's busbw as scripts/validate_fabric.py runs it (a staged NVLS
    AllReduce in mirror mode)."""
    staged = op == "allreduce" and algo == "nvls" and cfg.collective.nvls_buffers == "staged"
    return run_collective(cfg, op, algo, gib << 30, sim="mirror" if staged else "full").busbw_GBps


def dense_table(variant: str, sizes: tuple[int, ...] = (1, 2, 4, 8, 16)) -> list[dict[str, Any]]:
    """scripts/validate_fabric.py's dgx-h100 rows (busbw) under ``variant``."""
    cfg = system("dgx-h100", 8, variant)
    cases = [("allreduce", a, g) for a in ("nvls", "ring") for g in sizes]
    cases += [(op, a, 1) for op in ("allgather", "reducescatter") for a in ("nvls", "ring")]
    out = []
    for op, algo, gib in cases:
        bus = dense_busbw(cfg, op, algo, gib)
        ref = DENSE_REFERENCE.get((op, algo))
        out.append({"op": op, "algo": algo, "gib": gib, "busbw": bus, "published": ref,
                    "error": bus / ref - 1 if ref else None})
    return out


def production_table(variant: str) -> dict[str, dict[str, float]]:
    """scripts/validate_production.py's rows under ``variant``: mean |error| and signed
    bias per set, and over the scored rows."""
    vp = _script("validate_production")
    every = vp.rows()
    times = [vp.ours_us(r, VARIANTS[variant]) for r in every]
    groups = {s: [(r, t) for r, t in zip(every, times) if r.set == s] for s in vp.SETS}
    groups["scored"] = [(r, t) for r, t in zip(every, times) if r.set in vp.SCORED]
    return {s: {"rows": len(p), "mean_error": vp.mean_error(*zip(*p)), "bias": vp.bias(*zip(*p))}
            for s, p in groups.items() if p}


#: the names docs/moe.md gives the packet formats
DOC_NAMES = {"posted": "posted writes (the presets)", "ack1": "+ 1-flit response per packet",
             "ack2": "+ 2-flit response per packet", "hdr_ack1": "header-only writes + 1-flit response"}
DOC_ROWS = ("fit dispatch FP8", "fit combine", "H800 dispatch BF16", "H100 dispatch", "H100 combine")


def rate_text(fit: dict[str, Any]) -> str:
    """The refitted SM rate as the docs print it (the bracket's top: the fabric binds)."""
    return f"{fit['rate']:g}" + (" (fabric-bound)" if fit["rate"] >= BRACKET_GBPS[1] else "")


def doc_table(res: dict[str, Any]) -> str:
    """docs/moe.md's table (errors against the published rows), then a comment with each
    DeepEP cell's NVL chunk, which tests/test_moe_layer.py reruns."""
    lines = ["| packet format | SM rate (GB/s) | " + " | ".join(DOC_ROWS)
             + " | NCCL all-to-all | ring AllReduce 1 GiB | NVLS AllReduce 1 GiB |",
             "|---|---:|" + "---:|" * (len(DOC_ROWS) + 3)]
    chunks = []
    for t in res["ep"]:
        v = t["variant"]
        dense = {(r["op"], r["algo"], r["gib"]): r for r in res["dense"][v]}
        cells = [f"{100 * r['error']:+.1f} %" for r in t["deepep"]]
        cells.append(f"{100 * t['nccl'][0]['error']:+.1f} %")
        cells += [f"{100 * dense[('allreduce', a, 1)]['error']:+.1f} %" for a in ("ring", "nvls")]
        lines.append(f"| {DOC_NAMES[v]} | {rate_text(t['fit'])} | " + " | ".join(cells) + " |")
        chunks.append(f"{v} " + " ".join(str(r["chunk"]) for r in t["deepep"]))
    return "\n".join(lines) + "\n<!-- wack:chunks " + "; ".join(chunks) + " -->"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    ap.add_argument("--only", choices=("ep", "dense", "production"), default=None)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--doc", metavar="JSON", help="print docs/moe.md's table from this script's --json output")
    args = ap.parse_args()
    if args.doc:
        print(doc_table(json.loads(Path(args.doc).read_text())))
        return
    res: dict[str, Any] = {"ep": [], "dense": {}, "production": {}}
    for variant in args.variants:
        if args.only in (None, "ep"):
            res["ep"].append(ep_table(variant))
        if args.only in (None, "dense"):
            res["dense"][variant] = dense_table(variant)
        if args.only in (None, "production"):
            res["production"][variant] = production_table(variant)
    if args.json:
        print(json.dumps(res, indent=1))
        return
    for t in res["ep"]:
        f = t["fit"]
        print(f"\n### {t['variant']} {VARIANTS[t['variant']]}: SM copy rate refitted {f['rate']} GB/s "
              f"(minimax {100 * f['minimax_error']:.1f} %)\n")
        print("| set | system | op | dtype | published | ours | error | chunk | unbounded SM | error |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in t["deepep"]:
            print(f"| {r['set']} | {r['system']} | {r['op']} | {r['dtype']} | {r['published']} | {r['ours']:.1f} | "
                  f"{100 * r['error']:+.1f} % | {r['chunk']} | {r['unbounded']:.1f} | "
                  f"{100 * r['unbounded_error']:+.1f} % |")
        for r in t["nccl"]:
            print(f"| {r['set']} | {r['system']} | nccl {r['op']} | bf16 | {r['published']} | {r['ours']:.1f} | "
                  f"{100 * r['error']:+.1f} % | | | |")
    for variant, rows in res["dense"].items():
        print(f"\n### dense dgx-h100, {variant} {VARIANTS[variant]}\n")
        print("| op | algo | size | busbw | published | error |\n|---|---|---|---|---|---|")
        for r in rows:
            err = f"{100 * r['error']:+.1f} %" if r["error"] is not None else "n/a"
            pub = r["published"] or "n/a"
            print(f"| {r['op']} | {r['algo']} | {r['gib']} GiB | {r['busbw']:.1f} | {pub} | {err} |")
    if res["production"]:
        print("\n### production all-reduce (validate_production.py): mean |error| / bias per set\n")
        sets = list(next(iter(res["production"].values())))
        print("| variant | " + " | ".join(sets) + " |\n|---|" + "---|" * len(sets))
        for variant, per in res["production"].items():
            print(f"| {variant} | " + " | ".join(f"{100 * per[s]['mean_error']:.1f} % / {100 * per[s]['bias']:+.1f} %"
                                                  for s in sets) + " |")


if __name__ == "__main__":
    main()
