"""A GPU's memory in functional mode: named numpy buffers addressed by element."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Region:
    """Elements of a named buffer (flat, row-major): ``rows`` runs of ``count``
    elements, the first at element ``start``, each ``stride`` after the previous (a
    2-D block such as a GEMM tile; ``rows == 1`` is a contiguous run).
    ``elem_bytes`` is the simulated element size (2 for bf16): timing uses it, while
    functional data may be held at higher precision so that sums are exact."""

    buffer: str
    start: int
    count: int
    elem_bytes: int = 2
    rows: int = 1
    stride: int = 0

    @property
    def nbytes(self) -> int:
        return self.rows * self.count * self.elem_bytes

    @property
    def byte_offset(self) -> int:
        return self.start * self.elem_bytes

    def sub(self, start: int, count: int) -> "Region":
        """The contiguous sub-region of ``count`` elements at ``start`` elements into
        this (contiguous) one."""
        return Region(self.buffer, self.start + start, count, self.elem_bytes)

    def row_block(self, first: int, rows: int) -> "Region":
        """Rows ``first .. first+rows-1`` of this block."""
        return Region(self.buffer, self.start + first * self.stride, self.count, self.elem_bytes, rows, self.stride)

    @staticmethod
    def block(buffer: str, row_len: int, r0: int, nrows: int, c0: int, ncols: int, elem_bytes: int = 2) -> "Region":
        """The block [r0:r0+nrows, c0:c0+ncols] of a row-major matrix with rows of
        ``row_len`` elements."""
        if ncols == row_len:  # whole rows: contiguous
            return Region(buffer, r0 * row_len, nrows * row_len, elem_bytes)
        return Region(buffer, r0 * row_len + c0, ncols, elem_bytes, nrows, row_len)


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
