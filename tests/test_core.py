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
