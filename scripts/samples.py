"""The output samples in README.md and docs/: every ```text block preceded by a
``<!-- sample: COMMAND -->`` line is what COMMAND prints, made by running it, and
every ``<!-- table: COMMAND -->`` ... ``<!-- /table -->`` span is the Markdown COMMAND
prints (a table generated from shipped results). Run this to regenerate them after a
change that moves a number or a word; ``--check`` runs them and fails where one
differs (tests/test_samples.py does so for every sample).

    .venv/bin/python scripts/samples.py [--check] [--only TEXT] [FILE.md ...]

Each command runs in a fresh temporary folder (so ``--out report`` writes there) with
the checkout's ``cais`` first on PATH, ``COLUMNS`` = 110 and no colour. What a run
cannot repeat is compared loosely: wall times (a number before ``s`` or ``min``,
progress lines) are masked, and lines are compared as words, so a verdict that wraps
one word earlier is the same sample.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = ("README.md", "docs/cais.md", "docs/validation.md", "docs/compute-model.md", "docs/moe.md", "docs/memory.md")
MARK = re.compile(r"^<!-- sample: (?P<cmd>.+?) -->\n```text\n(?P<body>.*?)^```$", re.M | re.S)
TABLE = re.compile(r"^<!-- table: (?P<cmd>.+?) -->\n(?P<body>.*?)^<!-- /table -->$", re.M | re.S)
WIDTH = 110
#: a wall-clock duration in a command's output ("10 s", "1.2 s", "4 min 37 s"), masked when checking
WALL = re.compile(r"\b\d[\d,]*(?:\.\d+)?\s?(?:s|min)\b")
#: lines of live progress, which a run prints only as it goes
PROGRESS = re.compile(r"^cais: .*ETA", re.M)


@dataclass(frozen=True)
class Sample:
    """One sample block: the file, the command, the text the file shows and whether
    it is raw Markdown (a ``table``) rather than a ```text block."""

    path: Path
    command: str
    shown: str
    table: bool = False

    def block(self, body: str) -> str:
        """The block as the file holds it, with ``body``."""
        if self.table:
            return f"<!-- table: {self.command} -->\n{body}<!-- /table -->"
        return f"<!-- sample: {self.command} -->\n```text\n{body}```"


def samples(paths: list[Path]) -> list[Sample]:
    """Every sample block of ``paths``, in order."""
    out = []
    for p in paths:
        text = p.read_text()
        found = [(m.start(), Sample(p, m["cmd"], m["body"])) for m in MARK.finditer(text)]
        found += [(m.start(), Sample(p, m["cmd"], m["body"], True)) for m in TABLE.finditer(text)]
        out += [s for _, s in sorted(found, key=lambda f: f[0])]
    return out


def run(command: str, here: bool = False) -> tuple[str, float]:
    """What ``command`` prints (stdout and stderr, progress lines dropped) and its wall
    seconds, run in a fresh temporary folder (``here``: in the checkout, for a command
    that only reads what the checkout holds)."""
    env = {**os.environ, "COLUMNS": str(WIDTH), "NO_COLOR": "1", "TERM": "dumb", "CAIS_PROGRESS": "0",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        done = subprocess.run(command, shell=True, cwd=ROOT if here else tmp, env=env, capture_output=True, text=True,
                              timeout=900)
        wall = time.perf_counter() - t0
    text = PROGRESS.sub("", done.stdout + done.stderr)
    text = "\n".join(line.rstrip() for line in text.strip("\n").splitlines()) + "\n"
    return text, wall


def words(text: str) -> list[str]:
    """``text`` as the words a check compares: wall times masked, wrapping ignored."""
    return WALL.sub("<wall>", text).split()


def first_difference(shown: str, got: str) -> str | None:
    """Where the shown sample and a fresh run first differ, in words (None: the same)."""
    a, b = words(shown), words(got)
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"word {i}: shown '{' '.join(a[max(0, i - 6):i + 6])}', now '{' '.join(b[max(0, i - 6):i + 6])}'"
    if len(a) != len(b):
        return f"shown {len(a)} words, now {len(b)}"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path, help="Markdown files (default: README.md, docs/cais.md, docs/validation.md)")
    ap.add_argument("--check", action="store_true", help="run the samples and fail where one differs")
    ap.add_argument("--only", default="", help="only the samples whose command contains this text")
    a = ap.parse_args(argv)
    paths = [p if p.is_absolute() else ROOT / p for p in (a.files or [Path(f) for f in FILES])]
    todo = [s for s in samples(paths) if a.only in s.command]
    if not todo:
        print("samples: no sample blocks matched", file=sys.stderr)
        return 2
    bad = 0
    for s in todo:
        got, wall = run(s.command, s.table)
        print(f"samples: {s.path.name}: '{s.command}' ran in {wall:.1f} s", file=sys.stderr)
        if a.check:
            diff = first_difference(s.shown, got)
            if diff:
                bad += 1
                print(f"samples: {s.path.name}: '{s.command}' differs from its sample: {diff}", file=sys.stderr)
            continue
        text = s.path.read_text()
        s.path.write_text(text.replace(s.block(s.shown), s.block(got), 1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
