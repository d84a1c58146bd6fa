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
import sys
from pathlib import Path

from cais.reproduce.publish import regenerate

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
    regenerate("cost", ["--quick"] if "--quick" in sys.argv[1:] else [], OUT, PAGE, BEGIN, END, section, from_docs, ROOT)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
