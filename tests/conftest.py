import pytest

from cais.hw.config import SystemConfig, load_system


@pytest.fixture(scope="session")
def h100() -> SystemConfig:
    return load_system("dgx-h100")
