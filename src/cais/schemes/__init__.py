"""The compared systems: one module per scheme, each a :class:`Scheme` subclass that
decides how a layer period's kernels, collectives and dependencies run."""

from __future__ import annotations

from cais.schemes.base import Scheme
from cais.schemes.sp_nvls import SpNvls
from cais.schemes.tp_nvls import TpNvls

SCHEMES: dict[str, type[Scheme]] = {cls.name: cls for cls in (TpNvls, SpNvls)}


def get_scheme(name: str) -> Scheme:
    """A scheme by name; a one-line ValueError lists the valid names."""
    cls = SCHEMES.get(name)
    if cls is None:
        raise ValueError(f"--scheme: unknown scheme '{name}'; valid: {', '.join(SCHEMES)}")
    return cls()
