"""Remote-access strategies on the H100 as sold (docs/remote-access.md): each Table I
model's layer period under CAIS, CAIS-Base and LADM with every ``remote_read.strategy``
(and the paper's L2 assumption for scale), 8 GPUs x 66 SMs as Fig. 11 runs them,
beside TP-NVLS on the same system. Prints Markdown: time per period, CAIS's speedup
over TP-NVLS, and the bytes each GPU receives and sends over NVLink, against the
paper's traffic model (each remote row block reaches each GPU once).

    .venv/bin/python scripts/remote_access.py --workers 2 > /tmp/remote_access.md

About 10 minutes on 2 cores with the defaults (three models, prefill). The as-sold
rule's table (docs/remote-access.md, "The as-sold rule"):

    .venv/bin/python scripts/remote_access.py --models paper-llama-7b --modes prefill train \
        --schemes cais --baselines tp-nvls t3 --rule
"""

from __future__ import annotations

import argparse
import json

from cais.experiments.baselines import TABLE1, geomean
from cais.sweep.runner import sweep_rows

FN = "cais.reproduce.points:layer_point"
STRATEGIES: dict[str, dict[str, str]] = {
    "reload": {"remote_read.strategy": "reload"},
    "cluster 2": {"remote_read.strategy": "cluster", "remote_read.cluster_ctas": "2"},
    "cluster 4": {"remote_read.strategy": "cluster", "remote_read.cluster_ctas": "4"},
    "cluster 8": {"remote_read.strategy": "cluster", "remote_read.cluster_ctas": "8"},
    "cluster 16": {"remote_read.strategy": "cluster", "remote_read.cluster_ctas": "16"},
    "staged": {"remote_read.strategy": "staged"},  # the upper bound: an untimed flag, no SM time for the copy
    "copy-engine": {"remote_read.strategy": "copy-engine"},
    "comm-sms": {"remote_read.strategy": "comm-sms"},
    "copy-engine 1 MiB": {"remote_read.strategy": "copy-engine", "remote_read.copy_chunk_kB": "1024"},
    "comm-sms 1 MiB": {"remote_read.strategy": "comm-sms", "remote_read.copy_chunk_kB": "1024"},
    "L2 keeps (paper)": {"gpu.l2_keeps_peer_reads": "true"},
    # the as-sold rule's candidates for rows a producer signals (CAIS's fused pipeline);
    # rows ready at launch stay whole shards (remote_read.copy_chunk_kB) in each
    "auto (default)": {"remote_read.strategy": "auto"},
    "copy-engine, signalled whole": {"remote_read.strategy": "copy-engine", "remote_read.signalled_chunk_kB": "0"},
    "copy-engine, signalled 1 MiB": {"remote_read.strategy": "copy-engine",
                                     "remote_read.signalled_chunk_kB": "1024"},
    "copy-engine, signalled 512 KiB": {"remote_read.strategy": "copy-engine",
                                       "remote_read.signalled_chunk_kB": "512"},
    "comm-sms 4, signalled 512 KiB": {"remote_read.strategy": "comm-sms", "remote_read.comm_sms": "4",
                                      "remote_read.signalled_chunk_kB": "512"},
    "comm-sms 8, signalled 512 KiB": {"remote_read.strategy": "comm-sms", "remote_read.comm_sms": "8",
                                      "remote_read.signalled_chunk_kB": "512"},
}
#: the as-sold rule's table (docs/remote-access.md, "The as-sold rule")
RULE = ["auto (default)", "copy-engine, signalled whole", "copy-engine, signalled 1 MiB",
        "copy-engine, signalled 512 KiB", "comm-sms 4, signalled 512 KiB", "comm-sms 8, signalled 512 KiB"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--system", default="dgx-h100")
    ap.add_argument("--models", nargs="+", default=list(TABLE1))
    ap.add_argument("--modes", nargs="+", default=["prefill"])
    ap.add_argument("--schemes", nargs="+", default=["cais", "cais-base", "ladm"])
    ap.add_argument("--baselines", nargs="+", default=["tp-nvls", "t3", "fuselib-nvls"],
                    help="schemes run as they are, to compare with (the first is the speedups' reference)")
    ap.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=list(STRATEGIES))
    ap.add_argument("--rule", action="store_true", help="the as-sold rule's candidates only (RULE)")
    ap.add_argument("--sms", type=int, default=66)
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args()
    if args.rule:
        args.strategies = RULE

    def point(model: str, mode: str, scheme: str, sets: dict[str, str]) -> dict[str, object]:
        return {"system": args.system, "sets": json.dumps(sets, sort_keys=True), "model": model, "mode": mode,
                "scheme": scheme, "sms": args.sms}

    points = [point(m, mode, b, {}) for m in args.models for mode in args.modes for b in args.baselines]
    points += [point(m, mode, s, STRATEGIES[k]) for m in args.models for mode in args.modes for s in args.schemes
               for k in args.strategies]
    rows = sweep_rows(points, FN, workers=args.workers, progress=True)
    bad = [r for r in rows if r["status"] != "ok"]
    for r in bad:
        print(f"FAILED: {r['point.scheme']} {r['point.model']} {r['point.sets']}: {r['error']}")
    by = {(r["point.model"], r["point.mode"], r["point.scheme"], r["point.sets"]): r for r in rows
          if r["status"] == "ok"}
    print(f"system {args.system}, {args.sms} SMs per GPU; default run of each model (Table I); "
          f"wire = bytes per GPU and direction over NVLink, mean over the GPUs (GB)\n")
    for mode in args.modes:
        ref = args.baselines[0]
        base = {b: {m: by[(m, mode, b, "{}")]["total_us"] for m in args.models if (m, mode, b, "{}") in by}
                for b in args.baselines}
        tp = base[ref]
        best = {m: min(base[b][m] for b in args.baselines if m in base[b]) for m in tp}
        print(f"#### {mode}\n")
        print("| scheme | strategy | " + " | ".join(f"{m} (us)" for m in args.models)
              + f" | over {ref} (geomean) | over the best of {', '.join(args.baselines)} (geomean) "
              f"| wire down / up (GB, {args.models[0]}) |")
        print("|---|---|" + "---|" * len(args.models) + "---|---|---|")
        for b in args.baselines:
            print(f"| {b} | - | " + " | ".join(f"{base[b].get(m, float('nan')):,.1f}" for m in args.models)
                  + f" | {geomean([tp[m] / base[b][m] for m in base[b] if m in tp]):.2f}x | - | "
                  + _wire(by.get((args.models[0], mode, b, "{}"))) + " |")
        for s in args.schemes:
            for k in args.strategies:
                key = json.dumps(STRATEGIES[k], sort_keys=True)
                ts = {m: by[(m, mode, s, key)]["total_us"] for m in args.models if (m, mode, s, key) in by}
                sp = geomean([tp[m] / ts[m] for m in ts if m in tp])
                sb = geomean([best[m] / ts[m] for m in ts if m in best])
                print(f"| {s} | {k} | " + " | ".join(f"{ts.get(m, float('nan')):,.1f}" for m in args.models)
                      + f" | {sp:.2f}x | {sb:.2f}x | " + _wire(by.get((args.models[0], mode, s, key))) + " |")
        print()


def _wire(r: dict | None) -> str:
    return "-" if r is None else f"{r['wire_down_GB']:.3f} / {r['wire_up_GB']:.3f}"


if __name__ == "__main__":
    main()
