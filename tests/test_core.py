"""The compiled core (rust/, module cais._core) as the rest of the simulator sees it:
the kinds it serves agree with the packet table, a train crosses a switch chip
natively unless a Python unit registered a handler for its kind, and bad use is
refused with a Python error, not a crash."""

import pytest

from cais import _core
from cais.engine import Channel, Credits, Signal, Simulator, Train
from cais.hw.packets import Kind
from cais.machine import Machine


def test_the_kinds_the_core_serves_agree_with_the_packet_table() -> None:
    assert _core.CORE_KINDS  # the loop below runs
    for name, value in _core.CORE_KINDS.items():
        assert Kind[name] == value, name


def _flag(m: Machine, src: int, dst: int, seen: list) -> Train:
    kind = Kind.FLAG
    return Train(0, *m.pk.wire(kind, 0), kind=kind, src=src, dst=dst, chip=0, vc=m.vcmap.vc(kind),
                 done=lambda t: seen.append((m.sim.now, t.dst)))


def test_a_train_crosses_a_switch_natively_or_through_a_registered_handler(h100) -> None:
    m = Machine(h100.with_overrides(gpus=2))
    seen: list = []
    m.fabric.inject(_flag(m, 0, 1, seen))
    m.run()
    down = m.fabric.down[0]  # chip 0 -> GPU g
    assert len(seen) == 1 and (down[0].trains, down[1].trains) == (0, 1)  # the crossbar forwards it to GPU 1
    native = seen[0][0]

    m = Machine(h100.with_overrides(gpus=2))
    sw = m.fabric.switches[0]
    handled: list = []

    def reroute(train: Train) -> None:  # a Python unit: send it back to its source instead
        handled.append(train.kind)
        sw.emit(train, train.src, train)

    sw.handlers[Kind.FLAG] = reroute
    seen = []
    m.fabric.inject(_flag(m, 0, 1, seen))
    m.run()
    down = m.fabric.down[0]
    assert handled == [Kind.FLAG] and len(seen) == 1 and (down[0].trains, down[1].trains) == (1, 0)
    assert seen[0][0] == native  # the same path length, the other port
    assert all(sw.ledger.balanced() for sw in m.fabric.switches)
    assert not any(sw.stuck() for sw in m.fabric.switches)


def test_the_core_counts_its_events_by_kind(h100) -> None:
    m = Machine(h100.with_overrides(gpus=2))
    seen: list = []
    m.fabric.inject(_flag(m, 0, 1, seen))
    m.sim.after(5, seen.append, "called")
    m.run()
    kinds = m.sim.events_by_kind
    assert set(kinds) == {"call", "arbitrate", "arrive", "step", "due"}
    assert sum(kinds.values()) == m.sim.events > 0
    hops = sum(ch.trains for ch in m.fabric.channels())
    assert kinds["arrive"] == hops == 2  # one arrival a channel hop: up to the chip, down to GPU 1
    assert kinds["call"] == 1 and "called" in seen


def test_bad_use_is_a_python_error() -> None:
    sim = Simulator()
    ch = Channel(sim, "c", 1.0, 0, vcs=2, credits=Credits("b", 2, 1000, 0))
    with pytest.raises(IndexError, match="VC 5"):
        ch.send(Train(10, 10, 10, kind=0, src=0, dst=1, vc=5), lambda t: None)
    with pytest.raises(ValueError, match="capacity must be positive"):
        Credits("b", 1, 0, 0)
    with pytest.raises(ValueError, match="past"):
        sim.at(-1, print)
    sim.at(5, lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):  # an exception in a callback reaches the caller
        sim.run()
    assert sim.now == 5


def _piece(start: int, data: object) -> Train:
    from cais.hw.memory import Region
    return Train(0, 32, 32, kind=Kind.READ_RESP, src=1, dst=0, addr=Region("x", start, 4), data=data)


def test_a_completion_counts_an_operations_trains_and_calls_back_once() -> None:
    calls: list = []
    counter = _core.Completion(3, lambda: calls.append("done"))
    for _ in range(3):
        assert not calls  # not before the last train
        counter(_piece(0, None))
    assert calls == ["done"] and counter.left == 0

    import numpy as np
    from cais.hw.memory import Region
    region = Region("x", 0, 12)
    pieces = [(Region("x", 0, 4), 0), (Region("x", 4, 4), 1), (Region("x", 8, 4), 2)]
    got: list = []

    def assemble(reg, pcs, parts):  # what the ISA does: the pieces' data in address order
        assert reg is region and pcs is pieces
        return np.concatenate([parts[p.start] for p, _ in pcs])
    gather = _core.Completion(3, got.append, region, pieces, assemble)
    for start in (8, 0, 4):  # out of order, as chips answer
        gather(_piece(start, np.full(4, float(start))))
    assert len(got) == 1 and list(got[0]) == [0.0] * 4 + [4.0] * 4 + [8.0] * 4

    timing: list = []
    gather = _core.Completion(2, timing.append, region, pieces[:2], assemble)
    gather(_piece(0, np.zeros(4)))
    gather(_piece(4, None))  # a piece without data (timing mode): the load has none
    assert timing == [None]


def test_signals_countdowns_and_bounds_keep_their_contracts() -> None:
    from cais.engine import Bound, Countdown, Signal
    sim = Simulator()
    sig, seen = Signal(), []
    sig.on_fire(seen.append)
    sig.fire(sim, 7)
    sig.on_fire(seen.append)  # after firing: runs at once, with the value
    assert seen == [7, 7] and sig.fired and sig.time == 0
    with pytest.raises(RuntimeError, match="fired twice"):
        sig.fire(sim)

    class Loud(Countdown):  # a Python subclass refines fire; arrive must call it
        def fire(self, sim, value=None):
            seen.append("loud")
            super().fire(sim, value)
    c = Loud(2)
    c.arrive(sim)
    c.arrive(sim)
    assert seen[-1] == "loud" and c.fired
    with pytest.raises(RuntimeError, match="below zero"):
        Countdown(1).arrive(sim, 2)

    b = Bound(sim, 100)
    assert b.acquire(60) is None
    first, second = b.acquire(60), b.acquire(10)  # FIFO: the small one waits behind the large
    assert first is not None and second is not None and b.waited == 2
    b.release(60)
    assert first.fired and second.fired and b.used == 70 and b.peak == 70
    with pytest.raises(ValueError, match="exceeds its bound"):
        b.acquire(101)
    with pytest.raises(RuntimeError, match="more than was taken"):
        b.release(1000)


def test_the_cais_switch_serves_mergeable_kinds_natively() -> None:
    from cais.config import apply_overrides, load_system
    m = Machine(apply_overrides(load_system("dgx-h100"), {"gpus": "4", "switch.model": "cais"}))
    sw = m.fabric.switches[0]
    assert len(sw.units) == 4 and all(isinstance(u, _core.MergeUnit) for u in sw.units)
    for kind in (Kind.LD_CAIS_REQ, Kind.LD_CAIS_RESP, Kind.RED_CAIS, Kind.GROUP_SYNC):
        assert kind not in sw.handlers  # no Python call per request
    assert sw.group_sync == (0, 0)  # the Group Sync Table is the chip's own


def _group_release_times(entries: int, via_issue: bool = False) -> tuple[dict[str, float], tuple[int, int]]:
    """Two TB groups of two GPUs whose keys map to one chip: GPU 0 registers with A
    and B at once, GPU 1 with B at once and with A 10 us later. When each group is
    released (us), and the chip's (registrations, most groups held). ``via_issue``:
    each registration is the generic ``Endpoint.issue`` of a ``GROUP_SYNC`` train, not
    the ISA's (``Endpoint.group_sync``)."""
    from cais.config import apply_overrides, load_system
    m = Machine(apply_overrides(load_system("dgx-h100"), {"gpus": "2", "switch.model": "cais",
                                                         "cais.sync_entries": str(entries)}))
    chip = m.isa.flag_chip(0)
    a, b = [k for k in range(1000) if m.isa.flag_chip(k) == chip][:2]
    released: dict[str, list[float]] = {"A": [], "B": []}

    def register(gpu: int, name: str, key: int) -> None:
        if via_issue:
            sig = Signal()
            m.gpus[gpu].issue(Kind.GROUP_SYNC, -1, m.isa.flag_chip(key), None, None, sig, 0, 0, tag=key, expect=2)
        else:
            sig = m.isa.group_sync(gpu, key, 2)
        sig.on_fire(lambda _: released[name].append(m.sim.now / 1e6))

    register(0, "A", a)
    register(0, "B", b)
    register(1, "B", b)
    m.sim.after(10_000_000, register, 1, "A", a)
    m.sim.run()
    assert [len(v) for v in released.values()] == [2, 2]  # every member released once
    return {k: max(v) for k, v in released.items()}, m.fabric.switches[chip].group_sync


def test_the_group_sync_table_holds_a_new_group_while_its_entries_are_full() -> None:
    """With one entry, group A holds it until its last member registers at 10 us, so
    group B (complete from the start) waits in its input buffer and is released after
    A; with two entries, B is released at once."""
    one, (regs1, peak1) = _group_release_times(1)
    two, (regs2, peak2) = _group_release_times(2)
    assert one["A"] > 10 and one["B"] > one["A"]
    assert two["B"] < 10 < two["A"]
    assert (regs1, peak1) == (4, 1) and (regs2, peak2) == (4, 2)


def test_the_isa_group_sync_is_the_generic_issue_of_a_group_sync_train() -> None:
    """``Endpoint.group_sync`` (the core builds the registration) and the generic
    ``Endpoint.issue`` of a ``GROUP_SYNC`` train release the groups at the same
    picosecond, with the same table counts."""
    for entries in (1, 2):
        assert _group_release_times(entries) == _group_release_times(entries, via_issue=True)


def test_a_region_is_a_value_compared_and_hashed_by_its_fields() -> None:
    import pickle

    from cais.hw.memory import Region

    name = "".join(["bu", "f"])  # another str object than the literal below
    a, b = Region("buf", 8, 4, 2), Region(name, 8, 4)
    assert a == b and hash(a) == hash(b) and not (a != b)
    assert {a: 1}[b] == 1  # a dict key, as the merge unit's and the L2's tables use it
    for other in (Region("buf", 9, 4), Region("buf", 8, 5), Region("buf", 8, 4, 4), Region("buf", 8, 4, 2, 2, 16),
                  Region("fub", 8, 4)):
        assert a != other and not (a == other), other
    assert a != ("buf", 8, 4, 2, 1, 0)  # only a region equals a region
    assert (a.nbytes, a.byte_offset) == (8, 16)
    assert repr(a) == "Region(buffer='buf', start=8, count=4, elem_bytes=2, rows=1, stride=0)"
    assert pickle.loads(pickle.dumps(a)) == a
    assert a.sub(1, 2) == Region("buf", 9, 2)
    blk = Region.block("m", 64, 2, 3, 8, 16, 2)  # rows 2-4, columns 8-23 of a [*, 64] matrix
    assert blk == Region("m", 2 * 64 + 8, 16, 2, 3, 64) and blk.nbytes == 3 * 16 * 2
    assert blk.row_block(1, 2) == Region("m", 3 * 64 + 8, 16, 2, 2, 64)
    assert Region.block("m", 64, 2, 3, 0, 64) == Region("m", 128, 192)  # whole rows: one run
    with pytest.raises(AttributeError):
        a.start = 0  # immutable


def _trains_by_the_rule(links: list[int], maxp: int, region, unit: int) -> list[tuple]:
    """The interleave's rule written out independently: cut at unit boundaries, deal
    each unit's packets to the links from a hashed start link, one train per chip."""
    out = []
    per = max(1, unit // region.elem_bytes)
    start, end = region.start, region.start + region.count
    while start < end:
        stop = min(end, (start // per + 1) * per)
        count, ppk = stop - start, max(1, maxp // region.elem_bytes)
        slots = -(-count // ppk)
        first_link = ((start * region.elem_bytes // unit) * 0x9E3779B97F4A7C15 >> 29) % len(links)
        per_chip: dict[int, int] = {}
        for i in range(len(links)):
            chip = links[(first_link + i) % len(links)]
            per_chip[chip] = per_chip.get(chip, 0) + slots // len(links) + (i < slots % len(links))
        first = 0
        for chip, n in per_chip.items():
            if n:
                out.append((region.buffer, start + first, min(n * ppk, count - first), chip))
                first += n * ppk
        start = stop
    return out


def test_the_address_interleave_cuts_and_deals_as_its_rule_says() -> None:
    from cais.hw.memory import Region

    links = [0] * 5 + [1] * 4 + [2] * 4 + [3] * 5  # DGX-H100: 18 links over 4 chips
    il = _core.Interleave(links, 256)
    checked = 0
    for region, unit in [(Region("x", 0, 65536), 8192), (Region("x", 1000, 50_000), 4096), (Region("y", 7, 3), 8192),
                         (Region("z", 4096 * 3 + 17, 9000, 4), 16384)]:
        got = [(r.buffer, r.start, r.count, chip) for r, chip in il.trains(region, unit)]
        assert got == _trains_by_the_rule(links, 256, region, unit), region
        assert sum(c for _, _, c, _ in got) == region.count  # every element once
        pieces = il.pieces(region, unit)
        assert all((p.start * p.elem_bytes) // unit == ((p.start + p.count) * p.elem_bytes - 1) // unit
                   for p in pieces)  # no piece straddles a unit boundary
        checked += 1
    assert checked == 4
    # a unit of exactly one packet per link: each chip carries its links' share
    per_chip: dict[int, int] = {}
    for chip, n in il.stripe(5, len(links)):
        per_chip[chip] = per_chip.get(chip, 0) + n
    assert per_chip == {0: 5, 1: 4, 2: 4, 3: 5}
    # a block is cut into whole rows, and its rows are dealt
    blk = Region.block("m", 4096, 0, 8, 0, 1024)  # 8 rows of 2 KiB
    assert [p.rows for p in il.pieces(blk, 8192)] == [4, 4]
    assert sum(r.rows for r, _ in il.trains(blk, 8192)) == 8
    # mirror mode counts the units of fewer packets than links
    assert (il.uneven_units, il.mirror_packets) == (0, 0)
    il.mirror = True
    il.trains(Region("y", 7, 3), 8192)
    assert (il.uneven_units, il.uneven_packets, il.mirror_packets) == (1, 1, 1)
    assert il.chip_of(12345) == links[(12345 * 0x9E3779B97F4A7C15 >> 29) % len(links)]


def _loads_by_hand(m: Machine, loads: list, window_limit: int, done_at: list) -> None:
    """A TB program that issues ``loads`` one by one in Python, each under its SM's
    window and the GPU's bound, as kernels did before the core streamed them."""
    from cais.engine import Bound, Countdown, Process
    from cais.kernels.common import RequestSlots

    def program():
        slots = RequestSlots(Bound(m.sim, window_limit), m.isa.request_bound(0))
        arrived = Countdown(len(loads))

        def got(nbytes):
            def done(_data) -> None:
                slots.release(nbytes)
                arrived.arrive(m.sim)
            return done
        for home, region in loads:
            yield from slots.acquire(region.nbytes)
            m.isa.ld(0, home, region, got(region.nbytes), unit=8192)
        yield arrived
        done_at.append(m.sim.now)
    Process(m.sim, program())


def test_a_load_stream_issues_as_a_tb_loop_would_and_keeps_its_bounds(h100) -> None:
    from cais.engine import Bound, Countdown, Process
    from cais.hw.memory import Region

    loads = [(1 + k % 3, Region("w", k * 4096, 4096)) for k in range(24)]  # 8 KiB each from GPUs 1-3
    by_hand: list = []
    m = Machine(h100.with_overrides(gpus=4))
    _loads_by_hand(m, loads, 32 * 1024, by_hand)
    m.run()

    m2 = Machine(h100.with_overrides(gpus=4))
    window = Bound(m2.sim, 32 * 1024)
    placed: list = []
    streamed: list = []

    def program():
        arrived = Countdown(len(loads))
        m2.isa.ld_stream(0, [(h, r, m2.isa.stripes(r, 8192), placed.append) for h, r in loads], window,
                         m2.isa.request_bound(0), arrived)
        yield arrived
        streamed.append(m2.sim.now)
    Process(m2.sim, program())
    m2.run()
    assert by_hand and streamed == by_hand  # the same picosecond
    assert m2.sim.events == m.sim.events  # and the same events
    assert window.peak == 32 * 1024 and window.waited > 0  # the window bound, and loads waited for it
    assert window.used == 0 and m2.isa.request_bound(0).used == 0  # every byte given back
    assert placed == [None] * len(loads)  # timing mode: each load's placer ran, with no data


def _reductions_by_hand(m: Machine, pieces: list, window_limit: int, signal: int, local: list, done_at: list) -> None:
    """A TB epilogue's loop, as a Python program would run it: each piece takes its
    room, goes out as ``red.cais`` through the SM's port and gives the room back once
    the switch has taken it; an add into the GPU's own memory in its turn."""
    from cais.engine import Bound, Process
    from cais.kernels.common import RequestSlots

    def program():
        slots = RequestSlots(Bound(m.sim, window_limit), m.isa.request_bound(0))
        port = m.isa.sm_port()
        for home, region in pieces:
            if home == 0:
                local.append(m.sim.now)
                continue
            yield from slots.acquire(region.nbytes)
            m.isa.red_cais(0, home, region, None, signal, lambda n=region.nbytes: slots.release(n), port,
                           unit=8192)
        if port.free_at > m.sim.now:
            yield port.free_at - m.sim.now
        done_at.append(m.sim.now)
    Process(m.sim, program())


def test_a_reduction_stream_issues_as_a_tb_epilogue_would_and_keeps_its_bounds(h100) -> None:
    from cais.engine import Bound, Process
    from cais.hw.memory import Region

    # 16 KiB pieces for GPUs 1-3, with an add into GPU 0's own memory in the middle
    pieces = [(k % 4, Region("p", k * 8192, 8192)) for k in range(20)]
    by_hand: list = []
    local_by_hand: list = []
    m = Machine(h100.with_overrides(gpus=4, switch={**h100.switch.model_dump(), "model": "cais"}))
    _reductions_by_hand(m, pieces, 32 * 1024, 7, local_by_hand, by_hand)
    m.run()

    m2 = Machine(h100.with_overrides(gpus=4, switch={**h100.switch.model_dump(), "model": "cais"}))
    window = Bound(m2.sim, 32 * 1024)
    local: list = []
    streamed: list = []

    def program():
        port = m2.isa.sm_port()
        items = [(lambda: local.append(m2.sim.now)) if home == 0 else
                 (region.nbytes, [m2.isa.red_cais_op(home, region, None, 7, 8192)]) for home, region in pieces]
        yield m2.isa.red_stream(0, items, window, m2.isa.request_bound(0), port)
        if port.free_at > m2.sim.now:
            yield port.free_at - m2.sim.now
        streamed.append(m2.sim.now)
    Process(m2.sim, program())
    m2.run()
    assert by_hand and streamed == by_hand  # the same picosecond
    assert local and local == local_by_hand  # the local adds in their turn
    assert m2.sim.events == m.sim.events  # and the same events
    assert window.peak == 32 * 1024 and window.waited > 0  # the window bound, and pieces waited for it
    assert window.used == 0 and m2.isa.request_bound(0).used == 0  # every byte given back
    landed = [m2.gpus[h].signals.get(7, 0) for h in (1, 2, 3)]
    assert landed == [m.gpus[h].signals.get(7, 0) for h in (1, 2, 3)] and min(landed) > 0  # every piece signalled


def test_a_region_stays_in_pythons_64_byte_size_class() -> None:
    # Runs hold many regions at their peak. At 80 bytes (a cached hash added to it) the
    # 1 GiB staged NVLS AllReduce's peak RSS rose from 74 to 77 MB (docs/core.md, the
    # eleventh step): what a region would need more is kept elsewhere.
    assert _core.Region.__basicsize__ <= 64
