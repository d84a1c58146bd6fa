"""The reproduction report: a verdict, the provenance, then sections of paragraphs,
tables and figures, and the reasons we differ from the paper with links to the
docs, written as Markdown (``report.md``) and as one static HTML page
(``report.html``, figures as ``<img>`` of the PNG files next to it, no scripts)."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd


#: the longest verdict line a report writes (characters): one claim a line, readable
#: in a terminal of 80 columns in three rows or fewer
VERDICT_LINE_MAX = 200

#: the column of a comparison table that gives the reason ours and the paper's differ
WHY_COLUMN = "why they differ (> 10 %)"


@dataclass(frozen=True)
class Claim:
    """One claim of the paper as a run judged it: its name (the same on the quick and
    the full grid), whether it holds, and the figure that decided it."""

    name: str
    holds: bool
    figure: str


@dataclass
class Section:
    """One experiment's part of the report: a title, its verdict as ``lines`` (one claim
    a line, each from the numbers: the claim, our figure, the paper's, whether it holds,
    the world; at most :data:`VERDICT_LINE_MAX` characters), and blocks in order:
    ``("p", text)``, ``("table", DataFrame)``, ``("notes", [reasons])`` or ``("img",
    file name relative to the report)``; ``summary`` is the table printed in the
    terminal."""

    name: str
    title: str
    blocks: list[tuple[str, object]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    summary: pd.DataFrame | None = None
    #: numbers the report's other parts state too (e.g. ``comm_over_compute``), so all say one thing
    facts: dict[str, float] = field(default_factory=dict)
    claims: list[Claim] = field(default_factory=list)

    def p(self, text: str) -> "Section":
        self.blocks.append(("p", text))
        return self

    def claim(self, name: str, ok: bool, figure: str) -> str:
        """Record one of the paper's claims as this run judged it (``name``: the same on
        every grid; ``figure``: the number that decided it, in words) and return
        ``holds`` or ``does not hold`` for the verdict's sentence."""
        self.claims.append(Claim(name, bool(ok), figure))
        return "holds" if ok else "does not hold"

    def says(self, *lines: str) -> "Section":
        """Set the section's verdict, one claim a line (empty lines dropped)."""
        self.lines = [ln.strip() for ln in lines if ln and ln.strip()]
        return self

    @property
    def verdict(self) -> str:
        """The verdict's lines as one text, a line each ("" where there is none)."""
        return "\n".join(self.lines)

    def table(self, df: pd.DataFrame, summary: bool = False) -> "Section":
        """Add ``df``; a reasons column (:data:`WHY_COLUMN`) becomes note numbers with
        each distinct reason written once under the table. ``summary``: this is the
        table the terminal prints."""
        notes: list[str] = []
        if WHY_COLUMN in df.columns:
            df = df.copy()
            refs = []
            for why in df[WHY_COLUMN]:
                if isinstance(why, str) and why:
                    if why not in notes:
                        notes.append(why)
                    refs.append(f"[{notes.index(why) + 1}]")
                else:
                    refs.append("")
            df[WHY_COLUMN] = refs
        self.blocks.append(("table", df))
        if notes:
            self.blocks.append(("notes", notes))
        if summary:
            self.summary = df
        return self

    def img(self, name: str) -> "Section":
        self.blocks.append(("img", name))
        return self

    @property
    def images(self) -> list[str]:
        return [str(b) for k, b in self.blocks if k == "img"]


def cell(v: object) -> str:
    """A table cell as text: floats to 3 significant digits (thousands separated), NaN as a dash."""
    if isinstance(v, float):
        if math.isnan(v):
            return "–"
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def table_md(df: pd.DataFrame) -> str:
    """A DataFrame as a Markdown table (floats to 3 significant digits)."""
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def table_html(df: pd.DataFrame) -> str:
    """A DataFrame as an HTML table (cells as in :func:`table_md`)."""
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(cell(v))}</td>" for v in row) + "</tr>"
                   for row in df.itertuples(index=False))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


CSS = """body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:0.9em}td,th{border:1px solid #bbb;padding:3px 8px;
text-align:right}th{background:#eee}img{max-width:100%;border:1px solid #ddd;margin:1em 0}
td:last-child{text-align:left;max-width:420px}h2{border-bottom:2px solid #444;margin-top:2em}p{line-height:1.45}
#verdict{background:#eef6ee;border-left:6px solid #2a7a2a;padding:0.6em 1em}#verdict h2{margin-top:0.3em}
.warning{background:#fff4e0;border-left:6px solid #d08000;padding:0.6em 1em;font-weight:bold}
.verdict{background:#f3f3f3;border-left:4px solid #2a7a2a;padding:0.4em 0.8em}
#provenance td{text-align:left}ol.notes{font-size:0.85em;color:#444}"""


@dataclass(frozen=True)
class Front:
    """The report's opening: the overall ``verdict`` ((section title, its lines) per
    section), a ``warning`` shown
    boxed (e.g. a quick grid compared with the paper's full grid; "" for none),
    ``facts`` (opening paragraphs), ``provenance`` ((label, value) pairs) and
    ``why`` ((reason, link text, link target) of the "why we differ" section)."""

    verdict: list[tuple[str, list[str]]]
    warning: str
    facts: list[str]
    provenance: list[tuple[str, str]]
    why: list[tuple[str, str, str]]


def _front_item_html(title: str, lines: list[str]) -> str:
    """One section in the page's opening verdict: its title and first line, the rest
    folded under it (so the provenance stays on the first screen; each section's own
    verdict below shows every line)."""
    head = f"<b>{html.escape(title)}</b>" + (f": {html.escape(lines[0])}" if lines else "")
    if len(lines) <= 1:
        return head
    return head + f"<details><summary>{len(lines) - 1} more</summary>{_lines_html(lines[1:])}</details>"


def _lines_html(lines: list[str]) -> str:
    return "<ul>" + "".join(f"<li>{html.escape(ln)}</li>" for ln in lines) + "</ul>"


TITLE = "cais-sim: reproduction of the CAIS paper (arXiv 2605.05628)"


def _front_md(f: Front) -> list[str]:
    md = [f"# {TITLE}", "", "## Verdict", ""]
    for title, lines in f.verdict:
        md += [f"- **{title}**"] + [f"  - {ln}" for ln in lines]
    md += [""]
    if f.warning:
        md += [f"> **Warning:** {f.warning}", ""]
    md += [p + "\n" for p in f.facts]
    md += ["## Provenance", "", table_md(pd.DataFrame(f.provenance, columns=["", "value"])), ""]
    return md


def _front_html(f: Front, sections: list[Section]) -> list[str]:
    body = [f"<h1>{html.escape(TITLE)}</h1>", '<div id="verdict"><h2>Verdict</h2><ul>'
            + "".join(f"<li>{_front_item_html(t, lines)}</li>" for t, lines in f.verdict)
            + "</ul></div>"]
    if f.warning:
        body.append(f'<p class="warning" id="warning">Warning: {html.escape(f.warning)}</p>')
    body += [f"<p>{html.escape(p)}</p>" for p in f.facts]
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in f.provenance)
    body.append(f'<h2>Provenance</h2><table id="provenance"><tbody>{rows}</tbody></table>')
    body.append("<ul>" + "".join(f'<li><a href="#{s.name}">{html.escape(s.title)}</a></li>' for s in sections)
                + '<li><a href="#why">Why we differ from the paper</a></li></ul>')
    return body


def write_report(out: Path, sections: list[Section], front: Front) -> tuple[Path, Path]:
    """Write ``out/report.md`` and ``out/report.html``: ``front``, then each section
    (its verdict first), then "why we differ" with its links."""
    md = _front_md(front)
    body = _front_html(front, sections)
    for s in sections:
        md.append(f"## {s.title}\n")
        body.append(f'<h2 id="{s.name}">{html.escape(s.title)}</h2>')
        if s.lines:
            md.append("**Verdict:**\n\n" + "\n".join(f"- {ln}" for ln in s.lines) + "\n")
            body.append(f'<div class="verdict"><b>Verdict:</b>{_lines_html(s.lines)}</div>')
        for kind, b in s.blocks:
            if kind == "p":
                md.append(f"{b}\n")
                body.append(f"<p>{html.escape(str(b))}</p>")
            elif kind == "table":
                md.append(table_md(b) + "\n")  # type: ignore[arg-type]
                body.append(table_html(b))  # type: ignore[arg-type]
            elif kind == "notes":
                md.append("\n".join(f"[{i}] {n}" for i, n in enumerate(b, 1)) + "\n")  # type: ignore[arg-type]
                body.append('<ol class="notes">' + "".join(f"<li>{html.escape(n)}</li>" for n in b)  # type: ignore
                            + "</ol>")
            else:
                md.append(f"![{s.name}]({b})\n")
                body.append(f'<img src="{html.escape(str(b))}" alt="{html.escape(s.title)}">')
    md.append("## Why we differ from the paper\n")
    md += [f"- {why} ([{text}]({target}))" for why, text, target in front.why] + [""]
    body.append('<h2 id="why">Why we differ from the paper</h2><ul>' + "".join(
        f'<li>{html.escape(why)} (<a href="{html.escape(target)}">{html.escape(text)}</a>)</li>'
        for why, text, target in front.why) + "</ul>")
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text("\n".join(md))
    page = ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>cais-sim reproduction</title>"
            f"<style>{CSS}</style></head><body>" + "\n".join(body) + "</body></html>")
    (out / "report.html").write_text(page)
    return out / "report.md", out / "report.html"
