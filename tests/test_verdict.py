"""Verdicts and honest figures (issue 21): the sentences follow the numbers they are
given, reasons are written once, ratio bars grow from 1."""

from __future__ import annotations

from pathlib import Path

import matplotlib.axes
import pandas as pd
import pytest

from cais.reproduce import paper as P
from cais.reproduce import plots
from cais.reproduce.experiments import fig11_verdict, first_reason, geomean_table
from cais.reproduce.report import WHY_COLUMN, Section
from cais.reproduce.verdict import doc_link, quick_warning, slug


def _fig11(speedups: dict[str, float]) -> pd.DataFrame:
    rows = [{"model": "m", "mode": "prefill", "scheme": s, "time_us": 100 * speedups.get(s, 1.0),
             "speedup_of_cais": speedups.get(s, 1.0)} for s in P.SCHEMES]
    return pd.DataFrame(rows)


def _runs(comm_over_compute: float, merged: int = 100, bypassed: int = 0) -> pd.DataFrame:
    return pd.DataFrame([
        {"scheme": "cais", "merged": merged, "bypassed": bypassed, "link_util_mean": 0.5,
         "comm_kernel_us": 0.0, "compute_kernel_us": 1.0},
        {"scheme": "tp-nvls", "merged": 0, "bypassed": 0, "link_util_mean": 0.3,
         "comm_kernel_us": comm_over_compute, "compute_kernel_us": 1.0}])


def test_fig11_verdict_counts_the_baselines_cais_beats() -> None:
    g = geomean_table(_fig11({b: 1.2 for b in P.BASELINES}))
    lines = fig11_verdict(g, _runs(0.5), "the quick grid")
    assert lines[0] == "Grid: the quick grid."
    assert lines[1].startswith("CAIS beats every baseline in prefill (paper's claim): holds; it beats 9 of 9, geomean "
                               "1.20x")
    g = geomean_table(_fig11({**{b: 1.2 for b in P.BASELINES}, "t3": 0.8}))
    lines = fig11_verdict(g, _runs(0.5), "the quick grid")
    assert "does not hold; it beats 8 of 9" in lines[1] and "0.80-1.20x" in lines[1]
    assert lines[2].startswith("First reason from the runs: ")


def test_first_reason_is_read_from_the_runs() -> None:
    assert "25 % of CAIS's mergeable requests" in first_reason(_runs(0.5, merged=75, bypassed=25))
    assert "0.50x as long in collectives" in first_reason(_runs(0.5))
    assert "links 50 % busy" in first_reason(_runs(2.0))


def test_a_reason_repeated_in_a_table_is_written_once() -> None:
    df = pd.DataFrame({"scheme": ["a", "b", "c", "d"], WHY_COLUMN: ["same", "same", "", "other"]})
    sec = Section("x", "X").table(df, summary=True)
    (_, table), (kind, notes) = sec.blocks
    assert list(table[WHY_COLUMN]) == ["[1]", "[1]", "", "[2]"]
    assert kind == "notes" and notes == ["same", "other"]
    assert sec.summary is table


def test_ratio_bars_grow_from_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict] = []
    real = matplotlib.axes.Axes.bar

    def spy(self, x, height, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append({"height": list(height), "bottom": kwargs.get("bottom")})
        return real(self, x, height, *args, **kwargs)
    monkeypatch.setattr(matplotlib.axes.Axes, "bar", spy)
    plots.bars(tmp_path / "r.png", ["a", "b"], {"s": [0.7, 1.43]}, "speedup (x)", "t", ratio=True)
    assert seen and seen[0]["bottom"] == 1.0
    assert seen[0]["height"] == pytest.approx([-0.3, 0.43])  # 0.7x is a bar below the line at 1
    seen.clear()
    plots.bars(tmp_path / "u.png", ["a"], {"s": [62.0]}, "utilisation (%)", "t")
    assert seen[0]["bottom"] is None


def test_quick_warning_only_for_the_quick_grid() -> None:
    assert "quick grid: paper-mega-gpt-4b" in quick_warning(True, ["paper-mega-gpt-4b"])
    assert quick_warning(False, ["paper-llama-7b"]) == ""


def test_doc_links_land_on_existing_headings(tmp_path: Path) -> None:
    assert slug("13. CAIS as the paper designed it (a note)") == "13-cais-as-the-paper-designed-it-a-note"
    text, target = doc_link("validation.md", "13. CAIS as the paper designed it", tmp_path)
    assert text == "docs/validation.md §13"
    path, anchor = target.split("#")
    doc = (tmp_path / path).resolve()
    assert doc.is_file()
    headings = [slug(line.lstrip("#")) for line in doc.read_text().splitlines() if line.startswith("#")]
    assert anchor in headings


def test_every_why_we_differ_link_lands_on_a_heading(tmp_path: Path) -> None:
    from cais.reproduce.verdict import WHY_DIFFER, why_links

    links = why_links(tmp_path)
    assert len(links) == len(WHY_DIFFER) + 1 >= 3  # the first written from the run's numbers
    assert "weighs less" in why_links(tmp_path, 1.0, 1.6)[0][0]
    assert "at least as much" in why_links(tmp_path, 2.0, 1.6)[0][0]
    for _, _, target in links:
        path, _, anchor = target.partition("#")
        doc = (tmp_path / path).resolve()
        assert doc.is_file(), target
        if anchor:
            assert anchor in [slug(ln.lstrip("#")) for ln in doc.read_text().splitlines() if ln.startswith("#")]
