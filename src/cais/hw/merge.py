"""The CAIS merge unit (paper §III-A.2-4): one per switch port, in the data path of
the requests whose home GPU is behind that port.

A CAM looks requests up by (address, type). Each hit or miss is a *session* in the
merging table, whose entries are 128 B lines (320 x 128 B = 40 KB per port by
default); the content array keeps the waiting requesters' metadata and the cached
load data. A session is ``Load-Wait`` (the first load went to the home GPU and its
data is not back), ``Load-Ready`` (the data is cached; later loads are answered from
it) or ``Reduction`` (partial sums being accumulated), and counts the requests
merged into it.

* Loads: the first ``ld.cais`` misses, allocates ``Load-Wait, Count = 1`` and goes to
  the home GPU; later ones wait (deferred response) or, once ``Load-Ready``, are
  answered from the cache. The session ends when ``Count`` reaches the number of
  requesters it expects (every GPU but the home: the home reads its own memory).
* Reductions: ``red.cais`` contributions are summed in the table; when all expected
  contributions are in, one reduction carrying their count goes to the home GPU.
* Eviction when a new session needs lines and the table is full, of the session the
  replacement policy names (``switch.merge.replacement``: ``lru``, the session
  accessed longest ago, by default, or ``fifo``, the one opened first;
  ``rust/src/hw/replacement/``, one file per policy): a
  ``Load-Ready`` session is dropped; a ``Reduction`` session sends its partial sum
  home (the home accumulates: the write is an add); a ``Load-Wait`` session cannot
  go before its data is back, so it is released once the data has been handed out,
  and the arriving request bypasses the unit unmerged (no further eviction: no
  thrashing, no deadlock).
* Idle timeout: a session not accessed for ``timeout_us`` is flushed like an
  eviction, so a session whose other requesters never come (they merged into an
  earlier, evicted session) still completes. The timer keeps its own queue, in order
  of last access, whatever the replacement policy.

Requests move as trains of whole packets (a transfer unit's share of one chip): a
session covers one train's address range and holds one line per 128 B of it, all
of them or none (the session rule, ``rust/src/hw/session_rule.rs``); a
request merges with requests for exactly the same range (the ISA cuts every GPU's
accesses to one address alike). The table never holds more lines than it has: what
does not fit travels on unmerged through the switch's buffers and links, under
their credits.

The unit is compiled (``rust/src/hw/merge.rs``, re-exported here): it serves its switch
chip without entering Python, and any object with :class:`MergeHost`'s methods (the
unit tests drive it through such a stand-in).
"""

from __future__ import annotations

from typing import Any, Protocol

from cais._core import MergeStats, MergeUnit, PortSpread, Session
from cais.engine import Simulator, Train

__all__ = ["LOAD_READY", "LOAD_WAIT", "REDUCTION", "MergeHost", "MergeStats", "MergeUnit", "PortSpread", "Session"]

LOAD_WAIT = "Load-Wait"
LOAD_READY = "Load-Ready"
REDUCTION = "Reduction"


class MergeHost(Protocol):
    """What a merge unit needs from the switch chip it sits in (a compiled
    ``SwitchChip`` serves it natively)."""

    sim: Simulator

    def forward(self, train: Train) -> None:
        """Send ``train`` on to its destination port unmerged (it keeps its input buffer
        until it leaves)."""

    def take(self, train: Train, absorbed: int) -> None:
        """``train`` is taken into the merge unit as it arrives: its input buffer frees
        now; ``absorbed`` payload bytes stay in the table."""

    def answer(self, reqs: list[Train], data: Any, head: int, tail: int, source: Train | None) -> None:
        """Send load data to each requester of ``reqs``: copies of the home's response
        ``source``, or (None) responses made from the cached data."""

    def write_home(self, home: int, session: Session, head: int, on_start: Any) -> None:
        """Send a session's (partial) sum to its home GPU as one reduction; call
        ``on_start(train, start, finish)`` when it goes on the wire (the unit's lines
        free then)."""
