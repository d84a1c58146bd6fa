"""Timelines: the Chrome Trace Event Format file is well formed, and its totals match
the run's (kernel time, link busy time, TB counts)."""

import json
from collections import defaultdict

import pytest

from cais.experiments.collective import run_collective
from cais.experiments.layer import run_layer
from cais.config import PS_PER_US
from cais.report.trace import build_trace, write_trace
from cais.results import Recorder
from cais.hw.gpu import Kernel
from cais.machine import Machine
from cais.workload.models import ModelSpec

TINY = ModelSpec(name="tiny-gpt", family="gpt", hidden=256, ffn_hidden=512, heads=4, layers=2, gated_mlp=False,
                 norm="layernorm", activation="gelu", seq=64, batch=4)
REQUIRED = {"X": {"name", "ph", "pid", "tid", "ts", "dur"}, "C": {"name", "ph", "pid", "ts", "args"},
            "M": {"name", "ph", "pid", "args"}}


def check_format(trace: dict) -> list[dict]:
    assert set(trace) >= {"traceEvents", "displayTimeUnit"} and trace["displayTimeUnit"] == "ns"
    events = trace["traceEvents"]
    for e in events:
        assert e["ph"] in REQUIRED and REQUIRED[e["ph"]] <= e.keys(), e
    named = {(e["pid"], e.get("tid")) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    procs = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    tracks = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            assert e["dur"] >= 0 and e["ts"] >= 0
            assert (e["pid"], e["tid"]) in named and e["pid"] in procs
            tracks[(e["pid"], e["tid"])].append(e)
        elif e["ph"] == "C":
            assert e["pid"] in procs and all(isinstance(v, (int, float)) for v in e["args"].values())
            tracks[(e["pid"], "C", e["name"])].append(e)
    for evs in tracks.values():
        ts = [e["ts"] for e in evs]
        assert ts == sorted(ts)  # non-decreasing within each track
        if evs[0]["ph"] == "X":  # slices on one track never overlap (they must nest)
            for a, b in zip(evs, evs[1:]):
                assert a["ts"] + a["dur"] <= b["ts"] + 1e-6
    return events


def counter_integral_ps(events: list[dict], pid: int, name: str, key: str) -> float:
    evs = [e for e in events if e["ph"] == "C" and e["pid"] == pid and e["name"] == name]
    return sum(a["args"][key] * (b["ts"] - a["ts"]) for a, b in zip(evs, evs[1:])) * PS_PER_US


@pytest.fixture(scope="module")
def collective_trace(h100, tmp_path_factory):
    rec = Recorder(bin_ps=200_000)
    r = run_collective(h100, "allreduce", "ring", 1 << 20, recorder=rec)
    path = tmp_path_factory.mktemp("trace") / "ring.json"
    n = write_trace(path, rec)
    trace = json.loads(path.read_text())
    assert n == len(trace["traceEvents"])
    return r, rec, trace


def test_trace_is_well_formed_and_names_every_gpu_and_chip(collective_trace) -> None:
    _, rec, trace = collective_trace
    events = check_format(trace)
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    m = rec.m
    assert {f"GPU {g}" for g in range(m.n)} | {f"NVSwitch {c}" for c in range(m.cfg.switch.chips)} == names
    threads = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"kernels", "collective", "SM 0"} <= threads


def test_trace_totals_match_the_run(collective_trace) -> None:
    _, rec, trace = collective_trace
    events = trace["traceEvents"]
    m = rec.m
    kernel_tids = {e["tid"] for e in events if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == 1
                   and e["args"]["name"].startswith("kernels")}
    kernel_us = sum(e["dur"] for e in events if e["ph"] == "X" and e["pid"] == 1 and e["tid"] in kernel_tids)
    want = sum(k.finished_at - k.started_at for k in rec.kernels(0)) / PS_PER_US
    assert kernel_us == pytest.approx(want, abs=1e-6)
    for ch in m.fabric.channels():
        chip = int(ch.name.split("sw")[1].split("-")[0])
        got = counter_integral_ps(events, 1 + m.n + chip, f"{ch.name} busy", "util")
        assert got == pytest.approx(ch.busy_ps, rel=1e-5, abs=1)
    tb_x = [e for e in events if e["ph"] == "X" and e.get("cat") == "tb"]
    assert len(tb_x) == sum(len(rec.tb_spans(g)) for g in range(m.n))
    marks = [e for e in events if e["ph"] == "X" and e["pid"] == 1 and e["name"] == "ring allreduce"]
    assert len(marks) == 1 and marks[0]["dur"] == pytest.approx(want, abs=1e-6)


def test_tb_spans_are_merged_past_the_limit(collective_trace) -> None:
    _, rec, _ = collective_trace
    n_tbs = sum(len(rec.tb_spans(g)) for g in range(rec.m.n))
    busy = sum(e - s for g in range(rec.m.n) for _, _, s, e in rec.tb_spans(g)) / PS_PER_US
    trace = build_trace(rec, tb_limit=n_tbs // 5)
    events = check_format(trace)
    tb_x = [e for e in events if e["ph"] == "X" and e.get("cat") == "tb"]
    assert len(tb_x) <= n_tbs // 5
    assert sum(e["args"]["tbs"] for e in tb_x) == n_tbs
    assert sum(e["args"]["tb_busy_us"] for e in tb_x) == pytest.approx(busy)
    assert "merged" in trace["otherData"]["tb_spans"]


def test_overlapping_kernels_go_on_lanes(h100) -> None:
    m_rec = Recorder()
    m = Machine(h100.with_overrides(gpus=2), recorder=m_rec)

    def sleeper(ps: int):
        def tb(_sm: int, _busy: int):
            yield ps
        return tb
    m.gpus[0].launch(Kernel("gemm", [sleeper(1000)] * 2, frozenset({0, 1})))
    m.gpus[0].launch(Kernel("allreduce", [sleeper(1000)], frozenset({2}), role="communication"), 500)
    m.gpus[0].launch(Kernel("norm", [sleeper(100)]), 2000)
    m.run()
    events = check_format(build_trace(m_rec))
    lanes = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"
             and e["pid"] == 1}
    by_lane = defaultdict(list)
    for e in events:
        if e["ph"] == "X" and e["pid"] == 1 and lanes[e["tid"]].startswith("kernels"):
            by_lane[lanes[e["tid"]]].append((e["name"], e["cat"]))
    assert by_lane == {"kernels": [("gemm", "compute"), ("norm", "compute")],
                       "kernels #2": [("allreduce", "communication")]}


def test_layer_trace_marks_segments(h100) -> None:
    rec = Recorder(bin_ps=100_000)
    run_layer(h100.with_overrides(gpus=4), TINY, "tp-nvls", "prefill", recorder=rec)
    events = check_format(build_trace(rec))
    segments = {e["name"] for e in events if e["ph"] == "X" and e["cat"] == "mark" and e["pid"] == 1}
    assert {"L1", "L2"} <= segments
    cats = {e["cat"] for e in events if e["ph"] == "X" and e["pid"] == 1}
    assert {"compute", "communication", "tb", "mark"} <= cats


def merge_tracks(events: list[dict]) -> dict[str, list[dict]]:
    """Merge-table counter events by track name."""
    out = defaultdict(list)
    for e in events:
        if e["ph"] == "C" and e["name"].endswith(" merge table"):
            out[e["name"]].append(e)
    return out


@pytest.fixture(scope="module")
def cais_trace(h100, tmp_path_factory):
    rec = Recorder(bin_ps=100_000)
    r = run_layer(h100.with_overrides(gpus=4), TINY, "cais-base", "prefill", recorder=rec)
    path = tmp_path_factory.mktemp("trace") / "cais.json"
    write_trace(path, rec)
    return r, rec, json.loads(path.read_text())


def test_merge_table_tracks_peak_at_the_run_metric(cais_trace) -> None:
    r, rec, trace = cais_trace
    events = check_format(trace)
    peaks = r.as_json()["merge_table_peak_kB"]["per_port"]
    tracks = merge_tracks(events)
    assert tracks and any(v > 0 for evs in tracks.values() for e in evs for v in e["args"].values())
    # one track per port whose table held anything, on its chip's process
    assert set(tracks) == {f"{port} merge table" for port, kB in peaks.items() if kB > 0}
    for port, kB in peaks.items():
        if kB == 0:
            continue
        evs = tracks[f"{port} merge table"]
        chip = int(port[2:port.index(".")])
        assert {e["pid"] for e in evs} == {1 + rec.m.n + chip}
        assert max(e["args"]["kB"] for e in evs) == pytest.approx(kB, abs=1e-9)
        assert evs[-1]["args"]["kB"] == 0  # the closing 0


def test_recorder_merge_occupancy_is_the_units_lines(cais_trace) -> None:
    r, rec, _ = cais_trace
    occ = rec.merge_occupancy()
    peaks = r.as_json()["merge_table_peak_kB"]["per_port"]
    assert set(occ) == set(peaks)
    for port, (times, lines, line_bytes) in occ.items():
        assert list(times) == sorted(times) and (lines >= 0).all()
        assert (lines.max(initial=0) * line_bytes / 1000) == pytest.approx(peaks[port])
        assert len(lines) == 0 or lines[-1] == 0  # every table empties by the end
    bins = rec.merge_peak_bins()
    assert all(len(b) == rec.n_bins() for b in bins.values())
    assert {p: b.max(initial=0) / 1000 for p, b in bins.items()} == pytest.approx(peaks)


def test_merge_logs_only_where_asked_and_on_cais_switches(h100) -> None:
    off = Recorder(bin_ps=100_000, merge=False)
    run_layer(h100.with_overrides(gpus=4), TINY, "cais-base", "prefill", recorder=off)
    assert off.merge_occupancy() == {} and not merge_tracks(build_trace(off)["traceEvents"])
    assert all(u.log is None for sw in off.m.fabric.switches for u in sw.units)
    nvls = Recorder(bin_ps=100_000)
    r = run_layer(h100.with_overrides(gpus=4), TINY, "sp-nvls", "prefill", recorder=nvls)
    assert "merge_table_peak_kB" not in r.as_json()
    assert nvls.merge_occupancy() == {} and not merge_tracks(check_format(build_trace(nvls)))
