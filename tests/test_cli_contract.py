"""The command's contract (docs/errors.md) where issue 21 found it broken, through the
real command line: ``cais reproduce --out`` and ``--cached`` checked before anything
runs, a closed stdout is exit 141 on every command (rich tables included), bare
``cais`` is the help and ``cais --version`` the version, a slow machine is not a
stalled one (and an absurdly slow one is refused as a user's mistake, while a real
deadlock is still exit 3), and the event limit offers ``--sim mirror`` where a run is
symmetric. Then where issue 36 found it broken (section 7 of the cases): a scheme
refuses a switch it cannot run on, a step the run could add up past the clock is
refused with the bound of that run (and that bound runs), empty and unwritable output
paths are refused before simulating, messages name the flag, byte sizes are read
strictly (``1GB`` refused), and run, collective and sweep write the same formats.

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

from cais.config import load_system
from cais.schemes import schemes
from cli_harness import SRC, TIME_LIMIT_S, Outcome, cais_env, files_of, run_cais
ROOT = os.geteuid() == 0
SETPRIV = shutil.which("setpriv")
NOBODY = 65534

COLL = ["collective", "--op", "allreduce", "--algo", "nvls", "--bytes", "64K"]
TINY_RUN = ["run", "--model", "paper-mega-gpt-4b", "--scheme", "tp-nvls", "--mode", "prefill", "--batch", "1",
            "--seq", "128"]
NVL72_1G = ["collective", "--system", "nvl72", "--gpus", "72", "--algo", "nvls", "--op", "allreduce", "--bytes", "1G"]
BIG_TRAIN = ["run", "--model", "paper-llama-7b", "--mode", "train", "--batch", "64"]
RING_1M = ["collective", "--op", "allreduce", "--algo", "ring", "--bytes", "1M"]
SMALL_LAYER = ["run", "--model", "paper-mega-gpt-4b", "--mode", "prefill", "--batch", "1", "--seq", "64"]
# the schemes that need merge units in the switch (ld.cais / red.cais): every one is refused on NVLS-only chips
MERGING_SCHEMES = [name for name, cls in schemes().items() if cls.switch == "cais"]
SWEEP_SPEC = "fixed: {kind: collective, op: allreduce, algo: nvls, bytes: 64K, gpus: 4}\n"


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
    creates: tuple[str, ...] = ()  # files the command must leave in its folder (a sweep's table); no others


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
    # ~0.19 s and ~33 s of simulated time: far past the watchdog's horizon (1 ms in the bandwidth case, 0.1 s in
    # the latency case)
    assert out["time_us"] > 1e5


def _bytes_are(n: int) -> Callable[[subprocess.CompletedProcess], None]:
    def check(proc: subprocess.CompletedProcess) -> None:
        assert json.loads(proc.stdout)["bytes"] == n
    return check


def _ran_on(switch: str) -> Callable[[subprocess.CompletedProcess], None]:
    def check(proc: subprocess.CompletedProcess) -> None:
        out = json.loads(proc.stdout)
        assert out["switch"] == switch and out["total_us"] > 0
    return check


def _wrote_csv(proc: subprocess.CompletedProcess) -> None:
    assert re.search(r"results: .*s\.csv \(1 rows; pandas\.read_csv\)", proc.stdout), proc.stdout


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
    # (issue 36: 1e-6 GB/s and 1e12 ns are past the bound of these runs now; these are within it)
    Case("slow-link-finishes", ["collective", "--op", "allreduce", "--algo", "nvls", "--bytes", "1M", "--set",
                                "link.bandwidth_GBps=5e-4", "--set", "watchdog_horizon_us=1000", "--json"], code=0,
         check=_slow_but_finished),
    Case("slow-latency-finishes", [*RING_1M, "--set", "link.latency_ns=1e9", "--json"], code=0,
         check=_slow_but_finished),
    Case("bandwidth-too-small-for-the-clock", [*COLL, "--set", "link.bandwidth_GBps=1e-320"],
         says=r"link.bandwidth_GBps: 1e-320 GB/s makes one transfer unit .* 64-bit picosecond clock may reach; "
              r"use at least [0-9.e+-]+ GB/s$"),
    Case("latency-infinite", [*COLL, "--set", "link.latency_ns=inf"], says=r"link.latency_ns: inf ns .* use at most [0-9.e+]+ ns$"),
    Case("slowdown-too-big-for-the-clock", [*TINY_RUN, "--set", 'gpu_slowdown={"1": 1e300}'],
         says=r"gpu_slowdown.1: 1e\+300 x makes 1 us of GPU work take .* use at most [0-9.e+]+ x$"),
    Case("deadlock-is-still-stalled", ["collective", "--op", "allreduce", "--algo", "nvls", "--bytes", "1M",
                                       "--system", "{d}/deadlock.json"], code=3,
         says=r"deadlock at t = .*waiting for credits", setup=_deadlock_system),
    # 6. the event limit offers --sim mirror where the run is symmetric
    Case("limit-offers-mirror-for-a-collective", NVL72_1G, says=r"beyond the limit.*, or --sim mirror \("),
    Case("limit-offers-mirror-for-tp-nvls", [*BIG_TRAIN, "--scheme", "tp-nvls", "--set", "gpu.hbm_capacity_GB=400"],
         says=r"use a smaller batch or seq, or --sim mirror \("),  # 335 GB per GPU: mirror only where it fits
    Case("limit-no-mirror-beyond-hbm", [*BIG_TRAIN, "--scheme", "tp-nvls"], says=r"use a smaller batch or seq$"),
    Case("limit-no-mirror-for-cais", [*BIG_TRAIN, "--scheme", "cais"], says=r"use a smaller batch or seq$"),
    Case("limit-no-mirror-when-mirror-is-on", ["collective", "--op", "allreduce", "--algo", "ring",
                                               "--bytes", "1e20", "--sim", "mirror"],
         says=r"use bytes of at most about [0-9.]+[KMG]?$"),
    Case("limit-no-mirror-for-a-slowed-gpu", [*NVL72_1G, "--set", 'gpu_slowdown={"3": 2}'],
         says=r"use bytes of at most about [0-9.]+[KMG]?$"),
    # 7. issue 36
    # a scheme refuses a switch it cannot run on (before building the machine), naming switch.model and the
    # values allowed; a scheme that needs NVLS only runs on a CAIS switch (it has NVLS too)
    *[Case(f"{name}-on-an-nvls-switch", [*SMALL_LAYER, "--scheme", name, "--set", "switch.model=nvls"],
           says=rf"switch\.model: scheme '{name}' needs a 'cais' switch \(.*merge unit.*\); 'nvls' has .* only; "
                r"allowed with this scheme: auto, cais, cais-ep$") for name in MERGING_SCHEMES],
    Case("tp-nvls-on-a-cais-switch", [*SMALL_LAYER, "--scheme", "tp-nvls", "--set", "switch.model=cais", "--json"],
         code=0, check=_ran_on("cais")),
    # CAIS's traffic control on one request VC would be cais-partial: refused, naming link.vc_policy (issue 38)
    *[Case(f"{name}-on-one-request-vc", [*SMALL_LAYER, "--scheme", name, "--set", "link.vc_policy=one"],
           says=rf"link\.vc_policy: scheme '{name}' keeps loads and reductions on separate VCs .*'one' puts them "
                r"on one, which is another scheme's \(cais-partial\); allowed with this scheme: class, kernel, destination$")
      for name in ("cais", "cais-wo-coord")],
    # a chunk below the smallest transfer is refused in one line
    Case("copy-chunk-below-a-line", [*SMALL_LAYER, "--scheme", "cais", "--set", "remote_read.copy_chunk_kB=1e-9"],
         says=r"remote_read\.copy_chunk_kB': 1e-09 kB is below one 128 B line \(0\.125 kB\).*use 0 \(whole shards\) "
              r"or at least 0\.125$"),
    # a step the run's events could add up past the clock: refused with this run's bound (test_the_offered_bound_runs)
    Case("latency-1e15", [*RING_1M, "--set", "link.latency_ns=1e15"],
         says=r"link\.latency_ns: 1e\+15 ns makes one step take 11\.6 days, and this run's [0-9,]+ estimated "
              r"events .* 64-bit picosecond clock may reach; use at most [0-9.]+e\+0\d ns$"),
    Case("latency-5e15", [*RING_1M, "--set", "link.latency_ns=5e15"], says=r"link\.latency_ns: 5e\+15 .* use at most"),
    Case("latency-9.2e15", [*RING_1M, "--set", "link.latency_ns=9.2e15"], says=r"link\.latency_ns: 9\.2e\+15 .* use at"),
    Case("bandwidth-1e-6", [*RING_1M, "--set", "link.bandwidth_GBps=1e-6"],
         says=r"link\.bandwidth_GBps: 1e-06 GB/s makes one transfer unit .*; use at least [0-9.e-]+ GB/s$"),
    Case("outstanding-past-the-counters", [*RING_1M, "--set", "gpu.remote_outstanding_kB=1e16"],
         says=r"gpu\.remote_outstanding_kB: 1e\+16 makes a quantity of 1\.02e\+19 bytes, beyond the 4\.61e\+18 bytes "
              r"\(half a 64-bit count\).*; use at most 4\.5e\+15$"),
    Case("horizon-past-the-clock", [*RING_1M, "--set", "watchdog_horizon_us=1e13"],
         says=r"watchdog_horizon_us: 1e\+13 us .* past the 4\.61e\+18 ps .*; use at most 4\.61e\+12 us$"),
    # sweep on a closed stdout: exit 141 like every command; the table is written before anything is printed
    Case("closed-stdout-sweep", ["sweep", "{d}/s.yaml", "--out", "{d}/x.parquet", "--no-progress"], code=141,
         closed_stdout=True, setup=_write("s.yaml", SWEEP_SPEC), creates=("x.parquet",)),
    # output paths: checked before anything runs, the path the user gave named
    Case("reproduce-out-in-proc", ["reproduce", "fig11", "--quick", "--out", "/proc/rp"],
         says=r"--out: cannot (write '/proc/rp': creating a file in /proc failed|create 'rp' in directory /proc)"),
    Case("run-out-in-proc", [*TINY_RUN, "--out", "/proc/x.parquet"],
         says=r"--out: cannot write '/proc/x\.parquet': (creating a file in /proc failed|no write permission)"),
    Case("collective-trace-in-proc", [*COLL, "--trace", "/proc/x.json"],
         says=r"--trace: cannot write '/proc/x\.json': (creating a file in /proc failed|no write permission)"),
    *[Case(f"{cmd}-{flag[2:]}-empty", [*args, flag, ""], says=rf"{flag}: the path is empty; give {what}")
      for cmd, args, flag, what in (
          ("reproduce", ["reproduce", "fig11", "--quick"], "--out", "a directory"),
          ("run", TINY_RUN, "--out", r"a file name ending in \.parquet or \.csv"),
          ("run", TINY_RUN, "--trace", r"a file name ending in \.json"),
          ("collective", COLL, "--out", r"a file name ending in \.parquet or \.csv"),
          ("collective", COLL, "--trace", r"a file name ending in \.json"),
          ("sweep", ["sweep", "{d}/s.yaml"], "--out", r"a file name ending in \.parquet or \.csv"))],
    # messages name the flag the user gave, not a config field
    Case("collective-gpus-1", [*COLL, "--gpus", "1"],
         says=r"error: --gpus: 1 is refused as gpus: Input should be greater than or equal to 2"),
    Case("collective-unit-7", [*COLL, "--unit", "7"],
         says=r"error: --unit: 7 is refused as transfer_unit_bytes: Input should be greater than or equal to 128"),
    Case("reproduce-models-unknown", ["reproduce", "fig11", "--quick", "--out", "{d}/out", "--models", "nosuch"],
         says=r"error: --models: unknown model 'nosuch'; valid: .*paper-mega-gpt-4b"),
    Case("reproduce-set-unknown", ["reproduce", "fig11", "--quick", "--out", "{d}/out", "--set", "foo=bar"],
         says=r"error: --set: unknown key 'foo'; valid keys at the top level: "),
    Case("reproduce-cached-set-unknown", ["reproduce", "fig11", "--quick", "--cached", "--out", "{d}/out", "--set",
                                          "foo=bar"], says=r"error: --set: unknown key 'foo'"),
    # byte sizes: binary units (1M = 2**20), numbers of bytes (1e5); KB/MB/GB refused as ambiguous, and so says
    Case("bytes-1GB", [*RING_1M[:-1], "1GB"],
         says=r"--bytes: '1GB': GB is ambiguous .*; write G or GiB for binary units \(1G = 2\*\*30\) .* 1e9$"),
    Case("bytes-64kb", [*RING_1M[:-1], "64kb"], says=r"--bytes: '64kb': kb is ambiguous"),
    Case("bytes-fraction", [*RING_1M[:-1], "0.1K"], says=r"--bytes: '0.1K' is 102.4 bytes, not a whole number"),
    Case("demo-bytes-1MB", ["demo", "--bytes", "1MB"], says=r"--bytes: '1MB': MB is ambiguous"),
    Case("unit-1KB", [*COLL, "--unit", "1KB"], says=r"--unit: '1KB': KB is ambiguous"),
    Case("sweep-bytes-1GB", ["sweep", "{d}/s.yaml", "--out", "{d}/s.parquet"],
         says=r"point 1 of 1 .*: key 'bytes': '1GB': GB is ambiguous",
         setup=_write("s.yaml", SWEEP_SPEC.replace("64K", "1GB"))),
    Case("bytes-1e5-is-decimal", [*COLL[:-1], "1e5", "--json"], code=0, check=_bytes_are(100_000)),
    Case("bytes-64KiB-is-binary", [*COLL[:-1], "64KiB", "--json"], code=0, check=_bytes_are(65_536)),
    # output formats: .parquet and .csv on every command, anything else refused with the same line
    Case("sweep-out-csv", ["sweep", "{d}/s.yaml", "--out", "{d}/s.csv", "--no-progress"], code=0,
         setup=_write("s.yaml", SWEEP_SPEC), check=_wrote_csv, creates=("s.csv",)),
    *[Case(f"{cmd}-out-txt", [*args, "--out", "{d}/s.txt"],
           says=r"--out: results table must end in \.parquet or \.csv, got '.*/s\.txt'$", setup=_write("s.yaml", SWEEP_SPEC))
      for cmd, args in (("run", TINY_RUN), ("collective", COLL), ("sweep", ["sweep", "{d}/s.yaml"]))],
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
    after = files_of(o.dir)
    for name in case.creates:  # the files it must write, and only those
        assert name in after and name not in o.before, name
        after.pop(name)
    if case.code == 0:
        assert o.proc.stderr == "", o.proc.stderr
        assert case.check is not None
        case.check(o.proc)
        assert not case.creates or after == o.before
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
    assert after == o.before  # nothing written (but what it must create), no temporary file, inputs untouched


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


# ---- issue 36, beyond the table of cases -------------------------------------------
def _offered(line: str) -> str:
    m = re.search(r"; use at (?:most|least) (\S+)(?: [a-zA-Z/]+)?$", line)
    assert m, line
    return m[1]


@pytest.mark.parametrize("case_id, field", [("latency-1e15", "link.latency_ns"),
                                            ("bandwidth-1e-6", "link.bandwidth_GBps"),
                                            ("outstanding-past-the-counters", "gpu.remote_outstanding_kB")])
def test_the_offered_bound_runs(case_id: str, field: str, outcomes: dict[str, Outcome], tmp_path: Path) -> None:
    """The value a refusal offers ("use at most X") is honest: X itself passes the checks
    and the run finishes (its time far from the clock's end; a size reaches the
    compiled core as a 64-bit count), and a value 1 % past X is refused with the same X."""
    o = outcomes[case_id]
    assert o.proc is not None and o.proc.returncode == 2, o.proc and o.proc.stderr
    bound = _offered(o.proc.stderr.strip())
    env = cais_env(MPLCONFIGDIR=str(tmp_path))
    ok = run_cais([*RING_1M, "--set", f"{field}={bound}", "--json"], env, cwd=tmp_path)
    assert ok is not None and ok.returncode == 0, ok and ok.stderr
    assert 0 < json.loads(ok.stdout)["time_us"] < 2**62 / 1e6
    past = float(bound) * (1.01 if "; use at most" in o.proc.stderr else 0.99)
    refused = run_cais([*RING_1M, "--set", f"{field}={past:.6g}"], env, cwd=tmp_path)
    assert refused is not None and refused.returncode == 2 and refused.stdout == ""
    assert _offered(refused.stderr.strip()) == bound


def test_settings_the_run_cannot_honour_are_warned_naming_what_ran(tmp_path: Path) -> None:
    """Copy SMs beyond half of a GEMM's set, a period absurd for a layer, a scheme
    outside its design and a setting with no effect in the mode finish (exit 0, the
    result on stdout) with one warning line each on stderr."""
    env = cais_env(MPLCONFIGDIR=str(tmp_path))
    capped = run_cais([*SMALL_LAYER, "--scheme", "cais", "--set", "remote_read.strategy=comm-sms",
                       "--set", "remote_read.comm_sms=200", "--json"], env, cwd=tmp_path)
    assert capped is not None and capped.returncode == 0, capped and capped.stderr
    lines = capped.stderr.splitlines()
    assert len(lines) == 1 and re.fullmatch(r"cais: warning: remote_read\.comm_sms: 200 asked, \d+ used where "
                                           r"fewest: a GEMM's copies run on at most half of its SM set", lines[0])
    assert json.loads(capped.stdout)["adjusted"]["remote_read.comm_sms"].startswith("200 asked")
    slow = run_cais([*SMALL_LAYER, "--scheme", "cais", "--set", "switch.merge.lookups_per_ns=1e-6", "--json"], env,
                    cwd=tmp_path)
    assert slow is not None and slow.returncode == 0, slow and slow.stderr
    assert json.loads(slow.stdout)["total_us"] > 1e6
    assert re.fullmatch(r"cais: warning: the layer period is [0-9.,e+]+ s, over a second for one layer .*",
                        slow.stderr.strip())
    # outside its design: an inference stack's all-reduce in training, a training-only setting in prefill
    stack = run_cais([*TINY_RUN[:4], "tp-trtllm", "--mode", "train", *TINY_RUN[7:], "--json"], env, cwd=tmp_path)
    assert stack is not None and stack.returncode == 0, stack and stack.stderr
    assert re.fullmatch(r"cais: warning: mode: 'tp-trtllm' is an inference stack's all-reduce.*; in train it runs, "
                        r"but as no deployment runs it \(made for: prefill, decode\)", stack.stderr.strip())
    wgrad = run_cais([*SMALL_LAYER, "--scheme", "cais", "--set", "train.wgrad_grads=keep", "--json"], env, cwd=tmp_path)
    assert wgrad is not None and wgrad.returncode == 0, wgrad and wgrad.stderr
    assert re.fullmatch(r"cais: warning: train\.wgrad_grads: 'keep' has no effect: .*prefill has no backward.*",
                        wgrad.stderr.strip())


def test_the_bound_keeps_every_sum_of_the_run_within_the_clock() -> None:
    """check_times' bound: a step at the bound, times the steps one delay adds up, times
    the run's estimated events, stays within the half of the clock a run may reach (so
    the sums the machine forms stay below 2**63); a step just past it is refused."""
    from cais.experiments.estimates import collective_events
    from cais.limits import MAX_TIME_PS, STEPS_PER_DELAY, check_times, step_bound_ps
    from cais.machine import CLOCK_GUARD_PS

    assert MAX_TIME_PS == CLOCK_GUARD_PS and 2 * MAX_TIME_PS <= 2**63
    cfg = load_system("dgx-h100")
    events = collective_events(cfg, "allreduce", "ring", 1 << 20)
    bound_ns = step_bound_ps(events) / 1000
    assert bound_ns * 1000 * STEPS_PER_DELAY * events <= MAX_TIME_PS
    check_times(cfg.model_copy(update={"link": cfg.link.model_copy(update={"latency_ns": bound_ns})}), events)
    with pytest.raises(ValueError, match=r"link\.latency_ns: .* use at most"):
        check_times(cfg.model_copy(update={"link": cfg.link.model_copy(update={"latency_ns": 1.01 * bound_ns})}),
                    events)


def test_a_run_past_the_clock_guard_stops_as_a_user_error_not_a_wrap() -> None:
    """What the checks before a run cannot foresee (a TB's work stretched past half the
    clock): Machine.run stops with ClockOverflow (a UserError, one line) before any time
    wraps around, never a deadlock at a negative time or an internal error."""
    from cais.errors import UserError
    from cais.hw.gpu import Kernel
    from cais.machine import CLOCK_GUARD_PS, ClockOverflow

    m = _machine()

    def long(sm: int, busy: int):
        for _ in range(3):
            yield CLOCK_GUARD_PS // 2 + 1  # the third step's end is past the guard (and below 2**63)

    m.gpus[0].launch(Kernel("long", [long]))
    with pytest.raises(ClockOverflow, match=r"simulated time would go past 4\.61e\+18 ps") as info:
        m.run()
    assert isinstance(info.value, UserError) and "\n" not in str(info.value)
    assert 0 < m.sim.now <= CLOCK_GUARD_PS


def test_the_python_api_refuses_a_scheme_on_a_switch_it_cannot_run_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check is where the scheme meets the system (run_layer, check_layer), so a
    LayerSpec refuses it as the command does, before any machine is built; and every
    scheme that needs merge units is refused, the others run on either switch."""
    import cais.experiments.layer as layer
    from cais.experiments.spec import LayerSpec, SystemSpec
    from cais.schemes.base import SwitchMismatch

    def no_machine(*args: object, **kwargs: object) -> None:
        raise AssertionError("a machine was built")

    monkeypatch.setattr(layer, "Machine", no_machine)
    assert {"cais", "cais-partial", "cais-base", "cais-wo-coord"} <= set(MERGING_SCHEMES)
    nvls = SystemSpec(sets=(("switch.model", "nvls"),))
    for name in MERGING_SCHEMES:
        spec = LayerSpec("paper-mega-gpt-4b", name, "prefill", nvls, batch=1, seq=64)
        with pytest.raises(SwitchMismatch, match=r"^switch\.model: .*allowed with this scheme: auto, cais, cais-ep$"):
            spec.check()
        with pytest.raises(SwitchMismatch):
            spec.run()
    for name, cls in schemes().items():
        assert cls().switch_model("cais") == "cais"
        assert cls().switch_model("auto") == cls.switch
        if cls.switch == "nvls":
            assert cls().switch_model("nvls") == "nvls"


def test_byte_sizes_are_read_by_one_parser_everywhere() -> None:
    """--bytes, --unit, demo --bytes, a sweep point's bytes and unit, and the Python
    API's CollectiveRunSpec(nbytes=...) read sizes alike: K/M/G/KiB binary, numbers of
    bytes as written (1e9 = 10**9), KB/MB/GB refused with the same words."""
    from cais.cli import build_parser
    from cais.experiments.spec import CollectiveRunSpec
    from cais.sweep.point import prepare
    from cais.units import SizeError, parse_size

    cases = {"1M": 1 << 20, "1MiB": 1 << 20, "1e9": 10**9, "1.5K": 1536, "512B": 512, "2G": 2 << 30, "64k": 65536}
    for text, n in cases.items():
        assert parse_size(text) == n
        args = build_parser().parse_args(["collective", "--op", "allreduce", "--algo", "ring", "--bytes", text,
                                          "--unit", text])
        assert args.bytes == args.unit == n
        assert build_parser().parse_args(["demo", "--bytes", text]).bytes == n
        spec = prepare({"kind": "collective", "op": "allreduce", "algo": "ring", "bytes": text, "unit": text})
        assert spec.size() == n and spec.system.unit == n
        assert CollectiveRunSpec("allreduce", "ring", text).size() == n
    for text in ("1GB", "1KB", "1mb", "0.1K", "0", "-1M", "inf", "nan", "1e40", "lots"):
        with pytest.raises(SizeError):
            parse_size(text)
        with pytest.raises(SizeError, match=r"^nbytes: "):
            CollectiveRunSpec("allreduce", "ring", text).check()
        with pytest.raises(ValueError, match=r"^key 'bytes': "):
            prepare({"kind": "collective", "op": "allreduce", "algo": "ring", "bytes": text})
    with pytest.raises(SizeError, match=r"GB is ambiguous .* write G or GiB .* e\.g\. 1e9$"):
        parse_size("1GB")


def test_a_csv_sweep_table_resumes(tmp_path: Path) -> None:
    """A sweep into a .csv table (as run and collective write) keeps its rows and, rerun,
    reuses them: nothing runs the second time, and the point ids read back as text."""
    import pandas as pd

    from cais.sweep.grid import point_id
    from cais.sweep.runner import run_sweep

    point = {"kind": "collective", "op": "allreduce", "algo": "nvls", "bytes": "64K", "gpus": 4}
    out = tmp_path / "t.csv"
    first = run_sweep([point], out, workers=1, progress=False)
    assert first.attrs["points_run"] == 1 and list(first["status"]) == ["ok"]
    again = run_sweep([point], out, workers=1, progress=False)
    assert again.attrs == {"points_run": 0, "points_reused": 1}
    assert list(pd.read_csv(out, dtype={"point_id": str})["point_id"]) == [point_id(point)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]  # no lock or temporary file left


def test_mirror_is_offered_only_where_the_mirrored_run_passes_its_checks(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 59: a decode of batch 100,000 was offered --sim mirror, which then failed the
    memory check. The offer is made only where the same run with --sim mirror passes
    every check the run makes (LayerSpec.check with sim='mirror')."""
    from cais.cli import main
    from cais.experiments.spec import LayerSpec, SystemSpec

    huge = ["run", "--model", "paper-llama-7b", "--scheme", "tp-nvls", "--mode", "decode", "--batch", "100000"]
    assert main(huge) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "beyond the limit" in err and "use a smaller batch or seq" in err
    assert "mirror" not in err
    assert main([*huge, "--sim", "mirror"]) == 2  # what the advice led to: 20,137 GB per GPU
    assert capsys.readouterr().err.startswith("cais: error: memory: ")
    fits = [*BIG_TRAIN, "--scheme", "tp-nvls", "--set", "gpu.hbm_capacity_GB=400"]
    assert main(fits) == 2
    assert "or --sim mirror (this run is symmetric" in capsys.readouterr().err
    LayerSpec("paper-llama-7b", "tp-nvls", "train", SystemSpec(sets={"gpu.hbm_capacity_GB": 400}), batch=64,
              sim="mirror").check()  # the offer works: the mirrored run passes every check
    with pytest.raises(Exception, match="sim mirror: this run is not symmetric"):  # check() knows sim now
        LayerSpec("paper-llama-7b", "cais", "train", batch=1, seq=64, sim="mirror").check()


def test_a_mirror_offer_the_mirrored_checks_refuse_is_not_made() -> None:
    """The guard itself: whatever the mirrored run's checks refuse (memory, symmetry),
    the refusal keeps its own hint and offers no --sim mirror."""
    import argparse

    from cais.cli import _offer_mirror
    from cais.errors import UserError
    from cais.limits import TooBig

    def refused() -> None:
        raise UserError("memory: does not fit")

    args = argparse.Namespace(sim="full", scheme="tp-nvls")
    cfg = load_system("dgx-h100")
    for mirrored, offered in ((refused, False), (lambda: None, True)):
        with pytest.raises(TooBig) as e, _offer_mirror(args, cfg, mirrored):
            raise TooBig("too big; use a smaller batch or seq", 8e7, 5e7)
        assert ("sim='mirror'" in str(e.value)) == offered, str(e.value)
