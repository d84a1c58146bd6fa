"""A GPU's memory in functional mode: named numpy buffers addressed by element."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Region:
    """A contiguous run of ``count`` elements of a named buffer, starting at element
    ``start``. ``elem_bytes`` is the simulated element size (2 for bf16): timing uses
    it, while functional data may be held at higher precision so that sums are exact."""

    buffer: str
    start: int
    count: int
    elem_bytes: int = 2

    @property
    def nbytes(self) -> int:
        return self.count * self.elem_bytes

    @property
    def byte_offset(self) -> int:
        return self.start * self.elem_bytes

    def sub(self, start: int, count: int) -> "Region":
        """The sub-region of ``count`` elements at ``start`` elements into this one."""
        return Region(self.buffer, self.start + start, count, self.elem_bytes)


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
        if not self.functional:
            return None
        return self.buffers[r.buffer][r.start:r.start + r.count].copy()

    def write(self, r: Region, data: np.ndarray | None) -> None:
        if self.functional:
            self.buffers[r.buffer][r.start:r.start + r.count] = data

    def add(self, r: Region, data: np.ndarray | None) -> None:
        if self.functional:
            self.buffers[r.buffer][r.start:r.start + r.count] += data
