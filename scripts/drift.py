"""Where the GPUs drift apart without TB coordination (docs/validation.md §18): one
layer period of a scheme, and per kernel the spread of its end over the GPUs (which
GPU ends first and last, by how much), and per merge-unit port (the home GPU behind
it) the mean first-to-last arrival skew of the requests for one address.

    .venv/bin/python scripts/drift.py --scheme cais-wo-coord
    .venv/bin/python scripts/drift.py --scheme cais
"""

from __future__ import annotations

import argparse
from collections import defaultdict


from cais.hw.compute import ComputeModel
from cais.config import PS_PER_US, apply_overrides, load_system
from cais.machine import Machine
from cais.schemes import get_scheme
from cais.schemes.base import LayerRun
from cais.workload.graph import build_period
from cais.workload.models import load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="paper-llama-7b")
    ap.add_argument("--scheme", default="cais-wo-coord")
    ap.add_argument("--mode", default="prefill")
    ap.add_argument("--sms", type=int, default=66)
    ap.add_argument("--system", default="dgx-h100")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--interleave", action="store_true",
                    help="what-if: the owner-interleaved tile order (cais.spread) without the rest of coordination "
                         "(cais-wo-coord keeps CUTLASS's raster otherwise)")
    args = ap.parse_args()
    if args.interleave:
        _interleave_without_coordination()
    cfg = apply_overrides(load_system(args.system), dict(kv.split("=", 1) for kv in args.set))
    cfg = cfg.with_overrides(gpu={**cfg.gpu.model_dump(), "sms": args.sms})
    sch = get_scheme(args.scheme)
    cfg = cfg.with_overrides(switch={**cfg.switch.model_dump(), "model": sch.switch_model(cfg.switch.model)})
    cfg = cfg.with_overrides(link={**cfg.link.model_dump(), "vc_policy": sch.vc_policy_for(cfg.link.vc_policy)})
    model = load_model(args.model)
    period = build_period(model, cfg.gpus, args.mode, sch.sp, 0, True)
    m = Machine(cfg)
    run = LayerRun(m, model, period, ComputeModel.load(cfg.gpu.compute_model, cfg.gpu.hbm_bandwidth_GBps))
    sch.run(run)
    m.run()
    ends: dict[str, dict[int, float]] = defaultdict(dict)
    starts: dict[str, dict[int, float]] = defaultdict(dict)
    for name, g, k in run.kernels:
        if k.finished_at is not None:
            ends[name][g] = k.finished_at / PS_PER_US
            starts[name][g] = (k.started_at or 0) / PS_PER_US
    total = max(max(e.values()) for e in ends.values())
    print(f"{args.model} {args.mode} under {args.scheme} on {args.system}, {args.sms} SMs"
          + (" (owner-interleaved order, no syncs)" if args.interleave else "") + f": {total:,.1f} us\n")
    print("| kernel | start spread (us) | end spread (us) | first to end | last to end |")
    print("|---|---|---|---|---|")
    for name in sorted(ends, key=lambda n: min(ends[n].values())):
        e, s = ends[name], starts[name]
        first, last = min(e, key=e.get), max(e, key=e.get)
        print(f"| {name} | {max(s.values()) - min(s.values()):.1f} | {e[last] - e[first]:.1f} | GPU {first} | "
              f"GPU {last} |")
    per_home: dict[int, list[float]] = defaultdict(list)
    for sw in m.fabric.switches:
        for u in getattr(sw, "units", []):
            if u.stats.skew_n:
                per_home[u.port].append(u.stats.skew_sum_ps / u.stats.skew_n / PS_PER_US)
    if per_home:
        print("\nmean arrival skew per home GPU (us, mean over its ports on the chips): "
              + ", ".join(f"GPU {h}: {sum(v) / len(v):.1f}" for h, v in sorted(per_home.items())))


def _interleave_without_coordination() -> None:
    """Give uncoordinated CAIS accesses the owner-interleaved order and K start (a
    diagnostic what-if: only this script does it)."""
    from cais.schemes.cais import CoordinatedAccess

    init = CoordinatedAccess.__init__

    def patched(self, m, *a, **kw) -> None:  # type: ignore[no-untyped-def]
        init(self, m, *a, **kw)
        self.spreads = m.cfg.cais.spread

    CoordinatedAccess.__init__ = patched  # type: ignore[method-assign]


if __name__ == "__main__":
    main()
