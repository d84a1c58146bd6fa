"""Run the EP kernels on every row of the published EP tables (src/cais/data/published/
deepep-h800-ep8.csv and nccl-alltoall-h100.csv) and print ours, published and the error
per row (docs/moe.md).

    python scripts/validate_ep.py [--json]
"""

from __future__ import annotations

import csv
import io
import json
import sys
from importlib import resources

from cais.config import load_system
from cais.experiments.ep import run_ep_tuned


TABLES = ("deepep-h800-ep8.csv", "nccl-alltoall-h100.csv")


def rows() -> list[dict[str, str]]:
    out = []
    for name in TABLES:
        text = (resources.files("cais") / "data" / "published" / name).read_text()
        out += csv.DictReader(io.StringIO("\n".join(l for l in text.splitlines() if not l.startswith("#"))))
    return out


def validate() -> list[dict[str, object]]:
    out = []
    for r in rows():
        cfg = load_system(r["system"], gpus=int(r["gpus"]))
        res = run_ep_tuned(cfg, r["kernel"], r["op"], int(r["tokens"]), int(r["hidden"]), int(r["topk"]),
                     int(r["experts"]), r["dtype"], sms=int(r["sms"]) if r.get("sms") else None,
                     routing=r.get("routing") or "uniform")
        ours = getattr(res, r["metric"])
        pub = float(r["published"])
        out.append({"set": r["set"], "kernel": r["kernel"], "op": r["op"], "metric": r["metric"],
                    "ours": round(ours, 1), "published": pub, "error": round((ours - pub) / pub, 3)})
    return out


if __name__ == "__main__":
    res = validate()
    if "--json" in sys.argv:
        print(json.dumps(res, indent=1))
    else:
        for r in res:
            print(f"{r['set']:5} {r['kernel']:10} {r['op']:9} {r['metric']:11} ours {r['ours']:8} "
                  f"published {r['published']:8} error {100 * r['error']:+.1f} %")
