"""Regenerate the numbers of docs/moe.md's "Which EP kernel wins where, and the
in-switch ladder in layers": run `cais reproduce moe` (the full grid; `--quick` for a
try; `--cached` to analyse the runs already in docs/reproduce-results/moe/runs/) into
docs/reproduce-results/moe/ and copy its report section (both parts), the figures'
paths made relative to docs/, between the page's `<!-- moe:begin -->` and
`<!-- moe:end -->` markers. Every number in the block comes from the run;
tests/test_moe_layer.py::test_the_moe_page_is_its_runs checks the block against moe.md,
moe.csv and moe_switch.csv. The run's claims.json stays beside them.

    PYTHONPATH=src .venv/bin/python scripts/moe_doc.py [--quick] [--cached]
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from cais.reproduce.publish import regenerate

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "reproduce-results" / "moe"
PAGE = ROOT / "docs" / "moe.md"
BEGIN, END = "<!-- moe:begin -->", "<!-- moe:end -->"
TITLE = "## Past the paper: which EP kernel wins where, and the in-switch ladder in layers"


def section(report: str) -> str:
    """The moe experiment's section of a report.md, its heading dropped."""
    return report.split(TITLE, 1)[1].split("\n## ", 1)[0].strip()


def from_docs(block: str) -> str:
    """``block`` with its figures' paths made relative to docs/."""
    return re.sub(r"\]\((moe_[a-z0-9_-]+\.png)\)", r"](reproduce-results/moe/\1)", block)


def main() -> int:
    regenerate("moe", [f for f in ("--quick", "--cached") if f in sys.argv[1:]], OUT, PAGE, BEGIN, END, section, from_docs, ROOT)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
