"""Every preset against the published nccl-tests points of the system it stands for
(issues 22 and 37): one table per preset, a row per (GPUs, collective, size) with ours
and, per published source, its time, our error and whether the point was fitted on
(a calibrated constant's fit set, `published.FIT_SETS`) or is a check; then the mean
|error| per collective at and above 1 MB and below it against issue 22's targets (10 %
and 25 %), and per (preset, GPUs, collective, source) the mean and max |error| over
the sizes TP layers issue, 8 KB-128 MiB, against issue 37's (5 % and 10 %).

    .venv/bin/python scripts/validate_presets.py [--systems dgx-h100 dgx-h200 nvl72] [--max-bytes 1G]

The published points are in src/cais/data/published/nccl_tests.csv; NVL72's 72-GPU
points run in mirror mode (the full model is refused by the event limit there).
"""

from __future__ import annotations

import argparse

from cais.experiments.published import (TP_RANGE, Point, compare, fitted_by, published, source_label, summary,
                                        tp_summary)


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
        print(f"\n### {system}\n", flush=True)
        pts = compare(system, args.max_bytes, sim="mirror")
        print(table(pts))
        print()
        print(frame(summary(pts)))
        print(f"\nSizes TP layers issue ({size(TP_RANGE[0])} to {size(TP_RANGE[1])}), per source; "
              f"issue 37's targets: mean |error| <= 5 %, max <= 10 %:\n")
        t = tp_summary(pts)
        print(frame(t) if len(t) else "(no published point in this range)")


def table(pts: list[Point]) -> str:
    """One row per (GPUs, op, size), one column group per source: published time,
    our error, fit or check."""
    sources = sorted({source_label(p.source) for p in pts})
    head = "| GPUs | op | size | ours (us) | ours ran |" + "".join(
        f" {s}: published (us) | error | fit/check |" for s in sources)
    lines = [head, "|" + "---|" * (5 + 3 * len(sources))]
    rows: dict[tuple[int, str, str, int], dict[str, Point]] = {}
    for p in pts:
        rows.setdefault((p.gpus, p.op, p.algo, p.nbytes), {})[source_label(p.source)] = p
    for (gpus, op, algo, nbytes), by in sorted(rows.items()):
        first = next(iter(by.values()))
        cells = []
        for s in sources:
            p = by.get(s)
            if p is None:
                cells.append(" – | – | – |")
            else:
                fit = fitted_by(p)
                cells.append(f" {p.theirs_us:,.1f} | {100 * p.error:+.1f} % | {'fit (' + ', '.join(fit) + ')' if fit else 'check'} |")
        lines.append(f"| {gpus} | {op} ({algo}) | {size(nbytes)} | {first.ours_us:,.1f} | {first.ran} |" + "".join(cells))
    lines.append("")
    lines += [f"- {s}: {next(p.source for p in pts if source_label(p.source) == s)}" for s in sources]
    return "\n".join(lines)


def frame(t) -> str:
    out = ["| " + " | ".join(c.replace("|", "\\|") for c in t.columns) + " |", "|" + "---|" * len(t.columns)]
    for r in t.itertuples(index=False):
        out.append("| " + " | ".join(f"{v:.1f}" if isinstance(v, float) else str(v) for v in r) + " |")
    return "\n".join(out)

if __name__ == "__main__":
    main()
