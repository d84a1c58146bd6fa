"""Verdicts in words: sentences generated from an experiment's numbers (which of the
paper's claims hold here, by how much, on which grid, and the first reason the runs
give), the report's overall verdict, its quick-grid warning, and the "why we differ"
reasons with links to the sections of the docs that measure them.

Nothing here is a number of its own: every figure in a sentence comes from a table
an experiment computed."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

#: the checkout's docs folder (absent in an installed wheel: links then name the file)
DOCS = Path(__file__).resolve().parents[3] / "docs"

#: (reason, document, heading) of the "why we differ" section after the first, which
#: :func:`comm_reason` writes from the run's numbers: the headings are the docs' own,
#: so each link lands on the section that measures the reason
WHY_DIFFER: tuple[tuple[str, str, str], ...] = (
    ("CAIS depends on the paper's stated mechanisms (TB coordination, merging-aware TB order, the per-GPU bound "
     "on outstanding requests) and on each remote row block reaching a GPU once: the paper's traffic model "
     "needs peer reads kept in L2, which the H100 as sold does not do; real kernels copy each peer's shard with "
     "the copy engines instead, which serialises the copy before the GEMM that reads it; staging each block once "
     "for free (an upper bound) gives the L2 world's "
     "times, and without either every column tile loads its rows again through the switch.",
     "validation.md", "18. CAIS on the H100 as sold"),
    ("The paper's world (Accel-Sim GEMMs, its baselines' time ratios) is approximated by the paper-world preset, "
     "fitted to the baselines only; its CAIS numbers are a prediction, and its GEMMs run faster than an H100 can "
     "(2.4x the dense BF16 peak of the SMs they run on).",
     "validation.md", "Fig. 11 at 40 KB in `paper-world` (the paper's world, fitted to its baselines only)"),
    ("Every modelling decision the paper leaves open, with its reason and its parameter.",
     "cais.md", ""),
)


def slug(heading: str) -> str:
    """A Markdown heading's anchor as GitHub and most renderers make it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def doc_link(doc: str, heading: str, out: Path) -> tuple[str, str]:
    """(link text, target) of ``docs/doc#heading`` from a report written in ``out``:
    a relative path to the checkout's docs where they exist, else the docs path."""
    anchor = f"#{slug(heading)}" if heading else ""
    path = DOCS / doc
    if path.exists():
        target = os.path.relpath(path, out.resolve()) + anchor
    else:
        target = f"docs/{doc}{anchor}"
    return f"docs/{doc}" + (f" §{heading.split(' ', 1)[0].rstrip('.')}" if heading[:1].isdigit() else
                             f", {heading}" if heading else ""), target


#: where the weight of communication against computation is measured against the paper's
COMM_DOC = ("validation.md", "6. The baselines against the paper (Table I models, 66 SMs)")


def comm_reason(ratio: float, paper: float) -> str:
    """The first "why we differ" reason, from the run's own number: TP-NVLS's
    collective time over its other kernels' time in Fig. 11's runs (``ratio``; NaN
    where none ran) against the paper's Fig. 2 (``paper``)."""
    if ratio != ratio:
        return (f"How much communication weighs against computation (the paper's Fig. 2: {paper}x at 8 GPUs) decides "
                "how much overlap hides and how much is left for CAIS to win; this run has no Fig. 11 runs to say.")
    said = f"TP-NVLS's collectives take {ratio:.2f}x its other kernels' time in Fig. 11's runs, the paper {paper}x"
    if ratio < paper:
        return (f"Communication weighs less against computation here than in the paper ({said}; our GEMMs are "
                "calibrated to cuBLAS on an H200), so the baselines' overlap hides more of it and there is less "
                "left for CAIS to win.")
    return (f"Communication weighs at least as much against computation here as in the paper ({said}), so the "
            "difference lies in how each scheme moves and overlaps it.")


def why_links(out: Path, ratio: float = float("nan"), paper: float = 1.6) -> list[tuple[str, str, str]]:
    """The "why we differ" section: (reason, link text, target) rows, the first
    written from the run's ``ratio`` (:func:`comm_reason`)."""
    return [(comm_reason(ratio, paper), *doc_link(*COMM_DOC, out))] + [
        (why, *doc_link(doc, heading, out)) for why, doc, heading in WHY_DIFFER]


def count_faster(speedups: pd.Series) -> tuple[int, int]:
    """(how many of ``speedups`` are at least 1, how many there are), NaNs left out."""
    s = speedups.dropna()
    return int((s >= 1).sum()), int(len(s))


def span(values: Sequence[float], unit: str = "x") -> str:
    """``a-b x`` over the finite values (``a x`` when they are equal)."""
    v = [x for x in values if x == x]
    if not v:
        return "no value"
    lo, hi = min(v), max(v)
    return f"{lo:.2f}{unit}" if abs(hi - lo) < 0.005 else f"{lo:.2f}-{hi:.2f}{unit}"


def holds(ok: bool) -> str:
    """``holds`` or ``does not hold``: a claim's fate in a verdict sentence."""
    return "holds" if ok else "does not hold"


def quick_warning(quick: bool, models: Sequence[str]) -> str:
    """The warning printed where a quick grid meets the paper's full-grid numbers."""
    if not quick:
        return ""
    return ("quick grid: " + (", ".join(models) or "a small model") + " with one short sequence stands in for the "
            "paper's Table I "
            "models; the paper's numbers are geomeans over its full grid, so the comparison is indicative only. "
            "Drop --quick for the full grid.")
