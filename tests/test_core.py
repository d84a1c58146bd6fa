"""The compiled core (rust/, module cais._core) as the rest of the simulator sees it:
the kinds it serves agree with the packet table, a train crosses a switch chip
natively unless a Python unit registered a handler for its kind, and bad use is
refused with a Python error, not a crash."""

import pytest

from cais import _core
from cais.engine import Channel, Credits, Simulator, Train
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
    from cais.hw.config import apply_overrides, load_system
    m = Machine(apply_overrides(load_system("dgx-h100"), {"gpus": "4", "switch.model": "cais"}))
    sw = m.fabric.switches[0]
    assert len(sw.units) == 4 and all(isinstance(u, _core.MergeUnit) for u in sw.units)
    for kind in (Kind.LD_CAIS_REQ, Kind.LD_CAIS_RESP, Kind.RED_CAIS):
        assert kind not in sw.handlers  # no Python call per request
    assert Kind.GROUP_SYNC in sw.handlers  # the Group Sync Table stays a Python unit
