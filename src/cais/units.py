"""Byte sizes as people write them, read one way everywhere: the command line
(``--bytes``, ``--unit``), sweep files (``bytes``, ``unit``) and the Python API
(``CollectiveRunSpec(nbytes="16M")``).

A size is a whole number of bytes: ``1048576``, ``1_048_576``, ``1e9``, or a number
with a binary unit: ``K``/``KiB`` = 2**10, ``M``/``MiB`` = 2**20, ``G``/``GiB`` = 2**30,
``T``/``TiB`` = 2**40 (any case; ``1.5K`` = 1536; a trailing ``B`` alone is bytes:
``512B``). ``KB``, ``MB``, ``GB`` and ``TB`` are refused: they mean 10**3.. in SI
but 2**10.. in much software, and a silent guess would be wrong for someone; the
message says to write ``1G``/``1GiB`` for 2**30 or ``1e9`` for 10**9 (docs/errors.md,
"Sizes"). A size that is not a whole number of bytes (``0.1K``), zero, negative,
``inf`` or ``nan`` is refused too. This module imports nothing of cais but its errors.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from cais.errors import UserError

BINARY = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
SIZE_EXAMPLES = "1048576, 1e9, 64K, 16M, 1G or 1GiB (K, M, G, T and KiB, MiB, GiB, TiB are binary: 1G = 2**30)"
MAX_DIGITS = 30  # sizes of 1e30 bytes and more are refused here (far past the event limit)
_SIZE = re.compile(r"(?P<sign>[+-]?)\s*(?P<number>[0-9][0-9_]*(?:\.[0-9_]*)?(?:e[+-]?[0-9]+)?|\.[0-9]+(?:e[+-]?[0-9]+)?)"
                   r"\s*(?P<unit>[kmgt]?i?b?)", re.IGNORECASE)


class SizeError(UserError):
    """A byte size that is not one (one line: what was given and how to write it)."""


def parse_size(value: int | float | str) -> int:
    """``value`` as a positive whole number of bytes (see the module's rules);
    SizeError (a UserError, one line) otherwise. An int is taken as it is, a float
    (a YAML ``1.0e6``) as its text."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise SizeError(f"expected a size like {SIZE_EXAMPLES}, got {value!r}")
    if isinstance(value, float):
        value = repr(value)
    if isinstance(value, int):
        if value <= 0:
            raise SizeError(f"expected a positive size, got {value}")
        return value
    word = value.strip().lstrip("+-").strip().lower()
    if word == "nan":
        raise SizeError(f"'{value}' is not a number (NaN); expected a positive size like {SIZE_EXAMPLES}")
    if word in ("inf", "infinity"):
        raise SizeError(f"'{value}' is not a finite size; expected a positive size like {SIZE_EXAMPLES}")
    m = _SIZE.fullmatch(value.strip())
    if not m:
        raise SizeError(f"expected a size like {SIZE_EXAMPLES}, got '{value}'")
    unit = m["unit"].upper()
    if unit in ("KB", "MB", "GB", "TB"):
        raise SizeError(f"'{value}': {m['unit']} is ambiguous (10**3.. or 2**10.. bytes); write {unit[0]} or "
                        f"{unit[0]}iB for binary units (1{unit[0]} = 2**{10 * 'KMGT'.index(unit[0]) + 10}) or the "
                        f"number of bytes, e.g. 1e{3 * 'KMGT'.index(unit[0]) + 3}")
    if unit not in ("", "B") and unit.removesuffix("B").removesuffix("I") not in BINARY:
        raise SizeError(f"expected a size like {SIZE_EXAMPLES}, got '{value}'")
    try:
        number = Decimal(m["sign"] + m["number"].replace("_", ""))
    except InvalidOperation:
        raise SizeError(f"expected a size like {SIZE_EXAMPLES}, got '{value}'") from None
    if number.adjusted() > MAX_DIGITS:  # no run is near; and the whole number would be huge to make
        raise SizeError(f"'{value}' is more than 1e{MAX_DIGITS} bytes, beyond any run")
    nbytes = number * BINARY.get(unit[:1], 1) if unit not in ("", "B") else number
    if nbytes != nbytes.to_integral_value():
        raise SizeError(f"'{value}' is {nbytes} bytes, not a whole number of bytes")
    if nbytes <= 0:
        raise SizeError(f"expected a positive size, got '{value}'")
    return int(nbytes)
