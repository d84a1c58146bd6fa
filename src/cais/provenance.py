"""Where a result came from: the package version, the git commit of the code that
made it, the date, the command line, and the system it ran on with a content hash of
that system's full configuration (the preset after every override), so that two
results can be told apart even when their presets share a name but not their values.

Every ``--json``, every ``--out`` row, every sweep row, every reproduction CSV and
report carries one (docs/results.md, "Provenance"). This module imports nothing of
the simulator, so every layer may use it.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any

def package_version() -> str:
    """The running ``cais-sim`` version (the installed distribution's, else the
    source tree's)."""
    from cais import __version__

    return __version__


@lru_cache(maxsize=1)
def git_commit() -> str:
    """The commit of the checkout this package runs from, with ``-dirty`` when files
    tracked by git differ from it; "unknown" outside a git checkout (an installed
    wheel) or without git. Cached: a process runs one version of the code."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}-dirty" if dirty else head or "unknown"


def content_hash(data: Mapping[str, Any]) -> str:
    """The first 16 hex digits of the SHA-256 of ``data`` as canonical JSON (sorted
    keys, no spaces): equal for equal contents, whatever their key order."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def now_utc() -> str:
    """The current time, UTC, ISO 8601 to the second."""
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


@dataclass(frozen=True)
class Provenance:
    """What made a result: ``version`` and ``commit`` of cais-sim, ``date`` (UTC),
    ``command`` (the command line, or the library call), ``system`` (preset name or
    file), ``system_sha256`` (content hash of its full configuration after the
    overrides, :func:`content_hash`) and ``sets`` (every dotted-key override)."""

    version: str
    commit: str
    date: str
    command: str
    system: str
    system_sha256: str
    sets: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[tuple[str, str]]:
        """(label, value) pairs for a report's provenance block."""
        sets = ", ".join(f"{k}={v}" for k, v in self.sets.items()) or "none"
        return [("cais-sim", self.version), ("commit", self.commit), ("date (UTC)", self.date),
                ("command", self.command), ("system", f"{self.system} (config sha256 {self.system_sha256})"),
                ("--set", sets)]

    def flat(self) -> dict[str, str]:
        """Every field as text, ``sets`` as JSON: the values of a table's
        ``provenance.<field>`` columns (a result's ``as_json()["provenance"]``)."""
        return {k: v if isinstance(v, str) else json.dumps(v, sort_keys=True) for k, v in self.as_json().items()}

    def columns(self) -> dict[str, str]:
        """Flat ``provenance.<field>`` columns for a results table."""
        return {f"provenance.{k}": v for k, v in self.flat().items()}


def collect(command: str, system: str, config: Mapping[str, Any] | None, sets: Mapping[str, Any]) -> Provenance:
    """The provenance of a result made now by ``command`` on ``system``, whose full
    configuration (a ``model_dump()``) is ``config`` (None: "unknown")."""
    return Provenance(version=package_version(), commit=git_commit(), date=now_utc(), command=command,
                      system=system, system_sha256=content_hash(config) if config is not None else "unknown",
                      sets=dict(sets))
