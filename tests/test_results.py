"""The recorder and the run metrics: one definition of link utilisation, link busy
time over bins, buffer occupancy from credit logs, kernel roles, Machine.mark."""

from types import SimpleNamespace

import numpy as np
import pytest

from cais.experiments.collective import run_collective
from cais.experiments.layer import kernel_split
from cais.config import PS_PER_US
from cais.hw.gpu import Kernel
from cais.machine import Machine
from cais.results import Recorder, link_utilisation
from cais.results.metrics import buffer_peaks_kB, wire_bytes_per_gpu
from cais.results.occupancy import level_steps, occupancy, peak_per_bin
from cais.results.ports import PortDirection, port_direction
from cais.results.timeline import busy_per_bin


@pytest.fixture(scope="module")
def recorded(h100):
    rec = Recorder(bin_ps=50_000)
    r = run_collective(h100, "allreduce", "nvls", 1 << 20, recorder=rec)
    return r, rec


def test_link_util_is_bytes_over_gpu_bandwidth_times_span(recorded) -> None:
    r, rec = recorded
    m = rec.m
    span = round(r.time_us * PS_PER_US) - m.launch_ps
    gbps = m.cfg.link.bandwidth_GBps * m.cfg.links_per_gpu  # bytes per ns
    wire = wire_bytes_per_gpu(m.record(span))
    lu = r.link_util
    assert set(lu.per_gpu) == set(range(m.n))
    for g in range(m.n):
        for d in ("up", "down"):
            assert lu.per_gpu[g][d] == pytest.approx(wire[g][d] / (gbps * span / 1000), rel=1e-12)
            assert 0 < lu.per_gpu[g][d] <= 1
    values = [u for dirs in lu.per_gpu.values() for u in dirs.values()]
    assert lu.mean == pytest.approx(sum(values) / len(values))
    chans = m.fabric.channels()
    assert lu.max == max(ch.busy_ps for ch in chans) / span == r.wire_util
    assert lu.max >= max(values) * 0.99  # a port is at least about as busy as its GPU's mean
    # wire bytes are the channels' counters, summed per GPU direction
    assert sum(w["up"] + w["down"] for w in wire.values()) == sum(ch.wire_bytes for ch in chans)
    # the same numbers without a recorder
    plain = run_collective(m.cfg, "allreduce", "nvls", 1 << 20)
    assert plain.link_util == lu


def test_bins_integrate_to_each_channels_busy_time(recorded) -> None:
    _, rec = recorded
    busy = rec.link_busy()
    chans = {ch.name: ch for ch in rec.m.fabric.channels()}
    assert set(busy) == set(chans) and all(len(b) == rec.n_bins() for b in busy.values())
    for name, bins in busy.items():
        assert bins.sum() == pytest.approx(chans[name].busy_ps, abs=1e-3)
        assert (bins >= 0).all() and (bins <= rec.bin_ps + 1e-6).all()
    util = rec.link_util_bins()
    assert max(u.max() for u in util.values()) > 0.5


def test_busy_per_bin_splits_intervals_exactly() -> None:
    # 1500 bytes at 1 ps/B from 0: 1000 ps in bin 0, 500 in bin 1
    assert busy_per_bin([(0, 1500, 1500)], 1.0, 1000, 3).tolist() == pytest.approx([1000, 500, 0])
    # a train whose tail arrives late: 1000 ps of wire time spread over [500, 2500]
    assert busy_per_bin([(500, 2500, 1000)], 1.0, 1000, 3).tolist() == pytest.approx([250, 500, 250])
    # back-to-back trains and a gap
    out = busy_per_bin([(0, 400, 400), (400, 900, 500), (2100, 2200, 100)], 1.0, 1000, 3)
    assert out.tolist() == pytest.approx([900, 0, 100])
    assert busy_per_bin([], 1.0, 1000, 2).tolist() == [0, 0]


class FakeCredits:
    """The credit-counter interface the fabric exposes (capacity, vcs, name, log)."""

    def __init__(self, vcs: int = 2, capacity: int = 4096) -> None:
        self.capacity, self.vcs, self.name, self.log = capacity, vcs, "fake", None


def test_occupancy_from_unordered_deltas() -> None:
    log = [(30, 0, -100), (10, 0, 100), (40, 0, -50), (20, 0, 50),  # vc0: 100, 150, 50, 0
           (5, 1, -8), (5, 1, 8), (60, 1, 8)]  # vc1: a same-time +/- nets to 0, then 8 from 60
    t, lv = level_steps(log, 0)
    assert t.tolist() == [10, 20, 30, 40] and lv.tolist() == [100, 150, 50, 0]
    occ = occupancy(t, lv, 0, 50)
    assert occ.peak_bytes == 150
    assert occ.mean_bytes == pytest.approx((100 * 10 + 150 * 10 + 50 * 10) / 50)
    assert occupancy(t, lv, 15, 35).mean_bytes == pytest.approx((100 * 5 + 150 * 10 + 50 * 5) / 20)
    t1, lv1 = level_steps(log, 1)
    assert occupancy(t1, lv1, 0, 100).peak_bytes == 8
    assert occupancy(t1, lv1, 0, 100).mean_bytes == pytest.approx(8 * 40 / 100)
    assert peak_per_bin(t, lv, 25, 3).tolist() == [150, 150, 0]  # 150 lasts from 20 to 30
    assert peak_per_bin(t, lv, 30, 2).tolist() == [150, 50]


def _with_fake_port(m: Machine, monkeypatch, credits: FakeCredits) -> SimpleNamespace:
    fake = SimpleNamespace(name="gpu0->sw9", credits=credits, timeline=None, busy_ps=0, wire_bytes=0,
                           ps_per_byte=1.0)
    real = m.fabric.channels()
    monkeypatch.setattr(m.fabric, "channels", lambda: real + [fake])
    return fake


def test_recorder_reads_credit_logs_and_peaks(h100, monkeypatch) -> None:
    m = Machine(h100)
    credits = FakeCredits()
    _with_fake_port(m, monkeypatch, credits)
    rec = Recorder(bin_ps=100)
    rec.attach(m)
    assert credits.log == []
    credits.log += [(150, 1, 2000), (50, 0, 1000), (250, 1, -2000), (120, 0, -1000)]
    occ = rec.buffer_occupancy(0, 300)["gpu0->sw9"]
    assert [o.peak_bytes for o in occ] == [1000, 2000]
    assert occ[0].mean_bytes == pytest.approx(1000 * 70 / 300) and occ[1].mean_bytes == pytest.approx(2000 * 100 / 300)
    assert buffer_peaks_kB(m.record(0))["gpu0->sw9"] == 2.0
    credits.peak = [3000, 500]  # a counter that keeps its own peaks is preferred
    assert buffer_peaks_kB(m.record(0))["gpu0->sw9"] == 3.0
    bins = rec.buffer_peak_bins()["gpu0->sw9"]
    assert bins[1][:3].tolist() == [0, 2000, 2000]


def test_without_a_recorder_nothing_is_logged(h100) -> None:
    m = Machine(h100)
    assert m.recorder is None
    m.mark(0, "collective", "x", 0, 1)  # dropped
    assert all(ch.timeline is None for ch in m.fabric.channels())
    assert all(g.kernel_log is None and g.tb_log is None for g in m.gpus)
    assert all(ch.credits.log is None for ch in m.fabric.channels())
    assert set(buffer_peaks_kB(m.record(0)).values()) == {0.0}  # peaks are counted without a recorder; nothing ran
    assert link_utilisation(m.record(0)).mean == 0.0


def test_marks_and_kernels_are_recorded(recorded) -> None:
    _, rec = recorded
    m = rec.m
    for g in range(m.n):
        kernels = rec.kernels(g)
        assert [k.role for k in kernels] == ["communication"]
        marks = [mk for mk in rec.marks if mk.gpu == g and mk.name == "nvls allreduce"]
        assert len(marks) == 1 and (marks[0].start_ps, marks[0].end_ps) == (kernels[0].started_at,
                                                                           kernels[0].finished_at)
        assert len(rec.tb_spans(g)) == m.cfg.collective.nvls_channels
    with pytest.raises(ValueError, match="one machine"):
        rec.attach(m)


def test_kernel_split_uses_the_role_not_the_name() -> None:
    def k(name: str, role: str, us: int) -> Kernel:
        return Kernel(name, [], role=role, started_at=0, finished_at=us * 1_000_000)
    run = SimpleNamespace(kernels=[("a", 0, k("nvls-lookalike", "compute", 3)), ("b", 0, k("x", "communication", 5)),
                                   ("c", 1, k("y", "communication", 7))])
    assert kernel_split(run) == {"communication": 5.0, "computation": 3.0}


def test_port_names() -> None:
    assert port_direction("gpu3->sw1") == PortDirection(3, 1, "up")
    assert port_direction("sw1->gpu3") == PortDirection(3, 1, "down")
    assert port_direction("sw1->sw2") is None


def test_bad_bin_width_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        Recorder(bin_ps=0)
    assert np.isfinite(busy_per_bin([(0, 0, 0)], 1.0, 10, 1)).all()
