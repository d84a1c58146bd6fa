"""ld.cais and red.cais on a whole machine with CAIS switches: every GPU's request for
one address meets in one merge unit; the traffic of an AG-GEMM and a GEMM-RS pattern
equals its closed form with merging and the unmerged one with a zero-entry table;
bytes are conserved; and cais-base reproduces the unsharded layer with a table so
small that eviction, bypass and the timeout all happen."""

from __future__ import annotations

import numpy as np
import pytest

from cais.experiments.layer import run_layer
from cais.config import apply_overrides, load_system
from cais.hw.memory import Region
from cais.machine import Machine

from test_schemes import GPT

SHARD = 16 * 1024  # elements of each GPU's shard (32 KiB of bf16)


def machine(n: int = 4, **sets: str) -> Machine:
    cfg = apply_overrides(load_system("dgx-h100"), {"gpus": str(n), "switch.model": "cais", **sets})
    m = Machine(cfg, functional=True)
    for g, gpu in enumerate(m.gpus):
        gpu.memory.alloc("x", SHARD, fill=np.arange(SHARD) + 1000.0 * g)
        gpu.memory.alloc("y", SHARD * n)
    return m


def all_gather_by_loads(m: Machine) -> dict[int, dict[int, np.ndarray]]:
    """Every GPU ld.cais's every other GPU's whole shard once (the AG-GEMM pattern)."""
    got: dict[int, dict[int, np.ndarray]] = {g: {} for g in range(m.n)}
    for g in range(m.n):
        for home in range(m.n):
            if home != g:
                m.isa.ld_cais(g, home, Region("x", 0, SHARD, 2), lambda d, g=g, h=home: got[g].__setitem__(h, d),
                              unit=8192)
    m.run()
    return got


def reduce_scatter_by_reductions(m: Machine, signal: int = 1) -> None:
    """Every GPU red.cais's its partial of every other GPU's shard (the GEMM-RS pattern)."""
    for g in range(m.n):
        for home in range(m.n):
            m.isa.red_cais(g, home, Region("y", home * SHARD, SHARD, 2), np.full(SHARD, g + 1.0), signal,
                           unit=8192)
    m.run()


def payload(m: Machine) -> tuple[list[int], list[int]]:
    fab = m.fabric
    up = [sum(ch.payload_bytes for ch in fab.up[g]) for g in range(m.n)]
    down = [sum(fab.down[c][g].payload_bytes for c in range(len(fab.switches))) for g in range(m.n)]
    return up, down


def merge_counts(m: Machine) -> dict[str, int]:
    out = {"merged": 0, "bypassed": 0, "sessions": 0}
    for sw in m.fabric.switches:
        for u in sw.units:
            for k in out:
                out[k] += getattr(u.stats, k)
    return out


def test_every_gpus_request_for_one_address_meets_in_one_chip_and_port() -> None:
    m = machine(8)
    region = Region("x", 0, SHARD, 2)
    cuts = {tuple(m.isa.stripes(region, 8192)) for _ in range(m.n)}
    assert len(cuts) == 1  # the cut and the chip of each piece depend on the address alone
    all_gather_by_loads(m)
    per_port = [u.stats.sessions for sw in m.fabric.switches for u in sw.units]
    trains = len(m.isa.stripes(region, 8192))
    assert sum(per_port) == m.n * trains  # one session per piece per home: all N-1 requests met in it
    assert merge_counts(m)["merged"] == m.n * trains * (m.n - 2)


@pytest.mark.parametrize("n", [4, 8])
def test_ag_gemm_loads_move_each_shard_once_up_and_once_to_each_gpu_that_lacks_it(n: int) -> None:
    m = machine(n)
    got = all_gather_by_loads(m)
    for g in range(n):
        for home, data in got[g].items():
            assert np.array_equal(data, np.arange(SHARD) + 1000.0 * home)
    s = SHARD * 2
    up, down = payload(m)
    assert up == [s] * n  # the home's shard leaves it once (requests carry no data)
    assert down == [(n - 1) * s] * n  # and reaches each of the n-1 others
    assert merge_counts(m)["bypassed"] == 0
    assert m.conservation().ok


@pytest.mark.parametrize("n", [4, 8])
def test_gemm_rs_reductions_go_up_once_and_come_down_once_as_the_sum(n: int) -> None:
    m = machine(n)
    reduce_scatter_by_reductions(m)
    s = SHARD * 2
    up, down = payload(m)
    assert up == [(n - 1) * s] * n and down == [s] * n
    total = n * (n + 1) / 2
    for h, gpu in enumerate(m.gpus):
        assert np.array_equal(gpu.memory.buffers["y"][h * SHARD:(h + 1) * SHARD], np.full(SHARD, total))
        assert gpu.signals[1] == n * s  # every GPU's contribution (its own added locally), counted by the sums
    assert m.conservation().ok


def test_with_a_zero_entry_table_every_request_goes_unmerged() -> None:
    n = 4
    m = machine(n, **{"switch.merge.entries": "0"})
    all_gather_by_loads(m)
    s = SHARD * 2
    up, down = payload(m)
    assert up == [(n - 1) * s] * n and down == [(n - 1) * s] * n  # as plain ld (LADM-like)
    m2 = machine(n, **{"switch.merge.entries": "0"})
    reduce_scatter_by_reductions(m2)
    assert payload(m2) == ([(n - 1) * s] * n, [(n - 1) * s] * n)
    assert merge_counts(m)["bypassed"] > 0 and merge_counts(m)["sessions"] == 0
    assert m2.gpus[0].signals[1] == n * s and m2.conservation().ok


def test_wire_bytes_are_the_payload_plus_the_packets_headers() -> None:
    m = machine(4)
    all_gather_by_loads(m)
    pk = m.pk
    s = SHARD * 2
    packets = -(-s // pk.maxp)
    up_wire = sum(ch.wire_bytes for ch in m.fabric.up[0])
    fmt = pk.fmt
    request = (fmt.header_flits + fmt.request_extra_flits) * fmt.flit_bytes
    response = fmt.header_flits * fmt.flit_bytes
    # GPU 0 sends its shard once (a header per packet) and asks for 3 shards (a request per packet)
    assert up_wire == s + packets * response + 3 * packets * request


def test_on_an_nvls_switch_cais_accesses_are_plain_loads_and_reductions() -> None:
    n = 4
    m = machine(n, **{"switch.model": "nvls"})
    got = all_gather_by_loads(m)
    assert np.array_equal(got[1][0], np.arange(SHARD))
    assert payload(m)[0] == [(n - 1) * SHARD * 2] * n


def _counts(r) -> dict[str, int]:
    return r.as_json()["merge"]


def test_cais_base_is_exact_with_a_tiny_table_that_evicts_bypasses_and_times_out() -> None:
    cfg = apply_overrides(load_system("dgx-h100"), {"gpus": "4", "switch.merge.entries": "40",
                                                      "switch.merge.timeout_us": "0.3", "remote_read.strategy": "staged"})
    r = run_layer(cfg, GPT, "cais-base", "train", functional=True, seed=3)
    assert r.checked >= 60 and r.mismatches == []
    counts = _counts(r)
    assert all(counts[k] > 0 for k in ("merged", "bypassed", "evicted")), counts
    # sessions orphaned by evictions end by the merge tracker (their address complete) or by the timer
    assert counts["tracked"] + counts["timed_out"] > 0, counts
    assert r.as_json()["merge_table_peak_kB"]["max"] <= 40 * 128 / 1000


def test_cais_base_merges_and_is_deterministic() -> None:
    cfg = load_system("dgx-h100").with_overrides(gpus=4)
    a = run_layer(cfg, GPT, "cais-base", "prefill", functional=True, seed=1)
    b = run_layer(cfg, GPT, "cais-base", "prefill", functional=True, seed=1)
    assert a.mismatches == [] and a.total_us == b.total_us and _counts(a) == _counts(b)
    assert _counts(a)["merged"] > 0 and a.as_json()["arrival_skew_us"]["max"] > 0


# ---- CAIS with coordination and the dataflow optimizer (issue 8) ----------------------

def _four(**sets: str):
    return apply_overrides(load_system("dgx-h100"), {"gpus": "4", **sets})


@pytest.mark.parametrize("sets", [
    {"cais.throttle_quorum": "0"},
    {"cais.throttle_quorum": "1"},
    {"switch.merge.entries": "40", "switch.merge.timeout_us": "0.3"},
    {"gpu.l2_keeps_peer_reads": "true"},
], ids=["no-throttle", "full-throttle", "tiny-table", "l2-keeps"])
@pytest.mark.parametrize("scheme", ["cais", "cais-wo-coord"])
def test_cais_is_exact_with_coordination_throttling_and_table_variants(scheme: str, sets: dict) -> None:
    r = run_layer(_four(**sets), GPT, scheme, "train", functional=True, seed=4)
    assert r.checked >= 60 and r.mismatches == []
    assert _counts(r)["merged"] > 0


def test_coordination_cuts_the_arrival_skew_and_sync_travels_on_the_wire() -> None:
    coord = run_layer(_four(), GPT, "cais", "prefill", functional=True, seed=1)
    free = run_layer(_four(), GPT, "cais-wo-coord", "prefill", functional=True, seed=1)
    assert coord.mismatches == [] and free.mismatches == []
    assert coord.as_json()["arrival_skew_us"]["mean"] < free.as_json()["arrival_skew_us"]["mean"]


def test_cais_partial_runs_with_one_request_vc_and_cais_with_loads_on_their_own() -> None:
    part = run_layer(_four(), GPT, "cais-partial", "prefill")
    full = run_layer(_four(), GPT, "cais", "prefill")
    assert (part.vc_policy, full.vc_policy) == ("one", "destination")  # cais runs on the system's
    assert part.switch == full.switch == "cais"
    from cais.hw.packets import Kind, VcMap

    for policy, shared in (("one", True), ("class", False), ("destination", False)):
        vcs = VcMap(_four().link.model_copy(update={"vc_policy": policy}))
        for dst in (1, 2, 3):  # traffic control: to any one destination, loads and reductions apart
            at = {"src": 0, "dst": dst, "n": 4}
            assert (vcs.vc(Kind.LD_CAIS_REQ, **at) == vcs.vc(Kind.RED_CAIS, **at)) == shared
    dest = VcMap(_four().link)
    assert dest.policy == "destination"
    # a queue per destination
    assert len({dest.vc(Kind.RED_CAIS, src=0, dst=d, n=4) for d in (1, 2, 3)}) == 3


@pytest.mark.parametrize("rule", ["on-ready", "on-launch"])
def test_a_slow_gpu_under_coordination_completes_and_slows_everyone(rule: str) -> None:
    fast = run_layer(_four(**{"gpu.tb_launch": rule}), GPT, "cais", "prefill", functional=True, seed=1)
    slow_cfg = _four(**{"gpu.tb_launch": rule}).model_copy(update={"gpu_slowdown": {2: 3.0}})
    slow = run_layer(slow_cfg, GPT, "cais", "prefill", functional=True, seed=1)
    assert slow.mismatches == [] and slow.total_us > fast.total_us
    # GPU 0 is not slowed itself, but its coordinated TBs wait for GPU 2's: on its
    # SMs when placed in launch order; pending, holding none, when launched on ready
    wait = {name: sum(r.kernel_tbs[k]["tb_wait_us"] for k in r.kernel_tbs) for name, r in (("fast", fast),
                                                                                           ("slow", slow))}
    if rule == "on-launch":
        assert slow.kernel_us["computation"] > 1.5 * fast.kernel_us["computation"]
        assert wait["slow"] > 2 * wait["fast"]
    else:  # the slow GPU costs GPU 0 time, not SM time spent waiting
        assert wait["slow"] == pytest.approx(wait["fast"], abs=1.0)


def test_a_broken_group_size_ends_in_the_watchdogs_one_line_error(monkeypatch) -> None:
    from cais.machine import Stalled

    from cais.schemes.cais import CoordinatedAccess

    real = CoordinatedAccess.sync_groups  # every TB registers as it says (the core's factory too)
    monkeypatch.setattr(CoordinatedAccess, "sync_groups",
                        lambda self: tuple(None if s is None else (s[0], s[1], s[2] + 1) for s in real(self)))
    with pytest.raises(Stalled) as err:
        run_layer(_four(), GPT, "cais", "prefill")
    line = str(err.value)
    assert "\n" not in line and "group sync table" in line and "of 5 registered" in line


@pytest.mark.parametrize("scheme", ["ladm", "cais-base"])
def test_keeping_peer_reads_in_the_l2_is_exact_and_cuts_traffic(scheme: str) -> None:
    keep = run_layer(_four(**{"gpu.l2_keeps_peer_reads": "true"}), GPT, scheme, "prefill", functional=True, seed=4)
    plain = run_layer(_four(**{"remote_read.strategy": "reload"}), GPT, scheme, "prefill", functional=True, seed=4)
    assert keep.mismatches == [] and plain.mismatches == []
    down = [sum(r.as_json()["wire_bytes"][str(g)]["down"] for g in range(4)) for r in (keep, plain)]
    assert down[0] < down[1]
