"""Link busy time over time: a channel's busy intervals cut into bins of equal width,
exactly (the bins of a channel add up to its ``busy_ps``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def busy_per_bin(intervals: Sequence[tuple[int, int, int]], ps_per_byte: float, bin_ps: int,
                 n_bins: int) -> np.ndarray:
    """Busy picoseconds of a channel in each bin ``[b * bin_ps, (b + 1) * bin_ps)``.

    ``intervals`` is the channel's ``timeline``: ``(start_ps, finish_ps, wire_bytes)``
    per train. A train keeps the wire busy for its serialisation time (``wire_bytes x
    ps_per_byte``, rounded as the channel rounds it), spread evenly over
    ``[start, finish]`` (a train whose tail arrives late trickles onto the wire); so
    the bins sum to the channel's ``busy_ps`` and no bin exceeds its width.
    """
    out = np.zeros(n_bins)
    if not intervals or n_bins <= 0:
        return out
    arr = np.asarray(intervals, dtype=np.int64).reshape(-1, 3)
    start, finish, wire = arr[:, 0], arr[:, 1], arr[:, 2]
    busy = np.floor(wire * ps_per_byte + 0.5)
    length = finish - start
    keep = length > 0
    start, finish, busy, length = start[keep], finish[keep], busy[keep], length[keep]
    if not len(start):
        return out
    rate = busy / length
    knots = np.concatenate([start, finish])
    change = np.concatenate([rate, -rate])
    order = np.argsort(knots, kind="stable")
    t = knots[order].astype(np.float64)
    r = np.cumsum(change[order])  # wire busy fraction on [t[k], t[k+1])
    cumulative = np.concatenate([[0.0], np.cumsum(r[:-1] * np.diff(t))])
    edges = np.arange(n_bins + 1, dtype=np.float64) * bin_ps
    at_edges = np.interp(edges, t, cumulative, left=0.0, right=cumulative[-1])
    return np.clip(np.diff(at_edges), 0.0, float(bin_ps))


def bins_to_cover(end_ps: int, bin_ps: int) -> int:
    """How many bins of ``bin_ps`` cover ``[0, end_ps]``."""
    if bin_ps <= 0:
        raise ValueError(f"bin width must be positive, got {bin_ps} ps")
    return max(1, -(-end_ps // bin_ps))
