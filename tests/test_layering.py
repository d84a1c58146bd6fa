"""Lower layers never import upper ones (docs/architecture.md, "The arrows").

:data:`ALLOWED` is the import table of the whole package: for each part of ``cais``
(a package such as ``cais.hw`` or a top-level module such as ``cais.isa``), the parts
and modules it may import. Every import counts: ``import x`` and ``from x import y``,
relative ones, imports inside functions and under ``TYPE_CHECKING``. An import the
table does not allow is a failure unless it is one of the :data:`TOLERATED` known
exceptions, each with its reason and the change that would remove it; an exception
that is gone from the code must leave the list too.

The checker (:func:`imports`, :func:`forbidden`) reads a package tree by path, so the
same code checks ``src/cais`` and the small synthetic trees that show it can fail.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "cais"

# Every part may import cais.errors: the error type every layer raises for a user's
# mistake (it imports nothing); and cais.units, the one reading of byte sizes
# ("64K", "1e9") that the command, sweep files and the Python API share.
EVERYONE = ("cais.errors", "cais.units")

# part -> what it may import besides itself and EVERYONE. A module belongs to the
# longest key that is it or a package above it. An entry allows a module and everything under it; the bare "cais"
# (the package root) allows only ``from cais import __version__``-style imports.
ALLOWED: dict[str, tuple[str, ...]] = {
    # ---- leaves: import nothing of cais (but errors) ----------------------------
    "cais": (),  # the package root: __version__, DISTRIBUTION
    "cais.errors": (),
    "cais.units": (),  # byte sizes as text: imports only cais.errors
    "cais.progress": (),  # the progress bar; the simulator calls it through a callback
    # the compiled core (rust/; its interface is the stub _core.pyi): event queue,
    # channels, credits, switch chips' crossbar and NVLS engine
    "cais._core": (),
    "cais.engine": ("cais._core",),  # discrete-event core: knows nothing of GPUs
    "cais.workload": (),  # models and layer graphs: plain data
    # the system config: every layer above the engine reads it
    "cais.cost": (),  # the merge unit's arrays in CACTI (a driver and its stored run)
    # the core's registries name what the config allows; a CACTI node gives the merge unit's timing
    "cais.config": ("cais._core", "cais.cost"),
    "cais.provenance": ("cais",),  # reads cais.__version__
    "cais.record": (),  # what a finished run leaves: plain data the machine makes and results/ reads
    # ---- the simulated machine ----------------------------------------------------
    "cais.hw": ("cais._core", "cais.engine", "cais.config"),
    "cais.isa": ("cais.engine", "cais.hw", "cais.config"),
    "cais.machine": ("cais.engine", "cais.hw", "cais.config", "cais.isa", "cais.record"),
    # ---- programs on the machine --------------------------------------------------
    # (and the core's kernel pieces: rust/src/kernels/, a TB factory a kernel describes)
    "cais.kernels": ("cais._core", "cais.engine", "cais.hw", "cais.config", "cais.isa", "cais.machine",
                     "cais.workload"),
    "cais.opt": ("cais.workload", "cais.kernels.gemm"),  # the CAIS passes: graphs and GEMM tile shapes only
    "cais.schemes": ("cais.engine", "cais.hw", "cais.config", "cais.isa", "cais.machine", "cais.kernels", "cais.opt",
                     "cais.workload"),
    # ---- reading a run --------------------------------------------------------------
    "cais.results": ("cais.config", "cais.record"),
    "cais.report": ("cais.results", "cais.config"),
    "cais.limits": ("cais.config", "cais.workload"),
    # ---- running things -------------------------------------------------------------
    "cais.experiments": ("cais.engine", "cais.hw", "cais.config", "cais.isa", "cais.machine", "cais.kernels",
                         "cais.opt",
                         "cais.schemes", "cais.workload", "cais.results", "cais.limits", "cais.progress",
                         "cais.provenance"),  # a run's result says what made it (LayerSpec.run)
    "cais.sweep": ("cais.experiments", "cais.schemes", "cais.kernels", "cais.config", "cais.workload",
                   "cais.results", "cais.provenance", "cais.progress"),
    # reproduce runs its points through the one run description, experiments/spec.py
    "cais.reproduce": ("cais.sweep", "cais.experiments.spec", "cais.results", "cais.report", "cais.config",
                       "cais.cost", "cais.workload", "cais.provenance", "cais.progress"),
    # ---- the command ----------------------------------------------------------------
    "cais.cli": ("cais", "cais.progress", "cais.record", "cais.cost", "cais.engine", "cais.workload", "cais.hw",
                 "cais.config", "cais.provenance", "cais.isa", "cais.machine", "cais.kernels", "cais.opt", "cais.schemes", "cais.results",
                 "cais.report", "cais.limits", "cais.experiments", "cais.sweep", "cais.reproduce"),
    "cais.__main__": ("cais.cli",),
}

# (file under src/cais, imported module) -> why it is tolerated today; removed by what.
TOLERATED: dict[tuple[str, str], str] = {
    # results/ reads the live machine after a run (issue 19 names it); goes when the
    # machine hands a run's record (counters, logs) to results/ instead.
    ("results/recorder.py", "cais.machine"): "attaches to Machine; goes with a run record",
    ("results/recorder.py", "cais.hw.gpu"): "reads Kernel objects; goes with a run record",
    ("results/recorder.py", "cais.hw.merge"): "reads MergeUnit logs; goes with a run record",
    ("report/trace.py", "cais.hw.gpu"): "type hint of Kernel (TYPE_CHECKING); goes with a run record",
    # the paper's published speedups, Table I and geomean() live in experiments/baselines.py;
    # goes when the numbers move to a data file (src/cais/data/published/) both read.
    ("reproduce/paper.py", "cais.experiments.baselines"): "the paper's numbers; goes when they are data",
    ("reproduce/experiments/common.py", "cais.experiments.baselines"):
        "geomean() beside the paper's numbers; goes when they are data",
}


# ---- the checker ------------------------------------------------------------------
@dataclass(frozen=True)
class Import:
    """One import in a package tree: the file (relative to the package directory),
    its line, and the module it imports (absolute, e.g. ``cais.hw.gpu``)."""

    file: str
    line: int
    module: str


def _module_of(root: Path, path: Path) -> str:
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(root: Path) -> list[Import]:
    """Every import of the package at ``root`` (a directory with ``__init__.py``) of
    itself: both statement forms, relative ones resolved, at any depth of the syntax
    tree (inside functions, ``if TYPE_CHECKING:``, ``try:``). ``from p import name``
    counts as ``p.name`` where that is a module of the tree, else as ``p``."""
    pkg = root.name
    files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    known = {_module_of(root, p) for p in files}
    out = []
    for path in files:
        rel = path.relative_to(root).as_posix()
        mod = _module_of(root, path)
        here = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")
                    base = base[:len(base) - (node.level - 1)]
                    parent = ".".join(base + ([node.module] if node.module else []))
                else:
                    parent = node.module or ""
                subs = [f"{parent}.{a.name}" for a in node.names if f"{parent}.{a.name}" in known]
                targets = subs if len(subs) == len(node.names) else [parent, *subs]
            else:
                continue
            out += [Import(rel, node.lineno, t) for t in targets if t == pkg or t.startswith(pkg + ".")]
    return out


def part_of(module: str, table: Mapping[str, Sequence[str]]) -> str | None:
    """The part ``module`` belongs to: the longest key of ``table`` that is it or a
    package above it (the package root only holds itself)."""
    root = module.split(".")[0]
    best = None
    for key in table:
        if module == key or (key != root and module.startswith(key + ".")):
            if best is None or len(key) > len(best):
                best = key
    return best


def _covers(entry: str, module: str) -> bool:
    return module == entry or ("." in entry and module.startswith(entry + "."))


def forbidden(root: Path, table: Mapping[str, Sequence[str]],
              everyone: Sequence[str] = EVERYONE) -> list[Import]:
    """The imports of the package at ``root`` that ``table`` does not allow: one part
    importing another that is not in its row (nor in ``everyone``). A file that
    belongs to no part is reported as an import of ``?`` so it cannot go unchecked."""
    bad = {Import(path.relative_to(root).as_posix(), 0, "?") for path in root.rglob("*.py")
           if "__pycache__" not in path.parts and part_of(_module_of(root, path), table) is None}
    for imp in imports(root):
        src = part_of(_module_of(root, root / imp.file), table)
        if src is None or part_of(imp.module, table) == src:
            continue
        if not any(_covers(e, imp.module) for e in (*table[src], *everyone)):
            bad.add(imp)
    return sorted(bad, key=lambda i: (i.file, i.line, i.module))


# ---- the real tree ------------------------------------------------------------------
def test_no_new_forbidden_import() -> None:
    """Every import between parts of src/cais is in ALLOWED or is a listed TOLERATED
    exception: a new upward (or sideways) import fails here, naming file:line."""
    bad = [f"{i.file}:{i.line}: imports {i.module}" for i in forbidden(SRC, ALLOWED)
           if (i.file, i.module) not in TOLERATED]
    assert bad == []


def test_every_tolerated_exception_still_exists() -> None:
    """TOLERATED lists only exceptions the code still has: when one is removed from the
    code it must leave the list, so the list says what is left to fix."""
    found = {(i.file, i.module) for i in forbidden(SRC, ALLOWED)}
    assert sorted(k for k in TOLERATED if k not in found) == []


def test_table_covers_every_package_and_nothing_else() -> None:
    """Every .py file of src/cais belongs to a part of ALLOWED, every part has a file,
    and every row names only parts or modules that exist: a new package cannot
    escape the check, and the table has no dead rows."""
    modules = {_module_of(SRC, p) for p in [*SRC.rglob("*.py"), *SRC.rglob("*.pyi")] if "__pycache__" not in p.parts}
    assert "cais._core" in modules  # a compiled module counts by its stub
    assert sorted(m for m in modules if part_of(m, ALLOWED) is None) == []
    assert sorted(k for k in ALLOWED if not any(_covers(k, m) for m in modules)) == []
    named = {e for row in ALLOWED.values() for e in row} | set(EVERYONE)
    assert sorted(e for e in named if not any(_covers(e, m) for m in modules)) == []


# ---- the checker fails where it should -----------------------------------------------
FIXTURE_TABLE = {"cais": (), "cais.engine": (), "cais.schemes": ("cais.engine",)}


def _tree(tmp_path: Path, engine_sim: str) -> Path:
    """A fake ``cais`` package: engine/ (the bottom) and schemes/ (above it), where
    schemes imports the engine in every form, and engine/sim.py is ``engine_sim``."""
    root = tmp_path / "cais"
    files = {
        "__init__.py": "",
        "engine/__init__.py": "from cais.engine.sim import Simulator\n",
        "engine/sim.py": engine_sim,
        "schemes/__init__.py": "",
        "schemes/base.py": ("import cais.engine\n"
                            "from cais.engine import sim\n"
                            "from ..engine.sim import Simulator\n"
                            "def run():\n"
                            "    from cais.engine import Simulator\n"),
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.mark.parametrize("engine_sim, line, module", [
    ("class Simulator: ...\nfrom cais.schemes.base import run\n", 2, "cais.schemes.base"),
    ("import cais.schemes.base\n", 1, "cais.schemes.base"),
    ("from cais.schemes import base\n", 1, "cais.schemes.base"),
    ("from ..schemes.base import run\n", 1, "cais.schemes.base"),
    ("from .. import schemes\n", 1, "cais.schemes"),
    ("def f():\n    from cais.schemes.base import run\n", 2, "cais.schemes.base"),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cais.schemes import base\n", 3,
     "cais.schemes.base"),
])
def test_checker_reports_engine_importing_schemes(tmp_path: Path, engine_sim: str, line: int, module: str) -> None:
    """On a synthetic tree where engine/sim.py imports schemes/ (upward), in each form
    an import can take, the checker reports exactly that one import, and none of the
    allowed schemes -> engine imports."""
    root = _tree(tmp_path, engine_sim)
    assert forbidden(root, FIXTURE_TABLE, everyone=()) == [Import("engine/sim.py", line, module)]


def test_checker_passes_a_clean_tree_and_flags_an_unplaced_package(tmp_path: Path) -> None:
    """The same tree without the upward import passes; a package the table does not
    name (here ``cais/extra``) is reported, so no part of the tree goes unchecked."""
    root = _tree(tmp_path, "class Simulator: ...\n")
    assert forbidden(root, FIXTURE_TABLE, everyone=()) == []
    (root / "extra").mkdir()
    (root / "extra" / "__init__.py").write_text("")
    assert forbidden(root, FIXTURE_TABLE, everyone=()) == [Import("extra/__init__.py", 0, "?")]


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


# ---- the compiled core (rust/src): the same arrows between its folders ----------------
# rust/src/engine, hw and isa mirror cais.engine, cais.hw and cais.isa; lib.rs (the
# crate root, which registers the units and adds the classes) sees them all. A folder
# may use (`crate::x`, `super::super::x`) only itself and the folders it lists; and the
# engine names no type of the layers above it (its seam, engine/unit.rs, is how it calls
# them), nor a GPU, outside comments and string literals.
RUST = Path(__file__).resolve().parents[1] / "rust" / "src"
RUST_ALLOWED: dict[str, tuple[str, ...]] = {
    "engine": (),
    "hw": ("engine",),
    "isa": ("engine", "hw"),
    "kernels": ("engine", "hw", "isa"),  # TB factories a Python kernel describes
}
# names the engine must not use whether or not a type of that name is defined above it
RUST_HARDWARE_WORDS = ("Endpoint", "SwitchChip", "MergeUnit", "HbmShare", "HbmPhase", "Gpu", "GroupSyncTable")
RUST_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "rust_layering"


def _rust_code(text: str) -> list[str]:
    """The lines of a Rust file with comments and string literals blanked (line
    numbers kept)."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group().count("\n"), text, flags=re.S)
    text = re.sub(r'r#*"(?:.|\n)*?"#*|"(?:\\.|[^"\\])*"', lambda m: '""' + "\n" * m.group().count("\n"), text)
    return [line.split("//", 1)[0] for line in text.split("\n")]


def _rust_defined(root: Path, folders: Sequence[str]) -> set[str]:
    """The names of the types, traits and macros defined under ``folders`` of ``root``."""
    names: set[str] = set()
    for folder in folders:
        for path in sorted((root / folder).rglob("*.rs")):
            for line in _rust_code(path.read_text()):
                # items at the top of a file (an associated `type State` in an impl is not one)
                names.update(re.findall(r"^(?:pub(?:\([^)]*\))?\s+)?(?:struct|enum|trait|type|union)\s+([A-Z]\w*)",
                                        line))
    return names


def rust_violations(root: Path, table: Mapping[str, Sequence[str]] = RUST_ALLOWED,
                    words: Sequence[str] = RUST_HARDWARE_WORDS) -> list[str]:
    """``file:line: what`` for each use of a folder of ``root`` that ``table`` does not
    allow its folder, and each name in an engine file of a type defined above the engine
    (or one of ``words``)."""
    # a name the engine defines itself (its trait Unit's associated `type State`) is its own
    own = {name for path in (root / "engine").rglob("*.rs") for line in _rust_code(path.read_text())
           for name in re.findall(r"\b(?:struct|enum|trait|type|union)\s+([A-Z]\w*)", line)}
    above = (_rust_defined(root, [f for f in table if f != "engine"]) - own) | set(words)
    bad = []
    for path in sorted(root.rglob("*.rs")):
        rel = path.relative_to(root)
        if len(rel.parts) < 2:
            continue  # the crate root
        folder = rel.parts[0]
        if folder not in table:
            bad.append(f"{rel}:0: a folder the table does not place")
            continue
        allowed = {folder, *table[folder]}
        up = r"super::" if path.name == "mod.rs" and len(rel.parts) == 2 else r"super::super::"
        for n, line in enumerate(_rust_code(path.read_text()), 1):
            for used in re.findall(rf"(?:\bcrate|{up[:-2]})::(\w+)", line):
                if used in table and used not in allowed:
                    bad.append(f"{rel}:{n}: uses {used}")
            if folder == "engine":
                for name in sorted(set(re.findall(r"\b[A-Z]\w*", line)) & above):
                    bad.append(f"{rel}:{n}: names {name}")
    return bad


def test_rust_layers_keep_their_arrows() -> None:
    """rust/src/engine uses nothing above it and names no hardware type; hw uses only
    the engine; isa the engine and hw; kernels those three."""
    assert rust_violations(RUST) == []
    assert {p.name for p in RUST.iterdir() if p.is_dir()} == set(RUST_ALLOWED)


def test_rust_checker_flags_an_engine_file_that_names_hardware(tmp_path: Path) -> None:
    """The fixture (an engine file that uses hw and names Endpoint and MergeUnit in its
    code, and speaks of more only in comments and a string) fails the check on exactly
    those lines; the same tree without it passes."""
    root = tmp_path / "src"
    for folder, text in {"engine/sim.rs": "pub struct Simulator;\n",
                         "engine/train.rs": "pub struct Train;\n",
                         "hw/merge.rs": "use crate::engine::train::Train;\npub struct MergeUnit;\n",
                         "hw/gpu.rs": "pub(crate) struct Endpoint;\n",
                         "isa/stream.rs": "use crate::hw::gpu::Endpoint;\npub struct LoadStream;\n"}.items():
        (root / folder).parent.mkdir(parents=True, exist_ok=True)
        (root / folder).write_text(text)
    assert rust_violations(root) == []
    (root / "engine" / "bad.rs").write_text((RUST_FIXTURES / "engine_names_hardware.rs").read_text())
    assert rust_violations(root) == [
        "engine/bad.rs:7: uses hw",
        "engine/bad.rs:7: names MergeUnit",
        "engine/bad.rs:12: names Endpoint",
        "engine/bad.rs:13: names MergeUnit",
    ]
    # and hw may not use isa
    (root / "hw" / "gpu.rs").write_text("use crate::isa::stream::LoadStream;\npub(crate) struct Endpoint;\n")
    assert "hw/gpu.rs:1: uses isa" in rust_violations(root)
