"""Timelines of a recorded run in the Chrome Trace Event Format (JSON object form),
which ui.perfetto.dev and chrome://tracing open.

Layout: one process per GPU, with tracks (threads) for its kernels, for the marks
code reported (one track per mark track name, e.g. ``collective``, ``segments``) and
for its SMs' thread blocks; one process per switch chip, with counter tracks for
the utilisation of each of its ports per direction (per bin) and, where the port has
credit flow control, the peak occupancy of its input buffer per VC (per bin), and
on CAIS switches the peak data held in each port's merging table (per bin; ports
whose table never held anything are left out).
Overlapping spans on one track are put on extra lanes (``kernels #2``), since the
format's slices on one thread must nest. Timestamps are microseconds.

Past ``tb_limit`` TB spans, a kernel's TBs are merged: one span per kernel per
group of SMs (1, 2, 4, ... SMs: the smallest group that fits the limit), from its
first TB start to its last TB end in the group, with the TB count and summed TB
time as arguments.
"""

from __future__ import annotations

import json
import os
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cais.errors import UserError
from cais.results.metrics import BYTES_PER_KB
from cais.results.ports import port_direction
from cais.results.recorder import Recorder
from cais.results.table import publish

if TYPE_CHECKING:
    from cais.hw.gpu import Kernel

DEFAULT_TB_LIMIT = 20_000
PS_PER_US = 1e6

Event = dict[str, Any]


def _us(ps: int | float) -> float:
    return ps / PS_PER_US


@dataclass
class _Span:
    start: int
    end: int
    name: str
    cat: str
    args: dict[str, Any]


class _Threads:
    """Thread ids per process, in the order tracks are first asked for, with their
    ``thread_name`` / ``thread_sort_index`` metadata."""

    def __init__(self) -> None:
        self.ids: dict[tuple[int, str], int] = {}
        self.meta: list[Event] = []

    def tid(self, pid: int, name: str) -> int:
        key = (pid, name)
        if key not in self.ids:
            tid = sum(1 for p, _ in self.ids if p == pid) + 1
            self.ids[key] = tid
            self.meta += [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}},
                          {"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                           "args": {"sort_index": tid}}]
        return self.ids[key]


def _process(pid: int, name: str) -> list[Event]:
    return [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}},
            {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}}]


def _lanes(spans: list[_Span]) -> list[tuple[int, _Span]]:
    """Each span with the first lane (0, 1, ...) free at its start (greedy, by start)."""
    ends: list[int] = []
    out = []
    for sp in sorted(spans, key=lambda s: (s.start, -s.end)):
        for lane, end in enumerate(ends):
            if end <= sp.start:
                ends[lane] = sp.end
                break
        else:
            lane = len(ends)
            ends.append(sp.end)
        out.append((lane, sp))
    return out


def _slices(threads: _Threads, pid: int, track: str, spans: list[_Span]) -> list[Event]:
    events = []
    for lane, sp in _lanes(spans):
        tid = threads.tid(pid, track if lane == 0 else f"{track} #{lane + 1}")
        events.append({"name": sp.name, "cat": sp.cat, "ph": "X", "pid": pid, "tid": tid, "ts": _us(sp.start),
                       "dur": _us(sp.end - sp.start), "args": sp.args})
    return events


def _kernel_spans(kernels: Iterable[Kernel]) -> list[_Span]:
    return [_Span(k.started_at, k.finished_at, k.name, k.role,
                  {"role": k.role, "tbs": len(k.tbs), "sms": "any" if k.sms is None else len(k.sms)})
            for k in kernels if k.started_at is not None and k.finished_at is not None]


class _KernelIndex:
    """Finds the launch a TB belongs to: the last kernel of its name started by then."""

    def __init__(self, kernels: list[Kernel]) -> None:
        self.by_name: dict[str, list[tuple[int, int]]] = {}
        for i, k in enumerate(kernels):
            if k.started_at is not None:
                self.by_name.setdefault(k.name, []).append((k.started_at, i))
        for starts in self.by_name.values():
            starts.sort()

    def launch(self, name: str, start: int) -> int:
        starts = self.by_name.get(name, [])
        i = bisect_right(starts, (start, 1 << 62)) - 1
        return starts[i][1] if i >= 0 else -1


def _tb_groups(tbs: list[tuple[str, int, int, int]], index: _KernelIndex,
               group: int) -> dict[tuple[int, int], list[int | str]]:
    """(first SM of group, kernel launch) -> [start, end, TB count, busy ps, name]."""
    out: dict[tuple[int, int], list[int | str]] = {}
    for name, sm, start, end in tbs:
        key = (sm - sm % group, index.launch(name, start))
        agg = out.get(key)
        if agg is None:
            out[key] = [start, end, 1, end - start, name]
        else:
            agg[0] = min(agg[0], start)
            agg[1] = max(agg[1], end)
            agg[2] += 1
            agg[3] += end - start
    return out


def _sm_track(first: int, group: int, n_sms: int) -> str:
    return f"SM {first}" if group == 1 else f"SMs {first}-{min(first + group, n_sms) - 1}"


def _tb_events(rec: Recorder, threads: _Threads, tb_limit: int) -> tuple[list[Event], int]:
    """TB slices of every GPU, merged per SM group past ``tb_limit``; and the group size
    used (0: TBs one by one)."""
    m = rec.m
    per_gpu = [rec.tb_spans(g) for g in range(m.n)]
    events: list[Event] = []
    if sum(len(t) for t in per_gpu) <= tb_limit:
        for g, tbs in enumerate(per_gpu):
            by_sm: dict[int, list[_Span]] = {}
            for name, sm, start, end in tbs:
                by_sm.setdefault(sm, []).append(_Span(start, end, name, "tb", {}))
            for sm in sorted(by_sm):
                events += _slices(threads, 1 + g, f"SM {sm}", by_sm[sm])
        return events, 0
    indexes = [_KernelIndex(rec.kernels(g)) for g in range(m.n)]
    n_sms = m.cfg.gpu.sms
    group = 1
    while True:
        merged = [_tb_groups(tbs, idx, group) for tbs, idx in zip(per_gpu, indexes)]
        if sum(len(mg) for mg in merged) <= tb_limit or group >= n_sms:
            break
        group *= 2
    for g, mg in enumerate(merged):
        by_group: dict[int, list[_Span]] = {}
        for (first, _), (start, end, count, busy, name) in mg.items():
            by_group.setdefault(first, []).append(
                _Span(start, end, str(name), "tb", {"tbs": count, "tb_busy_us": _us(busy)}))
        for first in sorted(by_group):
            events += _slices(threads, 1 + g, _sm_track(first, group, n_sms), by_group[first])
    return events, group


def _counter_events(pid: int, name: str, series: dict[str, np.ndarray], bin_ps: int) -> list[Event]:
    """A counter track: one event per bin where any series changed, and a closing 0."""
    keys = list(series)
    values = np.vstack([series[k] for k in keys])  # series x bins
    n = values.shape[1]
    if n == 0:
        return []
    changed = np.flatnonzero(np.any(np.diff(values, axis=1) != 0, axis=0)) + 1
    bins = np.concatenate([[0], changed])
    events: list[Event] = [{"name": name, "ph": "C", "pid": pid, "tid": 0, "ts": _us(int(b) * bin_ps),
                            "args": dict(zip(keys, values[:, b].tolist()))} for b in bins]
    events.append({"name": name, "ph": "C", "pid": pid, "tid": 0, "ts": _us(n * bin_ps),
                   "args": {k: 0.0 for k in keys}})
    return events


def _switch_events(rec: Recorder) -> tuple[list[Event], list[Event]]:
    """Counter events and process metadata of the switch chips (and of any channel that
    is not a GPU<->chip port, on one ``fabric`` process)."""
    m = rec.m
    chips = m.cfg.switch.chips
    other_pid = 1 + m.n + chips
    meta = [e for c in range(chips) for e in _process(1 + m.n + c, f"NVSwitch {c}")]
    events: list[Event] = []
    used_other = False

    def pid_of(channel: str) -> int:
        nonlocal used_other
        port = port_direction(channel)
        if port is None:
            used_other = True
            return other_pid
        return 1 + m.n + port.chip

    for name, util in rec.link_util_bins().items():
        events += _counter_events(pid_of(name), f"{name} busy", {"util": np.round(util, 6)}, rec.bin_ps)
    for name, per_vc in rec.buffer_peak_bins().items():
        series = {f"vc{v}": np.round(peaks / BYTES_PER_KB, 3) for v, peaks in enumerate(per_vc) if peaks.any()}
        if series:
            events += _counter_events(pid_of(name), f"{name} buffer kB", series, rec.bin_ps)
    for name, peaks in rec.merge_peak_bins().items():  # name: sw<chip>.port<gpu>
        if peaks.any():
            chip = int(name[2:name.index(".")])
            events += _counter_events(1 + m.n + chip, f"{name} merge table",
                                      {"kB": np.round(peaks / BYTES_PER_KB, 3)}, rec.bin_ps)
    if used_other:
        meta += _process(other_pid, "fabric")
    return events, meta


def build_trace(rec: Recorder, tb_limit: int = DEFAULT_TB_LIMIT) -> dict[str, Any]:
    """The trace of a recorded run, as a JSON-ready object."""
    if tb_limit < 0:
        raise UserError(f"TB span limit must be >= 0, got {tb_limit}")
    m = rec.m
    threads = _Threads()
    meta: list[Event] = []
    events: list[Event] = []
    for g in range(m.n):
        pid = 1 + g
        meta += _process(pid, f"GPU {g}")
        events += _slices(threads, pid, "kernels", _kernel_spans(rec.kernels(g)))
        tracks: dict[str, list[_Span]] = {}
        for mk in rec.marks:
            if mk.gpu == g:
                tracks.setdefault(mk.track, []).append(_Span(mk.start_ps, mk.end_ps, mk.name, "mark", {}))
        for track, spans in tracks.items():
            events += _slices(threads, pid, track, spans)
    tb_events, group = _tb_events(rec, threads, tb_limit)
    events += tb_events
    switch_events, switch_meta = _switch_events(rec)
    events += switch_events
    events.sort(key=lambda e: e["ts"])
    other = {"system": m.cfg.name, "gpus": m.n, "bin_us": _us(rec.bin_ps),
             "tb_spans": "one by one" if group == 0 else
             f"merged: one span per kernel per {'SM' if group == 1 else f'group of {group} SMs'}"}
    return {"traceEvents": meta + switch_meta + threads.meta + events, "displayTimeUnit": "ns",
            "otherData": other}


def write_trace(path: str | Path, rec: Recorder, tb_limit: int = DEFAULT_TB_LIMIT) -> int:
    """Write the trace of a recorded run to ``path``; return the number of events. The
    file appears whole or not at all."""
    tmp, events = stage_trace(path, rec, tb_limit)
    publish(tmp, path)
    return events


def stage_trace(path: str | Path, rec: Recorder, tb_limit: int = DEFAULT_TB_LIMIT) -> tuple[Path, int]:
    """The trace of a recorded run written to a temporary file next to ``path``: (that
    file, the number of events). The caller moves it over ``path`` (``os.replace``)
    or deletes it. UserError (one line) if it cannot be written."""
    trace = build_trace(rec, tb_limit)
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as f:
            json.dump(trace, f, separators=(",", ":"))
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise UserError(f"cannot write {path}: {exc.strerror}") from None
        raise
    return tmp, len(trace["traceEvents"])
