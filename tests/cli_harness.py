"""What the subprocess tests of the command share: the environment a child ``python -m
cais`` runs in, a snapshot of the files in a case's folder, and a case's outcome."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SRC = str(Path(__file__).resolve().parents[1] / "src")
TIME_LIMIT_S = 60


@dataclass
class Outcome:
    """One case run through the command: its folder and the files in it before the
    run, the finished process (None when it timed out or was skipped)."""

    case: Any
    dir: Path
    before: dict[str, bytes]
    proc: subprocess.CompletedProcess | None
    skipped: str = ""
    timed_out: bool = False


def files_of(d: Path) -> dict[str, bytes]:
    """Every file under ``d`` with its bytes (a folder as ``<dir>``): equal snapshots
    mean nothing was written, left behind or changed."""
    return {str(p.relative_to(d)): (p.read_bytes() if p.is_file() else b"<dir>") for p in sorted(d.rglob("*"))}


def cais_env(extra: dict[str, str] | None = None, **more: str) -> dict[str, str]:
    """The child's environment: this checkout's sources first, no debug switch or
    moved event limit from the caller's shell."""
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), **more, **(extra or {})}
    for key in ("CAIS_DEBUG", "CAIS_MAX_EVENTS"):
        if key not in (extra or {}):
            env.pop(key, None)
    return env


def run_cais(args: list[str], env: dict[str, str], prefix: list[str] | None = None, **kwargs: Any
             ) -> subprocess.CompletedProcess | None:
    """``python -m cais ARGS`` (after ``prefix``, e.g. a privilege drop); None when it
    does not answer within :data:`TIME_LIMIT_S`."""
    kwargs.setdefault("stdout", subprocess.PIPE)
    try:
        return subprocess.run([*(prefix or []), sys.executable, "-m", "cais", *args], stderr=subprocess.PIPE,
                              text=True, env=env, timeout=TIME_LIMIT_S, **kwargs)
    except subprocess.TimeoutExpired:
        return None
