"""Print CAIS against every baseline and its ablations for docs/validation.md (issue 8):
the Table I models, prefill and train, 8 GPUs x 66 SMs; CAIS's geomean speedup over
each scheme beside the paper's, CAIS over CAIS-Base, merge-table peak and arrival
skew with and without coordination, mean link utilisation of Base / Partial / CAIS,
and CAIS against each sub-layer's lower bound. About 20-30 minutes on 2 cores.

    .venv/bin/python scripts/cais_paper.py --set gpu.l2_keeps_peer_reads=true > /tmp/cais_paper.md
"""

import argparse

from cais.experiments.baselines import PAPER_CAIS_SPEEDUP, TABLE1, geomean, grid_point, grid_points, grid_rows
from cais.sweep.runner import sweep_rows

CAIS = ("cais-base", "cais-wo-coord", "cais-partial", "cais")
PAPER_OVER_BASE = (1.43, 1.42)  # CAIS over CAIS-Base, inference / training (paper §V-A.3, as read)
PAPER_UTIL = {"cais-base": 62.4, "cais-partial": 84.7, "cais": 90.2}

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=list(TABLE1))
    ap.add_argument("--modes", nargs="+", default=["prefill", "train"])
    ap.add_argument("--schemes", nargs="+", default=list(PAPER_CAIS_SPEEDUP) + list(CAIS))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    sets = dict(kv.split("=", 1) for kv in args.set)
    rows = grid_rows(sweep_rows(grid_points(tuple(args.models), tuple(args.schemes), tuple(args.modes), sets=sets),
                                grid_point))
    by = {(r["model"], r["scheme"], r["mode"]): r for r in rows}
    print(f"settings: {' '.join(args.set) or 'defaults'}\n")
    for mode in args.modes:
        i = 1 if mode == "train" else 0
        print(f"\n#### {mode}: time per layer period (µs)\n")
        print("| scheme | " + " | ".join(args.models) + " | CAIS speedup (geomean) | paper |")
        print("|---|" + "---|" * len(args.models) + "---|---|")
        for s in args.schemes:
            ts = [by[(m, s, mode)]["total_us"] for m in args.models]
            sp = geomean([by[(m, s, mode)]["total_us"] / by[(m, "cais", mode)]["total_us"] for m in args.models])
            paper = PAPER_CAIS_SPEEDUP.get(s, (None, None))[i] if s in PAPER_CAIS_SPEEDUP else \
                (PAPER_OVER_BASE[i] if s == "cais-base" else None)
            print(f"| {s} | " + " | ".join(f"{t:,.0f}" for t in ts) + f" | {sp:.2f}x | "
                  + (f"{paper:.2f}x" if paper else "–") + " |")
        print(f"\n#### {mode}: the CAIS variants\n")
        print("| scheme | model | table peak kB | skew mean / max µs | merged | bypassed | evicted | timed out "
              "| link util | paper util | time / bound (sub-layers) |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for s in CAIS:
            if s not in args.schemes:
                continue
            for m in args.models:
                r = by[(m, s, mode)]
                c, sk = r["merge"] or {}, r["skew_us"] or {"mean": 0, "max": 0}
                ratio = geomean([r["sublayers"][k] / r["bounds"][k] for k in r["sublayers"]])
                print(f"| {s} | {m} | {r['table_peak_kB']:.0f} | {sk['mean']:.1f} / {sk['max']:.0f} "
                      f"| {c.get('merged', 0):,} | {c.get('bypassed', 0):,} | {c.get('evicted', 0):,} "
                      f"| {c.get('timed_out', 0):,} | {r['link_util']:.1%} | {PAPER_UTIL.get(s, '–')} "
                      f"| {ratio:.2f} |")
    print("\nwall time per run (s): " + ", ".join(f"{r['scheme']}/{r['mode']}/{r['model']}: {r['wall_s']:.0f}"
                                                    for r in rows if r["scheme"] in CAIS))
