"""Every preset against the published nccl-tests points of the system it stands for
(issue 22): one table per preset, each row a published point with its source, ours
beside it and the error, then the mean |error| per collective at and above 1 MB and
below it against the targets (10 % and 25 %).

    .venv/bin/python scripts/validate_presets.py [--systems dgx-h100 dgx-h200 nvl72] [--max-bytes 1G]

The published points are in src/cais/data/published/nccl_tests.csv; NVL72's 72-GPU
points run in mirror mode (the full model is refused by the event limit there).
"""

from __future__ import annotations

import argparse

from cais.experiments.published import Point, compare, published, summary


def size(b: int) -> str:
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << k:
            return f"{b / (1 << k):g} {unit}"
    return f"{b} B"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--systems", nargs="+", default=["dgx-h100", "dgx-h200", "nvl72"],
                    choices=sorted(set(published()["system"])), help="presets with published points")
    ap.add_argument("--max-bytes", type=lambda s: int(float(s[:-1]) * (1 << 30)) if s.endswith("G") else int(s),
                    default=None, help="skip larger published points (e.g. 1G)")
    args = ap.parse_args()
    for system in args.systems:
        print(f"\n### {system}\n")
        print("| GPUs | op | size | published (us) | ours (us) | ours ran | error | source |")
        print("|---|---|---|---|---|---|---|---|")

        def row(p: Point) -> None:
            print(f"| {p.gpus} | {p.op} ({p.algo}) | {size(p.nbytes)} | {p.theirs_us:,.1f} | {p.ours_us:,.1f} | "
                  f"{p.ran} | {100 * p.error:+.1f} % | {p.source} |", flush=True)
        pts = compare(system, args.max_bytes, sim="mirror", log=row)
        print()
        t = summary(pts)
        print("| " + " | ".join(t.columns) + " |\n|" + "---|" * len(t.columns))
        for r in t.itertuples(index=False):
            print("| " + " | ".join(f"{v:.1f}" if isinstance(v, float) else str(v) for v in r) + " |")


if __name__ == "__main__":
    main()
