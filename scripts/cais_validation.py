"""Print the cais-base validation table for docs/validation.md: cais-base against
TP-NVLS and SP-NVLS on the Table I models, prefill and train, at 66 SMs, with the
merge-unit metrics (table peak, arrival skew, what became of the requests).

    .venv/bin/python scripts/cais_validation.py > /tmp/cais.md
    .venv/bin/python scripts/cais_validation.py --models paper-llama-7b --set gpu.l2_keeps_peer_reads=true
"""

import argparse
import time

from cais.experiments.baselines import TABLE1
from cais.experiments.layer import run_layer
from cais.hw.config import apply_overrides, load_system
from cais.workload.models import load_model

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=list(TABLE1))
    ap.add_argument("--modes", nargs="+", default=["prefill", "train"])
    ap.add_argument("--sms", type=int, default=66)
    ap.add_argument("--system", default="dgx-h100")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    cfg = apply_overrides(load_system(args.system), dict(kv.split("=", 1) for kv in args.set))
    print(f"system {args.system} {' '.join(args.set)}, {args.sms} SMs\n")
    print("| model | mode | tp-nvls µs | sp-nvls µs | cais-base µs | vs TP-NVLS | vs SP-NVLS | table peak kB "
          "| mean kB (max port) | skew mean / max µs | merged | bypassed | evicted | timed out | link util | wall s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.models:
        model = load_model(name)
        for mode in args.modes:
            t = {s: run_layer(cfg, model, s, mode, sms=args.sms).total_us for s in ("tp-nvls", "sp-nvls")}
            t0 = time.perf_counter()
            r = run_layer(cfg, model, "cais-base", mode, sms=args.sms)
            wall = time.perf_counter() - t0
            j = r.as_json()
            c, sk = j["merge"], j["arrival_skew_us"]
            print(f"| {name} | {mode} | {t['tp-nvls']:,.0f} | {t['sp-nvls']:,.0f} | {r.total_us:,.0f} "
                  f"| {t['tp-nvls'] / r.total_us:.2f}x | {t['sp-nvls'] / r.total_us:.2f}x "
                  f"| {j['merge_table_peak_kB']['max']:.1f} | {j['merge_table_mean_kB']['max']:.1f} "
                  f"| {sk['mean']:.2f} / {sk['max']:.1f} | {c['merged']:,} | {c['bypassed']:,} | {c['evicted']:,} "
                  f"| {c['timed_out']:,} | {j['link_util']['mean']:.1%} | {wall:.0f} |", flush=True)
