"""The paper's claims as a reproduction judged them, and the full grid's answer shipped
with the code, so that a quick grid never states the opposite of the real answer
without saying so.

Every experiment records its claims on its :class:`~cais.reproduce.report.Section`
(``Section.claim``: a name that is the same on every grid, whether it holds, the
figure that decided it). A reproduction writes them to ``claims.json`` in its output
folder. ``scripts/full_grid_claims.py`` turns a full-grid run's file into the shipped
table ``src/cais/data/full-grid/<system>.json``; a quick run on that system (with no
``--set``) compares each of its claims with it, and where the two point different
ways its verdict gives the full grid's figure and says which is which."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cais.reproduce.report import Section

#: where the shipped full-grid tables live, one per system preset
SHIPPED = Path(__file__).resolve().parents[1] / "data" / "full-grid"


def claims_of(sections: Sequence[Section]) -> dict[str, list[dict[str, Any]]]:
    """Every section's claims: experiment -> [{name, holds, figure}]."""
    return {s.name: [{"name": c.name, "holds": c.holds, "figure": c.figure} for c in s.claims]
            for s in sections if s.claims}


def write_claims(out: Path, sections: Sequence[Section], facts: dict[str, Any]) -> Path:
    """``out/claims.json``: the claims with ``facts`` (system, grid, commit, command)."""
    path = out / "claims.json"
    path.write_text(json.dumps({**facts, "claims": claims_of(sections)}, indent=1) + "\n")
    return path


def shipped(system: str) -> dict[str, Any] | None:
    """The shipped full-grid table of a system preset (None where there is none)."""
    path = SHIPPED / f"{system}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def against_full(section: Section, table: dict[str, Any], why_quick: str = "") -> list[str]:
    """Where one of a quick section's claims points the other way from the shipped
    full grid: the lines its verdict must lead with, two per claim: the full grid's
    answer, then the quick grid's reading and ``why_quick`` (what the quick grid changes
    that moves it). Empty where all agree or none is shipped."""
    full = {c["name"]: c for c in table.get("claims", {}).get(section.name, [])}
    other = [(c, full[c.name]) for c in section.claims if c.name in full and full[c.name]["holds"] != c.holds]
    lines: list[str] = []
    for q, f in other:
        lines.append(f"The answer (full grid, commit {str(table.get('commit', '?'))[:7]}): '{q.name}' "
                     f"{'holds' if f['holds'] else 'does not hold'} "
                     f"({f['figure']}).")
        lines.append(f"This quick grid points the other way ({q.figure})"
                     + (f": {why_quick}" if why_quick else "") + "; indicative only.")
    return lines


def lead_with_full(section: Section, table: dict[str, Any], why_quick: str = "") -> None:
    """Put the full grid's answer first in a quick section's verdict where the quick
    grid points the other way (:func:`against_full`); leave it as it is elsewhere."""
    lead = against_full(section, table, why_quick)
    if lead and section.lines:
        section.lines = lead + section.lines
