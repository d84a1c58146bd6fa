"""NCCL's protocols and algorithm choice, the host's per-call cost and the NVLS
reduction engine (issue 22): each as a mechanism, checked against what it must do
and, where published points exist, against them."""

from __future__ import annotations

import numpy as np
import pytest

from cais.errors import UserError
from cais.experiments.collective import run_collective
from cais.experiments.published import compare, published, summary
from cais.config import load_system
from cais.kernels.protocols import LL, LL128, SIMPLE
from cais.kernels.tuning import choose


@pytest.fixture(scope="module")
def h100():
    return load_system("dgx-h100")


@pytest.mark.parametrize("proto", ["ll", "ll128", "simple"])
@pytest.mark.parametrize("op", ["allreduce", "allgather", "reducescatter"])
def test_every_protocol_moves_the_right_data(op: str, proto: str) -> None:
    cfg = load_system("dgx-h100", gpus=4)
    r = run_collective(cfg, op, "ring", 3 * 4099 * 2 * 4, functional=True, protocol=proto)
    assert r.correct and r.protocol == proto and r.chosen_by == "asked"
    c = r.conservation
    assert c.injected == c.delivered + c.absorbed - c.created  # payload is conserved whatever the line format


def test_line_formats_cost_wire_bytes_not_payload(h100) -> None:
    size = 4 << 20
    wire = {p: sum(run_collective(h100, "allgather", "ring", size, protocol=p).metrics.as_json()["wire_bytes"]["0"]
                   .values()) for p in ("simple", "ll128", "ll")}
    # LL's lines are half flags, LL128's 8 of 128 bytes; Simple's flags are separate small packets
    assert wire["ll"] / wire["simple"] == pytest.approx(LL.encoding, rel=0.05)
    assert wire["ll128"] / wire["simple"] == pytest.approx(LL128.encoding, rel=0.05)
    assert SIMPLE.encoding == 1.0


def test_ll_is_the_fastest_for_small_messages_and_simple_for_large(h100) -> None:
    small = {p: run_collective(h100, "allreduce", "ring", 4096, protocol=p).time_us for p in ("ll", "ll128", "simple")}
    assert small["ll"] < small["simple"]  # no fence and no flag packet per step
    large = {p: run_collective(h100, "allreduce", "ring", 64 << 20, protocol=p).time_us for p in ("ll", "simple")}
    assert large["simple"] < large["ll"]  # half of LL's wire bytes are flags, and its loop is slow


def test_nccl_chooses_ring_ll_below_about_a_megabyte_and_nvls_above() -> None:
    def pick(size: int) -> tuple[str, str]:
        c = choose("allreduce", size, 8, 18, 16, 16, "sm90")
        return c.algo, c.protocol
    assert pick(8) == ("ring", "ll") and pick(512 << 10) == ("ring", "ll")
    assert pick(2 << 20) == ("nvls", "simple") and pick(1 << 30) == ("nvls", "simple")
    assert choose("allreduce", 1 << 30, 8, 18, 16, 16, "sm90", algo="ring").protocol == "simple"
    with pytest.raises(UserError, match="simple protocol only"):
        choose("allreduce", 8, 8, 18, 16, 16, "sm90", algo="nvls", protocol="ll")


def test_auto_reports_what_it_ran(h100) -> None:
    r = run_collective(h100, "allreduce", "auto", 64 << 10, protocol="auto")
    assert (r.algo, r.protocol, r.chosen_by) == ("ring", "ll", "nccl")
    assert r.as_json()["protocol"] == "ll" and r.as_json()["chosen_by"] == "nccl"
    with pytest.raises(UserError, match="protocol: unknown 'll64'"):
        run_collective(h100, "allreduce", "ring", 4096, protocol="ll64")


def test_host_cost_adds_to_a_standalone_call(h100) -> None:
    base = h100.with_overrides(collective={**h100.collective.model_dump(), "host_us": 0.0})
    a = run_collective(base, "allreduce", "ring", 4096, protocol="ll").time_us
    b = run_collective(h100, "allreduce", "ring", 4096, protocol="ll").time_us
    assert h100.collective.host_us > 0 and b - a == pytest.approx(h100.collective.host_us, abs=0.01)


def test_reduction_engine_sets_nvls_time_when_it_binds() -> None:
    cfg = load_system("nvl72", gpus=16)  # the zero-copy kernel: the engine alone against the links
    cfg = cfg.with_overrides(collective={**cfg.collective.model_dump(), "nvls_buffers": "registered"})
    free = cfg.with_overrides(switch={**cfg.switch.model_dump(), "reduce_GBps": None})
    size = 16 << 20
    t_free = run_collective(free, "allreduce", "nvls", size, sim="mirror").time_us
    rate = 200.0  # GB/s of operands per chip: far below what the links carry
    slow = cfg.with_overrides(switch={**cfg.switch.model_dump(), "reduce_GBps": rate})
    t_slow = run_collective(slow, "allreduce", "nvls", size, sim="mirror").time_us
    engine_us = 16 * size / cfg.switch.chips / (rate * 1e3)  # n operands of every byte, spread over the chips
    assert t_slow > 2 * t_free
    assert engine_us < t_slow < engine_us + t_free  # the engine and the links overlap
    full = run_collective(slow, "allreduce", "nvls", size).time_us  # mirror mode charges the images' work
    assert full == pytest.approx(t_slow, rel=0.05)


def test_nvl72_runs_nccl_tests_staged_kernel_whose_copies_set_its_8_gpu_top() -> None:
    """The preset runs what nccl-tests runs on GB200 (the staged kernel on NCCL 2.26's
    32 sm100 channels). Its two calibrations are fitted one after the other
    (scripts/calibrate_nvl72.py), which holds only if the switch's reduction rate does
    not bind at 8 GPUs while the copy rate does."""
    cfg = load_system("nvl72", gpus=8)
    assert cfg.collective.nvls_buffers == "staged" and cfg.collective.nvls_channels == 32
    size = 256 << 20
    base = run_collective(cfg, "allreduce", "nvls", size, sim="mirror")
    free = cfg.with_overrides(switch={**cfg.switch.model_dump(), "reduce_GBps": None})
    unbound = run_collective(free, "allreduce", "nvls", size, sim="mirror").time_us
    assert unbound == pytest.approx(base.time_us, rel=1e-4)
    faster = cfg.with_overrides(collective={**cfg.collective.model_dump(), "nvls_copy_GBps": 30.0})
    assert base.nvls_buffers == "staged"
    assert run_collective(faster, "allreduce", "nvls", size, sim="mirror").time_us < 0.9 * base.time_us


def test_published_points_carry_their_source() -> None:
    t = published()
    assert len(t) >= 50 and t["source"].str.len().min() > 20
    assert set(t["system"]) == {"dgx-h100", "dgx-h200", "nvl72"}
    h = t[(t["system"] == "dgx-h100") & (t["bytes"] == 8 << 30)]
    assert h["busbw_GBps"].iloc[0] == pytest.approx(480.2, abs=0.5)  # as nccl-tests printed it


def test_small_messages_on_dgx_h100_within_the_target() -> None:
    """host_us was fitted on the published points up to 2 KiB; the points from 8 KiB
    to 512 KiB are the check (issue 22's target below 1 MB: mean |error| <= 25 %)."""
    pts = [p for p in compare("dgx-h100", max_bytes=512 << 10) if p.nbytes >= 8 << 10]
    assert len(pts) >= 7
    assert np.mean([abs(p.error) for p in pts]) <= 0.25
    s = summary(pts)
    assert bool(s["met"].iloc[0])


@pytest.mark.parametrize("scheme,algo,proto", [("tp-nvls", "nvls", "simple"), ("sp-nvls", "nvls", "simple"),
                                               ("tp-ring", "ring", "ll"), ("sp-ring", "ring", "ll"),
                                               ("tp-nccl", "ring", "ll"), ("sp-nccl", "ring", "ll")])
def test_a_layer_with_nccl_s_choice_is_exact_and_says_what_ran(scheme: str, algo: str, proto: str) -> None:
    """collective.layer_choice = nccl: a decode layer's small collectives run in the
    algorithm the scheme names, forced as NCCL_ALGO forces it, in NCCL's protocol by
    size for it (Ring/LL; NVLS has Simple only); tp-nccl and sp-nccl run NCCL's own
    choice (Ring/LL). Each still reproduces the unsharded layer exactly, and the
    result says which algorithm and protocol its calls ran; with layer_choice =
    scheme the named algorithm runs in Simple, and tp-nccl and sp-nccl still run
    NCCL's choice."""
    from cais.experiments.layer import run_layer
    from cais.workload.models import load_model

    nccl = load_system("dgx-h100", gpus=4)  # the H100 as sold: NCCL's own choice per call
    assert nccl.collective.layer_choice == "nccl"
    cfg = nccl.with_overrides(collective={**nccl.collective.model_dump(), "layer_choice": "scheme"})
    model = load_model("paper-mega-gpt-4b").with_run(batch=8, seq=256)
    r = run_layer(nccl, model, scheme, "decode", functional=True, seed=5)
    assert r.checked > 0 and r.mismatches == []
    ran = r.as_json()["collectives"]
    assert ran["choice"] == "nccl" and ran["ran"] and set(ran["ran"]) == {f"{algo}/{proto}"}
    plain = run_layer(cfg, model, scheme, "decode").as_json()["collectives"]
    own = "ring/ll" if scheme.endswith("nccl") else f"{algo}/simple"  # the *-nccl schemes: NCCL's choice anyway
    assert plain["choice"] == "scheme" and set(plain["ran"]) == {own}
    assert sum(plain["ran"].values()) == sum(ran["ran"].values()) == (4 if scheme.startswith("sp") else 2)


def test_a_scheme_runs_the_algorithm_it_names_on_the_h100_as_sold() -> None:
    """Issue 56: on dgx-h100 (layer_choice = nccl) tp-ring runs ring collectives and
    tp-nvls NVLS ones, whatever NCCL would pick by size, so their times differ; only
    the protocol is NCCL's by size. tp-nccl runs NCCL's own choice: NVLS for a
    prefill's 3 MiB all-reduces (tp-nvls's run, event for event), Ring/LL for a
    decode's small ones."""
    from cais.experiments.layer import run_layer
    from cais.kernels.tuning import choose_for
    from cais.workload.models import load_model

    cfg = load_system("dgx-h100", gpus=4)
    assert cfg.collective.layer_choice == "nccl"
    prefill = load_model("paper-mega-gpt-4b").with_run(batch=1, seq=512)  # 3 MiB all-reduces: NCCL picks NVLS
    nbytes = 512 * prefill.hidden * prefill.dtype_bytes
    assert choose_for(cfg, "allreduce", nbytes).algo == "nvls"
    ring_proto = choose_for(cfg, "allreduce", nbytes, algo="ring").protocol
    r = {s: run_layer(cfg, prefill, s, "prefill") for s in ("tp-ring", "tp-nvls", "tp-nccl")}
    assert r["tp-ring"].collectives_ran == {f"ring/{ring_proto}": 2}
    assert r["tp-nvls"].collectives_ran == r["tp-nccl"].collectives_ran == {"nvls/simple": 2}
    assert r["tp-ring"].total_us != r["tp-nvls"].total_us
    assert r["tp-nccl"].total_us == r["tp-nvls"].total_us and r["tp-nccl"].events == r["tp-nvls"].events
    decode = prefill.with_run(batch=8, seq=256)  # 8 token rows: NCCL picks Ring/LL
    d = {s: run_layer(cfg, decode, s, "decode") for s in ("tp-nvls", "tp-nccl")}
    assert d["tp-nvls"].collectives_ran == {"nvls/simple": 2} and d["tp-nccl"].collectives_ran == {"ring/ll": 2}
    assert d["tp-nvls"].total_us != d["tp-nccl"].total_us


def test_a_collective_forced_to_an_algorithm_says_only_its_protocol_was_chosen(h100) -> None:
    r = run_collective(h100, "allreduce", "nvls", 64 << 10, protocol="auto")  # NCCL would pick Ring/LL here
    assert (r.algo, r.protocol, r.chosen_by) == ("nvls", "simple", "nccl-protocol")
