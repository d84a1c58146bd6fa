"""The compiled core's stub (``src/cais/_core.pyi``) says what the module has: every
class, method, property and function the stub names exists in ``cais._core``, and
every public class and function of the module is in the stub; and mypy's stubtest
finds the two agreeing, signatures included (as ``.ci/run`` checks it)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import cais._core as core

STUB = Path(core.__file__).with_name("_core.pyi") if Path(core.__file__).with_name("_core.pyi").is_file() \
    else Path(__file__).resolve().parents[1] / "src" / "cais" / "_core.pyi"


def _stub() -> tuple[dict[str, set[str]], set[str]]:
    """(class -> the names its body defines, module-level functions) of the stub."""
    tree = ast.parse(STUB.read_text())
    classes: dict[str, set[str]] = {}
    functions: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names = set()
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names.add(item.target.id)
            classes[node.name] = names
        elif isinstance(node, ast.FunctionDef):
            functions.add(node.name)
    return classes, functions


def test_every_name_in_the_stub_exists_in_the_module() -> None:
    classes, functions = _stub()
    assert len(classes) >= 10  # the stub was read
    missing = [c for c in classes if not hasattr(core, c)]
    missing += [f for f in functions if not hasattr(core, f)]
    missing += [f"{c}.{n}" for c, names in classes.items() if hasattr(core, c) for n in sorted(names)
                if not hasattr(getattr(core, c), n)]
    assert missing == []


def test_every_public_class_and_function_of_the_module_is_in_the_stub() -> None:
    classes, functions = _stub()
    public = {n for n in dir(core) if not n.startswith("_") and callable(getattr(core, n))}
    assert public and sorted(public - set(classes) - functions) == []


ROOT = Path(__file__).resolve().parents[1]
ALLOWLIST = ROOT / ".ci" / "stubtest-allowlist"


def _stubtest(stub_dir: Path) -> subprocess.CompletedProcess[str]:
    """mypy's stubtest on ``cais._core``: the built module against the stub found under
    ``stub_dir`` (MYPYPATH; without it mypy finds no stub, the package having no
    py.typed, and stubtest reports success having checked nothing)."""
    env = {**os.environ, "MYPYPATH": str(stub_dir)}
    return subprocess.run([sys.executable, "-m", "mypy.stubtest", "cais._core", "--allowlist", str(ALLOWLIST)],
                          capture_output=True, text=True, env=env, cwd=ROOT)


def test_stubtest_finds_the_stub_and_the_module_agreeing() -> None:
    """The signatures too (PyO3's text signatures), not only the names: what .ci/run checks."""
    pytest.importorskip("mypy.stubtest")
    r = _stubtest(STUB.parent.parent)
    assert r.returncode == 0, r.stdout + r.stderr


def test_stubtest_fails_on_a_stub_that_disagrees(tmp_path: Path) -> None:
    """The check is not vacuous: a method the module lacks, and a parameter renamed, are found."""
    pytest.importorskip("mypy.stubtest")
    (tmp_path / "cais").mkdir()
    (tmp_path / "cais" / "__init__.pyi").write_text("")
    text = STUB.read_text()
    text = text.replace("    def next_time(self) -> int | None: ...",
                        "    def next_time(self) -> int | None: ...\n    def not_in_the_core(self) -> None: ...", 1)
    text = text.replace("def fire(self, sim: Simulator,", "def fire(self, simulator: Simulator,", 1)
    (tmp_path / "cais" / "_core.pyi").write_text(text)
    r = _stubtest(tmp_path)
    assert r.returncode == 1
    assert "cais._core.Simulator.not_in_the_core" in r.stdout and "cais._core.Signal.fire" in r.stdout
