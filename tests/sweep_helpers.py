"""Sweep functions for tests/test_sweep.py, importable by worker processes (spawned
children inherit the test process's sys.path, which holds this folder)."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any


def square(point: dict[str, Any]) -> dict[str, Any]:
    """Record the call as a file in ``point["calls"]``, sleep ``point["sleep"]`` s, fail
    for ``x == point["fail"]``, kill its process for ``x == point["die"]``, else return x squared (and a nested dict)."""
    x = point["x"]
    Path(point["calls"], f"x{x}-{os.getpid()}-{uuid.uuid4().hex[:8]}").touch()
    time.sleep(point.get("sleep", 0))
    if x == point.get("die"):
        os._exit(1)  # the worker process dies without a word
    if x == point.get("fail"):
        raise ValueError(f"x={x} is\nbad")
    return {"y": x * x, "nested": {"pid": os.getpid()}, "status": "not mine"}


def cube(point: dict[str, Any]) -> dict[str, Any]:
    """A second point function: sleep ``point["sleep"]`` s, return x cubed."""
    time.sleep(point.get("sleep", 0))
    return {"z": point["x"] ** 3}
