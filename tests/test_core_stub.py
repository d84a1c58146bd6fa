"""The compiled core's stub (``src/cais/_core.pyi``) says what the module has: every
class, method, property and function the stub names exists in ``cais._core``, and
every public class and function of the module is in the stub."""

from __future__ import annotations

import ast
from pathlib import Path

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
