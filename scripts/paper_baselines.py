"""Print the baseline comparison table for docs/validation.md: every baseline x the
Table I models x prefill/train at 66 SMs by default (about 10 minutes on 2 cores),
or a subset, on another system or SM count, or with other link bandwidth.

    .venv/bin/python scripts/paper_baselines.py > /tmp/baselines.md
    .venv/bin/python scripts/paper_baselines.py --models paper-llama-7b --modes prefill --sms 132
    .venv/bin/python scripts/paper_baselines.py --models paper-llama-7b --modes prefill --link-bandwidth 8.33
"""

import argparse
import json
import tempfile

from cais.experiments.baselines import TABLE1, grid_point, grid_points, grid_rows, markdown
from cais.config import load_system
from cais.sweep.runner import sweep_rows

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=list(TABLE1))
    ap.add_argument("--modes", nargs="+", default=["prefill", "train"])
    ap.add_argument("--sms", type=int, default=66)
    ap.add_argument("--system", default="dgx-h100")
    ap.add_argument("--link-bandwidth", type=float, default=None, help="GB/s per link per direction")
    args = ap.parse_args()
    system = args.system
    if args.link_bandwidth is not None:
        data = load_system(system).model_dump()
        data["link"]["bandwidth_GBps"] = args.link_bandwidth
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(data, f)
        system = f.name
    points = grid_points(tuple(args.models), modes=tuple(args.modes), sms=args.sms, system=system)
    print(markdown(grid_rows(sweep_rows(points, grid_point))))
