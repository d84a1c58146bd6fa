"""Sweep points and their ids (stand-in for the sweep branch)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

Point = dict[str, Any]


def point_id(point: Point) -> str:
    """A stable id of ``point``: the SHA-1 of its keys and values as sorted JSON."""
    return hashlib.sha1(json.dumps(point, sort_keys=True, default=str).encode()).hexdigest()
