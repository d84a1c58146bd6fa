"""Long runs talk: the simulator's progress hook, the bar's log lines, the estimate
notice, and Ctrl-C as one line with exit code 130."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
from pathlib import Path

from cais.engine import Simulator
from cais.experiments.collective import run_collective
from cais.config import load_system
from cais.progress import RunProgress

ROOT = Path(__file__).resolve().parents[1]


def test_tick_every_n_events_and_no_change_to_results() -> None:
    calls: list[tuple[int, int]] = []
    sim = Simulator()
    sim.tick, sim.tick_every = (lambda now, ev: calls.append((now, ev))), 10
    for t in range(35):
        sim.at(t, lambda: None)
    sim.run()
    assert [ev for _, ev in calls] == [10, 20, 30] and sim.events == 35

    cfg = load_system("dgx-h100")
    plain = run_collective(cfg, "allreduce", "nvls", 1 << 20)
    p = RunProgress(show=False)
    watched = run_collective(cfg, "allreduce", "nvls", 1 << 20, progress=p)
    assert p.ticks == plain.events // Simulator.TICK_EVERY > 0
    assert (watched.time_us, watched.events) == (plain.time_us, plain.events)


def test_log_lines_when_not_a_terminal_and_notice_for_long_runs() -> None:
    out = io.StringIO()
    p = RunProgress(show=True, after_s=0.0, stream=out)
    p.begin(1e9, "a big run")  # about 33 min at the assumed rate: announced
    p.tick(5_000_000, 4096)
    p.end()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("cais: a big run is estimated at 1e+09 events, about ") and "Ctrl-C" in lines[0]
    assert lines[1].startswith("cais: progress: a big run: sim 5.0 us | 4,096 events")
    quiet = io.StringIO()
    q = RunProgress(show=False, stream=quiet)
    q.begin(1e3, "a small run")
    q.tick(1, 4096)
    assert quiet.getvalue() == ""
    hinted = io.StringIO()
    RunProgress(show=False, stream=hinted, hint="; try X").begin(1e9, "a big run")
    assert hinted.getvalue().rstrip().endswith("Ctrl-C stops it; try X")


def test_ctrl_c_is_one_line_and_exit_130() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.Popen([sys.executable, "-m", "cais", "collective", "--system", "nvl72", "--gpus", "16",
                             "--op", "allreduce", "--algo", "nvls", "--bytes", "8G", "--progress",
                             "--set", "collective.nvls_buffers=registered"],  # about 10 s; the first line at 2 s
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # as a terminal's Ctrl-C finds it: a suite started in the background
                            # (a shell's `&`) hands its children SIGINT ignored
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stderr is not None
    first = proc.stderr.readline()  # the first progress line: the event loop is running
    assert first.startswith("cais: progress: nvls allreduce of 8G on 16 GPUs"), first
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert out == ""
    lines = [line for line in err.splitlines() if not line.startswith("cais: progress:")]
    assert lines == ["cais: interrupted"], err


def test_the_long_run_notice_suggests_mirror_mode_only_where_it_applies() -> None:
    """'--sim mirror' is offered for symmetric runs (tp-nvls, sp-nvls, collectives),
    never for a scheme mirror mode refuses (CAIS) or when mirror is already on."""
    import argparse

    from cais.cli import _progress

    def hint(**kw: object) -> str:
        args = argparse.Namespace(progress=False, json=True, sim="full", **kw)
        return _progress(args).hint

    assert "--sim mirror" in hint(scheme="tp-nvls")
    assert "--sim mirror" in hint()  # a collective
    assert hint(scheme="cais") == ""
    assert _progress(argparse.Namespace(progress=False, json=True, sim="mirror", scheme="sp-nvls")).hint == ""


class FakeClock:
    """A wall clock the test moves by hand."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _logged(estimate: float, ticks: list[tuple[float, int]], **kw: object) -> tuple[RunProgress, list[str]]:
    """The log lines of a run of ``estimate`` events ticked at (wall s, events)."""
    clock, out = FakeClock(), io.StringIO()
    p = RunProgress(show=True, after_s=0.0, stream=out, clock=clock, **kw)
    p.log_every_s = 0.0  # a line at every tick
    p.begin(estimate, "r")
    for t, events in ticks:
        clock.t = t
        p.tick(1_000_000, events)
    return p, out.getvalue().splitlines()


def test_no_eta_until_the_rate_is_measured() -> None:
    p, lines = _logged(1e6, [(0.5, 4096), (1.0, 8192), (1.4, 12288)])
    assert p.rate == 0 and p.eta(12288) is None
    assert all("ETA" not in line and "k/s" not in line for line in lines), lines
    assert lines[0] == "cais: progress: r: sim 1.0 us | 4,096 events (0 s)"


def test_the_eta_comes_from_the_measured_rate_not_the_setup_time() -> None:
    """Building the machine took 10 s before the first event; then 100 k events/s.
    Counted from begin() the rate would be 9.5 k/s and the ETA 100 s."""
    p, lines = _logged(1_104_096, [(10.0, 4096), (11.0, 104_096)])
    assert p.rate == 100_000
    assert lines[-1].endswith("| 100 k/s | ETA <= 10 s (11 s)"), lines[-1]


def test_the_rate_is_smoothed_over_the_run_so_far() -> None:
    ticks = [(float(t), 1000 * t) for t in range(0, 31)]  # 1 k/s for 30 s
    ticks += [(30.0 + t, 30_000 + 5000 * t) for t in range(1, 4)]  # then 5 k/s for 3 s
    p, _ = _logged(1e9, ticks)
    assert 1000 < p.rate < 3000  # moving towards 5 k/s, not jumping to it
    assert p.eta(45_000) == f"ETA <= {(1e9 - 45_000) / p.rate / 3600:.1f} h"


def test_past_the_estimate() -> None:
    p, lines = _logged(10_000, [(0.0, 4096), (2.0, 12288)])
    assert p.eta(12288) == "ETA: past the estimate" and lines[-1].endswith("ETA: past the estimate (2 s)")


def test_a_sweep_in_a_pipe_prints_whole_lines_with_the_eta_first() -> None:
    """stderr not a terminal: a plain line at most every ``every_s`` (none for a short
    sweep), the ETA first and never cut."""
    import io

    from cais.sweep.runner import PlainProgress

    now = [0.0]
    out = io.StringIO()
    with PlainProgress("sweep", 4, every_s=10.0, clock=lambda: now[0], stream=out) as bar:
        now[0] = 5.0
        bar.update(0, advance=1)
        assert out.getvalue() == ""  # before the first interval: nothing
        now[0] = 20.0
        bar.update(0, advance=1, failed=1)
    lines = out.getvalue().splitlines()
    assert lines == ["cais: sweep: ETA 0:00:20 | 2/4 | 1 failed | 0:00:20"]


def test_the_environment_turns_progress_off_where_no_flag_asks(monkeypatch) -> None:
    from argparse import Namespace

    from cais.cli import _progress_asked

    monkeypatch.delenv("CAIS_PROGRESS", raising=False)
    assert _progress_asked(Namespace(progress=None)) is None
    monkeypatch.setenv("CAIS_PROGRESS", "0")
    assert _progress_asked(Namespace(progress=None)) is False
    assert _progress_asked(Namespace(progress=True)) is True  # a flag wins
    monkeypatch.setenv("CAIS_PROGRESS", "1")
    assert _progress_asked(Namespace()) is True
