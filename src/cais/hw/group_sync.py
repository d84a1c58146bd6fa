"""The Group Sync Table of a CAIS switch chip (paper §III-B.2, Fig. 8(b)): it counts
the TBs of a TB group that have registered (one empty packet from each GPU's TB-group
synchroniser) and, once every GPU of the group has, releases them all (one empty
packet to each). Its entries are finite (``cais.sync_entries``): a registration for a
new group that finds the table full waits in its input buffer, holding its credits,
until an entry frees."""

from __future__ import annotations

from collections import deque
from typing import Protocol

from cais.engine import Simulator, Train


class SyncHost(Protocol):
    """What the table needs from its switch chip."""

    sim: Simulator

    def consume(self, train: Train) -> None:
        """``train`` leaves its input buffer now."""

    def release(self, group: int, members: list[Train]) -> None:
        """Send the group's release to the GPU of each registration in ``members``."""


class GroupSyncTable:
    """Registrations per TB group key, up to ``entries`` groups at once."""

    def __init__(self, host: SyncHost, entries: int) -> None:
        self.host = host
        self.entries = entries
        self.groups: dict[int, list[Train]] = {}  # group key -> registrations so far
        self.waiting: deque[Train] = deque()  # registrations for new groups, table full
        self.peak = 0
        self.registrations = 0

    def register(self, req: Train) -> None:
        """A TB of group ``req.tag`` on GPU ``req.src`` registers; the group has
        ``req.expect`` TBs."""
        if req.tag not in self.groups and len(self.groups) >= self.entries:
            req.left += 1  # stays in its input buffer
            self.waiting.append(req)
            return
        self._admit(req)

    def _admit(self, req: Train) -> None:
        self.registrations += 1
        members = self.groups.setdefault(req.tag, [])
        members.append(req)
        self.peak = max(self.peak, len(self.groups))
        self.host.consume(req)
        if len(members) >= req.expect:
            del self.groups[req.tag]
            self.host.release(req.tag, members)
            while self.waiting and (self.waiting[0].tag in self.groups or len(self.groups) < self.entries):
                self._admit(self.waiting.popleft())

    def stuck(self) -> list[str]:
        if not self.groups:
            return []
        key, members = next(iter(self.groups.items()))
        return [f"group sync table: {len(self.groups)} TB group(s) waiting for members (group {key}: "
                f"{len(members)} of {members[0].expect} registered)"]
