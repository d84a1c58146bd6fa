"""Output that fits: every table the commands print, and the progress bar, read whole
on an 80-column terminal and in a pipe (issue 36, item 5). A table cell is never cut
with an ellipsis (rich's ``layerno…``), no line is longer than 80 columns, and the
progress bar's ETA is never cut (``ETA …``).

The commands run as a user runs them in a pipe: a child process with ``COLUMNS=80``
and stdout not a terminal. Each table is also rendered in-process with worst-case
contents (long names, 14-digit numbers, more columns than fit), beside rich's own
rendering of the same table, which cuts it: the checks are not vacuous."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console
from rich.table import Table

from cais.progress import BarView, RunProgress
from cais.results.fit import fit, print_table

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 80
ELLIPSIS = "…"
QUICK_RUNS = ROOT / "docs" / "reproduce-results" / "quick-all"  # cached quick-grid runs, committed


def assert_fits(text: str, width: int = WIDTH) -> None:
    """No ellipsis anywhere, no line wider than ``width``."""
    assert ELLIPSIS not in text, text
    long = [line for line in text.splitlines() if len(line) > width]
    assert not long, "\n".join(long)


def cais(*args: str, cwd: Path | None = None, timeout: int = 300) -> str:
    """``python -m cais ARGS`` in a pipe at 80 columns: its stdout (exit code 0)."""
    env = {**os.environ, "COLUMNS": str(WIDTH), "PYTHONPATH": str(ROOT / "src")}
    env.pop("CAIS_DEBUG", None)
    proc = subprocess.run([sys.executable, "-m", "cais", *args], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=timeout, encoding="utf-8")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def rendered(table: Table, width: int = WIDTH, fitted: bool = True) -> str:
    """``table`` as printed on a ``width``-column console: through :func:`fit`, or as
    rich prints it (``fitted=False``)."""
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None)
    if fitted:
        print_table(console, table)
    else:
        console.print(table)
    return out.getvalue()


def words(text: str) -> list[str]:
    """The words of ``text``, box-drawing characters left out."""
    return re.sub(r"[\u2500-\u257f]", " ", text).split()


def every_word_whole(table_cells: list[str], text: str) -> None:
    """Every word of every cell is in ``text``, whole (cut nowhere)."""
    have = set(words(text))
    missing = [w for cell in table_cells for w in cell.split() if w not in have]
    assert not missing, (missing, text)


# ---- the layout itself ------------------------------------------------------------


def _table(headers: list[str], rows: list[list[str]], **kw: object) -> Table:
    t = Table(title="a table", **kw)  # type: ignore[arg-type]
    for h in headers:
        t.add_column(h, justify="right")
    for r in rows:
        t.add_row(*r)
    return t


def test_a_table_that_fits_is_printed_as_rich_prints_it() -> None:
    def make() -> Table:
        return _table(["mode", "scheme", "time (us)"], [["prefill", "tp-nvls", "1,234.5"], ["train", "cais", "9.9"]])
    assert rendered(make()) == rendered(make(), fitted=False)


def test_long_headers_become_keys_with_a_legend() -> None:
    headers = ["mode", "scheme", "paper", "ours, dgx-h100 (verdict)", "ours, paper-world (prediction)",
               "cais_over_tp-nvls", "within 15 %"]
    rows = [["prefill", s, "1.38", "1.09", "1.12", "0.808", "False"]
            for s in ("tp-nvls", "coconet-nvls", "cais-wo-coord", "cais-partial")]
    assert ELLIPSIS in rendered(_table(headers, rows), fitted=False)  # what rich alone does
    text = rendered(_table(headers, rows))
    assert_fits(text)
    every_word_whole([c for r in rows for c in r], text)
    legend = " ".join(text[text.index("\n#1: ") + 1:].split())  # under the table, maybe wrapped
    assert legend.startswith("#1: ") and "cais_over_tp-nvls" in legend
    every_word_whole(headers, text)  # each header whole, in the table or in the legend


def test_cells_too_wide_for_a_row_are_shown_one_row_at_a_time() -> None:
    headers = [f"column {i}" for i in range(8)]
    rows = [["14,563,555,555.0"] * 8, ["layernorm"] * 8]
    assert ELLIPSIS in rendered(_table(headers, rows), fitted=False)
    text = rendered(_table(headers, rows))
    assert_fits(text)
    every_word_whole([c for r in rows for c in r] + headers, text)
    assert text.count("14,563,555,555.0") == 8 and text.count("layernorm") == 8


def test_a_word_longer_than_the_terminal_is_folded_not_cut() -> None:
    t = Table(title="quantities", show_header=False)
    t.add_column("quantity")
    t.add_column("value", justify="right")
    path = "/a-rather-deep/directory" * 6
    t.add_row("trace", path)
    text = rendered(t)
    assert_fits(text)
    assert path in "".join(re.sub(r"[\u2500-\u257f]", "", text).split())  # every character, in order


def test_a_title_longer_than_its_table_widens_the_table() -> None:
    title = "AllReduce on my-own-system-file-with-a-rather-long-name.json (8 GPUs), 256 MiB"
    t = _table(["a", "b"], [["1", "2"]])
    t.title = title
    assert "my-own-system-file-with-a-rather-long-name.json" not in rendered(t, fitted=False)  # rich: fragments
    text = rendered(t)
    assert_fits(text)
    assert text.splitlines()[0].strip() == title


@pytest.mark.parametrize("width", [40, 60, 80, 120])
def test_the_layout_fits_other_widths_too(width: int) -> None:
    headers = ["mode", "scheme", "ours, paper-world (prediction)", "total (us)", "status"]
    rows = [["prefill", "cais-wo-coord", "0.887", "14,563,555,555.0", "ok"]]
    text = rendered(_table(headers, rows), width)
    assert_fits(text, width)
    every_word_whole(rows[0], text)


def test_fit_keeps_a_fitting_table_and_returns_the_legend_separately() -> None:
    console = Console(file=io.StringIO(), width=WIDTH)
    t = _table(["a", "b"], [["1", "2"]])
    assert fit(t, console) == [t]


# ---- the commands, in a pipe at 80 columns ------------------------------------------


def test_run_prints_within_80_columns_and_names_the_models_norm_and_kv_note() -> None:
    out = cais("run", "--system", "nvl72", "--gpus", "16", "--model", "llama3-70b", "--scheme", "tp-nvls",
               "--mode", "prefill", "--batch", "1", "--seq", "32", "--set", "link.bandwidth_GBps=50.123456",
               "--set", "switch.merge.entries=2000")
    assert_fits(out)
    assert "dropout+residual+RMSNorm" in out and "LayerNorm" not in out  # llama3-70b is an RMSNorm model
    assert "note: llama3-70b: 8 KV heads over TP=16: each KV head replicated on 2 ranks" in " ".join(out.split())


def test_run_of_a_layernorm_model_says_layernorm_and_no_kv_note() -> None:
    out = cais("run", "--model", "paper-mega-gpt-4b", "--scheme", "sp-nvls", "--mode", "prefill", "--batch", "1",
               "--seq", "64", "--gpus", "4")
    assert_fits(out)
    assert "dropout+residual+LayerNorm" in out and "RMSNorm" not in out and "KV head" not in out


def test_collective_prints_within_80_columns() -> None:
    out = cais("collective", "--op", "allreduce", "--algo", "auto", "--bytes", "1M", "--set",
               "link.bandwidth_GBps=50.123456", "--set", "collective.nvls_buffers=registered")
    assert_fits(out)
    every_word_whole(["ring / ll (NCCL's choice by size; --algo, --protocol)", "collective.nvls_buffers=registered"],
                     out)


def test_listings_print_within_80_columns() -> None:
    for command in ("models", "schemes", "systems"):
        assert_fits(cais(command))
    assert_fits(cais("gemm", "--m", "9216", "--n", "1536", "--k", "4096"))


def test_demo_prints_within_80_columns_and_the_baselines_its_help_counts(tmp_path: Path) -> None:
    spec = json.loads((ROOT / "src/cais/data/models/paper-mega-gpt-4b.json").read_text())
    name = "a-small-rmsnorm-model-with-a-long-name-for-the-demo"
    spec.update(name=name, seq=64, batch=1, norm="rmsnorm", activation="swiglu", gated_mlp=True, heads=16,
                kv_heads=2)
    model = tmp_path / "model.json"
    model.write_text(json.dumps(spec))
    out = cais("demo", "--bytes", "64K", "--model", str(model))
    assert_fits(out)
    from cais.schemes import schemes

    table = out[out.index(" prefill, one layer period"):]
    rows = [line.split("│")[1].strip() for line in table.splitlines() if line.startswith("│")]
    baselines = [r for r in rows if r and r != "cais"]
    assert rows and sorted(rows) == sorted(n for n, c in schemes().items() if c().in_demo)
    found = re.search(r"CAIS and the (\w+) baselines", " ".join(cais("demo", "--help").split()))
    assert found, "demo --help counts the baselines"
    count = found.group(1)
    numbers = {"nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13}
    assert numbers.get(count) == len(baselines), (count, baselines)
    assert "dropout+residual+RMSNorm" in out
    assert f"note: {name}: 2 KV heads over TP=8: each KV head replicated on 4 ranks" in " ".join(out.split())


def test_reproduce_prints_every_experiment_within_80_columns(tmp_path: Path) -> None:
    out_dir = tmp_path / "report"
    shutil.copytree(QUICK_RUNS, out_dir)
    out = cais("reproduce", "all", "--quick", "--cached", "--out", str(out_dir))
    assert_fits(out)
    from cais.reproduce.run import expand

    for name in expand(["all"]):  # every experiment printed its table (the cached runs still serve it)
        assert f"[reproduce] {name}:" in out
    assert out.count("Verdict:") == len(expand(["all"]))


def test_sweep_prints_its_summary_within_80_columns(tmp_path: Path) -> None:
    spec = tmp_path / "wide.yaml"
    spec.write_text("""description: more varied keys than 80 columns hold
fixed: {kind: collective, op: allreduce, gpus: 4}
grid:
  algo: [ring, nvls]
  bytes: [64K, 128K]
  set.link.bandwidth_GBps: [25.5, 50]
  set.link.latency_ns: [100, 9000000000]
""")
    out = cais("sweep", str(spec), "--out", str(tmp_path / "s.parquet"), "--workers", "1", "--no-progress")
    assert_fits(out)
    assert "16 ok, 0 failed" in out and "9000000000" in out


# ---- the same printers with worst-case contents, in-process ---------------------------


@pytest.fixture
def narrow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", str(WIDTH))


def test_the_layer_table_with_huge_numbers_and_a_long_system(narrow: None, capsys: pytest.CaptureFixture[str]) -> None:
    from cais.cli import _print_layer
    from cais.experiments.layer import run_layer
    from cais.config import load_system
    from cais.workload.models import load_model

    model = load_model("paper-mega-gpt-4b").with_run(batch=1, seq=64)
    r = run_layer(load_system("dgx-h100").with_overrides(gpus=4), model, "tp-nvls", "prefill", 66)
    huge = {k: {**v, "time_us": 14_563_555_555.5, "bound_us": 14_563_555_555.5, "compute_us": 14_563_555_555.5,
                "comm_us": 14_563_555_555.5} for k, v in r.sublayers.items()}
    r = dataclasses.replace(r, sublayers=huge, total_us=3 * 14_563_555_555.5)
    _print_layer("dgx-h100 with link.bandwidth_GBps=50.123456, switch.merge.entries=2000, "
                 "switch.links_per_gpu=[9,9]", model, r)
    out = capsys.readouterr().out
    assert_fits(out)
    assert "14,563,555,555.5 / 14,563,555,555.5" in " ".join(out.split()) or out.count("14,563,555,555.5") >= 6


def test_every_reproduce_summary_even_the_widest_fits(narrow: None, capsys: pytest.CaptureFixture[str]) -> None:
    """Each experiment's whole CSV as its summary: far wider than any summary."""
    from cais.cli import _print_section
    from cais.reproduce.report import Section

    for csv in sorted(QUICK_RUNS.glob("*.csv")):
        df = pd.read_csv(csv)
        name = "fig11x" if csv.stem == "fig11" else csv.stem  # fig11 has its own printer, below
        _print_section(Section(name, f"{csv.stem}: every column", summary=df, lines=["a verdict"]), "dgx-h100", True)
        out = capsys.readouterr().out
        assert_fits(out)
        every_word_whole([str(df.columns[0])], out)
    fig11 = pd.DataFrame({"mode": ["prefill"] * 2, "scheme": ["cais-wo-coord", "coconet-nvls"],
                          "ours": [14_563_555_555.0, 1.05], "paper": [float("nan"), 1.25]})
    _print_section(Section("fig11", "Fig. 11", summary=fig11, lines=["v"]), "dgx-h100-paper-with-a-long-name", True)
    out = capsys.readouterr().out
    assert_fits(out)
    assert "cais-wo-coord" in out and "coconet-nvls" in out


def test_the_sweep_summary_with_errors_fits(narrow: None) -> None:
    from cais.sweep.command import summary_table
    from cais.sweep.grid import point_id

    points = [{"kind": "collective", "op": "allreduce", "algo": a, "bytes": b, "set.link.bandwidth_GBps": bw,
               "set.switch.merge.entries": 2000 + i}
              for i, (a, b, bw) in enumerate([("ring", "1M", 25.5), ("nvls", "14563555555", 50.0)])]
    table = pd.DataFrame({"point_id": [point_id(p) for p in points], "status": ["ok", "error"],
                          "time_us": [14_563_555_555.5, float("nan")], "busbw_GBps": [1.0, float("nan")],
                          "error": ["", "bytes: must be a positive multiple of 2 (bf16 elements), got "
                                        "14563555555; see docs/errors.md"]})
    text = rendered(summary_table(table, points, "wide.yaml: 2 collective points"))
    assert_fits(text)
    every_word_whole(["14,563,555,555.5", "14563555555;", "docs/errors.md", "switch.merge.entries"], text)


# ---- progress ----------------------------------------------------------------------------


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _ticked(stream: io.StringIO) -> RunProgress:
    """A long run's progress, ticked past its measuring second: the rate and ETA known."""
    clock = Clock()
    p = RunProgress(show=True, after_s=0.0, stream=stream, clock=clock)
    p.begin(5e9, "paper-llama-7b train under cais-wo-coord on 72 GPUs with a long description")
    for i in range(1, 6):
        clock.t = 1.5 * i
        p.tick(i * 12_345_678_901_234, i * 123_456_789)
    p.end()
    return p


@pytest.mark.parametrize("width", [80, 60, 40])
def test_the_progress_bar_keeps_its_eta_whole(width: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", str(width))
    stream = Terminal()
    p = _ticked(stream)
    assert p.view is not None
    eta = p.eta(5 * 123_456_789)
    assert eta is not None and eta.startswith("ETA <= ")
    text = rendered_view(p.view, width)
    assert_fits(text, width)
    assert eta in text
    assert "━" in text or width < 40  # the bar itself is drawn
    assert eta in stream.getvalue()  # and that is what went to the terminal


def rendered_view(view: BarView, width: int) -> str:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(view)
    return out.getvalue()


def test_the_bar_leaves_out_its_last_parts_first() -> None:
    view = BarView("a run", 100)
    view.update(50, ["ETA <= 5 min", "sim 12,345,678.9 us", "123,456,789 events", "82,305 k/s", "0:01:23"])
    assert view.line(200)[1].endswith("0:01:23")
    bar, text = view.line(40)
    assert text == "ETA <= 5 min" and bar >= BarView.MIN_BAR
    assert view.line(12) == (0, "ETA <= 5 min")  # no room for a bar: the ETA still


def test_in_a_pipe_progress_lines_are_whole() -> None:
    stream = io.StringIO()  # not a terminal
    p = RunProgress(show=True, after_s=0.0, stream=stream, clock=Clock())
    p.log_every_s = 0.0
    p.begin(5e9, "r")
    for i in range(1, 4):
        p.clock.t = 1.5 * i  # type: ignore[attr-defined]
        p.tick(i * 1_000_000, i * 123_456_789)
    last = stream.getvalue().splitlines()[-1]
    assert last.startswith("cais: progress: r: ") and re.search(r"\| ETA <= [\d.]+ (s|min|h) \(\d+ s\)$", last), last
    assert ELLIPSIS not in stream.getvalue()


@pytest.mark.parametrize("width", [80, 50])
def test_the_sweep_bar_keeps_its_eta(width: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from cais.sweep.runner import _progress

    monkeypatch.setenv("COLUMNS", str(width))
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # the bar of a terminal (in a pipe: PlainProgress, test_progress.py)
    bar, task = _progress(True, "a-sweep-spec-with-a-long-name-to-push-the-bar-off", 12_345, 1_234)
    bar.update(task, completed=2_345, failed=123)
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(bar.get_renderable())
    text = out.getvalue()
    assert_fits(text, width)
    assert "ETA " in text and "2345/12345" in text
