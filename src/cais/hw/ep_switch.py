"""The CAIS-EP switch chip: a CAIS switch (NVLS, a merge unit per port) with a
dynamic multicast group table per GPU-facing input port, the hardware of
``st.mc.dyn`` (docs/moe.md, "In-switch expert parallelism").

A dynamic multimem address names a *group* of the sending port's table and an offset.
The group's entry holds the member mask (one bit per GPU port); the chip sends one copy
of every ``st.mc.dyn`` train it receives to each member, at the same offset (the
receive buffers are laid out alike on every GPU, as NVLS replicas are), through the
NVLS engine's replication (``SwitchChip.multicast_to``: its ledger counts the bytes it
creates). The runtime binds a group's entry before the data moves (:meth:`GroupTable.bind`,
what a layout step's table write stands for) and frees it when the group is done; a
bind that finds the table full is refused (an overflow), and the sender then sends the
group's rows as unicast copies. A lookup that finds no entry is a miss (it cannot happen
when the runtime only sends to groups it bound; it is counted, and the train is refused).

The table's SRAM is sized as the merge unit's (``switch.merge.entries`` lines of
``switch.merge.line_bytes``: 40 KB per port by default) unless set otherwise
(:meth:`EpSwitch.size_tables`); an entry takes ``entry_bytes`` (the mask of ``gpus``
bits plus a 16-bit group tag and a valid bit, rounded up to a power of two). A lookup
may take ``lookup_ps`` (pipelined: the copies leave that much later, and the train holds
its input buffer until they have). Telemetry per table: entries bound at the peak, binds, overflows, lookups,
misses; :meth:`EpSwitch.group_stats` sums a chip's ports."""

from __future__ import annotations

from dataclasses import dataclass

from cais.engine import Train
from cais.hw.cais_switch import CaisSwitch
from cais.hw.packets import Kind


def entry_bytes(gpus: int) -> int:
    """Bytes of one group entry: a ``gpus``-bit member mask, a 16-bit group tag and a
    valid bit, rounded up to a power of two (at least 4)."""
    bits = gpus + 16 + 1
    size = 4
    while size * 8 < bits:
        size *= 2
    return size


@dataclass
class GroupStats:
    """A group table's telemetry: entries held at the peak, binds, refused binds
    (overflows), lookups and lookups that found no entry (misses)."""

    peak: int = 0
    binds: int = 0
    overflows: int = 0
    lookups: int = 0
    misses: int = 0

    def add(self, other: GroupStats) -> None:
        self.peak = max(self.peak, other.peak)
        self.binds += other.binds
        self.overflows += other.overflows
        self.lookups += other.lookups
        self.misses += other.misses


class GroupTable:
    """One input port's dynamic multicast group table: ``capacity`` entries, each a
    group tag -> the member GPUs its stores are copied to."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"capacity: must be at least 0, got {capacity}")
        self.capacity = capacity
        self.entries: dict[int, tuple[int, ...]] = {}
        self.stats = GroupStats()

    def bind(self, group: int, members: tuple[int, ...]) -> bool:
        """Write group ``group``'s entry; False (an overflow) when the table is full."""
        if group in self.entries:
            self.entries[group] = members
            return True
        if len(self.entries) >= self.capacity:
            self.stats.overflows += 1
            return False
        self.entries[group] = members
        self.stats.binds += 1
        self.stats.peak = max(self.stats.peak, len(self.entries))
        return True

    def free(self, group: int) -> None:
        self.entries.pop(group, None)

    def lookup(self, group: int) -> tuple[int, ...] | None:
        self.stats.lookups += 1
        got = self.entries.get(group)
        if got is None:
            self.stats.misses += 1
        return got


class EpSwitch(CaisSwitch):
    """A CAIS switch chip that also multicasts ``st.mc.dyn`` stores to the members of a
    dynamic group: one :class:`GroupTable` per input port (module doc)."""

    has = "NVLS, CAIS merge units and dynamic multicast group tables (st.mc.dyn)"

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        n = len(self.units)
        cfg = self.merge_cfg
        budget = int(cfg.entries) * int(cfg.line_bytes)
        self.entry_bytes = entry_bytes(n)
        self.tables = [GroupTable(budget // self.entry_bytes) for _ in range(n)]
        self.lookup_ps = 0
        self.handlers[Kind.MC_DYN_STORE] = self._dyn_store

    def size_tables(self, table_bytes: int, lookup_ps: int = 0) -> None:
        """Give every port's table ``table_bytes`` of SRAM (before any bind) and a
        lookup latency of ``lookup_ps``."""
        if table_bytes < 0 or lookup_ps < 0:
            raise ValueError("table_bytes and lookup_ps must be at least 0")
        self.tables = [GroupTable(table_bytes // self.entry_bytes) for _ in self.tables]
        self.lookup_ps = lookup_ps

    def _dyn_store(self, train: Train) -> None:
        members = self.tables[train.src].lookup(train.tag)
        if members is None:
            raise RuntimeError(f"sw{self.chip}: st.mc.dyn from gpu{train.src} to unbound group {train.tag}")
        if self.lookup_ps:  # the copies leave that much later (a pipelined lookup, as the chip's pipeline latency)
            train.head += self.lookup_ps
            train.tail += self.lookup_ps
        self.multicast_to(train, list(members), int(Kind.WRITE))

    def group_stats(self) -> GroupStats:
        """The chip's ports' telemetry: summed counts, the largest port's peak."""
        out = GroupStats()
        for t in self.tables:
            out.add(t.stats)
        return out
