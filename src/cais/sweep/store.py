"""The results table of a sweep: one Parquet or CSV file (by its suffix, as ``cais run
--out``), one row per point id.

Every append writes the whole table to a temporary file next to it and moves it over
the old one with ``os.replace`` (atomic on POSIX), so at any moment, ``kill -9``
included, the file is the table after some complete append: a finished point is never
lost once :meth:`ResultStore.add` returned, and the file is never half written. The
cost is one table write per batch of finished points (milliseconds for hundreds of
rows; simulation points take seconds). One sweep writes a table at a time: a lock
file (``.<name>.lock``, ``flock``, released by the kernel even on ``kill -9``; removed
when the sweep ends) refuses a second sweep on the same table.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from cais.errors import UserError
from cais.results.table import table_format

META_COLUMNS = ("point_id", "status", "error", "wall_s")


def _tmp_name(path: Path, pid: int) -> Path:
    return path.with_name(f".{path.name}.sweep-{pid}.tmp")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def normalise(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` made writable as Parquet: an object column whose values are of mixed
    types (``64`` in one row, ``"64K"`` in another) becomes text; None stays missing."""
    for col in table.columns:
        if table[col].dtype != object:
            continue
        kinds = {type(v) for v in table[col] if v is not None and not (isinstance(v, float) and pd.isna(v))}
        if len(kinds) > 1 and not kinds <= {int, float}:
            table[col] = [None if v is None or (isinstance(v, float) and pd.isna(v)) else str(v)
                          for v in table[col]]
    return table


def _format(path: Path) -> str:
    """``parquet`` or ``csv`` by the suffix; UserError naming ``out`` for any other."""
    try:
        return table_format(path)
    except UserError as exc:
        raise UserError(f"out: {exc}") from None


def read_table(path: str | Path) -> pd.DataFrame:
    """The sweep table at ``path`` (empty, with the meta columns, if there is none);
    UserError if the file is not a readable Parquet or CSV table (by its suffix) with
    a ``point_id`` column. A CSV's meta columns are read as text (a point id of digits
    only stays the same text)."""
    path = Path(path)
    fmt = _format(path)
    if not path.exists():
        return pd.DataFrame({c: pd.Series(dtype=object) for c in META_COLUMNS})
    if path.is_dir():
        raise UserError(f"out: '{path}' is a directory; give a .parquet or .csv file name")
    try:
        table = (pd.read_parquet(path) if fmt == "parquet" else
                 pd.read_csv(path, dtype={"point_id": str, "status": str, "error": str}))
    except Exception as exc:  # noqa: BLE001 - any reader failure means "not a table we can extend"
        raise UserError(f"out: cannot resume {path}: not a readable {fmt} table ({type(exc).__name__})") from None
    if "point_id" not in table.columns:
        raise UserError(f"out: {path} is not a sweep table (no point_id column); give another file name")
    return table


class ResultStore:
    """The table at ``path``, held in memory and rewritten atomically on each append.

    Use as a context manager: entering takes the table's lock and removes temporary
    files that killed sweeps left behind; leaving releases the lock."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.format = _format(self.path)
        if not self.path.parent.is_dir():
            raise UserError(f"out: no directory {self.path.parent} for '{path}'")
        self.table = read_table(self.path)
        self._lock: int | None = None

    def __enter__(self) -> ResultStore:
        lock = self._lock_path()
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise UserError(f"out: cannot write in {self.path.parent}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.fstat(fd).st_ino != os.stat(lock).st_ino:  # its holder removed it as we opened it
                raise BlockingIOError
        except OSError:
            os.close(fd)
            raise UserError(f"out: another sweep is writing {self.path}; wait for it or use another file") from None
        self._lock = fd
        for tmp in self.path.parent.glob(f".{self.path.name}.sweep-*.tmp"):
            pid = tmp.name.rsplit("-", 1)[-1].removesuffix(".tmp")
            if pid.isdigit() and not _alive(int(pid)):
                tmp.unlink(missing_ok=True)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._lock is not None:
            self._lock_path().unlink(missing_ok=True)  # while still held: a waiting opener sees a new file
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            os.close(self._lock)
            self._lock = None

    def _lock_path(self) -> Path:
        return self.path.with_name(f".{self.path.name}.lock")

    def finished(self, keep_errors: bool = False) -> set[str]:
        """Point ids that need no rerun: those with status ok (and with ``keep_errors``,
        those that failed too)."""
        t = self.table
        done = t["point_id"] if keep_errors else t.loc[t["status"] == "ok", "point_id"]
        return set(done.astype(str))

    def add(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Append ``rows`` (each with a ``point_id``; a row replaces an earlier row of
        the same point) and publish the table atomically."""
        new = pd.DataFrame([dict(r) for r in rows])
        if new.empty:
            return
        old = self.table[~self.table["point_id"].isin(new["point_id"])]
        table = normalise(pd.concat([old, new], ignore_index=True) if len(old) else new)
        tmp = _tmp_name(self.path, os.getpid())
        try:
            if self.format == "parquet":
                table.to_parquet(tmp, index=False)
            else:
                table.to_csv(tmp, index=False)
            os.replace(tmp, self.path)
        except BaseException as exc:
            tmp.unlink(missing_ok=True)
            if isinstance(exc, OSError):
                raise UserError(f"out: cannot write {self.path}: {exc.strerror}") from None
            raise
        self.table = table
