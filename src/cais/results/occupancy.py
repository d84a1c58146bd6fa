"""Input-buffer occupancy of a port over time, from the changes its credit counter
logged: ``(time_ps, vc, delta_bytes)``, in any order."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Occupancy:
    """How full one virtual channel's input buffer was: its peak (bytes, over the whole
    run) and its time-weighted mean (bytes, over the span asked for)."""

    peak_bytes: int
    mean_bytes: float


def level_steps(log: Sequence[tuple[int, int, int]], vc: int) -> tuple[np.ndarray, np.ndarray]:
    """The occupancy of ``vc`` as a step function: the distinct times it changed
    (ascending) and the level from each of them on (0 before the first).

    Changes logged for the same picosecond are netted: the level at a time is the
    sum of all changes at or before it, whatever order they were logged in."""
    if not log:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    arr = np.asarray(log, dtype=np.int64).reshape(-1, 3)
    arr = arr[arr[:, 1] == vc]
    if not len(arr):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.argsort(arr[:, 0], kind="stable")
    times, deltas = arr[order, 0], arr[order, 2]
    distinct, first = np.unique(times, return_index=True)
    return distinct, np.cumsum(np.add.reduceat(deltas, first))


def occupancy(times: np.ndarray, levels: np.ndarray, start_ps: int, end_ps: int) -> Occupancy:
    """Peak (whole run) and time-weighted mean over ``[start_ps, end_ps]`` of a step
    function from :func:`level_steps`."""
    if not len(times):
        return Occupancy(0, 0.0)
    peak = max(0, int(levels.max()))
    span = end_ps - start_ps
    if span <= 0:
        return Occupancy(peak, 0.0)
    seg_start = np.clip(times, start_ps, end_ps)
    seg_end = np.clip(np.append(times[1:], end_ps), start_ps, end_ps)
    area = float(np.sum(levels * (seg_end - seg_start)))
    return Occupancy(peak, area / span)


def peak_per_bin(times: np.ndarray, levels: np.ndarray, bin_ps: int, n_bins: int) -> np.ndarray:
    """The highest level of a step function in each bin ``[b * bin_ps, (b + 1) * bin_ps)``."""
    out = np.zeros(n_bins, np.int64)
    if not len(times) or n_bins <= 0:
        return out
    starts = np.arange(n_bins, dtype=np.int64) * bin_ps
    idx = np.searchsorted(times, starts, side="right") - 1
    out = np.where(idx >= 0, levels[np.maximum(idx, 0)], 0)
    inside = times < n_bins * bin_ps
    np.maximum.at(out, times[inside] // bin_ps, levels[inside])
    return out


def vc_occupancy(log: Sequence[tuple[int, int, int]], vcs: int, start_ps: int, end_ps: int) -> list[Occupancy]:
    """:class:`Occupancy` of each of ``vcs`` virtual channels."""
    return [occupancy(*level_steps(log, vc), start_ps, end_ps) for vc in range(vcs)]
