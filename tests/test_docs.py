"""Help, README and docs agree (issue 36, item 6): every flag a help text or a
documented command line names exists on that command; every scheme the registry
knows is in the README's scheme list; the mirror mode's accuracy is one figure, the
measured one, in the help and the README; ``demo --help`` counts the baselines the
demo runs; the note docs/models.md promises is the one the model gives; and the docs
index lists every page."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from cais.cli import build_parser
from cais.schemes import schemes
from cais.workload.graph import SUBLAYERS, sublayer_legend
from cais.workload.models import load_model

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


@pytest.fixture(autouse=True)
def wide_help(monkeypatch: pytest.MonkeyPatch) -> None:
    """argparse wraps help to the terminal and may break a flag at its hyphen: no wrapping."""
    monkeypatch.setenv("COLUMNS", "100000")


def commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def summaries(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each command's one-line help in ``cais --help``."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest: a.help or "" for a in sub._choices_actions}


def unknown_flags(sp: argparse.ArgumentParser, text: str) -> list[str]:
    """The flags ``text`` names that ``sp`` does not have."""
    return sorted({f for f in FLAG.findall(text) if f not in sp._option_string_actions})


def test_every_flag_named_in_a_help_text_exists_on_that_command() -> None:
    parser = build_parser()
    assert unknown_flags(parser, parser.format_help()) == []
    said = summaries(parser)
    for name, sp in commands(parser).items():
        text = sp.format_help() + "\n" + said.get(name, "")
        assert unknown_flags(sp, text) == [], f"cais {name} --help names flags it does not have"


def test_the_flag_check_finds_a_flag_that_is_not_there() -> None:
    sp = argparse.ArgumentParser()
    sp.add_argument("--out", help="like --trace, and --out-dir is not a flag either; --out is")
    assert unknown_flags(sp, sp.format_help()) == ["--out-dir", "--trace"]


def test_set_help_names_only_the_config_flags_each_command_has() -> None:
    parsers = commands(build_parser())
    for name, sp in parsers.items():
        if "--set" not in sp._option_string_actions:
            continue
        text = " ".join(sp._option_string_actions["--set"].help.split())  # type: ignore[union-attr]
        for flag in ("--gpus", "--unit", "--json"):
            assert (flag in text) == (flag in sp._option_string_actions), (name, flag, text)
    assert "provenance" in parsers["reproduce"]._option_string_actions["--set"].help  # type: ignore[operator]


def documented_command_lines() -> list[tuple[str, int, str, str]]:
    """(file, line, command, the rest of the line) of every ``cais COMMAND ...`` line in
    a code block, and every inline ```cais COMMAND ...```, of README.md and docs/."""
    out = []
    files = [README, *sorted(DOCS.glob("*.md")), *sorted(DOCS.glob("*/*.md"))]
    for f in files:
        fence = False
        for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip().startswith("```"):
                fence = not fence
                continue
            if fence and (m := re.match(r"^\s*(?:\$ )?(?:\.venv/bin/)?cais (\w[\w-]*)(.*)$", line)):
                out.append((f.name, i, m[1], m[2].split(" #")[0]))
            out += [(f.name, i, m[1], m[2]) for m in re.finditer(r"`(?:\.venv/bin/)?cais (\w[\w-]*)([^`]*)`", line)]
    return out


def test_every_documented_command_line_names_flags_the_command_has() -> None:
    parsers = commands(build_parser())
    lines = documented_command_lines()
    assert len(lines) > 30  # the scan finds the README's and the docs' command lines
    bad = []
    for f, i, command, rest in lines:
        if command not in parsers:
            bad.append(f"{f}:{i}: no command '{command}'")
        elif unknown := unknown_flags(parsers[command], rest):
            bad.append(f"{f}:{i}: cais {command} has no {', '.join(unknown)}")
    assert not bad, "\n".join(bad)


def readme_scheme_list() -> set[str]:
    """The words of the README's ``cais schemes`` line and the comment lines under it."""
    lines = README.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("cais schemes "))
    block = [lines[start]]
    for line in lines[start + 1:]:
        if not re.match(r"^\s+#", line):
            break
        block.append(line)
    return set(re.findall(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*", " ".join(block)))


def test_every_scheme_is_in_the_readme_scheme_list() -> None:
    listed = readme_scheme_list()
    missing = sorted(set(schemes()) - listed)
    assert not missing, f"README's 'cais schemes' list lacks {missing}"
    assert "ladm-colmajor" in listed and "no-such-scheme" not in listed


def test_mirror_accuracy_is_one_measured_figure_in_help_and_readme() -> None:
    parsers = commands(build_parser())
    figures = set()
    for name in ("run", "collective"):
        text = " ".join(parsers[name]._option_string_actions["--sim"].help.replace("%%", "%").split())  # type: ignore
        figures.add(re.search(r"within ([\d.]+) % of full.*?largest \+([\d.]+) %", text).groups())  # type: ignore
    readme = " ".join(README.read_text(encoding="utf-8").split())
    said = re.search(r"`--sim mirror`.*?within ([\d.]+) % of the full model.*?largest \+([\d.]+) %", readme)
    assert said, "README states mirror mode's accuracy"
    figures.add(said.groups())
    assert len(figures) == 1, figures
    (within, largest), = figures
    assert float(largest) <= float(within)
    validation = (DOCS / "validation.md").read_text(encoding="utf-8")
    assert f"+{largest} %" in validation  # the measured error, as docs/validation.md gives it


def test_demo_help_counts_the_baselines_the_demo_runs() -> None:
    parser = build_parser()
    texts = [summaries(parser)["demo"], commands(parser)["demo"].description or ""]
    numbers = {"eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13}
    run = [n for n, cls in schemes().items() if cls().in_demo and n != "cais"]  # what cmd_demo runs
    for text in texts:
        counts = re.findall(r"CAIS and the (\w+) baselines", " ".join(text.split()))
        assert counts and all(numbers.get(c) == len(run) for c in counts), (counts, run)


def test_the_kv_note_in_models_md_is_what_the_model_says() -> None:
    note = load_model("llama3-70b").check_tp(16)
    assert note
    text = " ".join((DOCS / "models.md").read_text(encoding="utf-8").split())
    assert f"note: {note}" in text


def test_the_sublayer_legend_names_the_models_norm() -> None:
    for name in SUBLAYERS:
        assert "RMSNorm" in sublayer_legend(name, "rmsnorm") and "LayerNorm" not in sublayer_legend(name, "rmsnorm")
        assert sublayer_legend(name, "layernorm") == SUBLAYERS[name]
    assert load_model("llama3-70b").norm == "rmsnorm"


def test_the_docs_index_lists_every_page() -> None:
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#]+)\)", index)
    pages = sorted(p.name for p in DOCS.glob("*.md") if p.name != "README.md")
    missing = [p for p in pages if p not in links]
    assert not missing, f"docs/README.md does not list {missing}"
    broken = [link for link in links if not (DOCS / link).exists()]
    assert not broken, f"docs/README.md links to {broken}, which are not there"
    for page in pages:  # one line each, with what the page is about
        line = next(line for line in index.splitlines() if f"]({page})" in line)
        assert len(line.split("—", 1)[-1].split()) >= 5, line


# Every python block of docs/python.md runs as pasted (issue 59, part 3): in order, in
# one fresh interpreter, with nothing but what the page itself defines.
PYTHON_PAGE = DOCS / "python.md"
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
RUN_BLOCKS = """\
import json, sys
blocks = json.load(open(sys.argv[1]))
namespace = {"__name__": "__main__"}
for i, block in enumerate(blocks, 1):
    exec(compile(block, f"<docs/python.md, python block {i}>", "exec"), namespace)
    print(f"@@ block {i} ran", flush=True)
"""


def test_every_python_block_of_the_python_page_runs_in_order_as_pasted(tmp_path: Path) -> None:
    import json
    import os
    import subprocess
    import sys

    import cais

    blocks = PYTHON_BLOCK.findall(PYTHON_PAGE.read_text())  # the page itself, not a copy
    assert len(blocks) >= 8, f"docs/python.md has {len(blocks)} python blocks; expected at least 8"
    (tmp_path / "blocks.json").write_text(json.dumps(blocks))
    (tmp_path / "run_blocks.py").write_text(RUN_BLOCKS)
    work = tmp_path / "work"  # the reader's folder: empty, and not the repository
    work.mkdir()
    src = str(Path(cais.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, *filter(None, [os.environ.get("PYTHONPATH")])]),
           "TMPDIR": str(tmp_path), "MPLBACKEND": "Agg"}
    done = subprocess.run([sys.executable, str(tmp_path / "run_blocks.py"), str(tmp_path / "blocks.json")],
                          cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"a block of docs/python.md failed:\n{done.stderr[-3000:]}"
    ran = [line for line in done.stdout.splitlines() if line.startswith("@@ block ")]
    assert ran == [f"@@ block {i} ran" for i in range(1, len(blocks) + 1)]
