"""README's output samples are what their commands print today (scripts/samples.py):
each ``<!-- sample: COMMAND -->`` block is run again and compared word for word, wall
times masked. A sample that differs fails here; ``python scripts/samples.py``
regenerates them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("samples", ROOT / "scripts" / "samples.py")
assert spec is not None and spec.loader is not None
samples = importlib.util.module_from_spec(spec)
sys.modules["samples"] = samples
spec.loader.exec_module(samples)

ALL = samples.samples([ROOT / f for f in samples.FILES])


def test_readme_shows_samples_of_its_commands() -> None:
    commands = [s.command for s in ALL]
    assert commands[0] == "cais reproduce fig11 --quick --out report"  # README's first command's output
    assert "cais demo" in commands and "python scripts/world_table.py" in commands and len(commands) >= 4
    first = (ROOT / "README.md").read_text().split("```bash\n")[1].split("\n```")[0]
    assert first.endswith(commands[0].replace("cais ", ".venv/bin/cais ", 1))  # the sample is of that command


@pytest.mark.parametrize("sample", ALL, ids=[s.command for s in ALL])
def test_a_sample_is_what_its_command_prints(sample) -> None:
    got, _ = samples.run(sample.command, sample.table)
    assert samples.first_difference(sample.shown, got) is None, samples.first_difference(sample.shown, got)


def test_the_check_masks_wall_times_and_wrapping_only() -> None:
    shown = "[reproduce] fig11: 10 s\nCAIS is 1.29x\nfaster\n"
    assert samples.first_difference(shown, "[reproduce] fig11: 7 s\nCAIS is 1.29x faster\n") is None
    assert "1.29x" in (samples.first_difference(shown, "[reproduce] fig11: 7 s\nCAIS is 1.39x faster\n") or "")
