import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from cais.config import SystemConfig, load_system

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"

# The modules that take longest (a module-scoped reproduction, CLI runs in subprocesses,
# a Ray cluster): collected first, so that with several workers (pytest-xdist, one
# module per worker at a time) the long ones start at once and the workers finish
# together, rather than one of them starting a long module last.
LONGEST_FIRST = ("test_reproduce.py", "test_bad_inputs.py", "test_decode.py", "test_sweep.py", "test_cli_contract.py",
                 "test_nvls_staged.py", "test_protocols.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: order within a module kept


@pytest.fixture(scope="session")
def h100() -> SystemConfig:
    return load_system("dgx-h100")


def _load_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` as a module (registered under ``name``, as a dataclass in it
    looks its module up), once per session."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def load_script() -> Callable[[str], ModuleType]:
    """A loader of the scripts under ``scripts/`` by name (``load_script("validate_token")``)."""
    return _load_script
