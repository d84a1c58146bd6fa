"""Ship a full-grid reproduction's claims with the code: read ``REPORT/claims.json``
from ``cais reproduce all --out REPORT`` (the full grid, no ``--set``) and write
``src/cais/data/full-grid/<system>.json``, which a quick run on that system compares
its own claims with (src/cais/reproduce/claims.py).

    .venv/bin/cais reproduce all --workers 2 --out /tmp/full
    .venv/bin/python scripts/full_grid_claims.py /tmp/full
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cais.reproduce.claims import SHIPPED


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", type=Path, help="the output folder of a full-grid cais reproduce")
    args = ap.parse_args()
    path = args.report / "claims.json"
    if not path.is_file():
        print(f"full_grid_claims: error: {path} not found; run cais reproduce all --out {args.report} first",
              file=sys.stderr)
        return 2
    data = json.loads(path.read_text())
    if data.get("grid") != "full" or data.get("sets"):
        print(f"full_grid_claims: error: {path} is a {data.get('grid')} grid with --set {data.get('sets')}; "
              "ship only a full grid with no --set", file=sys.stderr)
        return 2
    SHIPPED.mkdir(parents=True, exist_ok=True)
    out = SHIPPED / f"{data['system']}.json"
    out.write_text(json.dumps(data, indent=1) + "\n")
    n = sum(len(c) for c in data["claims"].values())
    print(f"wrote {out}: {n} claims of {len(data['claims'])} experiments (commit {data['commit'][:7]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
