"""The paper's claims as a reproduction records them, and the quick grid held to the
shipped full grid: a quick claim that points the other way from the full grid's gets
the full grid's figure in its verdict; one that agrees gets nothing."""

from __future__ import annotations

import json
from pathlib import Path

from cais.reproduce.claims import against_full, claims_of, lead_with_full, shipped, write_claims
from cais.reproduce.report import Section

FULL = {"system": "dgx-h100", "commit": "0123456789abcdef", "grid": "full",
        "claims": {"fig17": [{"name": "throughput holds", "holds": False, "figure": "-11.4 % from 8 to 32 GPUs"}]}}


def test_a_claim_that_points_the_other_way_gets_the_full_grids_figure() -> None:
    sec = Section("fig17", "Fig. 17")
    assert sec.claim("throughput holds", True, "+70.3 % from 8 to 16 GPUs") == "holds"
    answer, quick = against_full(sec, FULL, "8 -> 16 GPUs for 8 -> 32")
    assert answer == ("The answer (full grid, commit 0123456): 'throughput holds' does not hold (-11.4 % from 8 to 32 "
                      "GPUs).")
    assert quick == ("This quick grid points the other way (+70.3 % from 8 to 16 GPUs): 8 -> 16 GPUs for 8 -> 32; "
                     "indicative only.")


def test_the_verdict_leads_with_the_full_grids_answer() -> None:
    sec = Section("fig17", "Fig. 17").says("+70.3 % per GPU from 8 to 16 GPUs: the claim holds here.")
    sec.claim("throughput holds", True, "+70.3 % from 8 to 16 GPUs")
    lead_with_full(sec, FULL, "a smaller grid")
    assert len(sec.lines) == 3 and sec.lines[0].startswith("The answer (full grid")
    assert "a smaller grid" in sec.lines[1] and sec.lines[2] == "+70.3 % per GPU from 8 to 16 GPUs: the claim holds here."
    agreeing = Section("fig17", "Fig. 17").says("as it was")
    agreeing.claim("throughput holds", False, "-3 %")
    lead_with_full(agreeing, FULL)
    assert agreeing.lines == ["as it was"]


def test_agreeing_or_unknown_claims_add_nothing() -> None:
    sec = Section("fig17", "Fig. 17")
    assert sec.claim("throughput holds", False, "-3 %") == "does not hold"
    sec.claim("a claim the full grid does not have", True, "1x")
    assert against_full(sec, FULL) == []
    assert against_full(Section("fig11", "Fig. 11"), FULL) == []


def test_claims_are_written_with_their_facts(tmp_path: Path) -> None:
    sec = Section("fig2", "Fig. 2")
    sec.claim("communication dominates", False, "0.56x")
    path = write_claims(tmp_path, [sec, Section("area", "area")], {"system": "dgx-h100", "grid": "quick"})
    data = json.loads(path.read_text())
    assert data["grid"] == "quick" and data["claims"] == claims_of([sec])
    assert data["claims"]["fig2"] == [{"name": "communication dominates", "holds": False, "figure": "0.56x"}]


def test_the_default_system_ships_its_full_grid() -> None:
    full = shipped("dgx-h100")
    assert full is not None and full["grid"] == "full" and not full["sets"]
    assert sum(len(c) for c in full["claims"].values()) >= 10
    assert shipped("no-such-system") is None
    pw = shipped("paper-world")  # the paper's world is held to its own full grid too
    assert pw is not None and pw["system"] == "paper-world" and pw["grid"] == "full"


def test_a_quick_run_without_a_shipped_full_grid_says_its_claims_are_unchecked(tmp_path: Path) -> None:
    from cais.reproduce.experiments import Context
    from cais.reproduce.run import reproduce

    assert shipped("dgx-h200") is None
    logged: list[str] = []
    reproduce(["fig2"], Context(system="dgx-h200", quick=True, out=tmp_path), workers=1, log=logged.append)
    assert any("not checked against a full grid: no full grid of dgx-h200" in line for line in logged)
    assert "Its claims are not checked against a full grid" in (tmp_path / "report.md").read_text()
