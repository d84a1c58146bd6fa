"""The reproduction report: sections of paragraphs, tables and figures, written as
Markdown (``report.md``) and as one static HTML page (``report.html``, figures as
``<img>`` of the PNG files next to it, no scripts)."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd


@dataclass
class Section:
    """One experiment's part of the report: a title, and blocks in order: ``("p",
    text)``, ``("table", DataFrame)`` or ``("img", file name relative to the report)``."""

    name: str
    title: str
    blocks: list[tuple[str, object]] = field(default_factory=list)

    def p(self, text: str) -> "Section":
        self.blocks.append(("p", text))
        return self

    def table(self, df: pd.DataFrame) -> "Section":
        self.blocks.append(("table", df))
        return self

    def img(self, name: str) -> "Section":
        self.blocks.append(("img", name))
        return self

    @property
    def images(self) -> list[str]:
        return [str(b) for k, b in self.blocks if k == "img"]


def _cell(v: object) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "–"
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def table_md(df: pd.DataFrame) -> str:
    """A DataFrame as a Markdown table (floats to 3 significant digits)."""
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def table_html(df: pd.DataFrame) -> str:
    """A DataFrame as an HTML table (cells as in :func:`table_md`)."""
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(_cell(v))}</td>" for v in row) + "</tr>"
                   for row in df.itertuples(index=False))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


CSS = """body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:0.9em}td,th{border:1px solid #bbb;padding:3px 8px;
text-align:right}th{background:#eee}img{max-width:100%;border:1px solid #ddd;margin:1em 0}
td:last-child{text-align:left;max-width:420px}h2{border-bottom:2px solid #444;margin-top:2em}p{line-height:1.45}"""


def write_report(out: Path, sections: list[Section], header: list[str]) -> tuple[Path, Path]:
    """Write ``out/report.md`` and ``out/report.html``; ``header``: opening paragraphs."""
    md = ["# cais-sim: reproduction of the CAIS paper (arXiv 2605.05628)", ""]
    md += [h + "\n" for h in header]
    body = [f"<h1>cais-sim: reproduction of the CAIS paper (arXiv 2605.05628)</h1>"]
    body += [f"<p>{html.escape(h)}</p>" for h in header]
    body.append("<ul>" + "".join(f'<li><a href="#{s.name}">{html.escape(s.title)}</a></li>' for s in sections)
                + "</ul>")
    for s in sections:
        md.append(f"## {s.title}\n")
        body.append(f'<h2 id="{s.name}">{html.escape(s.title)}</h2>')
        for kind, b in s.blocks:
            if kind == "p":
                md.append(f"{b}\n")
                body.append(f"<p>{html.escape(str(b))}</p>")
            elif kind == "table":
                md.append(table_md(b) + "\n")  # type: ignore[arg-type]
                body.append(table_html(b))  # type: ignore[arg-type]
            else:
                md.append(f"![{s.name}]({b})\n")
                body.append(f'<img src="{html.escape(str(b))}" alt="{html.escape(s.title)}">')
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text("\n".join(md))
    page = ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>cais-sim reproduction</title>"
            f"<style>{CSS}</style></head><body>" + "\n".join(body) + "</body></html>")
    (out / "report.html").write_text(page)
    return out / "report.md", out / "report.html"
