"""Run a sweep's points in local processes or on a Ray cluster; each finished point's
row is appended to the results table at once (:mod:`cais.sweep.store`), so an
interrupted sweep resumes where it stopped."""

from __future__ import annotations

import gc
import importlib
import multiprocessing
import os
import signal
import socket
import sys
import tempfile
import time
from contextlib import ExitStack, closing
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

import pandas as pd

from cais.errors import UserError
from cais.progress import clock_text, fitted_progress
from cais.provenance import git_commit, now_utc, package_version
from cais.results.table import flatten
from cais.sweep.grid import Point, point_id
from cais.sweep.store import META_COLUMNS, ResultStore, read_table

DEFAULT_FN = "cais.sweep.point:run_point"


PointFn = Callable[[Point], Mapping[str, Any]]
Job = tuple["str | PointFn", Point]
#: (point function's name, point) -> the point whose run under that function is this one's
SameRun = Callable[[str, Point], Point]


def resolve(fn: str | PointFn) -> PointFn:
    """The point function: ``fn`` itself, or the function a ``module:function`` name
    stands for; UserError if there is none. A function must be importable by worker
    processes (defined at the top level of a module)."""
    if callable(fn):
        return fn
    module, sep, name = fn.partition(":")
    if not sep or not module or not name:
        raise UserError(f"fn: expected 'module:function', got '{fn}'")
    try:
        obj = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise UserError(f"fn: cannot load '{fn}': {exc}") from None
    if not callable(obj):
        raise UserError(f"fn: '{fn}' is not a function")
    return obj  # type: ignore[no-any-return]


def _name(fn: str | PointFn) -> str:
    """A point function as ``module:function``."""
    return fn if isinstance(fn, str) else f"{fn.__module__}:{fn.__qualname__}"


def one_line(exc: BaseException) -> str:
    """An exception as one line: ``Type: message`` (whitespace collapsed)."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def call_point(fn: str | PointFn, point: Point) -> dict[str, Any]:
    """Run ``fn`` on ``point`` and return the point's row: ``point_id``, ``status``,
    ``error`` (None when ok), ``wall_s``, the point's keys as ``point.<key>``, then the
    function's columns. Never raises for the point's own failure: any exception
    becomes status ``error`` with its one-line message (``CAIS_DEBUG=1`` also prints
    the traceback on stderr). Worker processes run it through :func:`worker_point`."""
    t0 = time.perf_counter()
    status, error, out = "ok", None, {}
    try:
        result = resolve(fn)(point)
        if not isinstance(result, Mapping):
            raise TypeError(f"{_name(fn)} returned {type(result).__name__}, not a dict")
        out = flatten(result)
    except Exception as exc:  # noqa: BLE001 - a failing point is a result, not the sweep's end
        if os.environ.get("CAIS_DEBUG"):
            traceback.print_exc()
        status, error = "error", one_line(exc)
    row: dict[str, Any] = {"point_id": point_id(point), "status": status, "error": error,
                           "wall_s": time.perf_counter() - t0}
    row.update(flatten(point, "point."))
    row.update({k: v for k, v in out.items() if k not in META_COLUMNS and k not in row})
    return row


def worker_point(fn: str | PointFn, point: Point) -> dict[str, Any]:
    """:func:`call_point` in a worker process of the sweep's own (a local pool's or a
    Ray task's), then the point's garbage collected, before the worker takes its next
    point. A finished machine lives in reference cycles (its TB programs' closures hold
    it) until the cyclic collector's next full pass, which the next point's run may not
    reach for a long time, so the worker would start its next point with the last one's
    machine still in memory (a full grid's peak RSS went from 3.1 to 3.4 GB that way;
    docs/core.md). After the worker's first point, what survives (its modules and
    caches) is frozen out of later collections (``gc.freeze``), so a collection costs
    what a point left, not the process's size; only then, so that nothing a later point
    leaves alive (a Ray worker's own bookkeeping) is kept from the collector for good. A
    process that is not the sweep's (the caller's, for one worker) is left to its own
    collector."""
    row = call_point(fn, point)
    gc.collect()
    if gc.get_freeze_count() == 0:
        gc.freeze()
    return row


Done = tuple[str, dict[str, Any]]  # a finished job: its function's name and its point's row


def _local(jobs: Sequence[Job], workers: int) -> Iterator[list[Done]]:
    """Rows of ``jobs`` ((function, point) pairs) in batches, as they finish, each with
    its function's name: in this process for one worker, else in a pool of ``workers``
    processes (spawned: no state inherited), started in the jobs' order."""
    if workers == 1:
        for fn, p in jobs:
            yield [(_name(fn), call_point(fn, p))]
        return
    ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_ignore_sigint)
    pending: dict[Future[dict[str, Any]], Job] = {pool.submit(worker_point, fn, p): (fn, p) for fn, p in jobs}
    try:
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            batch = []
            for fut in done:
                fn, point = pending.pop(fut)
                try:
                    batch.append((_name(fn), fut.result()))
                except Exception as exc:  # noqa: BLE001 - the worker process died (BrokenProcessPool)
                    batch.append((_name(fn), _failed(point, exc)))
            yield batch
    except BaseException:  # Ctrl-C or the caller stopped: end the workers now, not after their points
        workers_now = list(getattr(pool, "_processes", None) or {})
        manager = getattr(pool, "_executor_manager_thread", None)
        pool.shutdown(wait=False, cancel_futures=True)
        for pid in workers_now:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        # the pool's manager thread sees its workers gone and closes its wake-up pipe: wait
        # for it here, or the interpreter's exit hook may write to that pipe as it closes
        # and print a traceback after "cais: terminated"
        if manager is not None:
            manager.join(timeout=10)
        raise
    pool.shutdown()


def _ignore_sigint() -> None:
    """Workers leave Ctrl-C to the driver, which ends them (a point stopped half-way
    has no row and runs again on resume)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _failed(point: Point, exc: BaseException) -> dict[str, Any]:
    """The row of a point whose worker died before it could return one."""
    return {"point_id": point_id(point), "status": "error", "error": f"worker failed: {one_line(exc)[:300]}",
            "wall_s": None, **flatten(point, "point.")}


def _ray(jobs: Sequence[Job], address: str) -> Iterator[list[Done]]:
    """Rows of ``jobs`` ((function, point) pairs) in batches as they finish, each with
    its function's name; each job a Ray task on the cluster at ``address`` (``cais`` and the functions' modules must be
    importable there)."""
    try:
        import ray
    except ImportError:
        raise UserError("ray: Ray is not installed; pip install 'cais-sim[cluster]'") from None
    owned = not ray.is_initialized()
    if owned:
        _reachable(address)
        try:
            local = {"include_dashboard": False} if address == "local" else {}  # a new one-machine Ray
            ray.init(address=address, log_to_driver=False, logging_level="warning", **local)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            raise UserError(f"ray: cannot connect to a Ray cluster at '{address}': {one_line(exc)}") from None
    pending: dict[Any, Job] = {}
    try:
        task = ray.remote(num_cpus=1, max_retries=1)(worker_point)
        pending = {task.remote(fn, p): (fn, p) for fn, p in jobs}
        while pending:
            ready, rest = ray.wait(list(pending), num_returns=1)
            more, _ = ray.wait(rest, num_returns=len(rest), timeout=0) if rest else ([], [])
            batch = []
            for ref in [*ready, *more]:
                fn, point = pending.pop(ref)
                try:
                    batch.append((_name(fn), ray.get(ref)))
                except Exception as exc:  # noqa: BLE001 - the task's worker died (a Ray error)
                    batch.append((_name(fn), _failed(point, exc)))
            yield batch
    finally:
        for ref in pending:  # left when interrupted
            try:
                ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - finished or gone meanwhile
                pass
        if owned:
            ray.shutdown()


def _reachable(address: str) -> None:
    """UserError at once if ``host:port`` takes no TCP connection (Ray itself retries
    for minutes); other forms (``local``, ``auto``, ``ray://...``) are left to Ray."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "/" in address:
        return
    try:
        socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=5).close()
    except OSError as exc:
        raise UserError(f"ray: no Ray cluster answers at {address}: {exc.strerror or exc}") from None


class PlainProgress:
    """A sweep's progress where stderr is not a terminal (a pipe, a log file): a whole
    line at most every ``every_s`` seconds, ETA first, never cut; a sweep shorter than
    that prints nothing. It takes the calls rich's Progress takes here."""

    def __init__(self, label: str, total: int, every_s: float = 10.0,
                 clock: Callable[[], float] = time.perf_counter, stream: Any = None) -> None:
        self.label, self.total, self.every_s, self.clock = label, total, every_s, clock
        self.stream = stream if stream is not None else sys.stderr
        self.done = self.failed = 0
        self.t0 = self.next = 0.0

    def __enter__(self) -> "PlainProgress":
        self.t0 = self.clock()
        self.next = self.t0 + self.every_s
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, _task: int, advance: int = 0, failed: int = 0) -> None:
        self.done += advance
        self.failed = failed
        now = self.clock()
        if now < self.next:
            return
        self.next = now + self.every_s
        elapsed = now - self.t0
        eta = elapsed / self.done * (self.total - self.done) if self.done else None
        print(f"cais: {self.label}: ETA {clock_text(eta)} | {self.done}/{self.total} | {self.failed} failed | "
              f"{clock_text(elapsed)}", file=self.stream, flush=True)


def _progress(enabled: bool, desc: str, total: int, skipped: int) -> Any:
    """A rich progress bar on stderr (ETA, done/total, failures, elapsed; the ETA kept
    where the terminal is narrow, cais.progress.BarView); where stderr is not a
    terminal, plain lines now and then (:class:`PlainProgress`); nothing when not
    asked."""
    from rich.console import Console

    def parts(task: Any) -> list[str]:
        return [f"ETA {clock_text(task.time_remaining)}", f"{task.completed:.0f}/{task.total:.0f}",
                f"{task.fields['failed']} failed", clock_text(task.elapsed or 0.0)]

    console = Console(stderr=True)
    label = f"{desc} ({skipped} done before)" if skipped else desc
    if enabled and not console.is_terminal:
        return PlainProgress(label, total), 0
    progress = fitted_progress(parts, console=console, disable=not enabled)
    return progress, progress.add_task(label, total=total, failed=0)


def run_sweep(points: list[Point], out: str | Path, *, fn: str | PointFn = DEFAULT_FN, workers: int | None = None,
              ray_address: str | None = None, progress: bool = True, desc: str = "sweep",
              keep_errors: bool = False, command: str = "") -> pd.DataFrame:
    """Run every point of ``points`` not already finished in the table ``out`` (a
    ``.parquet`` or ``.csv`` file) through ``fn`` (a function defined at the top level of a
    module, or its ``module:function`` name; it takes a point and returns a flat or
    nested dict) and append each row to ``out`` as it finishes.

    Points whose id has a row with status ``ok`` are skipped; failed ones run again
    unless ``keep_errors``. Local processes by default (``workers``: default
    ``os.cpu_count()``; 1 runs in this process), or Ray tasks on the cluster at
    ``ray_address``. A point that raises becomes a row with status ``error`` and
    its one-line message; the others go on. Every row carries its provenance
    (``provenance.version``, ``.commit``, ``.date`` it finished, ``.command``: what
    started the sweep; without one, what the point function said, e.g. ``python:
    LayerSpec(...).run()``). Returns the whole table: earlier rows and new ones, one row
    per point id (a rerun point's row replaces its old one). What this call did is in
    the table's ``attrs``: ``attrs["points_run"]`` points it ran (simulated, or tried
    to), ``attrs["points_reused"]`` points whose finished row was already in ``out``."""
    tables = run_sweeps([(fn, p) for p in points], {_name(fn): out}, workers=workers, ray_address=ray_address,
                        progress=progress, desc=desc, keep_errors=keep_errors, command=command)
    return tables[_name(fn)]


def run_sweeps(jobs: Sequence[Job], outs: Mapping[str, str | Path], *, workers: int | None = None,
               ray_address: str | None = None, progress: bool = True, desc: str = "sweep",
               keep_errors: bool = False, command: str = "",
               on_batch: Callable[[Mapping[str, pd.DataFrame], set[tuple[str, str]]], None] | None = None,
               same_run: SameRun | None = None) -> dict[str, pd.DataFrame]:
    """:func:`run_sweep` for the points of several functions at once: ``jobs`` are
    (function, point) pairs, started in their order in one pool (so one function's
    long last point does not leave workers idle while the next function's points
    wait), and each function's rows go to its table ``outs[name]`` (by its
    ``module:function`` name). ``on_batch(tables, pending)``, if given, is called
    once before anything runs and again after each batch of finished points, with
    every function's table so far and the (function name, point id) pairs not yet
    finished. ``same_run(name, point)``, if given, is the point whose run under the
    function ``name`` is ``point``'s, event for event: of the points to run that share
    one, the first runs and the others get its row (:func:`shared_row`). Returns every
    function's whole table, each with the counts of this call in its ``attrs``
    (``points_run``, ``points_reused``: see :func:`run_sweep`; with ``same_run``, also
    ``points_shared``: the points given another's row)."""
    if workers is not None and workers < 1:
        raise UserError(f"workers: expected a positive number, got {workers}")
    if workers is not None and ray_address:
        raise UserError(f"workers: sets local processes; with ray='{ray_address}' the cluster's CPUs run the points")
    for fn in dict.fromkeys(fn for fn, _ in jobs):
        resolve(fn)  # a bad name fails here, once, not in every worker
        if _name(fn) not in outs:
            raise ValueError(f"run_sweeps: no table for the point function {_name(fn)}")
    with ExitStack() as stack:
        stores = {name: stack.enter_context(ResultStore(out)) for name, out in outs.items()}
        finished = {name: store.finished(keep_errors) for name, store in stores.items()}
        unique = {(_name(fn), point_id(p)): (fn, p) for fn, p in jobs}
        todo = [job for (name, pid), job in unique.items() if pid not in finished[name]]
        pending = {(_name(fn), point_id(p)) for fn, p in todo}
        runs, sharers = _shared_runs(todo, same_run)
        counts = {name: {"points_run": sum(_name(fn) == name for fn, _ in runs),
                         "points_reused": sum(n == name and pid in finished[name] for n, pid in unique)}
                  for name in outs}
        if same_run is not None:
            for name in outs:
                counts[name]["points_shared"] = sum(len(ps) for (n, _), ps in sharers.items() if n == name)
        bar, task = _progress(progress, desc, len(todo), len(unique) - len(todo))
        failed = 0
        if on_batch is not None:
            on_batch({name: store.table for name, store in stores.items()}, set(pending))
        batches = (_ray(runs, ray_address) if ray_address else
                   _local(runs, min(workers or os.cpu_count() or 1, max(1, len(runs)))))
        with bar, closing(batches):
            for batch in batches:
                batch = [(name, r) for name, row in batch
                         for r in (row, *(shared_row(row, p) for p in sharers.get((name, row["point_id"]), ())))]
                stamp = {"provenance.version": package_version(), "provenance.commit": git_commit(),
                         "provenance.date": now_utc()}
                by_fn: dict[str, list[dict[str, Any]]] = {}
                for name, row in batch:  # without a command, a row's own (a spec's call, run_point) stays
                    mine = command or str(row.get("provenance.command") or "")
                    by_fn.setdefault(name, []).append({**row, **stamp, "provenance.command": mine})
                for name, rows in by_fn.items():
                    stores[name].add(rows)
                    pending -= {(name, r["point_id"]) for r in rows}
                failed += sum(r["status"] != "ok" for _, r in batch)
                bar.update(task, advance=len(batch), failed=failed)
                if on_batch is not None:
                    on_batch({name: store.table for name, store in stores.items()}, set(pending))
    tables = {name: read_table(out) for name, out in outs.items()}  # as written: the same dtypes as read_parquet
    for name, table in tables.items():
        table.attrs.update(counts[name])
    return tables


def _shared_runs(todo: Sequence[Job], same_run: SameRun | None
                 ) -> tuple[list[Job], dict[tuple[str, str], list[Point]]]:
    """The jobs to run, in order (the first of each set of jobs whose points share a
    run, :func:`run_sweeps`), and by (function name, point id) of each such first job
    the points of the others."""
    if same_run is None:
        return list(todo), {}
    first: dict[tuple[str, str], Job] = {}
    sharers: dict[tuple[str, str], list[Point]] = {}
    for fn, p in todo:
        name = _name(fn)
        lead = first.setdefault((name, point_id(same_run(name, p))), (fn, p))
        if lead[1] is not p:
            sharers.setdefault((name, point_id(lead[1])), []).append(p)
    return list(first.values()), sharers


def shared_row(row: Mapping[str, Any], point: Point) -> dict[str, Any]:
    """The row of ``point`` whose run is the one ``row`` is of (``same_run``): that
    row's status and columns, under ``point``'s id and keys, with no wall time of its
    own (``wall_s`` 0) and the id of the row it shares in ``same_run_as``."""
    out: dict[str, Any] = {"point_id": point_id(point), "status": row["status"], "error": row["error"],
                           "wall_s": 0.0, **flatten(point, "point.")}
    out.update({k: v for k, v in row.items() if k not in out and not k.startswith("point.")})
    out["same_run_as"] = row["point_id"]
    return out


def summary(table: pd.DataFrame, points: Sequence[Point]) -> tuple[int, int]:
    """(points ok, points failed) among ``points`` in ``table``."""
    ids = {point_id(p) for p in points}
    mine = table[table["point_id"].isin(ids)]
    return int((mine["status"] == "ok").sum()), int((mine["status"] != "ok").sum())



def sweep_rows(points: list[Point], fn: str | PointFn = DEFAULT_FN, workers: int | None = None,
               progress: bool = False) -> list[dict[str, Any]]:
    """The rows of ``points`` run through ``fn`` (:func:`run_sweep` into a table that is
    thrown away), in the points' order: for callers that want the rows, not a file."""
    with tempfile.TemporaryDirectory() as tmp:
        table = run_sweep(points, Path(tmp) / "rows.parquet", fn=fn, workers=workers, progress=progress)
    by_id = {r["point_id"]: r for r in table.to_dict("records")}
    return [by_id[point_id(p)] for p in points]
