"""Sweeps (docs/sweeps.md): spec expansion and validation, failing points, resume
after a partial run and after kill -9, Ray against local (a local 2-CPU head), a killed
Ray worker and the rerun, and real simulation points."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest

import cais
from cais.cli import main
from cais.errors import UserError
from cais.sweep.grid import expand, load_spec, point_id
from cais.sweep.point import check_point
from cais.sweep.runner import run_sweep

SRC = str(Path(cais.__file__).resolve().parents[1])
HELPER = "sweep_helpers:square"
TINY_LAYER = {"kind": "layer", "model": "paper-mega-gpt-4b", "batch": 1, "seq": 64, "mode": "prefill", "gpus": 4,
              "scheme": "tp-nvls"}
SMALL_ALLREDUCE = {"kind": "collective", "op": "allreduce", "algo": "nvls", "bytes": "64K", "gpus": 4}


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _calls(path: Path) -> list[str]:
    return sorted(p.name.split("-")[0] for p in path.iterdir())


# --- the spec -------------------------------------------------------------------------

def test_expand_takes_the_cartesian_product_over_fixed_then_the_explicit_points() -> None:
    spec = {"fixed": {"a": 1, "b": 0}, "grid": {"b": [1, 2], "c": ["x", "y", "z"]}, "points": [{"d": 4}, {"b": 9}]}
    points = expand(spec, validate=False)
    assert len(points) == 2 * 3 + 2
    assert points[0] == {"a": 1, "b": 1, "c": "x"} and points[1] == {"a": 1, "b": 1, "c": "y"}  # first key slowest
    assert points[6] == {"a": 1, "b": 0, "d": 4} and points[7] == {"a": 1, "b": 9}
    assert all(p["a"] == 1 for p in points)
    assert expand({"fixed": {"a": 1}}, validate=False) == [{"a": 1}]
    assert len(expand({"grid": {"a": [1, 1, 2]}}, validate=False)) == 2  # a repeated point runs once


def test_point_ids_are_stable_and_independent_of_key_order() -> None:
    assert point_id({"a": 1, "b": [1, 2]}) == point_id({"b": [1, 2], "a": 1})
    assert point_id({"a": 1}) != point_id({"a": 2}) != point_id({"a": "1"})
    assert len(point_id({})) == 16


@pytest.mark.parametrize("spec,names", [
    ({"fixed": {**TINY_LAYER, "colour": "red"}}, "'colour'"),
    ({"fixed": TINY_LAYER, "grid": {"scheme": ["tp-nvls", "nope"]}}, "tp-nvls, sp-nvls"),
    ({"fixed": TINY_LAYER, "grid": {"mode": ["serve"]}}, "train, prefill, decode"),
    ({"fixed": TINY_LAYER, "grid": {"set.link.speed": [1]}}, "link.speed"),
    ({"fixed": TINY_LAYER, "grid": {"set.link.bandwidth_GBps": ["fast"]}}, "link.bandwidth_GBps"),
    ({"fixed": TINY_LAYER, "grid": {"sms": [0]}}, "'sms'"),
    ({"fixed": {**SMALL_ALLREDUCE, "scheme": "cais"}}, "'scheme'"),
    ({"fixed": {**SMALL_ALLREDUCE, "algo": "tree"}}, "ring, nvls"),
    ({"fixed": TINY_LAYER, "grid": {"scheme": "cais"}}, "grid.scheme"),
    ({"fixed": TINY_LAYER, "gird": {"scheme": ["cais"]}}, "'gird'"),
])
def test_a_bad_spec_is_one_line_naming_the_key(spec, names) -> None:
    with pytest.raises(UserError) as err:
        expand(spec)
    assert names in str(err.value) and "\n" not in str(err.value)


def test_a_bad_spec_exits_2_before_running_anything(tmp_path, capsys) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("fixed: {kind: layer, model: paper-mega-gpt-4b, mode: prefill}\n"
                    "grid: {scheme: [tp-nvls, nope]}\n")
    out = tmp_path / "r.parquet"
    assert main(["sweep", str(spec), "--out", str(out)]) == 2
    err = capsys.readouterr()
    assert err.out == "" and err.err.startswith("cais: error: point 2 of 2") and err.err.count("\n") == 1
    assert not out.exists()


# --- failures, resume ---------------------------------------------------------------

def test_a_point_that_raises_is_an_error_row_and_the_others_finish(tmp_path) -> None:
    calls = tmp_path / "calls"
    calls.mkdir()
    points = expand({"fixed": {"calls": str(calls), "fail": 2}, "grid": {"x": [1, 2, 3, 4]}}, validate=False)
    table = run_sweep(points, tmp_path / "r.parquet", fn=HELPER, workers=2, progress=False)
    by_x = table.set_index("point.x")
    assert list(by_x.loc[[1, 3, 4], "status"]) == ["ok"] * 3 and list(by_x.loc[[1, 3, 4], "y"]) == [1, 9, 16]
    assert by_x.loc[2, "status"] == "error" and by_x.loc[2, "error"] == "ValueError: x=2 is bad"
    assert pd.isna(by_x.loc[1, "error"]) and pd.isna(by_x.loc[2, "y"])
    assert set(table["nested.pid"].dropna()) and os.getpid() not in set(table["nested.pid"].dropna())  # workers
    assert pd.read_parquet(tmp_path / "r.parquet").equals(table)


def test_resume_runs_only_the_missing_points_and_the_table_has_one_row_each(tmp_path) -> None:
    calls = tmp_path / "calls"
    calls.mkdir()
    points = expand({"fixed": {"calls": str(calls)}, "grid": {"x": list(range(6))}}, validate=False)
    out = tmp_path / "r.parquet"
    first = run_sweep(points[:3], out, fn=HELPER, workers=1, progress=False)
    assert _calls(calls) == ["x0", "x1", "x2"] and first.attrs == {"points_run": 3, "points_reused": 0}
    full = run_sweep(points, out, fn=HELPER, workers=2, progress=False)
    assert _calls(calls) == [f"x{i}" for i in range(6)]  # each point ran exactly once
    assert full.attrs == {"points_run": 3, "points_reused": 3}
    assert sorted(full["point_id"]) == sorted(point_id(p) for p in points) and full["point_id"].is_unique
    kept = full.set_index("point_id").loc[first["point_id"], first.columns.drop("point_id")]
    pd.testing.assert_frame_equal(kept.reset_index(), first, check_dtype=False)  # earlier rows unchanged
    again = run_sweep(points, out, fn=HELPER, workers=2, progress=False)
    assert len(_calls(calls)) == 6 and again.equals(full) and again.attrs == {"points_run": 0, "points_reused": 6}


def test_points_of_two_functions_share_one_pool_and_each_row_goes_to_its_table(tmp_path) -> None:
    """One function's slow point does not hold back the next function's points: with
    two workers, the second function's points are done while the first's slow point
    still runs (two pools one after the other would run them after it), and each row
    lands in its own function's table. The slow point waits until the cubes are done
    (or 2 minutes, when they never come first): the test does not race the clock."""
    from cais.sweep.runner import run_sweeps

    calls = tmp_path / "calls"
    calls.mkdir()
    release = tmp_path / "release"
    cube = "sweep_helpers:cube"
    jobs = [(HELPER, {"x": 1, "calls": str(calls), "release": str(release)}), (HELPER, {"x": 2, "calls": str(calls)}),
            (cube, {"x": 3}), (cube, {"x": 4}), (cube, {"x": 3})]
    outs = {HELPER: tmp_path / "square.parquet", cube: tmp_path / "cube.parquet"}
    slow, cubes = (HELPER, point_id(jobs[0][1])), {(cube, point_id(p)) for _, p in jobs[2:]}
    seen: list[set[tuple[str, str]]] = []

    def on_batch(_tables: object, pending: set[tuple[str, str]]) -> None:
        seen.append(set(pending))
        if not pending & cubes:
            release.touch()

    tables = run_sweeps(jobs, outs, workers=2, progress=False, on_batch=on_batch)
    assert len(cubes) == 2 and seen[0] == {slow, (HELPER, point_id(jobs[1][1])), *cubes}  # before any ran
    assert any(slow in pending and not pending & cubes for pending in seen)
    assert seen[-1] == set()
    assert sorted(tables[HELPER]["y"]) == [1, 4] and "z" not in tables[HELPER]
    assert sorted(tables[cube]["z"]) == [27, 64] and "y" not in tables[cube]
    assert sorted(pd.read_parquet(outs[cube])["z"]) == [27, 64]


def test_points_that_share_a_run_run_once_and_each_gets_its_own_row(tmp_path) -> None:
    """With ``same_run``, of the points whose run is one point's only the first runs;
    the others get its columns under their own id and keys, no wall time of their
    own and the id of the row they share."""
    from cais.sweep.runner import run_sweeps

    calls = tmp_path / "calls"
    calls.mkdir()
    points = [{"x": x, "calls": str(calls), "tag": tag} for x, tag in [(2, "a"), (2, "b"), (3, "a"), (2, "c")]]
    asked: list[str] = []

    def same(name: str, point: dict) -> dict:
        asked.append(name)
        return {k: v for k, v in point.items() if k != "tag"}  # the tag does not change the run

    out = tmp_path / "r.parquet"
    table = run_sweeps([(HELPER, p) for p in points], {HELPER: out}, workers=2, progress=False, same_run=same)[HELPER]
    assert _calls(calls) == ["x2", "x3"] and asked == [HELPER] * 4  # one run for the three x = 2 points
    assert table.attrs == {"points_run": 2, "points_reused": 0, "points_shared": 2}
    ids = [point_id(p) for p in points]
    t = table.set_index("point_id")
    assert list(t.loc[ids, "y"]) == [4, 4, 9, 4] and list(t.loc[ids, "point.tag"]) == ["a", "b", "a", "c"]
    assert list(t.loc[[ids[1], ids[3]], "same_run_as"]) == [ids[0], ids[0]]
    assert list(t.loc[[ids[1], ids[3]], "wall_s"]) == [0.0, 0.0] and t.loc[ids[0], "wall_s"] > 0
    assert t.loc[[ids[0], ids[2]], "same_run_as"].isna().all() and (t["status"] == "ok").all()
    again = run_sweeps([(HELPER, p) for p in points], {HELPER: out}, workers=1, progress=False, same_run=same)[HELPER]
    assert len(_calls(calls)) == 2 and again.attrs == {"points_run": 0, "points_reused": 4, "points_shared": 0}


def test_a_workers_points_start_without_the_garbage_of_its_earlier_points(tmp_path) -> None:
    # each worker's collector is off (the helper), so only the runner frees a cycle
    points = expand({"grid": {"x": [1, 2, 3, 4, 5]}}, validate=False)
    table = run_sweep(points, tmp_path / "r.parquet", fn="sweep_helpers:cyclic", workers=2, progress=False)
    assert list(table["status"]) == ["ok"] * 5 and os.getpid() not in set(table["pid"])
    assert table["earlier_points"].max() >= 1  # some worker ran a point after another
    assert table["earlier_alive"].sum() == 0
    # a worker freezes what its first point left (its imports), and nothing after that
    later = table[table["earlier_points"] >= 1]
    assert (later["frozen"] > 0).all() and (later.groupby("pid")["frozen"].nunique() == 1).all()
    assert (table.loc[table["earlier_points"] == 0, "frozen"] == 0).all()


def test_failed_points_rerun_unless_keep_errors(tmp_path) -> None:
    calls = tmp_path / "calls"
    calls.mkdir()
    points = expand({"fixed": {"calls": str(calls), "fail": 1}, "grid": {"x": [0, 1]}}, validate=False)
    out = tmp_path / "r.parquet"
    run_sweep(points, out, fn=HELPER, workers=1, progress=False)
    run_sweep(points, out, fn=HELPER, workers=1, progress=False, keep_errors=True)
    assert _calls(calls) == ["x0", "x1"]
    table = run_sweep(points, out, fn=HELPER, workers=1, progress=False)
    assert _calls(calls) == ["x0", "x1", "x1"] and len(table) == 2 and table["point_id"].is_unique


def test_a_dying_worker_is_an_error_row_not_the_end_of_the_sweep(tmp_path) -> None:
    calls = tmp_path / "calls"
    calls.mkdir()
    points = expand({"fixed": {"calls": str(calls), "die": 0}, "grid": {"x": [0, 1, 2]}}, validate=False)
    table = run_sweep(points, tmp_path / "r.parquet", fn=HELPER, workers=2, progress=False).set_index("point.x")
    assert table.loc[0, "status"] == "error" and table.loc[0, "error"].startswith("worker failed: ")
    assert len(table) == 3 and set(table["status"]) <= {"ok", "error"}


def test_a_table_being_written_by_another_sweep_is_refused(tmp_path) -> None:
    from cais.sweep.store import ResultStore

    out = tmp_path / "r.parquet"
    with ResultStore(out):
        with pytest.raises(UserError, match="another sweep is writing"):
            run_sweep([{"x": 1}], out, fn=HELPER, workers=1, progress=False)
    assert not list(tmp_path.glob(".*lock"))  # removed when the sweep ends
    with pytest.raises(UserError, match="^out: .*must end in .parquet"):  # (or .csv, where sweeps write CSV)
        run_sweep([{"x": 1}], tmp_path / "r.txt", fn=HELPER, workers=1, progress=False)
    with pytest.raises(UserError, match="^ray: no Ray cluster answers|^ray: Ray is not installed"):
        run_sweep([{"x": 1}], out, fn=HELPER, ray_address=f"127.0.0.1:{_free_port()}", progress=False)


def test_kill_9_loses_no_finished_point_and_the_rerun_completes_the_same_table(tmp_path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("fixed: {kind: collective, op: allreduce, algo: ring, gpus: 4}\n"
                    "grid: {bytes: [256K, 320K, 384K, 448K, 512K, 576K]}\n")

    def sweep(out: Path) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "cais", "sweep", str(spec), "--out", str(out), "--workers", "1",
                                 "--no-progress"], env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    out = tmp_path / "killed.parquet"
    proc = sweep(out)
    deadline = time.monotonic() + 120
    while not out.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.kill()  # SIGKILL, the moment the first point is in the table
    proc.wait()
    before = pd.read_parquet(out)
    assert 1 <= len(before) < 6, "the sweep must be killed half-way (points too fast?)"
    rerun = sweep(out)
    stdout, stderr = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, stderr
    assert "6 ok, 0 failed" in stdout and str(out) in stdout.replace("\n", "")  # a long path wraps at 80 columns
    clean_proc = sweep(tmp_path / "clean.parquet")
    assert clean_proc.wait(timeout=300) == 0
    final, clean = pd.read_parquet(out), pd.read_parquet(tmp_path / "clean.parquet")
    assert final["point_id"].is_unique and set(final["point_id"]) == set(clean["point_id"])
    pd.testing.assert_frame_equal(final.set_index("point_id").loc[before["point_id"]].reset_index(), before)
    metrics = ["time_us", "busbw_GBps", "events"]
    pd.testing.assert_frame_equal(final.set_index("point_id").sort_index()[metrics],
                                  clean.set_index("point_id").sort_index()[metrics])
    assert not list(tmp_path.glob(".killed.parquet.sweep-*.tmp"))  # a killed write's leftover is cleaned


def _children(pid: int) -> set[int]:
    """The processes whose parent is ``pid`` (Linux's /proc)."""
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[1]) == pid:
            out.add(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_sigterm_ends_a_sweep_and_its_worker_processes(tmp_path) -> None:
    """``kill`` (SIGTERM) stops a sweep as Ctrl-C does: one line, exit 143, the finished
    points kept, and the worker processes ended rather than left running their points."""
    spec = tmp_path / "spec.yaml"
    spec.write_text("fixed: {kind: collective, op: allreduce, algo: nvls, gpus: 16, system: nvl72,\n"
                    "        set.collective.nvls_buffers: registered}\n"
                    "grid: {bytes: [2G, 3G, 4G]}\n")  # about 10 s a point
    proc = subprocess.Popen([sys.executable, "-m", "cais", "sweep", str(spec), "--out", str(tmp_path / "r.parquet"),
                             "--workers", "2", "--no-progress"], env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    workers: set[int] = set()
    while len(workers) < 2 and proc.poll() is None and time.monotonic() < deadline:
        workers = {p for p in _children(proc.pid)
                   if "spawn_main" in Path(f"/proc/{p}/cmdline").read_text(errors="replace")}
        time.sleep(0.1)
    assert len(workers) == 2, "the sweep must be running its two workers"
    time.sleep(2)  # inside their points
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and err.strip().splitlines()[-1] == "cais: terminated", err
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in workers)


# --- real points, Ray -----------------------------------------------------------------

def test_run_point_rows_match_running_the_layer_and_the_collective_directly(tmp_path) -> None:
    from cais.experiments.collective import run_collective
    from cais.experiments.layer import run_layer
    from cais.config import load_system
    from cais.workload.models import load_model

    points = expand({"points": [TINY_LAYER, SMALL_ALLREDUCE]})
    table = run_sweep(points, tmp_path / "r.parquet", workers=1, progress=False).set_index("point.kind")
    assert list(table["status"]) == ["ok", "ok"]
    cfg = load_system("dgx-h100", gpus=4)
    layer = run_layer(cfg, load_model("paper-mega-gpt-4b").with_run(1, 64), "tp-nvls", "prefill")
    coll = run_collective(cfg, "allreduce", "nvls", 64 << 10)
    assert table.loc["layer", "total_us"] == pytest.approx(layer.total_us) and layer.total_us > 0
    assert table.loc["layer", "sublayers.L1.time_us"] == pytest.approx(layer.sublayers["L1"]["time_us"])
    assert table.loc["collective", "busbw_GBps"] == pytest.approx(coll.busbw_GBps) and coll.busbw_GBps > 0
    assert table.loc["collective", "time_us"] == pytest.approx(coll.time_us)
    assert table.loc["layer", "link.bandwidth_GBps"] == cfg.link.bandwidth_GBps  # config fields are columns


def test_set_fields_nested_or_dotted_are_the_same_run_and_mixed_types_are_stored(tmp_path) -> None:
    points = expand({"fixed": SMALL_ALLREDUCE, "points": [
        {"set.link.bandwidth_GBps": 50}, {"set": {"link.bandwidth_GBps": 50}}, {"bytes": 65536, "tag.figure": "f1"}]})
    table = run_sweep(points, tmp_path / "r.parquet", workers=1, progress=False)
    assert list(table["status"]) == ["ok"] * 3 and list(table["link.bandwidth_GBps"]) == [50, 50, 25]
    assert table.loc[0, "busbw_GBps"] == table.loc[1, "busbw_GBps"] != table.loc[2, "busbw_GBps"]
    assert list(table["point.bytes"]) == ["64K", "64K", "65536"]  # 64K and 65536 in one column: text
    assert table["point_id"].is_unique and table.loc[2, "bytes"] == 65536 and table.loc[2, "point.tag.figure"] == "f1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_bin() -> Path:
    """The ``ray`` command beside this Python (the venv's), else on PATH. Skips the test
    when Ray is not installed, or fails it with ``CAIS_REQUIRE_RAY=1`` (``.ci/run`` sets
    it: CI never skips the distributed path without a word)."""
    import importlib.util

    ray_bin = Path(sys.executable).with_name("ray")
    if not ray_bin.exists():
        ray_bin = Path(shutil.which("ray") or "ray")
    if importlib.util.find_spec("ray") is None or not ray_bin.exists():
        why = "Ray is not installed (pip install -e '.[cluster]')"
        if os.environ.get("CAIS_REQUIRE_RAY") == "1":
            pytest.fail(f"CAIS_REQUIRE_RAY=1 and {why}", pytrace=False)
        pytest.skip(why)
    return ray_bin


def test_without_ray_the_ray_tests_skip_or_with_cais_require_ray_fail(monkeypatch) -> None:
    """What a machine without Ray does to the Ray tests: skip them, or (CAIS_REQUIRE_RAY=1,
    as .ci/run sets) fail them."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    monkeypatch.delenv("CAIS_REQUIRE_RAY", raising=False)
    with pytest.raises(pytest.skip.Exception, match="Ray is not installed"):
        _ray_bin()
    monkeypatch.setenv("CAIS_REQUIRE_RAY", "1")
    with pytest.raises(pytest.fail.Exception, match="CAIS_REQUIRE_RAY=1 and Ray is not installed"):
        _ray_bin()


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory: pytest.TempPathFactory):
    """A local Ray head with 2 CPUs, started here once for the module (its own process
    group, token auth with a fresh token; stopped in the end): (address, the
    environment a driver needs). Its workers import ``sweep_helpers`` (this folder is
    on their PYTHONPATH). No Ray state in the test process: drivers are subprocesses."""
    ray_bin = _ray_bin()
    logs = tmp_path_factory.mktemp("ray")
    port = _free_port()
    temp = tempfile.mkdtemp(prefix="ray")  # short: Ray's socket paths live under it
    env = {**_env(), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
           "RAY_USAGE_STATS_ENABLED": "0"}
    env["PYTHONPATH"] = str(Path(__file__).parent) + os.pathsep + env["PYTHONPATH"]
    log = open(logs / "ray.log", "w")
    head = subprocess.Popen([str(ray_bin), "start", "--head", "--block", f"--port={port}", "--num-cpus=2",
                             "--include-dashboard=false", "--object-store-memory=100000000", "--disable-usage-stats",
                             f"--temp-dir={temp}"], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)  # its own process group: stopped below, and only it
    try:
        deadline = time.monotonic() + 300  # a hang guard, not a speed check
        while "Ray runtime started" not in (logs / "ray.log").read_text():
            assert head.poll() is None and time.monotonic() < deadline, (logs / "ray.log").read_text()[-2000:]
            time.sleep(0.5)
        yield f"127.0.0.1:{port}", env
    finally:
        head.terminate()  # `ray start` alone: it stops its processes in order (SIGTERM to all of them kills
        try:              # the GCS first, and `ray start` then waits half a minute for it)
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(head.pid, signal.SIGKILL)  # what SIGTERM left of the group (ray start leaves some)
        except ProcessLookupError:
            pass
        head.wait()
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def test_ray_cluster_gives_the_same_rows_as_local_processes(ray_head, tmp_path) -> None:
    """`cais sweep --ray` against the local head, in a subprocess: the same rows as
    local processes."""
    address, env = ray_head
    spec = tmp_path / "spec.yaml"
    spec.write_text("fixed: {kind: collective, op: allreduce, bytes: 64K, gpus: 4}\n"
                    "grid: {algo: [nvls, ring], set.link.bandwidth_GBps: [25, 50]}\n")
    proc = subprocess.run([sys.executable, "-m", "cais", "sweep", str(spec), "--out", str(tmp_path / "ray.parquet"),
                           "--ray", address], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "4 ok, 0 failed" in proc.stdout
    remote = pd.read_parquet(tmp_path / "ray.parquet")
    local = run_sweep(expand(load_spec(spec)), tmp_path / "local.parquet", workers=1, progress=False)
    assert list(remote["status"]) == ["ok"] * 4
    cols = ["time_us", "busbw_GBps", "events", "link.bandwidth_GBps"]
    pd.testing.assert_frame_equal(remote.set_index("point_id").sort_index()[cols],
                                  local.set_index("point_id").sort_index()[cols])


RAY_DRIVER = """import json, sys
from cais.sweep.runner import run_sweep
t = run_sweep(json.loads(sys.argv[1]), sys.argv[2], fn="sweep_helpers:held_point", ray_address=sys.argv[3],
              progress=False)
print(json.dumps(t.attrs))
"""
RAY_SIZES = ("64K", "96K", "128K", "160K")
HELPER_KEYS = ("calls", "hold", "release")


def _ray_sweep(points: list[dict], out: Path, address: str, env: dict[str, str]) -> subprocess.Popen:
    """A driver process running ``points`` through ``sweep_helpers:held_point`` on Ray;
    it prints the table's counts (``attrs``) as JSON."""
    import json

    return subprocess.Popen([sys.executable, "-c", RAY_DRIVER, json.dumps(points), str(out), address], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _running(calls: Path, size: str, driver: subprocess.Popen, known: set[int]) -> int:
    """The pid of the Ray worker that started the point of ``size`` and is not in
    ``known``, once it has (it then waits for its release file)."""
    deadline = time.monotonic() + 300  # a hang guard, not a speed check
    while True:
        pids = {int(f.name.split("-")[1]) for f in calls.glob(f"{size}-*")} - known
        if pids:
            pid = pids.pop()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            assert pid not in (os.getpid(), driver.pid) and "ray::" in cmd, cmd  # only ever kill a Ray worker
            return pid
        assert driver.poll() is None and time.monotonic() < deadline, driver.communicate()[1][-2000:]
        time.sleep(0.05)


def _ray_points(calls: Path, release: Path, held: str) -> list[dict]:
    return [{**SMALL_ALLREDUCE, "bytes": size, "calls": str(calls), "release": str(release),
             **({"hold": True} if size == held else {})} for size in RAY_SIZES]


def _same_as_local(table: pd.DataFrame, points: list[dict], tmp_path: Path) -> None:
    """``table``'s metrics are those of the points (without the helper's keys) run here."""
    plain = [{k: v for k, v in p.items() if k not in HELPER_KEYS} for p in points]
    local = run_sweep(plain, tmp_path / "local.parquet", workers=1, progress=False)
    metrics = ["time_us", "busbw_GBps", "events"]
    pd.testing.assert_frame_equal(table.set_index("point.bytes").sort_index()[metrics],
                                  local.set_index("point.bytes").sort_index()[metrics],
                                  check_dtype=False)  # events: float where the column once held a failed row's NaN


def _pids(calls: Path, size: str) -> list[int]:
    return sorted(int(f.name.split("-")[1]) for f in calls.glob(f"{size}-*"))


def _start_ray_sweep(ray_head, tmp_path: Path, held: str):  # type: ignore[no-untyped-def]
    """The Ray sweep of the four points, the ``held`` one waiting for its release file,
    started on the module's head: (calls, release, out, points, driver)."""
    address, env = ray_head
    calls, release, out = tmp_path / "calls", tmp_path / "release", tmp_path / "ray.parquet"
    calls.mkdir()
    points = _ray_points(calls, release, held=held)
    return calls, release, out, points, _ray_sweep(points, out, address, env)


def test_a_killed_ray_worker_s_point_runs_again_and_the_sweep_completes_the_same(ray_head, tmp_path) -> None:
    """SIGKILL to the Ray worker in the middle of a point: Ray runs the point again in
    another worker (the task's one retry), and the sweep ends with every point ok and
    the rows a local run gives."""
    calls, release, out, points, driver = _start_ray_sweep(ray_head, tmp_path, "96K")
    victim = _running(calls, "96K", driver, set())
    os.kill(victim, signal.SIGKILL)  # the point is running: it waits for its release
    release.touch()
    stdout, stderr = driver.communicate(timeout=600)
    assert driver.returncode == 0, stderr[-2000:]
    assert stdout.strip().splitlines()[-1] == '{"points_run": 4, "points_reused": 0}'
    table = pd.read_parquet(out)
    assert list(table["status"]) == ["ok"] * 4 and table["point_id"].is_unique
    held = _pids(calls, "96K")
    assert len(held) == 2 and victim in held  # started twice: killed, then again in another worker
    assert all(len(_pids(calls, s)) == 1 for s in RAY_SIZES if s != "96K")
    _same_as_local(table, points, tmp_path)


def test_a_point_whose_ray_worker_dies_twice_is_an_error_row_and_the_rerun_completes_it(ray_head, tmp_path) -> None:
    """A point whose worker is killed on both tries is an error row ("worker failed"),
    the other points finish; running the sweep again runs only that point, and the
    table is then whole and the same as a local run's."""
    calls, release, out, points, driver = _start_ray_sweep(ray_head, tmp_path, "128K")
    first = _running(calls, "128K", driver, set())
    os.kill(first, signal.SIGKILL)
    second = _running(calls, "128K", driver, {first})
    os.kill(second, signal.SIGKILL)
    stdout, stderr = driver.communicate(timeout=600)
    assert driver.returncode == 0, stderr[-2000:]
    assert stdout.strip().splitlines()[-1] == '{"points_run": 4, "points_reused": 0}'
    before = pd.read_parquet(out).set_index("point.bytes")
    assert before.loc["128K", "status"] == "error" and before.loc["128K", "error"].startswith("worker failed: ")
    assert list(before.drop("128K")["status"]) == ["ok"] * 3
    release.touch()
    rerun = _ray_sweep(points, out, *ray_head)
    stdout, stderr = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, stderr[-2000:]
    assert stdout.strip().splitlines()[-1] == '{"points_run": 1, "points_reused": 3}'  # only the failed point
    after = pd.read_parquet(out)
    assert list(after["status"]) == ["ok"] * 4 and after["point_id"].is_unique
    assert all(len(_pids(calls, s)) == 1 for s in RAY_SIZES if s != "128K") and len(_pids(calls, "128K")) == 3
    same = ["time_us", "busbw_GBps", "events", "wall_s", "provenance.date"]  # the finished rows, untouched
    pd.testing.assert_frame_equal(after.set_index("point.bytes").drop("128K")[same], before.drop("128K")[same])
    _same_as_local(after, points, tmp_path)


def test_sweep_rows_come_back_in_the_points_order_without_a_file(tmp_path) -> None:
    """``sweep_rows``: the one grid runner for callers that want rows (the paper
    baseline scripts): the runner's rows, in the points' order, nothing left behind."""
    from cais.sweep.runner import sweep_rows

    points = [{"x": x, "calls": str(tmp_path)} for x in (3, 1, 2)]
    rows = sweep_rows(points, HELPER, workers=1)  # by name; the next test passes the function
    assert [r["y"] for r in rows] == [9, 1, 4] and all(r["status"] == "ok" for r in rows)
    assert not list(tmp_path.glob("*.parquet"))


def test_the_baseline_grid_refuses_a_failed_point() -> None:
    """The paper grid's rows (experiments/baselines.grid_rows) never hide a failed run."""
    from cais.experiments.baselines import grid_rows

    bad = {"status": "error", "error": "ValueError: boom", "point.model": "m", "point.scheme": "s",
           "point.mode": "prefill"}
    with pytest.raises(RuntimeError, match="m/s/prefill: ValueError: boom"):
        grid_rows([bad])
    assert grid_rows([]) == []


def test_a_sweep_takes_the_point_function_itself(tmp_path) -> None:
    """``fn`` may be the function, not only its ``module:function`` name; worker
    processes import it by reference."""
    import sweep_helpers

    points = [{"x": x, "calls": str(tmp_path)} for x in (2, 5)]
    table = run_sweep(points, tmp_path / "r.parquet", fn=sweep_helpers.square, workers=2, progress=False)
    assert sorted(table["y"]) == [4, 25]


def test_a_moe_point_is_the_layer_cais_run_runs_and_its_attention_key_is_taken(tmp_path) -> None:
    """An EP scheme on a mixture-of-experts model is a sweep point as it is a ``cais run``:
    the row's period equals LayerSpec's run of the same layer (attention ``dp``), the two
    attention modes are different runs, and a dense scheme on the MoE model or an unknown
    attention is a one-line refusal naming the key."""
    import json

    from cais.experiments.spec import LayerSpec
    from tests.test_moe_layer import TINY

    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY))
    base = {"kind": "layer", "model": str(path), "scheme": "ep-deepep", "mode": "prefill"}
    points = expand({"fixed": base, "grid": {"attention": ["tp", "dp"]}})
    table = run_sweep(points, tmp_path / "r.parquet", workers=1, progress=False).set_index("point.attention")
    assert list(table["status"]) == ["ok", "ok"]
    direct = LayerSpec(str(path), "ep-deepep", "prefill", attention="dp").run()
    assert table.loc["dp", "total_us"] == pytest.approx(direct.total_us) and direct.total_us > 0
    assert table.loc["tp", "total_us"] != pytest.approx(table.loc["dp", "total_us"])
    with pytest.raises(UserError, match="key 'attention': unknown value \"ep\"; allowed: tp, dp"):
        check_point({**base, "attention": "ep"})
    with pytest.raises(UserError, match="scheme"):
        check_point({**base, "scheme": "tp-nvls"})


def test_every_example_sweep_expands_and_each_point_passes_the_checks() -> None:
    """The specs in examples/sweeps/ are what docs/sweeps.md tells users to run: each
    expands to points and every point passes the checks a sweep makes before running."""
    from cais.sweep.point import check_points

    examples = sorted((Path(SRC).parent / "examples" / "sweeps").glob("*.yaml"))
    assert len(examples) >= 3
    for path in examples:
        points = expand(load_spec(path))
        assert points, path.name
        check_points(points)
