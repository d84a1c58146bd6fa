"""The compared systems: one module per scheme, each a :class:`Scheme` subclass that
decides how a layer period's kernels, collectives and dependencies run. A module
that defines a subclass with a ``name`` is found automatically."""

from __future__ import annotations

import importlib
import pkgutil

from cais.errors import UserError
from cais.schemes.base import Scheme

MOE_FAMILY = "moe"  # Scheme.family of the MoE layer's EP schemes

# The paper's order (§IV-C), the plain Megatron baselines, then anything else alphabetically.
PAPER_ORDER = ("tp-nvls", "sp-nvls", "coconet", "fuselib", "t3", "coconet-nvls", "fuselib-nvls", "t3-nvls", "ladm",
               "tp-ring", "sp-ring", "tp-nccl", "sp-nccl")  # then the plain Megatron baselines (NCCL ring, or
# NCCL's own choice per call; no overlap)


def _discover() -> dict[str, type[Scheme]]:
    found: dict[str, type[Scheme]] = {}
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, Scheme) and obj.name and obj.__module__ == module.__name__:
                found[obj.name] = obj
    rank = {n: i for i, n in enumerate(PAPER_ORDER)}
    return dict(sorted(found.items(), key=lambda kv: (rank.get(kv[0], len(rank)), kv[0])))


def schemes() -> dict[str, type[Scheme]]:
    """The dense (tensor-parallel) schemes: name -> class, in the paper's order."""
    return {name: cls for name, cls in _discover().items() if cls.family != MOE_FAMILY}


def moe_schemes() -> dict[str, type[Scheme]]:
    """The MoE layer's schemes, one per EP kernel of the registry (cais.schemes.ep)."""
    return {name: cls for name, cls in _discover().items() if cls.family == MOE_FAMILY}


def get_scheme(name: str) -> Scheme:
    """A scheme by name, dense or MoE; a one-line UserError lists the valid names."""
    found = _discover()
    cls = found.get(name)
    if cls is None:
        raise UserError(f"scheme: unknown scheme '{name}'; valid: {', '.join(found)}")
    return cls()
