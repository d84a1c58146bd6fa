"""Issue 37: collectives at the sizes TP layers issue. NCCL's ring launch by size, the
published table's sources, and validate_presets' per-source summary."""

from __future__ import annotations

import pytest

from cais.experiments.collective import run_collective
from cais.experiments.published import FIT_SETS, TP_RANGE, Point, fitted_by, published, source_label, tp_summary
from cais.config import load_system
from cais.kernels.nvls_staged import spin_end
from cais.kernels.tuning import ring_launch


def test_ring_launch_follows_nccl_thresholds() -> None:
    # Ring LL on 8 GPUs: 64 B per thread, 512 threads -> 32 KiB per channel
    assert ring_launch(8 << 10, 8, "ll", 16) == (1, 128)
    assert ring_launch(16 << 10, 8, "ll", 16) == (1, 256)
    assert ring_launch(32 << 10, 8, "ll", 16) == (1, 512)
    assert ring_launch(64 << 10, 8, "ll", 16) == (2, 512)
    assert ring_launch(128 << 10, 8, "ll", 16) == (4, 512)
    assert ring_launch(512 << 10, 8, "ll", 16) == (16, 512)
    assert ring_launch(8, 8, "ll", 16) == (1, 96)  # never under three warps
    # Simple: 64 B per thread whatever the ranks; large buffers keep every channel
    assert ring_launch(128 << 20, 8, "simple", 16) == (16, 512)


def _cfg(**collective: object):
    cfg = load_system("dgx-h100")
    return cfg.model_validate({**cfg.model_dump(), "collective": {**cfg.collective.model_dump(), **collective}})


def _ring_ll(launch: str, nbytes: int, **collective: object) -> float:
    return run_collective(_cfg(ring_launch=launch, **collective), "allreduce", "ring", nbytes, protocol="ll").time_us


def test_ring_launch_moves_time_only_through_channels_and_threads() -> None:
    # Simple at 128 MiB: NCCL launches all 16 channels at full threads, the same run as fixed.
    big = {launch: run_collective(_cfg(ring_launch=launch), "allreduce", "ring", 128 << 20, protocol="simple",
                                  sim="mirror").time_us for launch in ("fixed", "nccl")}
    assert big["fixed"] == big["nccl"]
    # At 32 KiB LL it runs one channel: slower than 16 channels, never faster.
    assert _ring_ll("nccl", 32 << 10) > _ring_ll("fixed", 32 << 10)


def test_ll_first_wave_changes_time_only_through_its_rate() -> None:
    # ll_wave_GBps is NCCL-launch LL only: fixed runs, and Simple, ignore it.
    assert _ring_ll("fixed", 32 << 10, ll_wave_GBps=1.0) == _ring_ll("fixed", 32 << 10)
    simple = [run_collective(_cfg(ring_launch="nccl", ll_wave_GBps=w), "allreduce", "ring", 1 << 20,
                             protocol="simple").time_us for w in (1.0, 14.0)]
    assert simple[0] == simple[1]
    # 32 KiB on one 512-thread channel: each of the 14 steps stores one wave of 4 KiB
    # (one line per thread); the wave's rate adds 4 KiB / rate per step, no more.
    fast, slow = _ring_ll("nccl", 32 << 10, ll_wave_GBps=1e6), _ring_ll("nccl", 32 << 10, ll_wave_GBps=14.0)
    per_step = 4096 / 14.0e3  # us
    assert 0.8 * 14 * per_step < slow - fast < 1.2 * 14 * per_step
    # 1 MiB on 16 channels: two lines per thread, the second at the loop's rate after the first
    assert _ring_ll("nccl", 1 << 20) > _ring_ll("nccl", 1 << 20, ll_wave_GBps=1e6)


def test_hopper_presets_as_sold_launch_as_nccl_and_the_papers_keep_fixed() -> None:
    for name in ("dgx-h100", "dgx-h200", "h100-nvswitch"):
        assert load_system(name).collective.ring_launch == "nccl"
    for name in ("dgx-h100-paper", "paper-world", "nvl72"):
        assert load_system(name).collective.ring_launch == "fixed"


def test_spin_end_is_the_first_poll_reading_after_the_flag_landed() -> None:
    rtt = 1000
    for t0 in (0, 7, 333):
        for landed in range(t0 - 2000, t0 + 5000, 37):
            end, read = spin_end(t0, landed, rtt)
            assert end - read == rtt - rtt // 2 and (end - t0) % rtt == 0
            k = (read - t0 - rtt // 2) // rtt
            assert read >= landed or k == 0  # the successful poll read after the flag landed...
            assert k == 0 or read - rtt < landed  # ...and the one before it read too early
            # against a poll issued when the flag landed (oracle): between R/2 earlier and R/2 later
            assert -rtt // 2 <= end - (max(t0, landed) + rtt) <= rtt - rtt // 2


def test_spin_polls_move_staged_nvls_only_through_its_waits() -> None:
    # 2 MiB: one step per channel, so two multimem waits (scatter -> reduce) and one
    # local wait (reduce -> gather) on each channel's path; each moves the end by at
    # most its bound (a multimem round trip is under 3 us here, a local one 0.5 us).
    t = {p: run_collective(_cfg(poll=p), "allreduce", "nvls", 2 << 20).time_us for p in ("oracle", "spin")}
    assert t["spin"] != t["oracle"] and -1.5 <= t["spin"] - t["oracle"] <= 1.5 + 2 * 0.5
    # The zero-copy NVLS kernel and the ring do not poll this way.
    for algo, proto, extra in (("nvls", "simple", {"nvls_buffers": "registered"}), ("ring", "ll", {})):
        got = {p: run_collective(_cfg(poll=p, **extra), "allreduce", algo, 2 << 20, protocol=proto).time_us
               for p in ("oracle", "spin")}
        assert got["spin"] == got["oracle"]
    # Functional: the sums are right with spinning waits.
    assert run_collective(_cfg(poll="spin"), "allreduce", "nvls", 8 * 130 * 2, functional=True).correct


def test_copy_step_cost_moves_staged_nvls_only_through_its_copies() -> None:
    # 2 MiB on 16 channels x 8 heads: 16 KiB chunks, one step per channel, so the
    # channel's path holds one scatter copy and one gather copy: the end moves by
    # between one and two step costs. Zero is the kernel without the cost.
    t = {s: run_collective(_cfg(nvls_copy_step_us=s), "allreduce", "nvls", 2 << 20).time_us for s in (0.0, 4.5)}
    assert 4.5 - 1e-6 <= t[4.5] - t[0.0] <= 9.0 + 1e-6
    # The zero-copy NVLS kernel and the ring copy nothing through staging slots.
    for algo, proto, extra in (("nvls", "simple", {"nvls_buffers": "registered"}), ("ring", "ll", {})):
        got = {s: run_collective(_cfg(nvls_copy_step_us=s, **extra), "allreduce", algo, 2 << 20,
                                 protocol=proto).time_us for s in (0.0, 4.5)}
        assert got[4.5] == got[0.0]
    # The as-sold presets carry the fitted cost; the paper's presets do not.
    assert load_system("dgx-h100").collective.nvls_copy_step_us == 4.5
    assert load_system("dgx-h100-paper").collective.nvls_copy_step_us == 0.0


def test_published_rows_parse_and_name_sources() -> None:
    t = published()
    assert len(t) > 0
    for col in ("system", "gpus", "op", "algo", "bytes", "time_us", "source"):
        assert t[col].notna().all(), col
    assert (t["time_us"] > 0).all() and (t["bytes"] > 0).all()
    assert all(isinstance(s, str) and len(s.strip()) > 10 for s in t["source"])
    # every fit set names a source that is in the table
    for system, gpus, src, lo, hi, _ in FIT_SETS:
        rows = t[(t["system"] == system) & (t["gpus"] == gpus) & t["source"].str.startswith(src)]
        assert ((rows["bytes"] >= lo) & (rows["bytes"] <= hi)).any(), (system, src)


def _pt(nbytes: int, theirs: float, ours: float, source: str = "A/b (x)", system: str = "s") -> Point:
    return Point(system, 8, "allreduce", "auto", nbytes, theirs, ours, "ring/ll", source)


def test_tp_summary_on_a_fixture() -> None:
    pts = [_pt(8 << 10, 10.0, 11.0), _pt(1 << 20, 10.0, 9.5), _pt(128 << 20, 100.0, 102.0),
           _pt(4, 10.0, 20.0),  # below 8 KiB: left out
           _pt(1 << 30, 10.0, 20.0),  # above 128 MiB: left out
           _pt(1 << 20, 20.0, 30.0, source="C/d (y)")]
    t = tp_summary(pts)
    assert list(t["source"]) == ["A/b", "C/d"]
    a = t.iloc[0]
    assert a["points"] == 3 and a["fit points"] == 0
    assert a["mean |error| (%)"] == pytest.approx((10 + 5 + 2) / 3)
    assert a["max |error| (%)"] == pytest.approx(10.0)
    assert a["check mean |error| (%)"] == pytest.approx((10 + 5 + 2) / 3)
    assert not a["met"]  # mean 5.7 % > 5 %
    c = t.iloc[1]
    assert c["points"] == 1 and c["max |error| (%)"] == pytest.approx(50.0) and not c["met"]
    assert TP_RANGE == (8192, 128 << 20)


def test_fit_marker_names_the_constant() -> None:
    src = "NVIDIA/dgxc-benchmarking nccl/README.md @46e42015 (8x H100 80GB HBM3, one host, NCCL default choice)"
    assert fitted_by(Point("dgx-h100", 8, "allreduce", "auto", 1024, 1, 1, "", src)) == ["collective.host_us"]
    assert fitted_by(Point("dgx-h100", 8, "allreduce", "auto", 8192, 1, 1, "", src)) == ["collective.ll_wave_GBps"]
    assert fitted_by(Point("dgx-h100", 8, "allreduce", "auto", 65536, 1, 1, "", src)) == []
    assert fitted_by(Point("dgx-h100", 8, "allreduce", "auto", 64 << 20, 1, 1, "", src)) == \
        ["collective.nvls_copy_GBps"]
    assert source_label(src) == "NVIDIA/dgxc-benchmarking nccl/README.md @46e42015"
