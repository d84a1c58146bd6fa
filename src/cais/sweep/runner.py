"""Run a function over sweep points, one row per point, resumable (stand-in for the
sweep branch: serial in this process, with the same signature and row format; the
real runner uses worker processes or Ray and appends rows as points finish)."""

from __future__ import annotations

import importlib
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from cais.sweep.grid import Point, point_id


def _resolve(fn: str) -> Callable[[Point], dict[str, Any]]:
    module, _, name = fn.partition(":")
    return getattr(importlib.import_module(module), name)


def _one(fn: str, p: Point) -> dict[str, Any]:
    """One point's row: its id, keys, status, error, wall time and ``fn``'s columns."""
    t0 = time.perf_counter()
    row: dict[str, Any] = {"point_id": point_id(p), **{f"point.{k}": v for k, v in p.items()}}
    try:
        row.update(_resolve(fn)(p))
        row.update(status="ok", error="")
    except Exception as exc:  # noqa: BLE001 - recorded as the point's failure
        row.update(status="error", error=f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}")
    row["wall_s"] = time.perf_counter() - t0
    return row


def run_sweep(points: list[Point], out: str | Path, *, fn: str = "cais.sweep.point:run_point",
              workers: int | None = None, ray_address: str | None = None, progress: bool = True,
              desc: str = "sweep") -> pd.DataFrame:
    """Run ``fn`` ("module:function") on every point not yet in the Parquet file ``out``
    and return all rows of ``points`` (``point_id``, ``status`` "ok"/"error", ``error``,
    ``wall_s``, the point's keys as ``point.<key>`` and the returned columns).
    ``workers`` > 1 runs points in that many local processes; ``ray_address`` is
    accepted and ignored by this stand-in."""
    out = Path(out)
    done = pd.read_parquet(out) if out.exists() else pd.DataFrame()
    have = set(done["point_id"]) if "point_id" in done else set()
    rows = []
    todo = list({point_id(p): p for p in points if point_id(p) not in have}.values())
    if workers and workers > 1 and len(todo) > 1:
        pool = ProcessPoolExecutor(max_workers=workers)
        futures = [pool.submit(_one, fn, p) for p in todo]
        results = (f.result() for f in as_completed(futures))
    else:
        pool = None
        results = (_one(fn, p) for p in todo)
    for i, row in enumerate(results):
        p = {k[len("point."):]: v for k, v in row.items() if k.startswith("point.")}
        rows.append(row)
        if progress:
            print(f"[{desc}] {i + 1}/{len(todo)} {row['status']} {row['wall_s']:.1f}s "
                  + " ".join(f"{k}={v}" for k, v in p.items() if k in ("model", "scheme", "mode", "gpus", "op")),
                  flush=True)
        frame = pd.concat([done, pd.DataFrame(rows)], ignore_index=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        frame.to_parquet(out)
    if pool is not None:
        pool.shutdown()
    frame = pd.concat([done, pd.DataFrame(rows)], ignore_index=True) if rows else done
    ids = [point_id(p) for p in points]
    if frame.empty:
        return frame
    frame = frame.drop_duplicates("point_id", keep="last").set_index("point_id")
    return frame.loc[[i for i in ids if i in frame.index]].reset_index()
