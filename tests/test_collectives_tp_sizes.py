"""Issue 37: collectives at the sizes TP layers issue. NCCL's ring launch by size, the
published table's sources, and validate_presets' per-source summary."""

from __future__ import annotations

import pytest

from cais.experiments.collective import run_collective
from cais.experiments.published import FIT_SETS, TP_RANGE, Point, fitted_by, published, source_label, tp_summary
from cais.hw.config import load_system
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


def _ring_ll(launch: str, nbytes: int) -> float:
    cfg = load_system("dgx-h100")
    cfg = cfg.model_validate({**cfg.model_dump(), "collective": {**cfg.collective.model_dump(), "ring_launch": launch}})
    return run_collective(cfg, "allreduce", "ring", nbytes, protocol="ll").time_us


def test_ring_launch_moves_time_only_through_channels_and_threads() -> None:
    # From 512 KiB NCCL launches all 16 channels at full threads: the same run as fixed.
    assert _ring_ll("nccl", 512 << 10) == _ring_ll("fixed", 512 << 10)
    # At 32 KiB it runs one channel: slower than 16 channels, never faster.
    assert _ring_ll("nccl", 32 << 10) > _ring_ll("fixed", 32 << 10)


def test_presets_keep_fixed_launch() -> None:
    for name in ("dgx-h100", "dgx-h200", "h100-nvswitch", "nvl72", "dgx-h100-paper", "paper-world"):
        assert load_system(name).collective.ring_launch == "fixed"


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
    assert fitted_by(Point("dgx-h100", 8, "allreduce", "auto", 8192, 1, 1, "", src)) == []
    assert fitted_by(Point("dgx-h100", 8, "allreduce", "auto", 64 << 20, 1, 1, "", src)) == \
        ["collective.nvls_copy_GBps"]
    assert source_label(src) == "NVIDIA/dgxc-benchmarking nccl/README.md @46e42015"
