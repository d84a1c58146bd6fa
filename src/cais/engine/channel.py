"""One direction of a link: a serialising server with virtual channels.

The network does not move flits one by one: it moves *trains*, a run of packets that
travel together (a transfer unit). A train is forwarded cut-through: the next hop may
start sending it as soon as its head has arrived, and cannot finish before its tail
has arrived. So a train of many packets costs one serialisation per link it crosses,
not one per hop, as for wormhole/virtual cut-through flit switching.

Both classes are compiled (``rust/src/channel.rs``, ``rust/src/train.rs``): a
channel's arbitrations and a train's arrival run in the event core without entering
the interpreter. Their documentation is on the classes (``help(Channel)``).
"""

from __future__ import annotations

from collections.abc import Callable

from cais._core import Channel as _CoreChannel
from cais._core import Credits, Simulator, Train

__all__ = ["Channel", "Deliver", "OnStart", "Train"]

Deliver = Callable[[Train], None]
OnStart = Callable[[Train, int, int], None]


class Channel(_CoreChannel):
    """One direction of a port (see :class:`cais._core.Channel`), bound at
    construction to the buffer it feeds: the buffer's credits wake this channel's
    arbiter when they come back."""

    __slots__ = ()

    def __init__(self, sim: Simulator, name: str, ps_per_byte: float, latency_ps: int, vcs: int = 1,
                 record_timeline: bool = False, credits: Credits | None = None, credit_rtt_ps: int = 0) -> None:
        if credits is not None:
            credits.on_return(self)
