"""Lower layers never import upper ones (design.md §2): workload/ imports only
workload/; opt/ (the CAIS passes) imports workload/ and the GEMM tile shapes of
kernels/gemm.py, never schemes/. Both may import cais.errors, the error type every
layer raises for a user's mistake (it imports nothing)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "cais"
ALLOWED = {"workload": ("cais.workload", "cais.errors"),
           "opt": ("cais.workload", "cais.opt", "cais.kernels.gemm", "cais.errors")}


def _imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.append(node.module)
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names]
    return [m for m in out if m == "cais" or m.startswith("cais.")]


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_what_is_below_it(package: str) -> None:
    files = sorted((SRC / package).glob("*.py"))
    assert files
    bad = [f"{f.name}: {m}" for f in files for m in _imports(f)
           if not any(m == a or m.startswith(a + ".") for a in ALLOWED[package])]
    assert bad == []


def test_no_library_error_speaks_of_command_line_flags() -> None:
    """Below the CLI, a user's mistake names the parameter (``sms: ...``, ``use
    sim='full'``); only cli.py words it as a flag (``cais.cli.as_flags``,
    docs/errors.md)."""
    import re

    bad = []
    for path in sorted(SRC.rglob("*.py")):
        if path == SRC / "cli.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            message = node.exc if isinstance(node, ast.Raise) else None  # and check_events' what / hint
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "check_events"):
                message = node
            if message is not None:
                for const in ast.walk(message):
                    if (isinstance(const, ast.Constant) and isinstance(const.value, str)
                            and re.search(r"(^|[\s(])--[a-z]", const.value)):
                        bad.append(f"{path.relative_to(SRC)}:{node.lineno}: {const.value!r}")
    assert bad == []
