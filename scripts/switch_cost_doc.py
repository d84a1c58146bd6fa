"""Regenerate the numbers of docs/switch-cost.md: run `cais reproduce cost` (the full
grid; `--quick` for a try) into docs/reproduce-results/cost/ and copy its report
section, with the figures' paths made relative to docs/, between the page's
`<!-- cost:begin -->` and `<!-- cost:end -->` markers. The page's prose stays as
written and states no result; every number in the block comes from the run, and
tests/test_cost.py::test_the_page_is_its_runs checks the block against cost.md and
cost.csv. The run's claims.json stays beside them.

    PYTHONPATH=src .venv/bin/python scripts/switch_cost_doc.py [--quick]

With CACTI installed (scripts/build_cacti.sh) the run calls it; without, it uses the
stored run (src/cais/data/cacti/merge_unit.json), and the block says which."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "reproduce-results" / "cost"
PAGE = ROOT / "docs" / "switch-cost.md"
BEGIN, END = "<!-- cost:begin -->", "<!-- cost:end -->"


def section(report: str) -> str:
    """The cost experiment's section of a report.md, its heading dropped (its
    figures' paths relative to the report's folder)."""
    body = report.split("## Past the paper: what each part buys, and what the merge unit costs", 1)[1]
    return body.split("\n## ", 1)[0].strip()


def from_docs(block: str) -> str:
    """``block`` with its figures' paths made relative to docs/."""
    return re.sub(r"\]\((cost_[a-z]+\.png)\)", r"](reproduce-results/cost/\1)", block)


def main() -> int:
    quick = ["--quick"] if "--quick" in sys.argv[1:] else []
    subprocess.run([sys.executable, "-m", "cais", "reproduce", "cost", *quick, "--out", str(OUT), "--workers", "2"],
                   check=True, cwd=ROOT)
    block = section((OUT / "report.md").read_text())
    if "ANALYSIS FAILED" in block:
        raise SystemExit("switch_cost_doc: the cost analysis failed: " + block.splitlines()[0])
    (OUT / "cost.md").write_text(block + "\n")
    page = PAGE.read_text()
    head, rest = page.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    PAGE.write_text(f"{head}{BEGIN}\n{from_docs(block)}\n{END}{tail}")
    for name in ("report.md", "report.html"):  # claims.json stays: the full grid's answer a quick run is held to
        (OUT / name).unlink(missing_ok=True)
    subprocess.run(["rm", "-rf", str(OUT / "runs")], check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
