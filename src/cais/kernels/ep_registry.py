"""The expert-parallel (EP) kernels by name: the one registry ``cais ep``, the MoE
layer's EP schemes (``ep-<name>``, cais.schemes.ep) and the MoE experiment read.

The contract a kernel module keeps to be run in a MoE layer (docs/moe.md, "Adding an
EP kernel"):

* ``kernels(m: Machine, call: EpCall) -> list[Kernel]``: one kernel per GPU for the
  dispatch or combine ``call`` describes (its routing, row width, dtype), reading and
  writing the buffers it allocates itself;
* optional ``PERMUTE``: where the stack puts the token rows in expert order, ``sender``
  (before the dispatch, one row per (token, expert): Megatron's permute), ``receiver``
  (after it, the rows a rank received; the default) or ``none`` (the kernel writes the
  experts' layout itself);
* optional ``SHARED_OVERLAP``: whether the stacks that run it overlap the shared
  experts with the dispatch on a side stream (default False).
"""

from __future__ import annotations

from types import ModuleType

from cais.kernels import ep_allgather, ep_deepep, ep_deepep_ll, ep_nccl

#: every EP kernel, by its ``--kernel`` name
EP_KERNELS: dict[str, ModuleType] = {"nccl": ep_nccl, "allgather": ep_allgather, "deepep": ep_deepep,
                                     "deepep-ll": ep_deepep_ll}

PERMUTE_PLACES = ("sender", "receiver", "none")


def permute_place(module: ModuleType) -> str:
    """Where the stack running ``module`` permutes the token rows (module doc)."""
    place = getattr(module, "PERMUTE", "receiver")
    if place not in PERMUTE_PLACES:
        raise ValueError(f"{module.__name__}.PERMUTE: '{place}'; valid: {', '.join(PERMUTE_PLACES)}")
    return str(place)


def shared_overlap(module: ModuleType) -> bool:
    """Whether the stacks running ``module`` overlap the shared experts with its dispatch."""
    return bool(getattr(module, "SHARED_OVERLAP", False))
