"""Sweep functions for tests/test_sweep.py, importable by worker processes (spawned
children inherit the test process's sys.path, which holds this folder)."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any


def square(point: dict[str, Any]) -> dict[str, Any]:
    """Record the call as a file in ``point["calls"]``, sleep ``point["sleep"]`` s, wait
    until the file ``point["release"]`` exists (if given; at most 2 minutes), fail for
    ``x == point["fail"]``, kill its process for ``x == point["die"]``, else return x
    squared (and a nested dict)."""
    x = point["x"]
    Path(point["calls"], f"x{x}-{os.getpid()}-{uuid.uuid4().hex[:8]}").touch()
    time.sleep(point.get("sleep", 0))
    if "release" in point:
        deadline = time.monotonic() + 120
        while not Path(point["release"]).exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    if x == point.get("die"):
        os._exit(1)  # the worker process dies without a word
    if x == point.get("fail"):
        raise ValueError(f"x={x} is\nbad")
    return {"y": x * x, "nested": {"pid": os.getpid()}, "status": "not mine"}


def cube(point: dict[str, Any]) -> dict[str, Any]:
    """A second point function: sleep ``point["sleep"]`` s, return x cubed."""
    time.sleep(point.get("sleep", 0))
    return {"z": point["x"] ** 3}


def held_point(point: dict[str, Any]) -> dict[str, Any]:
    """:func:`cais.sweep.point.run_point` on ``point`` without this helper's keys, after
    recording the call as a file ``<point["calls"]>/<bytes>-<pid>-<random>`` and, for a
    point with ``hold``, waiting until the file ``point["release"]`` exists (at most 10
    minutes): a test can kill the process running a point while it runs."""
    from cais.sweep.point import run_point

    Path(point["calls"], f"{point['bytes']}-{os.getpid()}-{uuid.uuid4().hex[:8]}").touch()
    if point.get("hold"):
        deadline = time.monotonic() + 600
        while not Path(point["release"]).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    return run_point({k: v for k, v in point.items() if k not in ("calls", "hold", "release")})


_HOLDERS: list[Any] = []  # this process's weak references to what cyclic() left


def cyclic(point: dict[str, Any]) -> dict[str, Any]:
    """Switch this process's cyclic collector off and leave garbage in a reference
    cycle, as a finished machine does; report how many points this process ran before,
    how many of their cycles were still in memory when this one started and how many
    objects the process had frozen out of collections by then."""
    import gc
    import weakref

    gc.disable()  # only the sweep runner's own collection can free a cycle now
    alive = sum(ref() is not None for ref in _HOLDERS)
    node: dict[str, Any] = {}
    node["self"] = node
    holder = type("Holder", (), {})()
    holder.node = node
    node["holder"] = holder
    earlier = len(_HOLDERS)
    _HOLDERS.append(weakref.ref(holder))
    return {"earlier_points": earlier, "earlier_alive": alive, "pid": os.getpid(), "frozen": gc.get_freeze_count()}
