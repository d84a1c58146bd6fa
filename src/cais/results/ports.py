"""Which GPU, switch chip and direction a fabric channel stands for, read from its
name (``gpu3->sw1``: GPU 3 up to chip 1; ``sw1->gpu3``: chip 1 down to GPU 3)."""

from __future__ import annotations

import re
from dataclasses import dataclass

_UP = re.compile(r"^gpu(\d+)->sw(\d+)$")
_DOWN = re.compile(r"^sw(\d+)->gpu(\d+)$")


@dataclass(frozen=True)
class PortDirection:
    """One direction of one GPU<->switch-chip port: ``up`` is GPU -> chip, ``down``
    chip -> GPU."""

    gpu: int
    chip: int
    direction: str


def port_direction(channel_name: str) -> PortDirection | None:
    """The port direction a channel named like ``gpu3->sw1`` / ``sw1->gpu3`` carries;
    None for a channel of another kind (it still counts as a port for ``max``)."""
    if m := _UP.match(channel_name):
        return PortDirection(int(m[1]), int(m[2]), "up")
    if m := _DOWN.match(channel_name):
        return PortDirection(int(m[2]), int(m[1]), "down")
    return None
