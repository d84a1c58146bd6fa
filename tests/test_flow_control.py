"""Finite input buffers with credit flow control, virtual channels, the forward-progress
watchdog, and synchronisation as packets on the wire."""

from __future__ import annotations

import numpy as np
import pytest

from cais.engine import Countdown
from cais.config import PS_PER_US, ConfigError, SystemConfig, load_system
from cais.hw.gpu import Kernel
from cais.hw.memory import Region
from cais.hw.packets import KINDS, Kind, VcMap
from cais.hw.switch import NvlsSwitch
from cais.hw import switches
from cais.kernels.sync import barrier
from cais.machine import Machine, Stalled

RTT_PS = 500_000  # credit loop: 250 ns over the link, 250 ns for the credit to come back


def _system(gpus: int = 4, chips: int = 1, depth: int = 1024, scope: str = "link", policy: str = "class",
            unit: int = 512, **gpu: object) -> SystemConfig:
    """A small DGX-H100-like system: ``chips`` switch chips sharing the 18 links."""
    base = load_system("dgx-h100").model_dump()
    base["gpus"] = gpus
    base["switch"].update(chips=chips, links_per_gpu=[18 // chips] * chips)
    base["link"].update(vc_depth_flits=depth, buffer_scope=scope, vc_policy=policy)
    base["transfer_unit_bytes"] = max(unit, 512)
    base["min_transfer_unit_bytes"] = unit
    base["gpu"].update(gpu)
    return SystemConfig.model_validate(base)


def _stream_rate_GBps(cfg: SystemConfig, nbytes: int = 1 << 20) -> float:
    """Wire bytes per ns of one P2P store stream GPU 0 -> GPU 1, until it has landed."""
    m = Machine(cfg)
    landed: list[int] = []
    m.isa.st(0, 1, Region("x", 0, nbytes // 2), None, lambda: landed.append(m.sim.now),
             unit=cfg.transfer_unit_bytes)
    m.run()
    assert landed
    return sum(ch.wire_bytes for ch in m.fabric.up[0]) / landed[0] * 1000


def _credits_all_back(m: Machine) -> bool:
    for ch in m.fabric.channels():
        cr = ch.credits
        for vc in range(cr.vcs):
            if cr.held[vc] or cr.free[vc] + cr.ramped[vc] != cr.capacity:
                return False
    return True


# ---- credits ------------------------------------------------------------------------
@pytest.mark.parametrize("depth", [16, 64, 256])
def test_a_tiny_buffer_throttles_a_stream_to_capacity_per_round_trip(depth) -> None:
    cfg = _system(depth=depth, scope="port")
    expected = depth * 16 / RTT_PS * 1000  # bytes per ns
    assert _stream_rate_GBps(cfg) == pytest.approx(expected, rel=0.05)
    assert expected < 0.05 * 450  # far below the wire: the buffer, not the link, sets it


def test_the_default_depth_does_not_cap_a_single_stream(h100) -> None:
    """1024 flits per VC per link covers 25 GB/s x 500 ns = 12.5 kB: one stream fills
    the GPU's 18 links (450 GB/s of wire)."""
    assert _stream_rate_GBps(h100, 64 << 20) > 0.97 * 450


def test_every_credit_comes_back_and_conservation_holds(h100) -> None:
    from cais.kernels.collectives import CollectiveSpec, build
    for algo in ("nvls", "ring"):
        m = Machine(h100)
        for gpu, k in zip(m.gpus, build(m, CollectiveSpec("allreduce", algo, 1 << 20))):
            gpu.launch(k)
        m.run()
        for ch in m.fabric.channels():
            for vc in range(ch.credits.vcs):
                ch.credits._fold(vc, m.sim.now + 10 * RTT_PS)  # let returns still in flight land
        assert _credits_all_back(m), algo
        assert max(max(ch.credits.peak) for ch in m.fabric.channels()) > 0
        assert m.conservation().ok


def _incast_and_bystander(policy: str, with_incast: bool = True) -> int:
    """Class A: GPUs 1-3 reduce 8 MiB each into GPU 0 (its down link is 3x
    oversubscribed). Class B: GPU 1 stores 2 MiB into idle GPU 2. Returns when B has
    landed."""
    m = Machine(_system(policy=policy, unit=4096))
    landed: dict[str, int] = {}
    if with_incast:
        for src in (1, 2, 3):
            m.isa.red(src, 0, Region("acc", 0, 4 << 20), None, unit=4096)
    m.isa.st(1, 2, Region("y", 0, 1 << 20), None, lambda: landed.setdefault("B", m.sim.now), unit=4096)
    m.run()
    return landed["B"]


def test_traffic_sharing_a_vc_is_blocked_head_of_line_and_separate_vcs_are_not() -> None:
    alone = _incast_and_bystander("class", with_incast=False)
    separate = _incast_and_bystander("class")  # stores and reductions on their own VCs
    shared = _incast_and_bystander("one")      # every request on one VC
    assert separate < 2 * alone  # only GPU 1's own link is shared, round-robin
    assert shared > 5 * alone    # B waits behind reductions stuck at the congested output
    assert VcMap(_system(policy="one").link).vc(Kind.RED) == VcMap(_system(policy="one").link).vc(Kind.WRITE)


# ---- VCs and packet kinds ------------------------------------------------------------
@pytest.mark.parametrize("policy", ["class", "kernel", "one"])
def test_requests_and_responses_never_share_a_vc(policy) -> None:
    link = _system(policy=policy).link
    vcs = VcMap(link)
    req = {vcs.vc(k, None, s) for k, spec in KINDS.items() if not spec.response for s in range(6)}
    resp = {vcs.vc(k, None, s) for k, spec in KINDS.items() if spec.response for s in range(6)}
    assert req and resp and not req & resp
    assert all(0 <= v < link.vcs for v in req | resp)
    if policy == "class":  # loads, stores, reductions and flags apart
        assert len({vcs.vc(k) for k in (Kind.READ_REQ, Kind.WRITE, Kind.RED, Kind.FLAG)}) == 4
    if policy == "kernel":  # each kernel's traffic on its own VC, whatever its class
        assert vcs.vc(Kind.WRITE, None, 1) == vcs.vc(Kind.RED, None, 1) != vcs.vc(Kind.WRITE, None, 2)


def test_every_kind_is_registered_once() -> None:
    assert set(KINDS) == set(Kind)
    assert all(spec.kind == k for k, spec in KINDS.items())


# ---- the watchdog -------------------------------------------------------------------
def _crossed_reads(policy: str) -> Machine:
    """Two GPUs read 256 kB from each other through 64 B buffers, and each serves one
    read at a time."""
    m = Machine(_system(gpus=2, policy=policy, depth=4, scope="port", read_serve_kB=0.5))
    for a, b in ((0, 1), (1, 0)):
        for k in range(64):
            m.isa.ld(a, b, Region("x", k * 2048, 2048), lambda d: None, unit=512)
    return m


def test_a_protocol_deadlock_ends_in_one_line_naming_what_is_stuck() -> None:
    """With requests and responses on one VC, held reads block the responses that
    would free them: the watchdog stops the run at once, the moment the event queue
    empties (nothing left to happen), not a livelock horizon of simulated time later."""
    m = _crossed_reads("shared")
    with pytest.raises(Stalled) as err:
        m.run()
    assert m.sim.next_time() is None  # stopped on the empty queue: the deadlock check, not the livelock one
    assert m.sim.now < m.cfg.watchdog_horizon_us * PS_PER_US  # before one horizon of simulated time had passed
    msg = str(err.value)
    assert "\n" not in msg and "deadlock" in msg and "VC 0" in msg and "waiting for credits" in msg


def test_separate_request_and_response_vcs_avoid_that_deadlock() -> None:
    m = _crossed_reads("one")
    m.run()
    assert not m.pending()


def test_no_progress_for_the_horizon_stops_a_livelock() -> None:
    cfg = _system().model_copy(update={"watchdog_horizon_us": 50.0})
    m = Machine(cfg)

    def spin(sm: int, busy: int):
        while True:  # polls a flag that never comes
            yield 1_000_000

    m.gpus[0].launch(Kernel("spinner", [spin]))
    with pytest.raises(Stalled, match="no progress for 50 us.*spinner"):
        m.run()
    assert m.sim.now < 200 * 1_000_000


def test_a_program_waiting_forever_is_reported() -> None:
    m = Machine(_system())
    never = Countdown(1)

    def wait(sm: int, busy: int):
        yield never

    m.gpus[1].launch(Kernel("waiter", [wait]))
    with pytest.raises(Stalled, match="gpu1: 1 TB.*waiter"):
        m.run()


# ---- synchronisation on the wire ------------------------------------------------------
def test_an_nvls_barrier_is_flags_on_the_wire(h100) -> None:
    """Each GPU multicasts one flag (up) and receives one from every GPU (down); a GPU
    passes one GPU -> switch -> GPU trip after the last arrival."""
    m = Machine(h100)
    arrive = [Countdown(1) for _ in range(m.n)]
    late = 7_000_000  # GPU 3 arrives 7 us late
    for g, sig in enumerate(arrive):
        m.sim.at(late if g == 3 else 0, sig.arrive, m.sim)
    passed = barrier(m, arrive)
    m.run()
    flag_wire = m.pk.wire(Kind.MC_FLAG, 8)[0]
    up, down = m.fabric.bytes_per_direction()
    assert up == [flag_wire] * m.n and down == [m.n * flag_wire] * m.n
    trip = 2 * h100.link_latency_ps
    for sig in passed:
        assert late + trip <= sig.time <= late + trip + 2_000  # plus a few flits' serialisation


def test_a_switchs_copies_wait_as_descriptions_and_land_as_the_trains_it_would_have_made() -> None:
    """A multicast's copies and an ld_reduce's pulls are made as they go on the wire
    (the core's ``Fanout``): queued behind each other, every copy still lands with its
    data, and the pulls read it back for the sum."""
    m = Machine(_system(gpus=4), functional=True)
    n, count = m.n, 16_384
    data = [np.arange(count, dtype=np.float64) + 1000.0 * g for g in range(n)]
    for gpu in m.gpus:
        for g in range(n):
            gpu.memory.alloc(f"x{g}", count)
    for g in range(n):  # every GPU multicasts at once: the copies queue at every port
        m.isa.multimem_st(g, Region(f"x{g}", 0, count), data[g])
    m.sim.run(until=400_000)
    assert sum(k for row in m.fabric.down for ch in row for _, k, _ in ch.waiting()) > n  # copies waiting
    m.run()
    up = sum(ch.trains for row in m.fabric.up for ch in row)
    assert sum(ch.copies for row in m.fabric.down for ch in row) == n * up > 0
    for gpu in m.gpus:
        for g in range(n):
            assert np.array_equal(gpu.memory.buffers[f"x{g}"], data[g])
    copies = sum(ch.copies for row in m.fabric.down for ch in row)
    down = sum(ch.trains for row in m.fabric.down for ch in row)
    sums: list[np.ndarray] = []
    m.isa.multimem_ld_reduce(0, Region("x1", 0, count), sums.append)
    m.run()
    pulls = sum(ch.copies for row in m.fabric.down for ch in row) - copies
    answers = sum(ch.trains for row in m.fabric.down for ch in row) - down - pulls
    assert pulls == n * answers > 0  # a pull to every GPU per request, one sum back
    assert len(sums) == 1 and np.array_equal(sums[0], n * data[1])


def test_ring_steps_are_fenced_and_flagged_on_the_wire(h100) -> None:
    """A ring AllReduce moves 2(n-1)/n S of data per GPU; write responses and slot
    and credit flags add wire bytes but no payload, and a step waits for them."""
    from cais.kernels.collectives import CollectiveSpec, build
    m = Machine(h100)
    size = 1 << 20
    for gpu, k in zip(m.gpus, build(m, CollectiveSpec("allreduce", "ring", size // 2))):
        gpu.launch(k)
    m.run()
    # GPU 0's ring peer is GPU 1 (its write responses come back from GPU n - 1): under the presets'
    # VC per destination the data takes its destination's VC, the flags keep their own (a ready flag
    # never waits behind the next slot's data), the responses theirs
    at, back = {"src": 0, "dst": 1, "n": m.n}, {"src": 0, "dst": m.n - 1, "n": m.n}
    sync_vc, ack_vc = m.vcmap.vc(Kind.FLAG, **at), m.vcmap.vc(Kind.WRITE_ACK, **back)
    data_vc = m.vcmap.vc(Kind.WRITE, **at)
    assert m.vcmap.policy == "destination" and len({sync_vc, ack_vc, data_vc}) == 3
    for vc in (sync_vc, ack_vc, data_vc):  # flags, write responses and data all crossed GPU 0's links
        assert max(ch.credits.peak[vc] for ch in m.fabric.up[0]) > 0
    data = sum(ch.payload_bytes for ch in m.fabric.up[0])
    assert data == 2 * (m.n - 1) * size // m.n
    assert sum(ch.wire_bytes for ch in m.fabric.up[0]) > data * 160 // 128  # headers, byte enables, sync


# ---- a pluggable switch ---------------------------------------------------------------
class _CountingSwitch(NvlsSwitch):
    """A switch with one extra unit: it counts the flags it multicasts."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.flags = 0
        self.handlers[Kind.MC_FLAG] = self._count

    def _count(self, train) -> None:
        self.flags += 1
        self.multicast(train)  # then the NVLS engine's own


def test_the_switch_model_comes_from_the_config(h100, monkeypatch) -> None:
    monkeypatch.setitem(switches.SWITCH_MODELS, "counting", _CountingSwitch)
    cfg = h100.model_copy(update={"switch": h100.switch.model_copy(update={"model": "counting"})})
    m = Machine(cfg)
    arrive = [Countdown(0) for _ in range(m.n)]
    for sig in arrive:
        sig.fire(m.sim)
    barrier(m, arrive)
    m.run()
    assert all(isinstance(sw, _CountingSwitch) for sw in m.fabric.switches)
    assert sum(sw.flags for sw in m.fabric.switches) == m.n


def test_an_unknown_switch_model_is_a_one_line_config_error(h100) -> None:
    cfg = h100.model_copy(update={"switch": h100.switch.model_copy(update={"model": "nosuch"})})
    with pytest.raises(ConfigError, match="switch.model.*nosuch.*valid: auto, nvls, cais"):
        Machine(cfg)


def test_the_paper_preset_keeps_its_literal_buffers() -> None:
    paper = load_system("dgx-h100-paper")
    assert (paper.link.vcs, paper.link.vc_depth_flits) == (8, 256)
    assert load_system("dgx-h100").link.vc_depth_flits * 16 >= 25 * 500  # >= one link's bandwidth x round trip

