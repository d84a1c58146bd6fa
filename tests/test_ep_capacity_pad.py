"""Capacity ``pad`` through the EP kernels (docs/moe.md, "Capacity padding"): the nccl
kernel sends each (source rank, expert)'s padding rows as Megatron-Core's all-to-all
dispatcher does, the allgather kernel's padding is made after its exchange, and every
other kernel refuses ``pad`` in one line."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from cais.config import load_system
from cais.errors import UserError
from cais.experiments.ep import EP_KERNELS, functional_check, nccl_rows_conserved, run_ep
from cais.kernels import ep_nccl
from cais.kernels.ep_common import EpCall
from cais.kernels.ep_registry import capacity_pad, check_capacity
from cais.machine import Machine
from cais.workload.routing import Routing, generate

SYSTEM = "hgx-h800"
RANKS, TOKENS, HIDDEN, TOPK, EXPERTS = 8, 24, 128, 2, 16


def _routing(capacity: str, cf: float = 1.0, seed: int = 3) -> Routing:
    return generate("powerlaw", RANKS, TOKENS, EXPERTS, TOPK, seed=seed, alpha=1.5, capacity_factor=cf,
                    capacity=capacity)


def _remote(rt: Routing, rows: np.ndarray) -> int:
    """Rows of a [ranks, experts] count that go to another rank's experts."""
    owners = np.arange(rt.experts) // rt.per_rank
    return int(rows[owners[None, :] != np.arange(rt.ranks)[:, None]].sum())


def _wire(kernel: str, call: EpCall):
    """The machine after one timing run of ``kernel``'s ``call`` (its fabric's byte balance)."""
    m = Machine(load_system(SYSTEM))
    ks = EP_KERNELS[kernel].kernels(m, call)
    for gpu, k in zip(m.gpus, ks):
        gpu.launch(k, m.launch_ps)
    m.run()
    return m.conservation()


def test_the_registry_says_who_pads_and_where() -> None:
    places = {k: capacity_pad(mod) for k, mod in EP_KERNELS.items()}
    assert places["nccl"] == "exchanged" and places["allgather"] == "local"
    assert {k for k, p in places.items() if p is None} == set(EP_KERNELS) - {"nccl", "allgather"}
    assert len(places) > 4  # the in-switch family is in the registry too


@pytest.mark.parametrize("op", ["dispatch", "combine"])
def test_nccl_sends_the_padding_rows_the_routing_gives(op: str) -> None:
    padded, dropped = _routing("pad"), _routing("drop")
    assert np.array_equal(padded.topk_idx, dropped.topk_idx) and padded.pad_rows.sum() > 0
    cap = math.ceil(TOKENS * TOPK / EXPERTS)
    assert (padded.expert_rows() == cap).all()  # every (rank, expert) filled to capacity
    for rt in (padded, dropped):
        call = EpCall(op, rt, HIDDEN)
        assert np.array_equal(ep_nccl.send_counts(call), rt.matrix("expert"))
        c = _wire("nccl", call)
        remote = _remote(rt, rt.expert_rows())
        assert c.injected == c.delivered == remote * call.row_bytes and c.ok  # bytes sent = received
    pad_wire = _wire("nccl", EpCall(op, padded, HIDDEN)).injected - _wire("nccl", EpCall(op, dropped, HIDDEN)).injected
    pad_remote = _remote(padded, padded.pad_rows)
    assert pad_remote > 0 and pad_wire == pad_remote * 2 * HIDDEN
    r = run_ep(load_system(SYSTEM), "nccl", op, TOKENS, HIDDEN, TOPK, EXPERTS, routing="powerlaw", seed=3, alpha=1.5,
               capacity_factor=1.0, capacity="pad")
    assert r.padded == int(padded.pad_rows.sum()) and r.pad_bytes == pad_wire


def test_allgather_moves_no_padding_but_its_experts_compute_it() -> None:
    padded, dropped = _routing("pad"), _routing("drop")
    for op in ("dispatch", "combine"):
        assert _wire("allgather", EpCall(op, padded, HIDDEN)).injected == \
            _wire("allgather", EpCall(op, dropped, HIDDEN)).injected > 0
    cap = math.ceil(TOKENS * TOPK / EXPERTS)
    assert padded.expert_rows().sum() == RANKS * EXPERTS * cap > dropped.expert_rows().sum()
    r = run_ep(load_system(SYSTEM), "allgather", "dispatch", TOKENS, HIDDEN, TOPK, EXPERTS, routing="powerlaw",
               seed=3, alpha=1.5, capacity_factor=1.0, capacity="pad")
    assert r.padded == int(padded.pad_rows.sum()) > 0 and r.pad_bytes == 0


def test_a_huge_capacity_factor_makes_every_rank_and_expert_equal() -> None:
    rt = _routing("pad", cf=40.0)
    cap = math.ceil(40.0 * TOKENS * TOPK / EXPERTS)
    assert rt.dropped() == 0 and (rt.expert_rows() == cap).all()
    call = EpCall("dispatch", rt, HIDDEN)
    counts = ep_nccl.send_counts(call)
    assert (counts == cap * rt.per_rank).all()
    assert [len(rows) for rows in ep_nccl.recv_layout(call)] == [RANKS * cap * rt.per_rank] * RANKS
    r = run_ep(load_system(SYSTEM), "nccl", "dispatch", TOKENS, HIDDEN, TOPK, EXPERTS, routing="powerlaw", seed=3,
               alpha=1.5, capacity_factor=40.0, capacity="pad")
    assert r.send_matrix == counts.tolist() and r.imbalance == 1.0


@pytest.mark.parametrize("kernel", sorted(set(EP_KERNELS) - {"nccl", "allgather"}))
def test_kernels_without_padding_refuse_pad_in_one_line_and_run_drop(kernel: str) -> None:
    cfg = load_system(SYSTEM)
    with pytest.raises(UserError) as info:
        run_ep(cfg, kernel, "dispatch", 8, HIDDEN, TOPK, EXPERTS, capacity_factor=1.0, capacity="pad")
    msg = str(info.value)
    assert msg.startswith("capacity:") and "\n" not in msg and "nccl, allgather" in msg and kernel in msg
    r = run_ep(cfg, kernel, "dispatch", 8, HIDDEN, TOPK, EXPERTS, routing="powerlaw", alpha=2.0, capacity_factor=0.5,
               capacity="drop")
    assert r.dropped > 0 and r.padded == 0 and r.time_us > 0


def test_bad_capacity_values_are_one_line() -> None:
    with pytest.raises(UserError, match=r"^capacity: unknown 'fill'; valid: none, drop, pad$"):
        check_capacity(EP_KERNELS["nccl"], "fill")
    with pytest.raises(UserError, match=r"^capacity_factor: must be positive"):
        run_ep(load_system(SYSTEM), "nccl", "dispatch", 8, HIDDEN, TOPK, EXPERTS, capacity="pad")


@pytest.mark.parametrize("kernel", ["nccl", "allgather"])
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_functional_exact_with_padding(kernel: str, dtype: str) -> None:
    r = run_ep(load_system(SYSTEM), kernel, "dispatch", 16, 256, 3, 16, dtype, routing="powerlaw", alpha=1.5,
               capacity_factor=1.25, capacity="pad", functional=True, seed=5)
    assert r.padded > 0 and r.dropped > 0 and r.correct is True


def test_functional_check_sees_padding_and_a_wrong_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_system(SYSTEM)
    rt = _routing("pad")
    call = EpCall("dispatch", rt, HIDDEN)
    layouts = ep_nccl.recv_layout(call)
    pads = sum(1 for rows in layouts for _, t, _ in rows if t == TOKENS)
    assert pads == int(rt.pad_rows.sum()) > 0 and nccl_rows_conserved(call)
    assert functional_check(cfg, "nccl", call) is True
    r, i = next((r, i) for r, rows in enumerate(layouts) for i, row in enumerate(rows) if row[1] == TOKENS)
    short = [rows if q != r else rows[:i] + rows[i + 1:] for q, rows in enumerate(layouts)]
    with monkeypatch.context() as mp:  # a rank that misses one padding row is caught
        mp.setattr(ep_nccl, "recv_layout", lambda c: short)
        assert not nccl_rows_conserved(call)
    x = np.random.default_rng(0).integers(-4, 5, size=(RANKS, TOKENS, HIDDEN)).astype(np.float64)
    wrong = np.zeros((RANKS, TOKENS, HIDDEN))  # the real answer is not zero: the comparison must fail
    assert functional_check(cfg, "nccl", call, x=x, reference=wrong) is False


def test_cli_ep_pad_json_and_refusal(capsys: pytest.CaptureFixture[str]) -> None:
    from cais.cli import main

    base = ["ep", "--system", SYSTEM, "--op", "dispatch", "--tokens", "32", "--hidden", "256", "--topk", "2",
            "--experts", "16", "--routing", "powerlaw", "--capacity-factor", "1.25", "--capacity", "pad"]
    assert main([*base, "--kernel", "nccl", "--json"]) in (0, None)
    out = json.loads(capsys.readouterr().out)
    assert out["padded"] > 0 and out["pad_bytes"] > 0 and out["time_us"] > 0
    assert main([*base, "--kernel", "deepep"]) == 2
    err = capsys.readouterr().err.strip()
    assert "capacity" in err and "nccl, allgather" in err and "\n" not in err and "Traceback" not in err
