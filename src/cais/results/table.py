"""Results as data: one row per run (the system config, the run's arguments and every
metric, flattened with dotted keys) appended to a Parquet or CSV table, so many runs
load with one ``pandas.read_parquet`` / ``read_csv``."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cais.errors import UserError
from cais.config import SystemConfig

TABLE_SUFFIXES = (".parquet", ".csv")

Scalar = str | int | float | bool | None


def flatten(obj: Mapping[str, Any], prefix: str = "") -> dict[str, Scalar]:
    """Nested dicts to one level with dotted keys (``{"a": {"b": 1}}`` -> ``{"a.b": 1}``);
    lists become JSON text (a column holds one value per run)."""
    out: dict[str, Scalar] = {}
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, name + "."))
        elif isinstance(value, (list, tuple)):
            out[name] = json.dumps(value)
        else:
            out[name] = value
    return out


def run_row(cfg: SystemConfig, arguments: Mapping[str, Any], metrics: Mapping[str, Any]) -> dict[str, Scalar]:
    """One run as a row: every config field (``link.bandwidth_GBps``), then the run's
    arguments, then its metrics (later keys win where names repeat, e.g. ``gpus``)."""
    return {**flatten(cfg.model_dump()), **flatten(arguments), **flatten(metrics)}


def table_format(path: str | Path) -> str:
    """``parquet`` or ``csv``, from the file's suffix; UserError for any other."""
    suffix = Path(path).suffix.lower()
    if suffix not in TABLE_SUFFIXES:
        raise UserError(f"results table must end in {' or '.join(TABLE_SUFFIXES)}, got '{path}'")
    return suffix[1:]


def publish(tmp: Path, path: str | Path) -> None:
    """Move a staged file ``tmp`` onto ``path`` atomically (it appears whole or not at
    all); a failure removes ``tmp`` and is a one-line user error."""
    try:
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise UserError(f"cannot write {path}: {exc.strerror}") from None


def stage_row(path: str | Path, row: Mapping[str, Scalar]) -> tuple[Path, int]:
    """The table at ``path`` with ``row`` appended, written to a temporary file next to
    it: (that file, the number of rows). The caller moves it over ``path``
    (``os.replace``) or deletes it; ``path`` itself is not touched. UserError (one
    line) if the table cannot be read or written."""
    import pandas as pd

    fmt = table_format(path)
    path = Path(path)
    if not path.parent.is_dir():
        raise UserError(f"cannot write {path}: no directory {path.parent}")
    table = pd.DataFrame([dict(row)])
    if path.exists():
        try:
            old = pd.read_parquet(path) if fmt == "parquet" else pd.read_csv(path)
        except Exception as exc:  # noqa: BLE001 - any reader failure means "not a table we can extend"
            raise UserError(f"cannot append to {path}: not a readable {fmt} table ({type(exc).__name__})") from None
        table = pd.concat([old, table], ignore_index=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if fmt == "parquet":
            table.to_parquet(tmp, index=False)
        else:
            table.to_csv(tmp, index=False)
        if path.exists():
            shutil.copymode(path, tmp)
    except BaseException as exc:  # the old table stays as it was; no temporary file stays behind
        tmp.unlink(missing_ok=True)
        if not isinstance(exc, Exception):
            raise
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
        why = str(why).replace(str(tmp), str(path))  # name the file the user gave, not the temporary one
        raise UserError(f"cannot write {path}: {why.splitlines()[0]}") from None
    return tmp, len(table)
