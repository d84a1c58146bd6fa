"""The docs say what the shipped runs say: the validation page's sections measured on
an older tree open with the commit their numbers are of; every page that describes
the three worlds carries the one description the code keeps (its text is held by
tests/test_samples.py); and the README's words on the switch's share are the shipped
world table's numbers."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VALIDATION = ROOT / "docs" / "validation.md"
#: the sections the validation page's introduction names as measured on older trees
HISTORICAL = ("6", "7", "8", "13", "16", "17", "18")


def _sections(text: str) -> dict[str, str]:
    parts = re.split(r"^## ", text, flags=re.M)[1:]
    return {p.split(".", 1)[0]: p for p in parts if p[:1].isdigit()}


def test_each_historical_validation_section_opens_with_its_commit() -> None:
    text = VALIDATION.read_text()
    assert "Sections 6-8, 13 and 16-18 compare with the paper as those runs stood" in text
    sections = _sections(text)
    for n in HISTORICAL:
        body = sections[n].split("\n", 2)[2].lstrip()
        m = re.match(r"> \*\*Measured as of commit ([0-9a-f]{7}) \(\d{4}-\d\d-\d\d\)\*\*", body)
        assert m, f"section {n} does not open with its commit"
        git = shutil.which("git")
        if git and (ROOT / ".git").exists():  # the commit is one of this tree's ancestors
            ok = subprocess.run([git, "merge-base", "--is-ancestor", m[1], "HEAD"], cwd=ROOT, capture_output=True)
            assert ok.returncode == 0, f"section {n}: {m[1]} is not an ancestor of HEAD"
    assert "Measured as of commit" not in sections["21"]  # the current section is not marked old


@pytest.mark.parametrize("page", ["README.md", "docs/reproduce.md"])
def test_pages_that_describe_the_worlds_carry_the_one_description(page: str) -> None:
    from cais.reproduce.experiments.common import WORLD_TEXT

    text = (ROOT / page).read_text()
    assert "<!-- table: python scripts/worlds_doc.py -->" in text
    for words in WORLD_TEXT.values():
        assert words in text


def test_the_readme_states_the_switchs_share_as_the_world_table_gives_it() -> None:
    text = (ROOT / "README.md").read_text()
    table = text.split("<!-- table: python scripts/world_table.py -->", 1)[1].split("<!-- /table -->", 1)[0]
    rows = {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:-1]] for r in table.splitlines()
            if r.startswith("| ") and not r.startswith("| world")}
    sw = {w: [float(x) for x in re.findall(r"([0-9.]+)x", cols[2])] for w, cols in rows.items() if "x" in cols[2]}
    h100 = [v for w, vals in sw.items() if w.startswith("dgx-h100") for v in vals]
    assert h100, rows
    lo, hi = round(100 * (min(h100) - 1)), round(100 * (max(h100) - 1))
    bullet = text.split("* **The switch's share**", 1)[1].split("\n* ", 1)[0]
    assert f"buys {lo}-{hi} %" in bullet, (lo, hi, bullet)
    pw, pw_tp = sw["paper-world"], [float(x) for x in re.findall(r"([0-9.]+)x", rows["paper-world"][0])]
    assert f"{pw[0]:.2f}x / {pw[1]:.2f}x" in bullet
    # "most of CAIS's gain": the switch's log share of CAIS's gain over TP-NVLS is over half in both modes
    assert all(math.log(s) / math.log(t) > 0.5 for s, t in zip(pw, pw_tp)) == ("most of" in bullet)
