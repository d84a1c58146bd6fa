"""The command's contract (docs/errors.md) where issue 21 found it broken, through the
real command line: ``cais reproduce --out`` and ``--cached`` checked before anything
runs, a closed stdout is exit 141 on every command (rich tables included), bare
``cais`` is the help and ``cais --version`` the version, a slow machine is not a
stalled one (and an absurdly slow one is refused as a user's mistake, while a real
deadlock is still exit 3), and the event limit offers ``--sim mirror`` where a run is
symmetric.

Every case is a subprocess (``python -m cais``); they run in parallel threads once per
module and each test checks one. A failure case must end with its exit code, exactly
one stderr line with its prefix, no traceback, nothing on stdout and no file created
or changed."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Callable

import pytest

from cais.hw.config import load_system
from cli_harness import SRC, TIME_LIMIT_S, Outcome, cais_env, files_of, run_cais
ROOT = os.geteuid() == 0
SETPRIV = shutil.which("setpriv")
NOBODY = 65534

COLL = ["collective", "--op", "allreduce", "--algo", "nvls", "--bytes", "64K"]
TINY_RUN = ["run", "--model", "paper-mega-gpt-4b", "--scheme", "tp-nvls", "--mode", "prefill", "--batch", "1",
            "--seq", "128"]
NVL72_1G = ["collective", "--system", "nvl72", "--gpus", "72", "--algo", "nvls", "--op", "allreduce", "--bytes", "1G"]
BIG_TRAIN = ["run", "--model", "paper-llama-7b", "--mode", "train", "--batch", "64"]


def _mkdir(*names: str, mode: int | None = None) -> Callable[[Path], None]:
    """Make the directories; ``mode`` is given to the first part of each name."""
    def setup(d: Path) -> None:
        for name in names:
            (d / name).mkdir(parents=True)
            if mode is not None:
                (d / name.split("/")[0]).chmod(mode)
    return setup


@functools.cache
def _drop_privileges() -> list[str] | str:
    """The command prefix that runs a case as nobody where we are root (root ignores
    permissions), or why it cannot (then those cases are skipped)."""
    if not ROOT:
        return []
    if not SETPRIV:
        return "running as root, and there is no setpriv to drop the privileges"
    prefix = [SETPRIV, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    probe = subprocess.run([*prefix, sys.executable, "-c", "import cais.cli"], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": SRC}, cwd="/")
    if probe.returncode:
        return "running as root, and the unprivileged user cannot run this Python: " + probe.stderr[-200:]
    return prefix


def _write(name: str, content: str | bytes) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            (d / name).write_bytes(content)
        else:
            (d / name).write_text(content)
    return setup


def _runs_of_another_grid(d: Path) -> None:
    """DIR/runs/layer_point.parquet holding one run that no quick fig11 point is."""
    import pandas as pd

    (d / "out" / "runs").mkdir(parents=True)
    pd.DataFrame({"point_id": ["not-a-fig11-point"], "status": ["ok"]}).to_parquet(
        d / "out" / "runs" / "layer_point.parquet")


def _deadlock_system(d: Path) -> None:
    """Requests and responses on one VC, 64 B buffers, one read served at a time: the
    NVLS pulls deadlock (tests/test_cli.py)."""
    data = load_system("dgx-h100").model_dump(mode="json")
    data["name"] = "deadlock"
    data["link"].update(vc_policy="shared", vc_depth_flits=4, buffer_scope="port")
    data["gpu"]["read_serve_kB"] = 0.5
    (d / "deadlock.json").write_text(json.dumps(data))


@dataclass
class Case:
    id: str
    args: list[str]  # "{d}" is the case's own directory
    code: int = 2
    says: str = ""  # a piece of the one stderr line (a regular expression)
    setup: Callable[[Path], None] | None = None
    closed_stdout: bool = False  # stdout is a pipe whose reading end is closed before the command starts
    as_nobody: bool = False  # needs permissions to hold: run as an unprivileged user where we are root
    check: Callable[[subprocess.CompletedProcess], None] | None = None  # more checks of a success
    env: dict[str, str] = field(default_factory=dict)


def _version_line(proc: subprocess.CompletedProcess) -> None:
    assert proc.stdout == f"cais-sim {version('cais-sim')}\n"
    assert re.fullmatch(r"cais-sim \d+\.\d+\.\d+\S*\n", proc.stdout)


def _help(proc: subprocess.CompletedProcess) -> None:
    assert proc.stdout.startswith("usage: cais")
    for command in ("collective", "gemm", "run", "sweep", "systems", "schemes", "models", "demo", "reproduce",
                    "--version"):
        assert command in proc.stdout


def _slow_but_finished(proc: subprocess.CompletedProcess) -> None:
    out = json.loads(proc.stdout)
    assert out["time_us"] > 1e7  # ~96 s of simulated time: far past the watchdog's 0.1 s horizon


CASES = [
    # 1. reproduce --out: checked before anything runs
    Case("reproduce-out-is-a-file", ["reproduce", "fig2", "--quick", "--out", "{d}/out"],
         says=r"--out: '.*/out' is a file; give a directory", setup=_write("out", "keep me")),
    Case("reproduce-out-parent-missing", ["reproduce", "fig2", "--quick", "--out", "{d}/a/b/c"],
         says=r"--out: no directory .*/a/b for '.*/a/b/c'"),
    Case("reproduce-out-parent-is-a-file", ["reproduce", "fig2", "--quick", "--out", "{d}/f/out"],
         says=r"--out: .*/f is not a directory", setup=_write("f", "x")),
    Case("reproduce-out-parent-unwritable", ["reproduce", "fig2", "--quick", "--out", "{d}/ro/out"],
         says=r"--out: cannot create 'out' in directory .*/ro: not writable", setup=_mkdir("ro", mode=0o555),
         as_nobody=True),
    Case("reproduce-out-unwritable", ["reproduce", "fig2", "--quick", "--out", "{d}/ro"],
         says=r"--out: cannot write in directory .*/ro", setup=_mkdir("ro", mode=0o555), as_nobody=True),
    Case("reproduce-out-unreachable", ["reproduce", "fig2", "--quick", "--out", "{d}/locked/sub/out"],
         says=r"--out: cannot reach '.*/locked/sub/out': Permission denied", setup=_mkdir("locked/sub", mode=0o700),
         as_nobody=True),
    Case("run-out-unreachable", [*COLL, "--out", "{d}/locked/sub/runs.csv"],
         says=r"--out: cannot reach '.*/locked/sub/runs.csv': Permission denied",
         setup=_mkdir("locked/sub", mode=0o700), as_nobody=True),
    Case("reproduce-out-runs-is-a-file", ["reproduce", "fig2", "--quick", "--out", "{d}/out"],
         says=r"--out: .*/out/runs is a file", setup=_write("out/runs", "x")),
    Case("reproduce-unknown-experiment", ["reproduce", "fig99", "--quick", "--out", "{d}/out"],
         says=r"unknown 'fig99'"),
    # 2. reproduce --cached with no cached runs
    Case("cached-dir-missing", ["reproduce", "fig11", "--quick", "--cached", "--out", "{d}/out"],
         says=r"--cached: no cached runs of fig11 \(quick grid\) in .*/out/runs; run without --cached first"),
    Case("cached-runs-empty", ["reproduce", "fig11", "--quick", "--cached", "--out", "{d}/out"],
         says=r"--cached: no cached runs of fig11 .* in .*/out/runs", setup=_mkdir("out/runs")),
    Case("cached-runs-of-another-grid", ["reproduce", "fig11", "--quick", "--cached", "--out", "{d}/out"],
         says=r"--cached: no cached runs of fig11", setup=_runs_of_another_grid),
    Case("cached-runs-table-unreadable", ["reproduce", "fig11", "--quick", "--cached", "--out", "{d}/out"],
         says=r"--cached: .*layer_point.parquet is not a readable runs table",
         setup=_write("out/runs/layer_point.parquet", "not parquet")),
    # 3. a closed stdout: exit 141, nothing on stderr
    *[Case(f"closed-stdout-{name}", args, code=141, closed_stdout=True) for name, args in (
        ("models", ["models"]), ("schemes", ["schemes"]), ("systems", ["systems"]),
        ("collective-table", COLL), ("collective-json", [*COLL, "--json"]),
        ("gemm-table", ["gemm", "--m", "256", "--n", "256", "--k", "256"]), ("run-table", TINY_RUN),
        ("help", ["--help"]), ("bare", []), ("version", ["--version"]))],
    # 4. bare cais and --version
    Case("bare-cais-is-the-help", [], code=0, check=_help),
    Case("version", ["--version"], code=0, check=_version_line),
    # 5. slow is not stuck; absurdly slow is refused before running; a deadlock is still exit 3
    Case("slow-link-finishes", ["collective", "--op", "allreduce", "--algo", "nvls", "--bytes", "1M", "--set",
                                "link.bandwidth_GBps=1e-6", "--json"], code=0, check=_slow_but_finished),
    Case("slow-latency-finishes", ["collective", "--op", "allreduce", "--algo", "ring", "--bytes", "1M", "--set",
                                   "link.latency_ns=1e12", "--json"], code=0, check=_slow_but_finished),
    Case("bandwidth-too-small-for-the-clock", [*COLL, "--set", "link.bandwidth_GBps=1e-320"],
         says=r"link.bandwidth_GBps: 1e-320 makes one transfer unit .* slow, not stuck\); use at least"),
    Case("latency-infinite", [*COLL, "--set", "link.latency_ns=inf"], says=r"link.latency_ns: inf .* use at most"),
    Case("slowdown-too-big-for-the-clock", [*TINY_RUN, "--set", 'gpu_slowdown={"1": 1e300}'],
         says=r"gpu_slowdown.1: 1e\+300 makes 1 us of GPU work take"),
    Case("deadlock-is-still-stalled", ["collective", "--op", "allreduce", "--algo", "nvls", "--bytes", "1M",
                                       "--system", "{d}/deadlock.json"], code=3,
         says=r"deadlock at t = .*waiting for credits", setup=_deadlock_system),
    # 6. the event limit offers --sim mirror where the run is symmetric
    Case("limit-offers-mirror-for-a-collective", NVL72_1G, says=r"beyond the limit.*, or --sim mirror \("),
    Case("limit-offers-mirror-for-tp-nvls", [*BIG_TRAIN, "--scheme", "tp-nvls"],
         says=r"use a smaller batch or seq, or --sim mirror \("),
    Case("limit-no-mirror-for-cais", [*BIG_TRAIN, "--scheme", "cais"], says=r"use a smaller batch or seq$"),
    Case("limit-no-mirror-when-mirror-is-on", ["collective", "--op", "allreduce", "--algo", "ring",
                                               "--bytes", "1e20", "--sim", "mirror"],
         says=r"use bytes of at most about [0-9.]+[KMG]?$"),
    Case("limit-no-mirror-for-a-slowed-gpu", [*NVL72_1G, "--set", 'gpu_slowdown={"3": 2}'],
         says=r"use bytes of at most about [0-9.]+[KMG]?$"),
]


def _run(case: Case, root: Path) -> Outcome:
    d = root / case.id
    d.mkdir()
    d.chmod(0o755)
    if case.setup:
        case.setup(d)
    args = [a.replace("{d}", str(d)) for a in case.args]
    before = files_of(d)
    env = cais_env(case.env, MPLCONFIGDIR=str(root / "mpl"), COLUMNS="100")
    prefix: list[str] = []
    if case.as_nobody:  # root ignores permissions: drop them, or skip
        drop = _drop_privileges()
        if isinstance(drop, str):
            return Outcome(case, d, before, None, skipped=drop)
        prefix = drop
    stdout: int = subprocess.PIPE
    if case.closed_stdout:
        read, stdout = os.pipe()
        os.close(read)  # no reader, ever: the first write fails (EPIPE), however small the output
    try:
        proc = run_cais(args, env, prefix, stdout=stdout, cwd=d)
    finally:
        if case.closed_stdout:
            os.close(stdout)
    return Outcome(case, d, before, proc, timed_out=proc is None)


@pytest.fixture(scope="module")
def outcomes() -> dict[str, Outcome]:
    # a directory every user may enter (the cases run as nobody need to reach theirs)
    root = Path(tempfile.mkdtemp(prefix="cais-contract-"))
    root.chmod(0o755)
    (root / "mpl").mkdir(mode=0o777)
    (root / "mpl").chmod(0o777)
    try:
        with ThreadPoolExecutor(max_workers=max(2, min(8, os.cpu_count() or 2))) as pool:
            yield {o.case.id: o for o in pool.map(lambda c: _run(c, root), CASES)}
    finally:
        for p in root.rglob("*"):
            if p.is_dir() and not p.is_symlink():
                p.chmod(0o755)
        shutil.rmtree(root, ignore_errors=True)


def test_the_cases_are_many_and_distinct() -> None:
    assert len(CASES) >= 16
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_the_contract(case: Case, outcomes: dict[str, Outcome]) -> None:
    o = outcomes[case.id]
    if o.skipped:
        pytest.skip(o.skipped)
    assert not o.timed_out, f"no answer within {TIME_LIMIT_S} s"
    assert o.proc is not None
    assert "Traceback" not in o.proc.stderr
    assert o.proc.returncode == case.code, o.proc.stderr
    lines = o.proc.stderr.splitlines()
    if case.code == 0:
        assert o.proc.stderr == "", o.proc.stderr
        assert case.check is not None
        case.check(o.proc)
        return
    if case.code == 141:  # quietly, as a process SIGPIPE ended
        assert o.proc.stderr == ""
    else:
        prefix = "cais: stalled: " if case.code == 3 else "cais: error: "
        assert len(lines) == 1, o.proc.stderr
        assert lines[0].startswith(prefix), lines[0]
        assert re.search(case.says, lines[0]), lines[0]
        assert "sim='" not in lines[0]  # the command shows parameters as its flags
        assert o.proc.stdout == ""
    assert files_of(o.dir) == o.before  # nothing written, no temporary file, inputs untouched


# ---- the watchdog in process: slow is not stuck ------------------------------------
# (The cases above check the command; these check Machine.run's decision directly.)
def _machine(horizon_us: float = 50.0):
    from cais.machine import Machine

    cfg = load_system("dgx-h100").model_copy(update={"watchdog_horizon_us": horizon_us})
    return Machine(cfg)


def test_a_tb_computing_for_many_horizons_is_slow_not_stalled() -> None:
    """Five steps of 10 horizons each: the machine jumps to each step's end (no events
    between), which is a wait for something that will come."""
    from cais.hw.gpu import Kernel

    m = _machine()

    def slow(sm: int, busy: int):
        for _ in range(5):
            yield 500_000_000  # 500 us = 10 horizons

    m.gpus[0].launch(Kernel("slow", [slow]))
    m.run()
    assert m.sim.now >= 2_500_000_000 and not m.pending()


def test_a_livelock_slower_than_the_horizon_is_still_stalled() -> None:
    """A TB polling every 2 horizons for ever: no events run for a horizon, but it
    wakes up 10,000 times without anything moving or finishing."""
    from cais.hw.gpu import Kernel
    from cais.machine import STALL_WAKEUPS, Stalled

    m = _machine()

    def poll(sm: int, busy: int):
        while True:
            yield 100_000_000  # 100 us

    m.gpus[0].launch(Kernel("poller", [poll]))
    with pytest.raises(Stalled, match=r"no progress for 10,000 wake-ups over .*poller"):
        m.run()
    assert m.sim.events <= STALL_WAKEUPS + 10
