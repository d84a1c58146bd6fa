"""The discrete-event core: ordering, processes, channel timing, cut-through, VCs."""

import pytest

from cais.engine import Channel, Countdown, Process, Signal, Simulator, Train


def _train(wire: int, vc: int = 0, packet: int = 144) -> Train:
    return Train(wire, wire, packet, kind=0, src=0, dst=1, vc=vc)


def test_same_time_events_run_in_schedule_order() -> None:
    sim, seen = Simulator(), []
    for i in range(5):
        sim.at(10, seen.append, i)
    sim.at(5, seen.append, "first")
    sim.run()
    assert seen == ["first", 0, 1, 2, 3, 4]
    assert sim.now == 10


def test_scheduling_in_the_past_is_refused() -> None:
    sim = Simulator()
    sim.at(10, lambda: sim.at(5, lambda: None))
    with pytest.raises(ValueError, match="past"):
        sim.run()


def test_process_sleeps_and_waits_on_signals() -> None:
    sim, log = Simulator(), []
    sig = Signal()
    done = Countdown(2)

    def waiter():
        value = yield sig
        log.append((sim.now, value))
        done.arrive(sim)

    def sleeper():
        yield 100
        sig.fire(sim, "go")
        yield 50
        log.append((sim.now, "slept"))
        done.arrive(sim)

    Process(sim, waiter())
    Process(sim, sleeper())
    sim.run()
    assert log == [(100, "go"), (150, "slept")]
    assert done.fired and done.time == 150


def test_one_train_costs_serialisation_plus_latency() -> None:
    sim = Simulator()
    ch = Channel(sim, "c", ps_per_byte=10.0, latency_ps=1000)
    got = []
    t = _train(1440)
    ch.send(t, lambda tr: got.append((sim.now, tr.head)))
    sim.run()
    assert got == [(14400 + 1000, 1440 + 1000)]


def test_cut_through_two_hops_pay_one_serialisation() -> None:
    sim = Simulator()
    a = Channel(sim, "a", 10.0, 1000)
    b = Channel(sim, "b", 10.0, 1000)
    got = []
    a.send(_train(14400), lambda tr: b.send(tr, lambda t2: got.append(sim.now)))
    sim.run()
    # 144000 ps on the wire once, two latencies, plus one packet of pipeline delay.
    assert got == [144000 + 2 * 1000 + 1440]


def test_fifo_within_a_vc_and_busy_time() -> None:
    sim = Simulator()
    ch = Channel(sim, "c", 1.0, 0)
    ends = []
    for _ in range(3):
        ch.send(_train(1000), lambda tr: ends.append(sim.now))
    sim.run()
    assert ends == [1000, 2000, 3000]
    assert ch.busy_ps == 3000 and ch.trains == 3


def test_round_robin_between_virtual_channels() -> None:
    sim = Simulator()
    ch = Channel(sim, "c", 1.0, 0, vcs=2)
    order = []
    ch.send(_train(100, vc=0), lambda tr: order.append("busy"))  # occupies the wire
    for i in range(3):
        ch.send(_train(100, vc=0), lambda tr, i=i: order.append(f"a{i}"))
    for i in range(3):
        ch.send(_train(100, vc=1), lambda tr, i=i: order.append(f"b{i}"))
    sim.run()
    assert order == ["busy", "a0", "b0", "a1", "b1", "a2", "b2"]
