"""A sweep spec to its points.

A spec (a YAML file, loaded to a dict) has up to three parts::

    fixed:  {kind: layer, model: paper-mega-gpt-4b, mode: prefill}   # in every point
    grid:   {scheme: [tp-nvls, cais], set.switch.merge.entries: [64, 2000]}  # cartesian product
    points: [{scheme: t3, sms: 66}]                                   # explicit, each over fixed

The grid's keys vary in the order written, the first slowest; the explicit points
follow the grid's. Without ``grid`` and ``points`` the spec is one point, ``fixed``.
A point that repeats an earlier one (same :func:`point_id`) is dropped.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cais.errors import UserError

Point = dict[str, Any]

SPEC_KEYS = ("fixed", "grid", "points", "description")


def point_id(point: Mapping[str, Any]) -> str:
    """A stable id of ``point``: the first 16 hex digits of the SHA-256 of its canonical
    JSON (sorted keys, no spaces). The resume key: the same point in another spec or
    another order has the same id; a different value (``64`` and ``64.0``, ``"64K"``
    and ``65536``) is a different point."""
    text = json.dumps(point, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _json_able(value: Any, where: str) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        raise UserError(f"{where}: value {value!r} is not plain data (numbers, text, true/false, null, "
                        "lists and mappings)") from None


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise UserError(f"'{where}' must be a mapping of key: value, got {type(value).__name__}")
    for key in value:
        if not isinstance(key, str):
            raise UserError(f"'{where}': key {key!r} must be text")
    _json_able(dict(value), where)
    return dict(value)


def expand(spec: Mapping[str, Any], *, validate: bool = True) -> list[Point]:
    """The points of ``spec`` (see the module docstring). With ``validate`` (the
    default) every point is checked as a :func:`cais.sweep.point.run_point` point
    before anything runs (known keys, names, values, the system each builds, a size
    the simulator accepts: :func:`cais.sweep.point.check_points`); pass
    ``validate=False`` for points meant for another function. UserError (one line,
    naming the key) on a malformed spec or a bad point."""
    if not isinstance(spec, Mapping):
        raise UserError(f"a sweep spec is a mapping with keys {', '.join(SPEC_KEYS)}; got {type(spec).__name__}")
    unknown = [k for k in spec if k not in SPEC_KEYS]
    if unknown:
        raise UserError(f"unknown spec key '{unknown[0]}'; allowed: {', '.join(SPEC_KEYS)}")
    fixed = _mapping(spec.get("fixed"), "fixed")
    grid = _mapping(spec.get("grid"), "grid")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise UserError(f"grid.{key}: expected a non-empty list of values, got {json.dumps(values)}")
    explicit = spec.get("points")
    if explicit is not None and not isinstance(explicit, list):
        raise UserError(f"'points' must be a list of mappings, got {type(explicit).__name__}")
    points: list[Point] = []
    if grid:
        for combo in itertools.product(*grid.values()):
            points.append({**fixed, **dict(zip(grid, combo))})
    for i, extra in enumerate(explicit or []):
        points.append({**fixed, **_mapping(extra, f"points[{i}]")})
    if not grid and not explicit:
        points.append(dict(fixed))
    seen: set[str] = set()
    points = [p for p in points if not (point_id(p) in seen or seen.add(point_id(p)))]  # first one wins
    if validate:
        from cais.sweep.point import check_points

        check_points(points)
    return points


def load_spec(path: str | Path) -> dict[str, Any]:
    """A YAML (or JSON) spec file as a dict; UserError (one line) if it is missing or
    not valid YAML."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise UserError(f"spec file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise UserError(f"{path}: not valid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, Mapping):
        raise UserError(f"{path}: a sweep spec is a mapping with keys {', '.join(SPEC_KEYS)}")
    return dict(data)
