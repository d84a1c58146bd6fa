"""The collective algorithms, by name: one registry every layer asks what an
algorithm is (which operations and protocols it runs, whether NCCL's tuning chooses
among it, whether it starts and ends with a barrier over all GPUs, how many channels
and events it takes) and how to build its kernels. An algorithm is one
:class:`Algorithm`, registered where its kernels are written (NCCL's ring and NVLS in
``kernels/collectives.py``, the production all-reduce kernels in
``kernels/production_ar.py``); nothing else names it. docs/extending.md says how to
add one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cais.errors import UserError

if TYPE_CHECKING:
    from cais.config import SystemConfig
    from cais.hw.gpu import Kernel
    from cais.machine import Machine

OPS = ("allreduce", "allgather", "reducescatter")


@dataclass(frozen=True)
class Algorithm:
    """A collective algorithm: its ``name``; the operations it runs (``ops``); the
    protocols it has (``protocols``; the first is the one run when none is chosen);
    ``nccl``: one of NCCL's algorithms, which its tuning model chooses among;
    ``barriers``: its kernels start and end with a barrier over all GPUs (NVLS: a GPU
    may not pull or push replicas its peers have not produced); ``channels``: the TBs
    per GPU it runs with on a system; ``step_bytes``: the most one channel moves per
    step on a system (None: its share of the buffer at once); ``events_per_train``:
    events one packet train of it costs (measured, docs/errors.md, "Size limits");
    ``build``: its kernels, one per GPU, for a ``CollectiveSpec`` on a machine."""

    name: str
    ops: tuple[str, ...]
    protocols: tuple[str, ...]
    nccl: bool
    barriers: bool
    channels: Callable[["SystemConfig"], int]
    events_per_train: int
    build: Callable[["Machine", Any], list["Kernel"]]
    step_bytes: Callable[["SystemConfig"], int] | None = None

    def check(self, op: str, protocol: str | None = None) -> None:
        """A UserError naming the field where ``op`` or ``protocol`` is not this
        algorithm's."""
        if op not in self.ops:
            raise UserError(f"op: algorithm '{self.name}' runs {', '.join(self.ops)}; got '{op}'")
        if protocol is not None and protocol not in self.protocols:
            raise UserError(f"protocol: '{self.name}' runs {', '.join(self.protocols)}; got '{protocol}'")


#: every algorithm, by name, in registration order
ALGORITHMS: dict[str, Algorithm] = {}


def register(algo: Algorithm) -> Algorithm:
    """Add ``algo`` to the registry (a name registered twice is an internal error)."""
    if algo.name in ALGORITHMS:
        raise ValueError(f"collective algorithm '{algo.name}' registered twice")
    ALGORITHMS[algo.name] = algo
    return algo


def unregister(name: str) -> None:
    """Take the algorithm ``name`` out of the registry (a test's fixture algorithm)."""
    del ALGORITHMS[name]


def algorithm(name: str) -> Algorithm:
    """The algorithm called ``name``; a UserError naming ``algo`` and the valid names."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise UserError(f"algo: unknown algorithm '{name}'; valid: {', '.join(ALGORITHMS)}") from None


def names(nccl: bool | None = None) -> tuple[str, ...]:
    """The registered algorithms' names (``nccl``: only NCCL's, or only the others)."""
    return tuple(n for n, a in ALGORITHMS.items() if nccl is None or a.nccl == nccl)
