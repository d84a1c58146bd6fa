"""Publish an experiment's full-grid run in the docs: its report section as
``<out>/<name>.md`` beside its CSV, plots and ``claims.json``, the same section (its
figures' paths made relative to docs/) between a page's begin and end markers, and
the run's report files and point tables removed (the claims stay: the full grid's
answer a quick run is held to). The scripts that regenerate a page's numbers
(scripts/switch_cost_doc.py, scripts/moe_doc.py) share it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path


def splice(page: str, begin: str, end: str, block: str) -> str:
    """``page`` with what lies between its ``begin`` and ``end`` markers replaced by ``block``."""
    head, rest = page.split(begin, 1)
    return f"{head}{begin}\n{block}\n{end}{rest.split(end, 1)[1]}"


def publish(name: str, block: str, out: Path, page: Path, begin: str, end: str, docs_block: str) -> None:
    """Write ``block`` (the experiment ``name``'s report section) to ``out/<name>.md``
    and ``docs_block`` between ``page``'s markers; remove ``out``'s report files and
    runs. SystemExit (a script's one line) if the analysis failed."""
    if "ANALYSIS FAILED" in block:
        raise SystemExit(f"{name}: the analysis failed: " + block.splitlines()[0])
    (out / f"{name}.md").write_text(block + "\n")
    page.write_text(splice(page.read_text(), begin, end, docs_block))
    for report in ("report.md", "report.html"):
        (out / report).unlink(missing_ok=True)
    shutil.rmtree(out / "runs", ignore_errors=True)


def regenerate(name: str, flags: list[str], out: Path, page: Path, begin: str, end: str,
               section: Callable[[str], str], for_docs: Callable[[str], str], cwd: Path) -> None:
    """Run ``cais reproduce <name> [flags] --out <out>`` (in ``cwd``), take its section
    from the report (``section``: report.md -> the section) and :func:`publish` it, the
    page's copy made by ``for_docs``."""
    subprocess.run([sys.executable, "-m", "cais", "reproduce", name, *flags, "--out", str(out), "--workers", "2"],
                   check=True, cwd=cwd)
    block = section((out / "report.md").read_text())
    publish(name, block, out, page, begin, end, for_docs(block))
