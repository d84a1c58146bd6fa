"""cais-sim: a discrete-event simulator of tensor-parallel LLM work on NVLink/NVSwitch
multi-GPU systems, built around CAIS (compute-aware in-switch computing)."""

from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "cais-sim"  # the distribution's name in pyproject.toml

try:
    __version__ = version(DISTRIBUTION)
except PackageNotFoundError:  # a source tree on PYTHONPATH, not installed: pyproject.toml's version
    __version__ = "0.1.0"
