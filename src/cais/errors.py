"""The one error type for a user's mistakes.

Anything a user can get wrong (an unknown name, a bad number, a bad file, a shape the
layer cannot be split into, a run too big to simulate) raises :class:`UserError` or a
subclass (``ConfigError`` for systems, ``ModelError`` for models, ``UsageError`` for
command-line arguments). Its message is one line and names what to change. The
``cais`` command catches it once and prints ``cais: error: <message>`` with exit code
2; any other exception is a bug in the simulator (docs/errors.md).

``UserError`` subclasses ``ValueError`` so that code written against the earlier
``ValueError``s keeps working. This module imports nothing, so every layer may use it.
"""

from __future__ import annotations


class UserError(ValueError):
    """A user's mistake: a one-line message naming the field or argument and what is
    allowed."""


def looks_like_path(text: str) -> bool:
    """Whether a ``system`` / ``model`` name is meant as a file (it has a
    directory part or a ``.json`` suffix; a preset name has neither), so that a
    missing one is reported as "file not found", not as an unknown name."""
    return "/" in text or "\\" in text or text.lower().endswith(".json")


def _is_nan(value: object) -> bool:
    """Whether ``value`` is a NaN, or text that reads as one (``nan``, ``-NaN``)."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return False
    return isinstance(value, float) and value != value


def validation_message(error: dict) -> str:
    """The words of one pydantic validation error (an entry of
    ``ValidationError.errors()``) for a one-line message: without pydantic's "Value
    error, " prefix, and saying so where the input is a NaN, which pydantic reports as
    a failed bound ("Input should be greater than or equal to 0"): ``not a number
    (NaN); Input should be greater than or equal to 0``."""
    msg = str(error.get("msg", "")).removeprefix("Value error, ")
    return f"not a number (NaN); {msg}" if _is_nan(error.get("input")) else msg
