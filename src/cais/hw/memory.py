"""A GPU's memory in functional mode: named numpy buffers addressed by element."""

from __future__ import annotations

import numpy as np

# A region of a buffer (its elements, runs and stride) is compiled: every memory
# instruction carries one, the core reads its fields and the merge unit keys on it.
from cais._core import Region

__all__ = ["Memory", "Region", "as_run"]


def as_run(r: Region, data: np.ndarray | None) -> np.ndarray | None:
    """``data`` for region ``r`` as its accesses take it: 1-D for a run (``rows == 1``;
    a block one row high, e.g. a GEMM tile's row for a one-row shard, may come as
    [1, count]), as given for a block."""
    return np.reshape(data, -1) if data is not None and r.rows == 1 else data


class Memory:
    """HBM of one GPU as named arrays. With ``functional=False`` it holds nothing and
    every access returns None: timing runs carry no data."""

    def __init__(self, functional: bool) -> None:
        self.functional = functional
        self.buffers: dict[str, np.ndarray] = {}

    def alloc(self, name: str, count: int, dtype: type = np.float64, fill: np.ndarray | None = None) -> None:
        if not self.functional:
            return
        if fill is not None:
            self.buffers[name] = np.array(fill, dtype=dtype).reshape(-1)
        else:
            self.buffers[name] = np.zeros(count, dtype=dtype)

    def read(self, r: Region) -> np.ndarray | None:
        """A copy of the region's data: 1-D for a run, [rows, count] for a block."""
        if not self.functional:
            return None
        return self.buffers[r.buffer][self._index(r)].copy()

    def _index(self, r: Region) -> slice | np.ndarray:
        if r.rows == 1:
            return slice(r.start, r.start + r.count)
        return r.start + np.arange(r.rows)[:, None] * r.stride + np.arange(r.count)

    def write(self, r: Region, data: np.ndarray | None) -> None:
        if self.functional:
            self.buffers[r.buffer][self._index(r)] = as_run(r, data)

    def add(self, r: Region, data: np.ndarray | None) -> None:
        if self.functional:
            self.buffers[r.buffer][self._index(r)] += as_run(r, data)

    def matrix(self, name: str, cols: int) -> np.ndarray:
        """A buffer seen as a row-major matrix with ``cols`` columns (a view)."""
        return self.buffers[name].reshape(-1, cols)
