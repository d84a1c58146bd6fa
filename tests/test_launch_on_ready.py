"""Launch on ready (``gpu.tb_launch``): a TB whose first step waits is placed on an SM
only once what it waits for is in; what placed TBs still wait for is measured
(``tb_wait_us``); CAIS's pre-launch registrations go out before dispatch, in launch
order and one wave ahead; the optimizer's SM split; every scheme stays exact."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from cais._core import TbDispatcher
from cais.config import apply_overrides, load_system
from cais.engine import Signal, Simulator
from cais.engine.sim import ProgramGen
from cais.experiments.layer import run_layer
from cais.hw.group_sync import TbGroupRegistrar
from cais.opt.fusion import asymmetric_split, choose_split

from test_schemes import GPT


def _kernel() -> SimpleNamespace:
    return SimpleNamespace(started_at=None, finished_at=None, tb_ps=0, tb_wait_ps=0)


def _runs(delay: int, wait: Signal | None = None) -> Any:
    def tb(sm: int, busy: int) -> ProgramGen:
        if wait is not None:
            yield wait
        yield delay
    return tb


def _one_sm(gated: bool) -> tuple[TbDispatcher, SimpleNamespace]:
    """One SM; a kernel of two TBs: TB 0 waits for a flag raised at 50 ps, then runs
    100 ps; TB 1 runs 100 ps at once. ``gated``: TB 0 is held back until the flag."""
    sim = Simulator()
    d = TbDispatcher(sim, 1)
    d.tb_log = []
    flag = Signal()
    k = _kernel()
    kid = d.enqueue(k, "k", [_runs(100, flag), _runs(100)], None, 0, False, Signal(), [1, 0] if gated else None)
    if gated:
        flag.on_fire(lambda _v: d.open(kid, 0))
    sim.after(50, flag.fire, sim)
    sim.run()
    return d, k


def test_a_gated_tb_holds_no_sm_until_its_data_are_in() -> None:
    d, k = _one_sm(gated=True)
    # TB 1 takes the SM at once; TB 0, ready at 50, gets it when TB 1 ends
    assert sorted(d.tb_log) == [("k", 0, 0, 100), ("k", 0, 100, 200)]
    assert (k.tb_ps, k.tb_wait_ps) == (200, 0)


def test_an_ungated_tb_waits_holding_its_sm_and_the_wait_is_counted() -> None:
    d, k = _one_sm(gated=False)
    # TB 0 takes the SM at 0 and spins until the flag at 50: TB 1 runs after it
    assert sorted(d.tb_log) == [("k", 0, 0, 150), ("k", 0, 150, 250)]
    assert (k.tb_ps, k.tb_wait_ps) == (250, 50)


def test_opening_a_tb_with_no_gate_shut_is_an_error() -> None:
    sim = Simulator()
    d = TbDispatcher(sim, 1)
    kid = d.enqueue(_kernel(), "k", [_runs(10)], None, 0, False, Signal(), [0])
    with pytest.raises(ValueError, match="no gate shut"):
        d.open(kid, 0)
    with pytest.raises(ValueError, match="1 gate counts for 2 TBs"):
        d.enqueue(_kernel(), "k2", [_runs(10), _runs(10)], None, 0, False, Signal(), [0])


def test_the_registrar_registers_in_launch_order_one_window_ahead() -> None:
    sim = Simulator()
    data = [Signal() for _ in range(5)]
    registered: list[tuple[int, int]] = []
    pending: dict[int, Signal] = {}

    def register(group: int, members: int) -> Signal:
        registered.append((group, members))
        pending[group] = Signal()
        return pending[group]

    reg = TbGroupRegistrar(sim, register, 100, 2, 8, [[s] for s in data], window=2)
    assert registered == []  # no TB's data are in
    data[1].fire(sim)
    assert registered == []  # TB 1 waits for TB 0: launch order
    data[0].fire(sim)
    assert registered == [(100, 8), (102, 8)]  # TBs 0 and 1: the window is full
    for s in data[2:]:
        s.fire(sim)
    assert len(registered) == 2
    pending[100].fire(sim)  # TB 0's group released: its gate opens, TB 2 registers
    assert reg.gates[0][0].fired and not reg.gates[1][0].fired
    assert registered[-1] == (104, 8)


def _four(**sets: str):
    return apply_overrides(load_system("dgx-h100"), {"gpus": "4", **sets})


def test_cais_ln_tbs_wait_holding_sms_only_when_launched_in_order() -> None:
    waits = {}
    for rule in ("on-ready", "on-launch"):
        r = run_layer(_four(**{"gpu.tb_launch": rule, "remote_read.strategy": "staged"}), GPT, "cais", "prefill")
        kernels = r.as_json()["kernels"]
        ln = [v for name, v in kernels.items() if name.startswith("dropout_add_ln")]
        assert ln, "the fused pipeline's LN kernels ran"
        waits[rule] = sum(v["tb_wait_us"] for v in ln)
        assert all(v["tb_us"] > 0 for v in ln)
    assert waits["on-ready"] == 0.0 < waits["on-launch"]


@pytest.mark.parametrize("scheme", ["cais", "cais-wo-coord", "cais-sw", "t3", "ladm", "fuselib", "coconet"])
@pytest.mark.parametrize("rule", ["on-ready", "on-launch"])
def test_schemes_are_exact_under_either_launch_rule(scheme: str, rule: str) -> None:
    r = run_layer(_four(**{"gpu.tb_launch": rule}), GPT, scheme, "train", functional=True, seed=3)
    assert r.checked >= 60 and r.mismatches == []


@pytest.mark.parametrize("split", ["none", "work", "auto"])
def test_cais_is_exact_whatever_the_sm_split(split: str) -> None:
    r = run_layer(_four(**{"cais.split": split}), GPT, "cais", "train", functional=True, seed=5)
    assert r.checked >= 60 and r.mismatches == []
    subs = r.as_json()["sublayers"]
    chosen = [(v["gemm_rs_sms"], v["ag_gemm_sms"]) for v in subs.values() if "gemm_rs_sms" in v]
    assert chosen, "every fused sub-layer reports its split"
    if split == "none":
        assert all(a == b == r.sms for a, b in chosen)
    if split == "work":
        assert all(a + b == r.sms for a, b in chosen)


def test_the_optimizer_splits_only_where_links_outweigh_compute() -> None:
    # compute-bound: each GEMM longer than its direction's link time; no split
    assert choose_split(400, 600, 170, 170, 32).split == "none"
    # link-bound: both at once hide the links; split in proportion to the work
    c = choose_split(100, 300, 350, 350, 32)
    assert c.split == pytest.approx(0.25) and c.split_ps < c.none_ps
    rs, ag = asymmetric_split(100, 300, 66, "none")
    assert rs == ag == frozenset(range(66))


def test_the_bound_stretches_compute_by_the_slowest_gpu() -> None:
    base = run_layer(_four(), GPT, "tp-nvls", "prefill")
    fast = run_layer(_four().model_copy(update={"gpu_slowdown": {g: 0.5 for g in range(4)}}), GPT, "tp-nvls",
                     "prefill")
    for name, sub in base.sublayers.items():
        assert fast.sublayers[name]["compute_us"] == pytest.approx(0.5 * sub["compute_us"], rel=1e-6)


def test_t3s_copy_engine_pays_its_start_per_command() -> None:
    free = run_layer(_four(**{"gpu.copy_engine.start_us": "0"}), GPT, "t3", "prefill")
    paid = run_layer(_four(**{"gpu.copy_engine.start_us": "2.8"}), GPT, "t3", "prefill")
    assert paid.total_us > free.total_us


def test_coordinated_tbs_sharing_one_sm_pool_never_deadlock() -> None:
    """A slow merge unit (0.3 lookups per ns) with both fused GEMMs on every SM: placed
    in different orders on different GPUs, each GPU's SMs filled with TBs waiting at
    their pre-access syncs for members the others kept off their SMs (a deadlock at
    2,235.8 us). Placed in one order, the run completes with no sync timing out."""
    from cais.workload.models import load_model

    cfg = apply_overrides(load_system("dgx-h100"), {"switch.merge.lookups_per_ns": "0.3"})
    r = run_layer(cfg, load_model("paper-llama-7b"), "cais", "prefill", 66)
    assert r.total_us > 0 and "sync_timeouts" not in r.as_json()
    assert all(v["gemm_rs_sms"] == v["ag_gemm_sms"] == 66 for v in r.sublayers.values()), "one pool: no split"


def test_a_sync_entry_that_times_out_releases_its_members_and_is_counted() -> None:
    """A group that cannot complete in time (a 1 ns timeout) releases the members it
    has; the late ones go at once; the layer stays exact and the timeouts are counted."""
    cfg = _four(**{"cais.sync_timeout_us": "0.001"})
    r = run_layer(cfg, GPT, "cais", "prefill", functional=True, seed=2)
    assert r.mismatches == [] and r.as_json().get("sync_timeouts", 0) > 0
