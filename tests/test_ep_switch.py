"""The in-switch EP family (kernels/ep_switch.py, hw/ep_switch.py, cost/group_table.py;
docs/moe.md, "In-switch expert parallelism")."""

from __future__ import annotations

import inspect
import json
import runpy
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cais.config import apply_overrides, load_system
from cais.cost import group_table as G
from cais.experiments import ep_table as E
from cais.cost import merge_unit as M
from cais.errors import UserError
from cais.experiments.ep import EP_KERNELS, on_switch, run_ep
from cais.experiments.ep_ladder import MoeBlock, run_rung
from cais.hw.ep_switch import EpSwitch, GroupTable, entry_bytes
from cais.kernels import ep_switch
from cais.kernels.ep_common import EpCall, ep_constants
from cais.machine import Machine
from cais.workload.routing import Routing, generate

ROOT = Path(__file__).resolve().parents[1]
FAMILY = sorted(ep_switch.VARIANTS)


def _run(kernel: str, op: str, tokens: int = 24, hidden: int = 256, topk: int = 4, experts: int = 16,
         functional: bool = False, **knobs: object) -> tuple[Machine, list]:
    cfg = load_system("dgx-h100")
    k = ep_switch.VARIANTS[kernel].with_(**knobs)
    cfg = on_switch(cfg, k)
    rt = generate("uniform", cfg.gpus, tokens, experts, topk, 3)
    call = EpCall(op, rt, hidden, "fp8" if op == "dispatch" else "bf16", None, False, ep_constants())
    m = Machine(cfg, functional=functional)
    ks = k.kernels(m, call)
    for gpu, kern in zip(m.gpus, ks):
        gpu.launch(kern, m.launch_ps)
    m.run()
    return m, ks


def test_the_family_is_registered_and_each_is_exact() -> None:
    assert set(FAMILY) == {"ep-switch", "ep-switch-mcast", "ep-switch-red", "ep-switch-unfused", "ep-switch-sw"}
    assert set(FAMILY) <= set(EP_KERNELS)
    cfg = load_system("dgx-h100")
    for kernel in FAMILY:  # dispatch and combine through a tiny MoE layer, against the unsharded one
        r = run_ep(cfg, kernel, "dispatch", 20, 256, 4, 16, "fp8", functional=True, seed=4)
        assert r.correct is True, kernel


def test_multicast_and_reduction_paths_are_taken_and_bytes_conserved() -> None:
    m, _ = _run("ep-switch", "dispatch")
    c = m.conservation()
    stats = [sw.group_stats() for sw in m.fabric.switches if isinstance(sw, EpSwitch)]
    assert len(stats) == len(m.fabric.switches) and sum(s.lookups for s in stats) > 0 and sum(s.misses for s in stats) == 0
    assert c.created > 0 and c.absorbed == 0  # copies made in the switch, nothing reduced
    assert c.injected + c.created == c.delivered and c.per_switch_ok and c.per_channel_ok
    m, _ = _run("ep-switch", "combine")
    c = m.conservation()
    assert sum(u.stats.merged for sw in m.fabric.switches for u in sw.units) > 0
    assert c.absorbed > 0 and c.created == 0 and c.injected == c.delivered + c.absorbed and c.per_switch_ok
    m, _ = _run("ep-switch-sw", "dispatch")
    c = m.conservation()
    assert c.created == 0 and c.injected == c.delivered  # unicast only


def test_multicast_sends_each_row_up_once() -> None:
    cfg = load_system("dgx-h100")
    sw = run_ep(cfg, "ep-switch-sw", "dispatch", 64, 1024, 8, 64, "bf16")
    mc = run_ep(cfg, "ep-switch", "dispatch", 64, 1024, 8, 64, "bf16")
    rt = generate("uniform", 8, 64, 64, 8, 0)
    hit = rt.in_rank()[0]
    remote = hit[:, 1:].sum(axis=1)
    assert sw.own_bytes == int(remote.sum()) * 2048
    assert mc.own_bytes == int((remote > 0).sum()) * 2048 < sw.own_bytes


def test_runs_are_deterministic() -> None:
    a = [k.finished_at for k in _run("ep-switch", "combine", functional=True)[1]]
    b = [k.finished_at for k in _run("ep-switch", "combine", functional=True)[1]]
    assert a == b and max(a) > 0


def test_a_full_table_falls_back_to_unicast_and_stays_exact() -> None:
    m, _ = _run("ep-switch", "dispatch", functional=True, table_bytes=2 * entry_bytes(8))
    stats = [sw.group_stats() for sw in m.fabric.switches if isinstance(sw, EpSwitch)]
    assert len(stats) == 4 and all(s.peak == 2 and s.overflows > 0 for s in stats)
    assert m.conservation().created > 0
    cfg = load_system("dgx-h100")
    k = ep_switch.VARIANTS["ep-switch"].with_(table_bytes=2 * entry_bytes(8))
    rt = generate("uniform", 8, 16, 16, 4, 1)
    call = EpCall("dispatch", rt, 256, "bf16", None, False, ep_constants())
    assert ep_switch.Plan.of(call, k, 8, 2).overflow[0] > 0


def test_lookup_latency_and_fusion_change_the_time() -> None:
    cfg = load_system("dgx-h100")
    b = MoeBlock(256, hidden=1024, topk=8, experts=64, ffn=512)
    fast = run_rung(cfg, "ep-switch", b)
    slow = run_rung(cfg, "ep-switch", b, lookup_ns=4000.0)
    assert slow.time_us > fast.time_us and fast.group_peak > 0
    fused = run_rung(cfg, "ep-switch", b, block_tokens=64)
    unfused = run_rung(cfg, "ep-switch-unfused", b)
    assert fused.time_us != unfused.time_us


def _recording_unit(send: Any, seen: set[int]) -> Any:
    """``send`` (an Isa method), adding the transfer unit of each call to ``seen``."""
    sig = inspect.signature(send)

    def wrapped(*a: object, **kw: object) -> None:
        seen.add(sig.bind(*a, **kw).arguments["unit"])
        send(*a, **kw)
    return wrapped


def test_the_fused_combine_is_sized_on_its_bf16_partials_after_an_fp8_dispatch(monkeypatch) -> None:
    """After an FP8 dispatch the fused kernel's combine sends BF16 partials: its transfer
    unit and in-flight window are a BF16 row's, its dispatch's an FP8 row's."""
    base = load_system("dgx-h100")
    cfg = base.with_overrides(collective={**base.collective.model_dump(), "outstanding_bytes_per_sm": 1024})
    limits: list[int] = []

    class Recording(ep_switch.Window):
        def __init__(self, sim: object, limit: int) -> None:
            limits.append(limit)
            super().__init__(sim, limit)  # type: ignore[arg-type]
    monkeypatch.setattr(ep_switch, "Window", Recording)
    rt = generate("uniform", cfg.gpus, 32, 16, 4, 3)
    call = EpCall("dispatch", rt, 7168, "fp8", None, False, ep_constants())
    row = ep_switch.combine_row_bytes(call)
    assert call.fp8 and call.row_bytes == 7392 < row == 14336  # the FP8 path: the dispatch's row is the smaller
    ran = []
    for kernel, sends in (("ep-switch", ("st_mc_dyn", "red_cais")), ("ep-switch-sw", ("st", "red"))):
        k = ep_switch.VARIANTS[kernel]
        m = Machine(on_switch(cfg, k))
        units: dict[str, set[int]] = {name: set() for name in sends}
        for name in sends:  # record the transfer unit each send is cut in
            monkeypatch.setattr(m.isa, name, _recording_unit(getattr(m.isa, name), units[name]))
        limits.clear()
        ks = k.layer_kernels(m, call, ep_switch.ExpertFfn(256, "fp8"))
        for gpu, kern in zip(m.gpus, ks):
            gpu.launch(kern, m.launch_ps)
        m.run()
        dispatch, combine = sends
        assert units[dispatch] == {cfg.unit_for(call.row_bytes)} != units[combine] == {cfg.unit_for(row)}, kernel
        assert set(limits) == {2 * call.row_bytes, 2 * row}, kernel  # each a TB's window: dispatch's, combine's
        ran.append(kernel)
    assert len(ran) == 2


def test_group_table_binds_until_full_and_counts() -> None:
    t = GroupTable(2)
    assert t.bind(1, (1, 2)) and t.bind(2, (3, 4)) and not t.bind(3, (5, 6))
    assert t.lookup(1) == (1, 2) and t.lookup(3) is None
    t.free(1)
    assert t.bind(3, (5, 6))
    assert (t.stats.peak, t.stats.binds, t.stats.overflows, t.stats.lookups, t.stats.misses) == (2, 3, 1, 2, 1)
    assert [entry_bytes(n) for n in (8, 32, 72)] == [4, 8, 16]


def test_groups_needed_count_distinct_remote_sets() -> None:
    # 4 ranks x 4 tokens, top-2 of 8 experts (two per rank): rank 0's tokens go to {1, 2}, {1, 2}, {1, 3}
    # and {0, 1} (one remote rank: no group); the other ranks' tokens to rank 0 only
    idx = np.array([[[2, 4], [4, 2], [2, 6], [0, 2]]] + [[[0, 1]] * 4] * 3)
    rt = Routing(idx, np.ones(idx.shape), 8, source="test")
    assert E.groups_per_port(rt).tolist() == [2, 0, 0, 0]
    assert E.groups_per_port(rt, 2).tolist() == [2, 0, 0, 0]  # blocks {1,2},{1,2} and {1,3}: two together
    rt = generate("uniform", 8, 256, 64, 8, 0)
    call = E.groups_per_port(rt)
    assert 0 < call.max() <= 2 ** 7 - 1 - 7  # sets of two or more of the 7 other ranks
    assert E.groups_per_port(rt, 32).max() <= 2 * call.max()
    need = E.table_need("uniform", 8, 64, 64, 8, seeds=3, block_tokens=16)
    assert [n["lifetime"] for n in need] == ["call", "block"] and all(n["bytes_p99"] > 0 for n in need)


def test_lookup_cost_is_the_merge_units_content_array() -> None:
    c = G.lookup_cost()
    data = M.scale(M.stored()["cells"]["itrs-hp"]["data/t1/1rw/bf16"], M.VERDICT_NM)
    assert c["area_mm2"] == data["area_mm2"] and c["lookups_per_ns"] > 0
    assert G.packets_per_ns(128.0, 128) == 1.0


def test_bad_input_names_the_field() -> None:
    cfg = load_system("dgx-h100")
    with pytest.raises(UserError, match="^sms:"):
        run_ep(cfg, "ep-switch", "dispatch", 8, 256, 2, 16, sms=3)
    nvls = cfg.with_overrides(switch={**cfg.switch.model_dump(), "model": "nvls"})
    with pytest.raises(UserError, match="^switch.model:"):
        run_ep(nvls, "ep-switch", "dispatch", 8, 256, 2, 16)
    assert run_ep(nvls, "ep-switch-sw", "dispatch", 8, 256, 2, 16).time_us > 0  # the software one runs on NVLS
    with pytest.raises(UserError, match="^group_order:"):
        _run("ep-switch", "dispatch", group_order="random")


def test_the_page_holds_the_stored_runs_and_a_stored_rung_reruns_alike() -> None:
    lad = runpy.run_path(str(ROOT / "scripts" / "ep_switch_ladder.py"))  # the script's names, main() not run
    data = json.loads(lad["STORE"].read_text())
    modes = json.loads(lad["MODES_STORE"].read_text())
    page = (ROOT / "docs" / "moe.md").read_text()
    block = page.split(lad["BEGIN"], 1)[1].split(lad["END"], 1)[0].strip()
    assert block == lad["section"](data, modes).strip()
    assert {r["world"] for r in data["rungs"]} == {w[0] for w in lad["GRID"]} >= {"dgx-h100", "gh200-nvl32"}
    assert all(r["commit"] for r in data["rungs"] if r["world"] == "gh200-nvl32")  # stamped when rerun alone
    small = [r for r in data["rungs"] if r["system"] == "dgx-h100" and r["tokens"] == min(
        x["tokens"] for x in data["rungs"]) and r["routing"] == "uniform" and r["kernel"] in ("deepep", "ep-switch")]
    assert len(small) == 2
    made = data["made_on"]  # the fabric and EP constants the stored runs were made on
    cfg = apply_overrides(load_system("dgx-h100"), made["sets"])
    consts = ep_constants().model_copy(update=made["ep_constants"])
    for r in small:
        again = run_rung(cfg, r["kernel"], MoeBlock(r["tokens"]), r["routing"], constants=consts)
        assert again.time_us == pytest.approx(r["time_us"], rel=1e-9), r["kernel"]


def test_a_partial_ladder_rerun_runs_only_its_rungs_on_the_stores_settings(load_script, monkeypatch) -> None:
    """``--kernels``: only the named rungs (and their one-knob, links-bind and break-even
    runs) run again, on the fabric and EP constants the store was made on, stamped with
    the commit; the others are kept with theirs, in the stored order."""
    from cais.experiments.ep_ladder import RungResult

    lad = load_script("ep_switch_ladder")
    data = json.loads(lad.STORE.read_text())
    made = data["made_on"]
    calls: list[tuple[str, str, float, dict]] = []

    def fake(cfg, kernel, b, routing="uniform", constants=None, **knobs):  # type: ignore[no-untyped-def]
        calls.append((kernel, cfg.link.vc_policy, constants.sm_copy_GBps, knobs))
        return RungResult(kernel, routing, b.tokens, -1.0, None, None, None, 0, 0, 0, 0.0)
    monkeypatch.setattr(lad, "run_rung", fake)
    monkeypatch.setattr(lad, "commit", lambda: "rerun")
    out = lad.rerun_world(data, None, ("ep-switch-red",))
    key = [(r["world"], r["tokens"], r["routing"], r["kernel"]) for r in data["rungs"]]
    assert [(r["world"], r["tokens"], r["routing"], r["kernel"]) for r in out["rungs"]] == key
    again = [r for r in out["rungs"] if r["kernel"] == "ep-switch-red"]
    assert len(calls) == len(again) == sum(k[3] == "ep-switch-red" for k in key) > 1
    assert all(r["time_us"] == -1.0 and r["commit"] == "rerun" for r in again)
    assert [r for r in out["rungs"] if r["kernel"] != "ep-switch-red"] == [
        r for r in data["rungs"] if r["kernel"] != "ep-switch-red"]
    assert {c[1:3] for c in calls} == {(made["sets"]["link.vc_policy"], made["ep_constants"]["sm_copy_GBps"])}
    calls.clear()
    out = lad.rerun_sensitivity(data, ("ep-switch-red",))
    assert out["sensitivity"] == data["sensitivity"] and out["break_even"] == data["break_even"]
    assert out["break_even_ref"]["commit"] == "rerun" and out["break_even_ref"]["time_us"] == -1.0
    moved = [x for x in out["links_bind"] if x.get("commit") == "rerun"]
    assert {x["kernel"] for x in moved} == {"ep-switch-red"} and len(moved) == 2
    assert len(out["links_bind"]) == len(data["links_bind"])
    assert {c[2] for c in calls if c[0] == "ep-switch-red" and not c[3]} >= {lad.UNBOUNDED_GBPS}


def test_the_ladder_per_mode_is_on_the_page_and_a_stored_layer_run_reruns_alike(monkeypatch) -> None:
    from cais.kernels import ep_common

    lad = runpy.run_path(str(ROOT / "scripts" / "ep_switch_ladder.py"))
    modes = json.loads(lad["MODES_STORE"].read_text())
    # the fabric and EP constants the stored runs were made on (none recorded: the current ones)
    made = modes.get("made_on") or {"sets": {}, "ep_constants": {}}
    then = ep_common.ep_constants().model_copy(update=made["ep_constants"])
    monkeypatch.setattr(ep_common, "ep_constants", lambda path=None: then)
    runs = modes["runs"]
    want = {(s, m, k) for s in lad["MODE_SYSTEMS"] for m in ("decode", "prefill") for k in lad["MODE_RUNGS"]}
    assert want <= {(r["system"], r["mode"], r["scheme"]) for r in runs}  # every rung, both systems, both modes
    page = (ROOT / "docs" / "moe.md").read_text()
    table = lad["modes_section"](modes)
    assert len(table) > len(runs) // len(lad["MODE_RUNGS"]) and all(line in page for line in table)
    point = [r for r in runs if r["system"] == "dgx-h100" and r["mode"] == "decode"
             and r["scheme"] in ("ep-deepep", "ep-switch")]
    assert len(point) == 2
    for r in point:
        again = lad["layer_point"](r["system"], r["scheme"], r["mode"], made["sets"])
        assert again["layer_us"] == pytest.approx(r["layer_us"], rel=1e-9), r["scheme"]
        assert again["dispatch_us"] + again["combine_us"] == pytest.approx(r["dispatch_us"] + r["combine_us"],
                                                                         rel=1e-9)


def test_each_member_is_a_layer_scheme_on_its_switch() -> None:
    from cais.experiments.layer import run_layer
    from cais.schemes import get_scheme
    from cais.workload.moe import load_moe_model

    mm = load_moe_model("qwen3-30b-a3b", seq=32, batch=2)
    cfg = load_system("dgx-h100")
    assert all(get_scheme(name).switch == ep_switch.VARIANTS[name].switch for name in FAMILY)
    r = run_layer(cfg, mm, "ep-switch", "decode")
    assert r.moe is not None and r.moe["kernel"] == "ep-switch" and r.moe["fused_us"] > 0
    nvls = cfg.with_overrides(switch={**cfg.switch.model_dump(), "model": "nvls"})
    with pytest.raises(UserError, match="^switch.model:"):
        run_layer(nvls, mm, "ep-switch", "decode")
    assert run_layer(nvls, mm, "ep-switch-sw", "decode").moe is not None
