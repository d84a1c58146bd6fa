"""Every relative link in README.md and the docs resolves: its file exists, and its
``#anchor`` (if any) is a heading of that file as GitHub makes anchors
(``cais.reproduce.verdict.slug``). Links to the web are not followed."""

from __future__ import annotations

import re
from pathlib import Path

from cais.reproduce.verdict import slug

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file's headings (a repeated heading gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", path.read_text()).splitlines():
        if line.startswith("#"):
            base = slug(line.lstrip("#").strip())
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken() -> tuple[list[str], int]:
    """(the links that do not resolve, as 'page: target', how many links were checked)."""
    bad, checked = [], 0
    for page in pages():
        for target in LINK.findall(FENCE.sub("", page.read_text())):
            if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
                continue
            checked += 1
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                bad.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    return bad, checked


def test_every_relative_link_resolves() -> None:
    bad, checked = broken()
    assert checked >= 50, checked  # the pages do link to one another
    assert bad == [], "\n".join(bad)


def test_a_broken_link_is_found(tmp_path: Path, monkeypatch) -> None:
    page = tmp_path / "README.md"
    (tmp_path / "docs").mkdir()
    page.write_text("# Top\n\n[ok](README.md#top) [gone](docs/nothing.md) [bad](README.md#nowhere)\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    bad, checked = broken()
    assert checked == 3 and len(bad) == 2


HISTORY = re.compile(r"\bissues? \d+|\b20\d\d-\d\d-\d\d\b|\b(first|second|third|fourth|fifth|sixth|seventh|eighth|"
                     r"ninth|tenth|eleventh|twelfth) (part|step)\b|^#+ (part|step) \d", re.I)


def test_reference_pages_are_not_organised_by_issue_or_date() -> None:
    """docs/core.md and docs/validation.md are topic pages: no heading names an issue,
    a date or a step of the work (that history is CHANGELOG.md and the git log)."""
    headings = 0
    for name in ("core.md", "validation.md"):
        text = FENCE.sub("", (ROOT / "docs" / name).read_text())
        for line in text.splitlines():
            if re.match(r"^#+ ", line):
                headings += 1
                assert not HISTORY.search(line), f"docs/{name}: {line}"
    assert headings >= 30, headings
    assert HISTORY.search("## The fifth step (2026-12-03): x") and HISTORY.search("### Part 3: y")
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert changelog.startswith("# Changelog") and "\n## Unreleased\n" in changelog
