import pytest

from cais.config import SystemConfig, load_system

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
